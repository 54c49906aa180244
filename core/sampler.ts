// The one denoising loop every sampler uses, the pipeline's on a swarm and the demo's in Node:
// seeded noise (or a checkpoint's latent), then per step the model's velocity and one Euler step
// along the flow-matching schedule. Where the forward passes run is the caller's `velocity`.
import { eulerStep, flowMatchSchedule, initialNoise } from './scheduler.ts';
import type { Tensor } from './tensor.ts';

export interface SampleRequest {
  shape: number[]; // [C, T, H, W]
  steps: number;
  flowShift: number;
  seed: number;
  /** continue from a checkpoint: `step` steps done, `latent` after them */
  resume?: { step: number; latent: Float32Array };
  /** the (guided) velocity the model predicts for `latent` at this step */
  velocity(at: { step: number; timestep: number; latent: Tensor }): Promise<Float32Array>;
  /** after each step: how many are done, the latent after them, the step's duration */
  onStep?(done: { step: number; latent: Float32Array; stepMs: number }): void;
  signal?: AbortSignal;
}

export async function sample(request: SampleRequest): Promise<Tensor> {
  const { shape, steps } = request;
  const schedule = flowMatchSchedule(steps, request.flowShift);
  let latent: Tensor = request.resume ? { shape, data: request.resume.latent } : initialNoise(shape, request.seed);
  for (let step = request.resume?.step ?? 0; step < steps; step++) {
    request.signal?.throwIfAborted();
    const started = performance.now();
    const velocity = await request.velocity({ step, timestep: schedule.timesteps[step], latent });
    latent = { shape, data: eulerStep(latent.data, velocity, schedule.sigmas[step], schedule.sigmas[step + 1]) };
    request.onStep?.({ step: step + 1, latent: latent.data, stepMs: performance.now() - started });
  }
  return latent;
}
