// diffusers' UniPCMultistepScheduler (schedulers/scheduling_unipc_multistep.py) as Wan2.1's folders
// configure it: prediction_type flow_prediction, use_flow_sigmas, predict_x0, solver_type bh2,
// final_sigmas_type zero (core/model/wan-pipeline.ts refuses any other). Each step turns the model's
// velocity into a prediction of the clean latent (x0 = x − σ·v), corrects the current sample with it
// (UniC, from the second step on) and predicts the next one (UniP) from the last solver_order x0
// predictions. The arithmetic runs in float64 on float32 sigmas, as diffusers keeps its sigmas; the
// transformer is given whole timesteps (diffusers casts σ·1000 to int64).
import { defined } from '../defined.ts';
import { indexForTimestep, type Schedule, type Scheduler, type SchedulerOutput } from './scheduler.ts';

/** The keys of scheduler_config.json this port reads, camel-cased. */
export interface UniPCMultistepSchedulerConfig {
  numTrainTimesteps: number;
  /** how many past x0 predictions the predictor uses (Wan: 2) */
  solverOrder: 1 | 2;
  /** the last steps drop to first order (Wan: true) */
  lowerOrderFinal: boolean;
  flowShift: number;
}

/** What a UniPC run carries from step to step: enough to continue it after a reload. */
export interface UniPcState {
  /** model_outputs: the last solver_order x0 predictions, oldest first (null before there were that many) */
  outputs: (Float32Array | null)[];
  /** last_sample: the sample the last predictor started from (the corrector's x) */
  lastSample: Float32Array | null;
  lowerOrderNums: number;
  /** this_order: the order the last predictor used (the corrector's) */
  thisOrder: number;
}

/** λ = log α − log σ with α = 1 − σ (flow sigmas) */
const lambda = (sigma: number) => Math.log(1 - sigma) - Math.log(sigma);

/** numpy's linspace: start + j·step, the last exactly the stop */
function linspace(start: number, stop: number, num: number): number[] {
  const step = (stop - start) / (num - 1);
  return Array.from({ length: num }, (_, j) => (j === num - 1 ? stop : start + j * step));
}

export class UniPCMultistepScheduler implements Scheduler<UniPcState> {
  readonly config: UniPCMultistepSchedulerConfig;
  timesteps: number[] = [];
  sigmas: number[] = [];
  numInferenceSteps: number | null = null;
  // model_outputs, last_sample, lower_order_nums, this_order: each step replaces them and never
  // changes them in place, so the state a checkpoint took stays as it was
  private modelOutputs: (Float32Array | null)[];
  private lastSample: Float32Array | null = null;
  private lowerOrderNums = 0;
  private thisOrder = 0;
  private stepIndex: number | null = null;
  private beginIndex: number | null = null;

  constructor({
    numTrainTimesteps = 1000,
    solverOrder = 2,
    lowerOrderFinal = true,
    flowShift = 1.0,
  }: Partial<UniPCMultistepSchedulerConfig> = {}) {
    this.config = { numTrainTimesteps, solverOrder, lowerOrderFinal, flowShift };
    this.modelOutputs = Array<Float32Array | null>(solverOrder).fill(null);
  }

  get state(): UniPcState {
    const { modelOutputs: outputs, lastSample, lowerOrderNums, thisOrder } = this;
    return { outputs, lastSample, lowerOrderNums, thisOrder };
  }

  /** use_flow_sigmas: σ from shift(1 − 1/1000) down, then 0 (final_sigmas_type zero); timesteps ⌊σ·1000⌋. */
  setTimesteps(numInferenceSteps: number): void {
    const { numTrainTimesteps, flowShift, solverOrder } = this.config;
    const alphas = linspace(1, 1 / numTrainTimesteps, numInferenceSteps + 1);
    const sigmas = alphas
      .map((alpha) => 1 - alpha)
      .map((s) => (flowShift * s) / (1 + (flowShift - 1) * s))
      .reverse()
      .slice(0, -1);
    this.timesteps = sigmas.map((s) => Math.trunc(s * numTrainTimesteps));
    this.sigmas = [...sigmas, 0].map((s) => Math.fround(s));
    this.numInferenceSteps = numInferenceSteps;
    this.modelOutputs = Array<Float32Array | null>(solverOrder).fill(null);
    this.lowerOrderNums = 0;
    this.thisOrder = 0;
    this.lastSample = null;
    this.stepIndex = null;
    this.beginIndex = null;
  }

  /** Past step 0 it needs the state of the run it continues: afresh there it would predict at a lower order. */
  setBeginIndex(beginIndex: number, state?: UniPcState): void {
    if (beginIndex > 0 && !state)
      throw new Error(`resuming UniPC at step ${beginIndex} needs its state from the checkpoint, which has none`);
    this.beginIndex = beginIndex;
    if (!state) return;
    this.modelOutputs = state.outputs;
    this.lastSample = state.lastSample;
    this.lowerOrderNums = state.lowerOrderNums;
    this.thisOrder = state.thisOrder;
  }

  step(modelOutput: Float32Array, timestep: number, sample: Float32Array): SchedulerOutput {
    if (this.numInferenceSteps === null)
      throw new Error('UniPCMultistepScheduler.step before setTimesteps: set the number of steps first');
    this.stepIndex ??= this.initStepIndex(timestep);
    const stepIndex = this.stepIndex;
    const { lastSample } = this;
    const modelOutputConvert = this.convertModelOutput(modelOutput, sample);
    if (stepIndex > 0 && lastSample)
      sample = this.multistepUniCBhUpdate(modelOutputConvert, lastSample, this.thisOrder);

    this.modelOutputs = [...this.modelOutputs.slice(1), modelOutputConvert];
    const thisOrder = this.config.lowerOrderFinal
      ? Math.min(this.config.solverOrder, this.timesteps.length - stepIndex)
      : this.config.solverOrder;
    this.thisOrder = Math.min(thisOrder, this.lowerOrderNums + 1); // warmup for multistep
    this.lastSample = sample;
    const prevSample = this.multistepUniPBhUpdate(sample, this.thisOrder);
    if (this.lowerOrderNums < this.config.solverOrder) this.lowerOrderNums += 1;
    this.stepIndex += 1;
    return { prevSample };
  }

  /** flow_prediction with predict_x0: x0 = x − σ·v */
  private convertModelOutput(modelOutput: Float32Array, sample: Float32Array): Float32Array {
    const sigmaT = this.sigmas[this.index];
    return sample.map((x, i) => x - sigmaT * modelOutput[i]);
  }

  /** multistep_uni_p_bh_update: from σ at the step index to the next σ, with model_outputs (newest last). */
  private multistepUniPBhUpdate(sample: Float32Array, order: number): Float32Array {
    const m0 = defined(this.modelOutputs.at(-1), "the step's x0 prediction");
    const x = sample;
    const [sigmaT, sigmaS0] = [this.sigmas[this.index + 1], this.sigmas[this.index]];
    const alphaT = 1 - sigmaT;
    const h = lambda(sigmaT) - lambda(sigmaS0);
    const hh = -h; // predict_x0
    const hPhi1 = Math.expm1(hh);
    const bH = Math.expm1(hh); // bh2
    let d1: Float32Array | null = null;
    if (order === 2) {
      const m1 = defined(this.modelOutputs.at(-2), "the previous step's x0 prediction");
      const rk = (lambda(this.sigmas[this.index - 1]) - lambda(sigmaS0)) / h;
      d1 = m1.map((v, i) => (v - m0[i]) / rk);
    }
    // for order 2 diffusers takes ρ = 0.5 rather than solving for it
    const rhosP = 0.5;
    const xT_ = (i: number) => (sigmaT / sigmaS0) * x[i] - alphaT * hPhi1 * m0[i];
    return x.map((_, i) => xT_(i) - (d1 ? alphaT * bH * rhosP * d1[i] : 0));
  }

  /** multistep_uni_c_bh_update: the sample at the step index corrected with its own x0 prediction. */
  private multistepUniCBhUpdate(thisModelOutput: Float32Array, lastSample: Float32Array, order: number): Float32Array {
    const m0 = defined(this.modelOutputs.at(-1), "the last step's x0 prediction");
    const x = lastSample;
    const modelT = thisModelOutput;
    const [sigmaT, sigmaS0] = [this.sigmas[this.index], this.sigmas[this.index - 1]];
    const alphaT = 1 - sigmaT;
    const h = lambda(sigmaT) - lambda(sigmaS0);
    const hh = -h; // predict_x0
    const hPhi1 = Math.expm1(hh);
    const bH = Math.expm1(hh); // bh2
    // rhos_c = [ρ_D, ρ_t] solves R·ρ = b, R's rows the powers of r_k = (λ_sk − λ_s0)/h and 1; order 1: ρ_t = 0.5
    let rhoD = 0;
    let rhoT = 0.5;
    let d1: Float32Array | null = null;
    if (order === 2) {
      const m1 = defined(this.modelOutputs.at(-2), 'the x0 prediction two steps back');
      const rk = (lambda(this.sigmas[this.index - 2]) - lambda(sigmaS0)) / h;
      d1 = m1.map((v, i) => (v - m0[i]) / rk);
      const phi1 = hPhi1 / hh - 1;
      const b1 = phi1 / bH;
      const b2 = ((phi1 / hh - 1 / 2) * 2) / bH;
      rhoD = (b1 - b2) / (1 - rk);
      rhoT = b1 - rhoD;
    }
    const xT_ = (i: number) => (sigmaT / sigmaS0) * x[i] - alphaT * hPhi1 * m0[i];
    return modelT.map((v, i) => xT_(i) - alphaT * bH * ((d1 ? rhoD * d1[i] : 0) + rhoT * (v - m0[i])));
  }

  /** _init_step_index: the begin index, else where the timestep is (the last step where it is nowhere). */
  private initStepIndex(timestep: number): number {
    return this.beginIndex ?? indexForTimestep(this.timesteps, timestep) ?? this.timesteps.length - 1;
  }

  private get index(): number {
    return defined(this.stepIndex, 'step_index');
  }
}

/** The sigmas and timesteps of `steps` steps at `flowShift`, without a scheduler to step. */
export function unipcSchedule(steps: number, flowShift: number): Schedule {
  const scheduler = new UniPCMultistepScheduler({ flowShift });
  scheduler.setTimesteps(steps);
  return { sigmas: scheduler.sigmas, timesteps: scheduler.timesteps };
}
