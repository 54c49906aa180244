// diffusers' FlowMatchEulerDiscreteScheduler (schedulers/scheduling_flow_match_euler_discrete.py), as
// the tiny models sample with it: sigmas from 1 down to 1/num_train_timesteps, bent toward noise by
// the shift, then Euler steps along the model's velocity. One difference, kept on purpose: the grid
// here is the unshifted sigmas 1 → 1/1000, shifted once; diffusers ends it at sigma_min, which its
// __init__ has shifted already, and shifts that again (its last sigma at shift 3 is 1/112, ours 3/1002).
import { indexForTimestep, type Schedule, type Scheduler, type SchedulerOutput } from './scheduler.ts';

/** The keys of scheduler_config.json this port reads, camel-cased. */
export interface FlowMatchEulerDiscreteSchedulerConfig {
  numTrainTimesteps: number;
  shift: number;
}

export class FlowMatchEulerDiscreteScheduler implements Scheduler {
  readonly config: FlowMatchEulerDiscreteSchedulerConfig;
  timesteps: number[] = [];
  sigmas: number[] = [];
  numInferenceSteps: number | null = null;
  private stepIndex: number | null = null;
  private beginIndex: number | null = null;

  constructor({ numTrainTimesteps = 1000, shift = 1.0 }: Partial<FlowMatchEulerDiscreteSchedulerConfig> = {}) {
    this.config = { numTrainTimesteps, shift };
  }

  /** Euler carries nothing from one step to the next. */
  get state(): undefined {
    return undefined;
  }

  setTimesteps(numInferenceSteps: number): void {
    const { numTrainTimesteps, shift } = this.config;
    const sigmas: number[] = [];
    for (let i = 0; i < numInferenceSteps; i++) {
      const s = numInferenceSteps === 1 ? 1 : 1 + ((1 / numTrainTimesteps - 1) * i) / (numInferenceSteps - 1);
      sigmas.push((shift * s) / (1 + (shift - 1) * s));
    }
    this.timesteps = sigmas.map((s) => s * numTrainTimesteps);
    this.sigmas = [...sigmas, 0];
    this.numInferenceSteps = numInferenceSteps;
    this.stepIndex = null;
    this.beginIndex = null;
  }

  setBeginIndex(beginIndex: number): void {
    this.beginIndex = beginIndex;
  }

  step(modelOutput: Float32Array, timestep: number, sample: Float32Array): SchedulerOutput {
    if (this.numInferenceSteps === null)
      throw new Error('FlowMatchEulerDiscreteScheduler.step before setTimesteps: set the number of steps first');
    this.stepIndex ??= this.initStepIndex(timestep);
    const sigma = this.sigmas[this.stepIndex];
    const sigmaNext = this.sigmas[this.stepIndex + 1];
    const prevSample = eulerStep(sample, modelOutput, sigma, sigmaNext);
    this.stepIndex += 1;
    return { prevSample };
  }

  private initStepIndex(timestep: number): number {
    if (this.beginIndex !== null) return this.beginIndex;
    const index = indexForTimestep(this.timesteps, timestep);
    if (index === undefined)
      throw new Error(`timestep ${timestep} is none of the schedule's ${this.timesteps.length}: give setBeginIndex`);
    return index;
  }
}

/** x + (σ_next − σ)·v */
export function eulerStep(
  latent: Float32Array,
  velocity: Float32Array,
  sigma: number,
  sigmaNext: number,
): Float32Array {
  const dt = sigmaNext - sigma;
  return latent.map((x, i) => x + dt * velocity[i]);
}

/** The sigmas and timesteps of `steps` steps at `shift`, without a scheduler to step. */
export function flowMatchSchedule(steps: number, shift: number): Schedule {
  const scheduler = new FlowMatchEulerDiscreteScheduler({ shift });
  scheduler.setTimesteps(steps);
  return { sigmas: scheduler.sigmas, timesteps: scheduler.timesteps };
}
