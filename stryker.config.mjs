// Mutation testing of the numeric, protocol and defence core: a habit before changing these modules, not a
// CI gate (too slow for that). `npm run test:mutation` (test/mutation.ts), or one module at a time:
//   npm run test:mutation -- --module core/schedulers/unipc-multistep-scheduler.ts
// Reports land in bench/out/mutation/ (index.html, mutation.json, and summary.json: each module's score).
/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  mutate: [
    'core/sampler.ts',
    'core/schedulers/*.ts',
    'core/cost-model.ts',
    'core/parallel.ts',
    'core/net/protocol.ts',
    'core/net/check.ts',
    'core/worker-api.ts',
    'core/step-cache.ts',
    'core/model/lora.ts',
    'core/model/umt5.ts',
    'core/model/umt5-tokenizer.ts',
    'core/model/wan-vae.ts',
    'core/model/wan-vae-tiling.ts',
    'coordinator/placement.ts',
    'coordinator/planner.ts',
    'coordinator/stage-plan.ts',
    'coordinator/spot-check.ts',
    'rank/displaced.ts',
    'rank/weight-cache.ts',
  ],
  testRunner: 'vitest',
  // `related`: per mutant, only the test files that import the mutated module (directly or not)
  vitest: { configFile: 'vitest.mutation.config.ts', related: true },
  // perTest: a mutant runs only the tests that reached it in the initial run
  coverageAnalysis: 'perTest',
  // Fixtures built in beforeAll make most mutants "static", and rerunning every related file for them
  // costs hours. Load-time-only mutants (worker-api's contract table, protocol's constant tables) are
  // then Ignored: check those with `--mutate core/worker-api.ts --ignoreStatic false`.
  ignoreStatic: true,
  checkers: ['typescript'],
  tsconfigFile: 'tsconfig.json',
  // 2 cores: one type checker and one test runner, then two test runners once checking is done
  concurrency: 2,
  reporters: ['html', 'json', 'clear-text', 'progress'],
  htmlReporter: { fileName: 'bench/out/mutation/index.html' },
  jsonReporter: { fileName: 'bench/out/mutation/mutation.json' },
  incrementalFile: 'bench/out/mutation/incremental.json',
  clearTextReporter: { allowColor: false, allowEmojis: false, reportScoreTable: true, reportMutants: true },
  // The sandbox is a copy of the repo, so test/unit/layout.test.ts still finds every source folder;
  // build output, benchmark reports and the e2e screenshots stay out of it.
  tempDirName: '.stryker-tmp',
  ignorePatterns: ['dist', 'bench/out', 'test-results', 'playwright-report', 'test/e2e/screenshots'],
  thresholds: { high: 90, low: 80, break: null },
  timeoutMS: 10_000,
};
