import { configDefaults, defineConfig, mergeConfig } from 'vitest/config';
import base from './vitest.config.ts';

// The unit tests a mutation run (stryker.config.mjs) may rerun per mutant: all but the two slow ones
// that check none of the mutated modules (demo training; the forward CLI, a child process that never
// loads the sandbox's mutated code). MUTATION_TESTS (comma-separated files) narrows them to a
// module's own tests, for a module most of the suite imports, such as core/net/protocol.ts.
const only = process.env.MUTATION_TESTS?.split(',').filter(Boolean);
export default mergeConfig(
  base,
  defineConfig({
    test: {
      ...(only ? { include: only } : {}),
      exclude: [...configDefaults.exclude, 'test/unit/demo-train.test.ts', 'test/unit/forward-cli.test.ts'],
    },
  }),
);
