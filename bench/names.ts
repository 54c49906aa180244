// The benchmarks `npm run bench` knows, in a module that runs nothing: bench/run.ts runs them, and the docs test
// holds every benchmark the docs name to its parser, with the compiler asking for one parser a benchmark.

/** every benchmark, in the order a whole run takes them (block cost first: the projection is held to it) */
export const BENCHMARKS = [
  'block-cost',
  'projection',
  'local-overhead',
  'scaling',
  'threads',
  'full-size',
  'pooled',
  'handoff',
  'vae',
  'uneven',
  'slow-link',
  'spot-check-overhead',
  'time-to-video',
  'first-job',
  'load',
  'api-polls',
  'node-worker',
  'signaling',
  'links',
] as const;
export type Benchmark = (typeof BENCHMARKS)[number];
