/**
 * ditswarm's library API: what a web page embeds.
 *
 *   const swarm = await openSwarm();                      // workers join via swarm.joinUrl
 *   const pipe = await createPipeline({ backend: 'swarm', swarm, workers: 2 });
 *   const { video, latent, report } = await pipe.generate({ prompt: 'a red ball', steps: 4 });
 *   await pipe.shutdown();
 */
import type { ExecutionProvider } from '../worker/onnx-stages.ts';
import { Swarm } from './swarm.ts';

export { createPipeline, DEFAULT_MODEL_URL } from './pipeline.ts';
export type { GenerateReport, GenerateRequest, GenerateResult, Pipeline, PipelineOptions, StepProgress } from './pipeline.ts';
export { BACKENDS, getExecutorClass, type Backend } from './backends.ts';
export { Executor, TimeoutError, WorkerError } from './executor.ts';
export type { Swarm, SwarmEvent, SwarmWorker } from './swarm.ts';
export { DEFAULT_JOB, LIMITS, checkJobParams, JobParamsError, type JobParams, type FieldErrors } from '../core/job.ts';
export { validDegrees } from '../core/parallel.ts';
export { probeWebM } from './video.ts';
export type { ExecutionProvider };
export type ExecutionProviderChoice = ExecutionProvider | 'auto';

/** Opens this page's swarm on the signaling server of `origin` (this page's by default). */
export function openSwarm(origin: string = globalThis.location.origin): Promise<Swarm> {
  return Swarm.open(origin);
}
