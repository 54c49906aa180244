import { configDefaults, defineConfig, mergeConfig } from 'vitest/config';
import base from './vitest.config.ts';

// The unit tests a mutation run (stryker.config.mjs) may rerun per mutant: all of them but the two
// slow ones that check none of the mutated modules' numbers (training the demo model, and the
// forward CLI in a child process, which would not even load the sandbox's mutated code).
// MUTATION_TESTS (comma-separated files) narrows them to a module's own tests: a module most of the
// suite imports, such as core/net/protocol.ts, takes hours against every test that reaches it.
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
