import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

// Unit tests run in Node (onnxruntime-web's wasm backend), apart from the app's Vite config.
export default defineConfig({
  test: {
    root: import.meta.dirname,
    include: ['test/unit/**/*.test.ts'],
    environment: 'node',
    testTimeout: 120_000,
    // hooks build models and sessions: vitest's 10 s default fails them on a loaded 2-core machine (issue 37)
    hookTimeout: 120_000,
    pool: 'forks',
    // vitest's default leaves a core free, which on a 2-core machine runs the files one at a time (issue 66)
    maxWorkers: availableParallelism(),
  },
});
