// The one denoising loop every sampler uses, the pipeline's on a swarm and the demo's in Node: seeded
// noise (or a checkpoint's latent), then per step the model's velocity and one step of the folder's
// scheduler (core/schedulers/, each named after its diffusers class). Where the forward passes run is
// the caller's `velocity`; classifier-free guidance (`guide`) mixes the two it makes with guidance.
import { SeededRandom } from './random.ts';
import {
  FlowMatchEulerDiscreteScheduler,
  type FlowMatchEulerDiscreteSchedulerConfig,
} from './schedulers/flow-match-euler-discrete-scheduler.ts';
import type { Schedule, Scheduler } from './schedulers/scheduler.ts';
import {
  UniPCMultistepScheduler,
  type UniPCMultistepSchedulerConfig,
  type UniPcState,
} from './schedulers/unipc-multistep-scheduler.ts';
import type { Tensor } from './tensor.ts';
import type { JobParams } from './job.ts';
import { WanStepDistillScheduler } from './schedulers/wan-step-distill-scheduler.ts';

export type { Schedule } from './schedulers/scheduler.ts';

/**
 * A folder's scheduler (scheduler/scheduler_config.json): diffusers' class name and what its config
 * sets. The flow shift is the job's, as diffusers' Wan example builds it with from_config(flow_shift=).
 */
export type Solver =
  | { kind: 'FlowMatchEulerDiscreteScheduler'; config: Partial<Omit<FlowMatchEulerDiscreteSchedulerConfig, 'shift'>> }
  | { kind: 'UniPCMultistepScheduler'; config: Partial<Omit<UniPCMultistepSchedulerConfig, 'flowShift'>> }
  | { kind: 'WanStepDistillScheduler'; config: Record<string, never> };

export const EULER: Solver = { kind: 'FlowMatchEulerDiscreteScheduler', config: {} };

/** What a step-distilled LoRA's job samples with (a job's scheduler 'step-distill'), whatever the folder's is. */
export const STEP_DISTILL: Solver = { kind: 'WanStepDistillScheduler', config: {} };

/** `step` steps done, the latent after them, and what the scheduler carries to the next step (UniPC's history). */
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
  /** flow-matching Euler unless given */
  solver?: Solver;
  /** continue from a checkpoint */
  resume?: SamplerCheckpoint;
  /**
   * image to video with `expand_timesteps` (Wan2.2 TI2V): the encoded image [C, 1, H, W], held as the first latent
   * frame — the model sees it there at every step (at timestep 0: the velocity's caller gives those tokens that), and
   * the sample ends with it (diffusers: `(1 − first_frame_mask) · condition + first_frame_mask · latents`)
   */
  firstFrame?: Float32Array;
  /** the (guided) velocity the model predicts for `latent` at this step */
  velocity(at: { step: number; timestep: number; latent: Tensor }): Promise<Float32Array>;
  /** after each step: the checkpoint after it, and the step's duration */
  onStep?(done: SamplerCheckpoint & { stepMs: number }): void;
  signal?: AbortSignal;
}

/** The folder's scheduler with the job's flow shift, as from_config builds it: the one reader of `kind`. */
export function schedulerFromConfig(solver: Solver, flowShift: number): Scheduler<UniPcState> {
  switch (solver.kind) {
    case 'UniPCMultistepScheduler':
      return new UniPCMultistepScheduler({ ...solver.config, flowShift });
    case 'WanStepDistillScheduler':
      return new WanStepDistillScheduler({ shift: flowShift, numTrainTimesteps: 1000 });
    case 'FlowMatchEulerDiscreteScheduler':
      return new FlowMatchEulerDiscreteScheduler({ ...solver.config, shift: flowShift });
  }
}

/** The solver a job samples with: the folder's, or lightx2v's step-distill schedule where the job asks it. */
export function jobSolver(folder: Solver, { scheduler }: Pick<JobParams, 'scheduler'>): Solver {
  return scheduler === 'step-distill' ? STEP_DISTILL : folder;
}

/** The timesteps the model is given and the sigmas the scheduler steps through. */
export function scheduleOf(solver: Solver, steps: number, flowShift: number): Schedule {
  const scheduler = schedulerFromConfig(solver, flowShift);
  scheduler.setTimesteps(steps);
  return { sigmas: scheduler.sigmas, timesteps: scheduler.timesteps };
}

/** The starting latent: standard normal noise from the job's seed, identical on every backend. */
export function initialNoise(shape: number[], seed: number): Tensor {
  const size = shape.reduce((a, b) => a * b, 1);
  return { shape, data: new SeededRandom(seed).normals(size) };
}

/** v_uncond + g·(v_cond − v_uncond) */
export function guide(cond: Float32Array, uncond: Float32Array, scale: number): Float32Array {
  return cond.map((c, i) => uncond[i] + scale * (c - uncond[i]));
}

export async function sample(request: SampleRequest): Promise<Tensor> {
  const { shape, steps, solver = EULER, resume } = request;
  const scheduler = schedulerFromConfig(solver, request.flowShift);
  scheduler.setTimesteps(steps);
  const first = resume?.step ?? 0;
  scheduler.setBeginIndex(first, resume?.solver);
  let latent: Tensor = resume ? { shape, data: resume.latent } : initialNoise(shape, request.seed);
  const { firstFrame } = request;
  const held = (t: Tensor): Tensor => (firstFrame ? withFirstFrame(t, firstFrame) : t);
  for (let step = first; step < steps; step++) {
    request.signal?.throwIfAborted();
    const started = performance.now();
    const timestep = scheduler.timesteps[step];
    const velocity = await request.velocity({ step, timestep, latent: held(latent) });
    latent = { shape, data: scheduler.step(velocity, timestep, latent.data).prevSample };
    request.onStep?.({
      step: step + 1,
      latent: latent.data,
      solver: scheduler.state,
      stepMs: performance.now() - started,
    });
  }
  return held(latent);
}

/** `latent` [C, T, H, W] with its first frame replaced by `frame` [C, 1, H, W]: a copy. */
export function withFirstFrame(latent: Tensor, frame: Float32Array): Tensor {
  const [C, T, H, W] = latent.shape;
  if (frame.length !== C * H * W)
    throw new RangeError(`a first frame of ${frame.length} values for a latent of ${C}×${H}×${W} a frame`);
  const data = latent.data.slice();
  for (let c = 0; c < C; c++) data.set(frame.subarray(c * H * W, (c + 1) * H * W), c * T * H * W);
  return { shape: latent.shape, data };
}
