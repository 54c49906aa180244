// What the sampler asks of a scheduler, as diffusers' schedulers offer it (SchedulerMixin,
// schedulers/scheduling_utils.py): set_timesteps, then step() once per timestep, the step index kept
// inside. A checkpoint resumes one with set_begin_index and the state it carried at that step.

/** The timesteps the model is given and the sigmas the scheduler steps through. */
export interface Schedule {
  /** steps + 1 values, the last 0 */
  sigmas: number[];
  /** what the transformer is given at each step */
  timesteps: number[];
}

/** diffusers' SchedulerOutput */
export interface SchedulerOutput {
  /** the sample at the next timestep */
  prevSample: Float32Array;
}

/** A diffusers scheduler as the sampler drives it; `State` is what a multistep one carries between steps. */
export interface Scheduler<State = never> extends Schedule {
  setTimesteps(numInferenceSteps: number): void;
  /** set_begin_index, with the state a checkpoint kept after `beginIndex` steps (a multistep scheduler's history) */
  setBeginIndex(beginIndex: number, state?: State): void;
  step(modelOutput: Float32Array, timestep: number, sample: Float32Array): SchedulerOutput;
  /** what the next step needs of the steps before it: a checkpoint keeps it (undefined: nothing) */
  readonly state: State | undefined;
}

/**
 * index_for_timestep: where `timestep` is in `timesteps`, the second place when it is in two (so
 * that a run started midway, image-to-image, does not skip a sigma); undefined where it is nowhere.
 */
export function indexForTimestep(timesteps: number[], timestep: number): number | undefined {
  const indices = timesteps.flatMap((t, i) => (t === timestep ? [i] : []));
  return indices.length > 1 ? indices[1] : indices.at(0);
}
