// The one denoising loop every sampler uses, the pipeline's on a swarm and the demo's in Node:
// seeded noise (or a checkpoint's latent), then per step the model's velocity and one step of the
// folder's solver: flow-matching Euler (the tiny models), or UniPC as Wan2.1's folders name it
// (unipc.ts). Where the forward passes run is the caller's `velocity`.
import { eulerStep, flowMatchSchedule, initialNoise, type Schedule } from './scheduler.ts';
import type { Tensor } from './tensor.ts';
import { initialUniPcState, unipcSchedule, unipcStep, type UniPcOptions, type UniPcState } from './unipc.ts';

/** How a folder's scheduler steps: its scheduler_config.json as diffusers' class names it. */
export type Solver = { kind: 'FlowMatchEulerDiscreteScheduler' } | ({ kind: 'UniPCMultistepScheduler' } & UniPcOptions);

export const EULER: Solver = { kind: 'FlowMatchEulerDiscreteScheduler' };

/** `step` steps done, the latent after them, and what the solver carries to the next step (UniPC's history). */
export interface SamplerCheckpoint {
  step: number;
  latent: Float32Array;
  solver?: UniPcState;
}

export interface SampleRequest {
  shape: number[]; // [C, T, H, W]
  steps: number;
  flowShift: number;
  seed: number;
  /** the flow-matching Euler solver unless given */
  solver?: Solver;
  /** continue from a checkpoint */
  resume?: SamplerCheckpoint;
  /** the (guided) velocity the model predicts for `latent` at this step */
  velocity(at: { step: number; timestep: number; latent: Tensor }): Promise<Float32Array>;
  /** after each step: the checkpoint after it, and the step's duration */
  onStep?(done: SamplerCheckpoint & { stepMs: number }): void;
  signal?: AbortSignal;
}

/** The timesteps the model is given and the sigmas the solver steps through. */
export function scheduleOf(solver: Solver, steps: number, flowShift: number): Schedule {
  return solver.kind === 'UniPCMultistepScheduler'
    ? unipcSchedule(steps, flowShift)
    : flowMatchSchedule(steps, flowShift);
}

export async function sample(request: SampleRequest): Promise<Tensor> {
  const { shape, steps, solver = EULER } = request;
  const schedule = scheduleOf(solver, steps, request.flowShift);
  let latent: Tensor = request.resume ? { shape, data: request.resume.latent } : initialNoise(shape, request.seed);
  let history =
    solver.kind === 'UniPCMultistepScheduler' ? (request.resume?.solver ?? initialUniPcState(solver.order)) : undefined;
  const first = request.resume?.step ?? 0;
  if (solver.kind === 'UniPCMultistepScheduler' && first > 0 && !request.resume?.solver)
    throw new Error(`resuming UniPC at step ${first} needs its state from the checkpoint, which has none`);
  for (let step = first; step < steps; step++) {
    request.signal?.throwIfAborted();
    const started = performance.now();
    const velocity = await request.velocity({ step, timestep: schedule.timesteps[step], latent });
    if (solver.kind === 'UniPCMultistepScheduler') {
      const next = unipcStep(schedule, solver, step, velocity, latent.data, history!);
      latent = { shape, data: next.sample };
      history = next.state;
    } else {
      latent = { shape, data: eulerStep(latent.data, velocity, schedule.sigmas[step], schedule.sigmas[step + 1]) };
    }
    request.onStep?.({ step: step + 1, latent: latent.data, solver: history, stepMs: performance.now() - started });
  }
  return latent;
}
