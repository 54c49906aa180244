// lightx2v's WanStepDistillScheduler (lightx2v/models/schedulers/wan/step_distill/scheduler.py), as its
// step- and CFG-distilled Wan LoRAs sample: a few fixed points of the 1000-step grid (1000, 750, 500, 250 for
// four steps: infer_steps evenly from 1000, as its scheduler makes them when the config lists none), each
// grid point's sigma x/1000 bent by the shift as flow matching bends it, and an Euler step along the model's
// velocity from each to the next, the last to 0.
import { eulerStep } from './flow-match-euler-discrete-scheduler.ts';
import { indexForTimestep, type Scheduler, type SchedulerOutput } from './scheduler.ts';

export class WanStepDistillScheduler implements Scheduler {
  timesteps: number[] = [];
  sigmas: number[] = [];
  /** the points of the 1000-step grid the steps start from */
  denoisingStepList: number[] = [];
  private stepIndex: number | null = null;
  private beginIndex: number | null = null;

  constructor(readonly config: { shift: number; numTrainTimesteps: number } = { shift: 5, numTrainTimesteps: 1000 }) {}

  get state(): undefined {
    return undefined;
  }

  setTimesteps(numInferenceSteps: number): void {
    const { shift, numTrainTimesteps: T } = this.config;
    const stride = Math.floor(T / numInferenceSteps);
    this.denoisingStepList = Array.from({ length: numInferenceSteps }, (_, i) => T - i * stride);
    // the grid's sigma at point x is x / T (linspace(1, 0, T + 1) read at index T − x), then shifted
    const sigmas = this.denoisingStepList.map((x) => {
      const s = x / T;
      return (shift * s) / (1 + (shift - 1) * s);
    });
    this.timesteps = sigmas.map((s) => s * T);
    this.sigmas = [...sigmas, 0];
    this.stepIndex = null;
    this.beginIndex = null;
  }

  setBeginIndex(beginIndex: number): void {
    this.beginIndex = beginIndex;
  }

  step(modelOutput: Float32Array, timestep: number, sample: Float32Array): SchedulerOutput {
    if (!this.timesteps.length)
      throw new Error('WanStepDistillScheduler.step before setTimesteps: set the number of steps first');
    this.stepIndex ??= this.beginIndex ?? indexForTimestep(this.timesteps, timestep) ?? null;
    if (this.stepIndex === null)
      throw new Error(`timestep ${timestep} is none of the schedule's ${this.timesteps.length}: give setBeginIndex`);
    const prevSample = eulerStep(sample, modelOutput, this.sigmas[this.stepIndex], this.sigmas[this.stepIndex + 1]);
    this.stepIndex += 1;
    return { prevSample };
  }
}
