// ditswarm's library API: what a web page embeds.
//
//   const swarm = await openSwarm();                      // workers join via swarm.joinUrl
//   const pipe = await createPipeline({ backend: 'swarm', swarm, placement: { ulyssesDegree: 2 } });
//   const { video, latent, report } = await pipe.generate({ prompt: 'a red ball', steps: 4 });
//   await pipe.shutdown();
import type { ExecutionProvider } from '../core/worker-api.ts';
import { JobQueue, type RunJob } from './job-queue.ts';
import { IdbJobStore, type JobStore } from './job-store.ts';
import { Swarm, type SwarmIdentity } from './swarm.ts';

export { createPipeline, loadFormModel, loadJobDefaults, loadModelConfig } from './pipeline.ts';
export { WAN_SIZES } from '../core/model/wan-pipeline.ts';
export type {
  GenerateReport,
  GenerateRequest,
  GenerateResult,
  JobRequest,
  Pipeline,
  PipelineOptions,
  StepProgress,
} from './pipeline.ts';
export { BACKENDS, getExecutorClass, type Backend } from './backends.ts';
export { Executor, TimeoutError, WorkerError, type RankReport } from './executor.ts';
export { measureWorker, type WorkerMeasurement } from './measure.ts';
export type { Swarm, SwarmEvent, SwarmIdentity, SwarmWorker } from './swarm.ts';
export type { JobQueue, QueueEvent, RunJob } from './job-queue.ts';
export { MemoryJobStore, type JobInputs, type JobPlacement, type JobStore, type StoredJob } from './job-store.ts';
export type { PlacementPrediction, PlacementRequest, ResolvedPlacement } from './placement.ts';
export type { FailureRecord } from './placer.ts';
export {
  DEFAULT_JOB,
  DEFAULT_MODEL_URL,
  FEW_STEP_SAMPLING,
  LIMITS,
  checkJobParams,
  JobParamsError,
  type JobParams,
  type FieldErrors,
} from '../core/job.ts';
export { validDegrees } from '../core/parallel.ts';
export { encodeWebM, probeWebM } from './video.ts';
export { describeDecodeProgress } from './vae-decoding.ts';
export { openPromptCache } from './prompt-cache.ts';
export type { PromptCache, PromptEncoding } from './text-encoding.ts';
export type { ExecutionProvider };
export type ExecutionProviderChoice = ExecutionProvider | 'auto';

/** Opens this page's swarm on the signaling server of `origin` (this page's by default). */
export function openSwarm(origin: string = globalThis.location.origin, identity?: SwarmIdentity): Promise<Swarm> {
  return Swarm.open(origin, identity);
}

/** The dashboard's persistent job queue (IndexedDB), resuming what a reload interrupted. */
export async function openJobQueue(run: RunJob, store?: JobStore): Promise<JobQueue> {
  return JobQueue.restore(store ?? (await IdbJobStore.open()), run);
}
export { preloadOnJoin, PRELOAD_FROM_BYTES, PRELOAD_LARGE_ONLY } from './preload.ts';
export {
  describeEstimate,
  describeLeft,
  needsConfirmation,
  PhaseRates,
  type JobEstimate,
  type TimeLeft,
} from './estimate.ts';
