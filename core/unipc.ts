// UniPCMultistepScheduler as Wan2.1's folders configure it (scheduler/scheduler_config.json:
// prediction_type flow_prediction, use_flow_sigmas, predict_x0, solver_type bh2, solver_order 2,
// lower_order_final, final_sigmas_type zero), ported from diffusers' scheduling_unipc_multistep.py.
// Each step turns the model's velocity into a prediction of the clean latent (x0 = x − σ·v), corrects
// the current sample with it (UniC, from the second step on) and predicts the next one (UniP) from
// the last two x0 predictions. The arithmetic runs in float64 on float32 sigmas, as diffusers keeps
// its sigmas; the transformer is given whole timesteps (diffusers casts σ·1000 to int64).

import type { Schedule } from './scheduler.ts';

const TRAIN_TIMESTEPS = 1000;

export interface UniPcOptions {
  /** solver_order: how many past x0 predictions the predictor uses (Wan: 2) */
  order: 1 | 2;
  /** lower_order_final: the last steps drop to first order (Wan: true) */
  lowerOrderFinal: boolean;
}

/** What a UniPC run carries from step to step: enough to continue it after a reload. */
export interface UniPcState {
  /** the last `order` x0 predictions, oldest first (null before there were that many) */
  outputs: (Float32Array | null)[];
  /** the sample the last predictor started from (the corrector's x) */
  lastSample: Float32Array | null;
  lowerOrderNums: number;
  /** the order the last predictor used (the corrector's) */
  thisOrder: number;
}

/** set_timesteps with use_flow_sigmas: σ from shift(0.999) down, then 0; timesteps ⌊σ·1000⌋. */
export function unipcSchedule(steps: number, flowShift: number): Schedule {
  // numpy's linspace(1, 1/1000, steps + 1): start + j·step, the last exactly the stop
  const step = (1 / TRAIN_TIMESTEPS - 1) / steps;
  const raw = Array.from({ length: steps + 1 }, (_, j) => 1 - (j === steps ? 1 / TRAIN_TIMESTEPS : 1 + j * step));
  const shifted = raw
    .map((s) => (flowShift * s) / (1 + (flowShift - 1) * s))
    .reverse()
    .slice(0, steps);
  return { sigmas: [...shifted.map(Math.fround), 0], timesteps: shifted.map((s) => Math.trunc(s * TRAIN_TIMESTEPS)) };
}

export function initialUniPcState(order: number): UniPcState {
  return { outputs: Array(order).fill(null), lastSample: null, lowerOrderNums: 0, thisOrder: 0 };
}

/** λ = log α − log σ with α = 1 − σ (flow sigmas) */
const lambda = (sigma: number) => Math.log(1 - sigma) - Math.log(sigma);

/**
 * One UniPC step at `index` of `schedule` (its sigmas): the model's velocity for `sample`, the
 * state after the previous step → the sample after this one, and the state after it.
 */
export function unipcStep(
  schedule: Schedule,
  options: UniPcOptions,
  index: number,
  velocity: Float32Array,
  sample: Float32Array,
  state: UniPcState,
): { sample: Float32Array; state: UniPcState } {
  const { sigmas } = schedule;
  const steps = sigmas.length - 1;
  const x0 = sample.map((x, i) => x - sigmas[index] * velocity[i]);

  let corrected = sample;
  if (index > 0 && state.lastSample) corrected = correct(sigmas, index, x0, state);

  const outputs = [...state.outputs.slice(1), x0];
  const finalOrder = options.lowerOrderFinal ? Math.min(options.order, steps - index) : options.order;
  const thisOrder = Math.min(finalOrder, state.lowerOrderNums + 1);
  const next = predict(sigmas, index, corrected, outputs, thisOrder);
  return {
    sample: next,
    state: {
      outputs,
      lastSample: corrected,
      lowerOrderNums: Math.min(state.lowerOrderNums + 1, options.order),
      thisOrder,
    },
  };
}

/** multistep_uni_p_bh_update: from σ_index to σ_index+1 with x0 predictions `outputs` (newest last). */
function predict(
  sigmas: number[],
  index: number,
  x: Float32Array,
  outputs: (Float32Array | null)[],
  order: number,
): Float32Array {
  const [sigmaT, sigmaS0] = [sigmas[index + 1], sigmas[index]];
  const alphaT = 1 - sigmaT;
  const h = lambda(sigmaT) - lambda(sigmaS0);
  const hPhi1 = Math.expm1(-h); // predict_x0: hh = −h
  const bH = Math.expm1(-h); // bh2
  const m0 = outputs.at(-1)!;
  let d1: Float32Array | null = null;
  if (order === 2) {
    const m1 = outputs.at(-2)!;
    const rk = (lambda(sigmas[index - 1]) - lambda(sigmaS0)) / h;
    d1 = m1.map((v, i) => (v - m0[i]) / rk);
  }
  // for order 2 diffusers takes ρ = 0.5 rather than solving for it
  return x.map((v, i) => (sigmaT / sigmaS0) * v - alphaT * hPhi1 * m0[i] - (d1 ? alphaT * bH * 0.5 * d1[i] : 0));
}

/** multistep_uni_c_bh_update: the sample at σ_index corrected with its own x0 prediction `modelT`. */
function correct(sigmas: number[], index: number, modelT: Float32Array, state: UniPcState): Float32Array {
  const order = state.thisOrder;
  const [sigmaT, sigmaS0] = [sigmas[index], sigmas[index - 1]];
  const alphaT = 1 - sigmaT;
  const h = lambda(sigmaT) - lambda(sigmaS0);
  const hh = -h;
  const hPhi1 = Math.expm1(hh);
  const bH = Math.expm1(hh);
  const m0 = state.outputs.at(-1)!;
  const x = state.lastSample!;
  // ρ solves R·ρ = b, R's rows the powers of r_k = (λ_sk − λ_s0)/h (and 1); for order 1, ρ = 0.5
  let rhoD = 0;
  let rhoT = 0.5;
  let d1: Float32Array | null = null;
  if (order === 2) {
    const rk = (lambda(sigmas[index - 2]) - lambda(sigmaS0)) / h;
    d1 = state.outputs.at(-2)!.map((v, i) => (v - m0[i]) / rk);
    const phi1 = hPhi1 / hh - 1;
    const b1 = phi1 / bH;
    const b2 = ((phi1 / hh - 1 / 2) * 2) / bH;
    rhoD = (b1 - b2) / (1 - rk);
    rhoT = b1 - rhoD;
  }
  const x_ = (i: number) => (sigmaT / sigmaS0) * x[i] - alphaT * hPhi1 * m0[i];
  return modelT.map((v, i) => x_(i) - alphaT * bH * ((d1 ? rhoD * d1[i] : 0) + rhoT * (v - m0[i])));
}
