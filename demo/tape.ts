// A small reverse-mode autograd over float32 buffers, with exactly the operations the Wan
// transformer is made of (see core/model/ops.ts for the forward math it mirrors). Operations
// record their backward step on a tape; `backward` replays it in reverse. Batched data is rows:
// a batch of G samples of R rows each is [G·R, width], and per-sample vectors (modulation,
// gates) are [G, width].

import type { Gemm } from './gemm.ts';

export class Var {
  grad: Float32Array | null = null;
  constructor(
    readonly data: Float32Array,
    readonly needsGrad: boolean,
  ) {}

  /** The gradient buffer, created on first use. */
  get g(): Float32Array {
    return (this.grad ??= new Float32Array(this.data.length));
  }
}

export const parameter = (data: Float32Array) => new Var(data, true);
export const constant = (data: Float32Array) => new Var(data, false);

type Backward = () => void | Promise<void>;

const GELU_C = Math.sqrt(2 / Math.PI);

export class Tape {
  private steps: Backward[] = [];

  constructor(private readonly gemm: Gemm) {}

  private result(
    data: Float32Array,
    inputs: (Var | null | undefined)[],
    backward: (dy: Float32Array) => void | Promise<void>,
  ): Var {
    const y = new Var(
      data,
      inputs.some((v) => v?.needsGrad),
    );
    if (y.needsGrad) this.steps.push(() => (y.grad ? backward(y.grad) : undefined));
    return y;
  }

  async backward(loss: Var): Promise<void> {
    loss.g.fill(1);
    for (let i = this.steps.length - 1; i >= 0; i--) await this.steps[i]();
    this.steps = [];
  }

  /** x [N, in] · Wᵀ + b, W [out, in] */
  async linear(x: Var, w: Var, b: Var | null, inDim: number): Promise<Var> {
    const y = await this.gemm.xwT(x.data, w.data, inDim);
    const outDim = w.data.length / inDim;
    if (b) for (let o = 0; o < y.length; o += outDim) for (let i = 0; i < outDim; i++) y[o + i] += b.data[i];
    return this.result(y, [x, w, b], async (dy) => {
      if (x.needsGrad) addInto(x.g, await this.gemm.xw(dy, w.data, outDim));
      if (w.needsGrad) addInto(w.g, await this.gemm.xTy(dy, x.data, dy.length / outDim));
      if (b?.needsGrad) {
        const gb = b.g;
        for (let o = 0; o < dy.length; o += outDim) for (let i = 0; i < outDim; i++) gb[i] += dy[o + i];
      }
    });
  }

  /** LayerNorm over rows of width dim, optional affine weight and bias. */
  layerNorm(x: Var, dim: number, eps: number, w?: Var, b?: Var): Var {
    const rows = x.data.length / dim;
    const xhat = new Float32Array(x.data.length);
    const inv = new Float64Array(rows);
    const y = new Float32Array(x.data.length);
    for (let r = 0; r < rows; r++) {
      const o = r * dim;
      let mean = 0;
      for (let i = 0; i < dim; i++) mean += x.data[o + i];
      mean /= dim;
      let variance = 0;
      for (let i = 0; i < dim; i++) variance += (x.data[o + i] - mean) ** 2;
      inv[r] = 1 / Math.sqrt(variance / dim + eps);
      for (let i = 0; i < dim; i++) {
        xhat[o + i] = (x.data[o + i] - mean) * inv[r];
        y[o + i] = xhat[o + i] * (w ? w.data[i] : 1) + (b ? b.data[i] : 0);
      }
    }
    return this.result(y, [x, w, b], (dy) => {
      const gw = w?.needsGrad ? w.g : null;
      const gb = b?.needsGrad ? b.g : null;
      for (let o = 0; o < dy.length; o += dim)
        for (let i = 0; i < dim; i++) {
          if (gw) gw[i] += dy[o + i] * xhat[o + i];
          if (gb) gb[i] += dy[o + i];
        }
      if (!x.needsGrad) return;
      const gx = x.g;
      for (let r = 0; r < rows; r++) {
        const o = r * dim;
        let mean = 0;
        let meanDot = 0;
        for (let i = 0; i < dim; i++) {
          const d = dy[o + i] * (w ? w.data[i] : 1);
          mean += d;
          meanDot += d * xhat[o + i];
        }
        mean /= dim;
        meanDot /= dim;
        for (let i = 0; i < dim; i++)
          gx[o + i] += inv[r] * (dy[o + i] * (w ? w.data[i] : 1) - mean - xhat[o + i] * meanDot);
      }
    });
  }

  /** RMSNorm over rows of width dim with a learned scale. */
  rmsNorm(x: Var, dim: number, eps: number, w: Var): Var {
    const rows = x.data.length / dim;
    const inv = new Float64Array(rows);
    const y = new Float32Array(x.data.length);
    for (let r = 0; r < rows; r++) {
      const o = r * dim;
      let sq = 0;
      for (let i = 0; i < dim; i++) sq += x.data[o + i] ** 2;
      inv[r] = 1 / Math.sqrt(sq / dim + eps);
      for (let i = 0; i < dim; i++) y[o + i] = x.data[o + i] * inv[r] * w.data[i];
    }
    return this.result(y, [x, w], (dy) => {
      const gw = w.needsGrad ? w.g : null;
      const gx = x.needsGrad ? x.g : null;
      for (let r = 0; r < rows; r++) {
        const o = r * dim;
        if (gw) for (let i = 0; i < dim; i++) gw[i] += dy[o + i] * x.data[o + i] * inv[r];
        if (!gx) continue;
        let dot = 0;
        for (let i = 0; i < dim; i++) dot += dy[o + i] * w.data[i] * x.data[o + i];
        const c = (inv[r] ** 3 * dot) / dim;
        for (let i = 0; i < dim; i++) gx[o + i] += inv[r] * dy[o + i] * w.data[i] - c * x.data[o + i];
      }
    });
  }

  /** x · (1 + scale[g]) + shift[g] for the R rows of each sample g; shift, scale [G, dim]. */
  modulate(x: Var, dim: number, rowsPerSample: number, shift: Var, scale: Var): Var {
    const rows = x.data.length / dim;
    const y = new Float32Array(x.data.length);
    for (let r = 0; r < rows; r++) {
      const m = Math.floor(r / rowsPerSample) * dim;
      for (let i = 0, k = r * dim; i < dim; i++, k++) y[k] = x.data[k] * (1 + scale.data[m + i]) + shift.data[m + i];
    }
    return this.result(y, [x, shift, scale], (dy) => {
      const gx = x.needsGrad ? x.g : null;
      const gscale = scale.needsGrad ? scale.g : null;
      const gshift = shift.needsGrad ? shift.g : null;
      for (let r = 0; r < rows; r++) {
        const m = Math.floor(r / rowsPerSample) * dim;
        for (let i = 0, k = r * dim; i < dim; i++, k++) {
          if (gx) gx[k] += dy[k] * (1 + scale.data[m + i]);
          if (gscale) gscale[m + i] += dy[k] * x.data[k];
          if (gshift) gshift[m + i] += dy[k];
        }
      }
    });
  }

  /** x + y · gate[g] (gate [G, dim]), or x + y without a gate. */
  gatedAdd(x: Var, y: Var, dim: number, rowsPerSample: number, gate?: Var): Var {
    const rows = x.data.length / dim;
    const out = new Float32Array(x.data.length);
    for (let r = 0; r < rows; r++) {
      const m = Math.floor(r / rowsPerSample) * dim;
      for (let i = 0, k = r * dim; i < dim; i++, k++) out[k] = x.data[k] + y.data[k] * (gate ? gate.data[m + i] : 1);
    }
    return this.result(out, [x, y, gate], (d) => {
      if (x.needsGrad) addInto(x.g, d);
      const gy = y.needsGrad ? y.g : null;
      const gg = gate?.needsGrad ? gate.g : null;
      for (let r = 0; r < rows; r++) {
        const m = Math.floor(r / rowsPerSample) * dim;
        for (let i = 0, k = r * dim; i < dim; i++, k++) {
          if (gy) gy[k] += d[k] * (gate ? gate.data[m + i] : 1);
          if (gg) gg[m + i] += d[k] * y.data[k];
        }
      }
    });
  }

  silu(x: Var): Var {
    const n = x.data.length;
    const sig = new Float32Array(n);
    const y = new Float32Array(n);
    for (let k = 0; k < n; k++) {
      sig[k] = 1 / (1 + Math.exp(-x.data[k]));
      y[k] = x.data[k] * sig[k];
    }
    return this.result(y, [x], (dy) => {
      const gx = x.g;
      for (let k = 0; k < n; k++) gx[k] += dy[k] * sig[k] * (1 + x.data[k] * (1 - sig[k]));
    });
  }

  /** GELU, tanh approximation. */
  gelu(x: Var): Var {
    const n = x.data.length;
    const th = new Float32Array(n);
    const y = new Float32Array(n);
    for (let k = 0; k < n; k++) {
      const v = x.data[k];
      th[k] = Math.tanh(GELU_C * (v + 0.044715 * v * v * v));
      y[k] = 0.5 * v * (1 + th[k]);
    }
    return this.result(y, [x], (dy) => {
      const gx = x.g;
      for (let k = 0; k < n; k++) {
        const v = x.data[k];
        const t = th[k];
        gx[k] += dy[k] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * GELU_C * (1 + 3 * 0.044715 * v * v));
      }
    });
  }

  /** x [G, n] + v[offset … offset+n) on every row. */
  addRow(x: Var, v: Var, n: number, offset = 0): Var {
    const y = new Float32Array(x.data.length);
    for (let k = 0; k < y.length; k++) y[k] = x.data[k] + v.data[offset + (k % n)];
    return this.result(y, [x, v], (dy) => {
      if (x.needsGrad) addInto(x.g, dy);
      if (v.needsGrad) for (let k = 0; k < dy.length; k++) v.g[offset + (k % n)] += dy[k];
    });
  }

  /** Columns [start, start+count) of x [rows, width]. */
  sliceCols(x: Var, width: number, start: number, count: number): Var {
    const rows = x.data.length / width;
    const y = new Float32Array(rows * count);
    for (let r = 0; r < rows; r++) y.set(x.data.subarray(r * width + start, r * width + start + count), r * count);
    return this.result(y, [x], (dy) => {
      const gx = x.g;
      for (let r = 0; r < rows; r++) for (let c = 0; c < count; c++) gx[r * width + start + c] += dy[r * count + c];
    });
  }

  /** Rotates channel pairs of every head; cos, sin [R, headDim/2] for the R rows of one sample. */
  rope(x: Var, width: number, headDim: number, rowsPerSample: number, cos: Float32Array, sin: Float32Array): Var {
    const half = headDim / 2;
    const rows = x.data.length / width;
    const angle = (r: number, c: number) => (r % rowsPerSample) * half + (c % headDim) / 2;
    const y = new Float32Array(x.data.length);
    for (let r = 0; r < rows; r++)
      for (let c = 0; c < width; c += 2) {
        const p = angle(r, c);
        const x1 = x.data[r * width + c];
        const x2 = x.data[r * width + c + 1];
        y[r * width + c] = x1 * cos[p] - x2 * sin[p];
        y[r * width + c + 1] = x1 * sin[p] + x2 * cos[p];
      }
    return this.result(y, [x], (dy) => {
      const gx = x.g;
      for (let r = 0; r < rows; r++)
        for (let c = 0; c < width; c += 2) {
          const p = angle(r, c);
          const d1 = dy[r * width + c];
          const d2 = dy[r * width + c + 1];
          gx[r * width + c] += d1 * cos[p] + d2 * sin[p];
          gx[r * width + c + 1] += -d1 * sin[p] + d2 * cos[p];
        }
    });
  }

  /**
   * Scaled dot-product attention per sample and head: q [G·sq, H·d], k and v [G·sk, H·d], heads in
   * contiguous column blocks; sample g's queries see only sample g's keys.
   */
  async attention(q: Var, k: Var, v: Var, headDim: number, width: number, sq: number, sk: number): Promise<Var> {
    const kernels = this.gemm.attention;
    if (kernels) {
      const samples = q.data.length / (sq * width);
      const { o, probs } = await kernels.forward(q.data, k.data, v.data, samples, headDim);
      return this.result(o, [q, k, v], async (dO) => {
        const { dq, dk, dv } = await kernels.backward(q.data, k.data, v.data, probs, dO, samples, headDim);
        if (q.needsGrad) addInto(q.g, dq);
        if (k.needsGrad) addInto(k.g, dk);
        if (v.needsGrad) addInto(v.g, dv);
      });
    }
    const samples = q.data.length / (sq * width);
    const heads = width / headDim;
    const scale = 1 / Math.sqrt(headDim);
    const probs = new Float32Array(samples * heads * sq * sk); // [G, H, sq, sk]
    const out = new Float32Array(q.data.length);
    const scores = new Float64Array(sk);
    for (let g = 0; g < samples; g++)
      for (let h = 0; h < heads; h++) {
        const c = h * headDim;
        for (let i = 0; i < sq; i++) {
          const qi = (g * sq + i) * width + c;
          let max = -Infinity;
          for (let j = 0; j < sk; j++) {
            const kj = (g * sk + j) * width + c;
            let dot = 0;
            for (let e = 0; e < headDim; e++) dot += q.data[qi + e] * k.data[kj + e];
            scores[j] = dot * scale;
            if (scores[j] > max) max = scores[j];
          }
          let total = 0;
          for (let j = 0; j < sk; j++) total += scores[j] = Math.exp(scores[j] - max);
          const p = ((g * heads + h) * sq + i) * sk;
          for (let j = 0; j < sk; j++) probs[p + j] = scores[j] / total;
          for (let e = 0; e < headDim; e++) {
            let acc = 0;
            for (let j = 0; j < sk; j++) acc += scores[j] * v.data[(g * sk + j) * width + c + e];
            out[qi + e] = acc / total;
          }
        }
      }
    return this.result(out, [q, k, v], (dout) => {
      const gq = q.needsGrad ? q.g : null;
      const gk = k.needsGrad ? k.g : null;
      const gv = v.needsGrad ? v.g : null;
      const ds = new Float64Array(sk);
      for (let g = 0; g < samples; g++)
        for (let h = 0; h < heads; h++) {
          const c = h * headDim;
          for (let i = 0; i < sq; i++) {
            const qi = (g * sq + i) * width + c;
            const p = ((g * heads + h) * sq + i) * sk;
            // dP_ij = dO_i · V_j; dS_ij = P_ij (dP_ij − Σ_j P_ij dP_ij)
            let rowDot = 0;
            for (let j = 0; j < sk; j++) {
              const vj = (g * sk + j) * width + c;
              let dot = 0;
              for (let e = 0; e < headDim; e++) dot += dout[qi + e] * v.data[vj + e];
              ds[j] = dot;
              rowDot += probs[p + j] * dot;
            }
            for (let j = 0; j < sk; j++) {
              const pj = probs[p + j];
              const kj = (g * sk + j) * width + c;
              const s = pj * (ds[j] - rowDot) * scale;
              for (let e = 0; e < headDim; e++) {
                if (gv) gv[kj + e] += pj * dout[qi + e];
                if (gq) gq[qi + e] += s * k.data[kj + e];
                if (gk) gk[kj + e] += s * q.data[qi + e];
              }
            }
          }
        }
    });
  }

  /**
   * The byte-level text encoder: rows i < length of each prompt are token[byte] + position[i],
   * later rows zero; the layer norm that follows leaves zero rows zero. → [G·L, dim]
   */
  embedBytes(token: Var, position: Var, prompts: Uint8Array[], maxLength: number, dim: number): Var {
    const y = new Float32Array(prompts.length * maxLength * dim);
    prompts.forEach((bytes, g) =>
      bytes.subarray(0, maxLength).forEach((b, i) => {
        for (let e = 0; e < dim; e++)
          y[(g * maxLength + i) * dim + e] = token.data[b * dim + e] + position.data[i * dim + e];
      }),
    );
    return this.result(y, [token, position], (dy) => {
      prompts.forEach((bytes, g) =>
        bytes.subarray(0, maxLength).forEach((b, i) => {
          for (let e = 0; e < dim; e++) {
            const d = dy[(g * maxLength + i) * dim + e];
            if (token.needsGrad) token.g[b * dim + e] += d;
            if (position.needsGrad) position.g[i * dim + e] += d;
          }
        }),
      );
    });
  }

  /** mean((x − target)²) → a one-element Var */
  meanSquaredError(x: Var, target: Float32Array): Var {
    let sum = 0;
    for (let k = 0; k < target.length; k++) sum += (x.data[k] - target[k]) ** 2;
    return this.result(Float32Array.of(sum / target.length), [x], (dy) => {
      const c = (2 * dy[0]) / target.length;
      for (let k = 0; k < target.length; k++) x.g[k] += c * (x.data[k] - target[k]);
    });
  }
}

function addInto(into: Float32Array, from: Float32Array): void {
  for (let i = 0; i < into.length; i++) into[i] += from[i];
}
