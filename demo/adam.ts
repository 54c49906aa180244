// AdamW with global gradient-norm clipping, plus an exponential moving average of the weights
// (what gets shipped: the average samples better than the last step's weights).

import type { Var } from './tape.ts';

export interface AdamOptions {
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
  clipNorm: number;
}

export const DEFAULT_ADAM: AdamOptions = { beta1: 0.9, beta2: 0.99, eps: 1e-8, weightDecay: 0, clipNorm: 1 };

export class Adam {
  private m: Float32Array[];
  private v: Float32Array[];
  private t = 0;
  readonly ema: Float32Array[];

  /** `lrScale[i]` multiplies the learning rate of parameter i (1 when absent). */
  constructor(
    private readonly params: Var[],
    private readonly options: AdamOptions = DEFAULT_ADAM,
    private readonly lrScale: number[] = [],
  ) {
    this.m = params.map((p) => new Float32Array(p.data.length));
    this.v = params.map((p) => new Float32Array(p.data.length));
    this.ema = params.map((p) => p.data.slice());
  }

  /** One update from the accumulated gradients, which it then clears; returns the gradient norm before clipping. */
  step(lr: number, emaDecay: number): number {
    const { beta1, beta2, eps, weightDecay, clipNorm } = this.options;
    let sq = 0;
    for (const p of this.params) if (p.grad) for (const g of p.grad) sq += g * g;
    const norm = Math.sqrt(sq);
    const clip = norm > clipNorm ? clipNorm / norm : 1;
    this.t++;
    const c1 = 1 - beta1 ** this.t;
    const c2 = 1 - beta2 ** this.t;
    this.params.forEach((p, i) => {
      const m = this.m[i];
      const v = this.v[i];
      const ema = this.ema[i];
      const g = p.grad;
      const rate = lr * (this.lrScale[i] ?? 1);
      for (let k = 0; k < p.data.length; k++) {
        const gk = g ? g[k] * clip : 0;
        m[k] = beta1 * m[k] + (1 - beta1) * gk;
        v[k] = beta2 * v[k] + (1 - beta2) * gk * gk;
        p.data[k] -= rate * (m[k] / c1 / (Math.sqrt(v[k] / c2) + eps) + weightDecay * p.data[k]);
        ema[k] = emaDecay * ema[k] + (1 - emaDecay) * p.data[k];
      }
      p.grad = null;
    });
    return norm;
  }
}
