// Moved: the schedulers are core/schedulers/ and the sampler's noise and guidance core/sampler.ts.
// This name stays until coordinator/pipeline.ts imports Schedule from core/sampler.ts.
export type { Schedule } from './schedulers/scheduler.ts';
