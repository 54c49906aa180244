// The few dense operations the Wan transformer is made of, on row-major float32 matrices, written
// for clarity: this is the reference the ONNX graphs are checked against. Sums run in float64.

/** x [N, in] · Wᵀ + b, with W [out, in] as PyTorch stores it → [N, out] */
export function linear(x: Float32Array, w: Float32Array, b: Float32Array | null, inDim: number): Float32Array {
  const n = x.length / inDim;
  const outDim = w.length / inDim;
  const y = new Float32Array(n * outDim);
  for (let r = 0; r < n; r++) {
    const xr = r * inDim;
    for (let o = 0; o < outDim; o++) {
      const wo = o * inDim;
      let sum = b ? b[o] : 0;
      for (let i = 0; i < inDim; i++) sum += x[xr + i] * w[wo + i];
      y[r * outDim + o] = sum;
    }
  }
  return y;
}

/** LayerNorm over rows of width `dim`; weight/bias optional (elementwise_affine=False). */
export function layerNorm(
  x: Float32Array,
  dim: number,
  eps: number,
  weight?: Float32Array,
  bias?: Float32Array,
): Float32Array {
  const y = new Float32Array(x.length);
  for (let r = 0; r < x.length; r += dim) {
    let mean = 0;
    for (let i = 0; i < dim; i++) mean += x[r + i];
    mean /= dim;
    let variance = 0;
    for (let i = 0; i < dim; i++) variance += (x[r + i] - mean) ** 2;
    const inv = 1 / Math.sqrt(variance / dim + eps);
    for (let i = 0; i < dim; i++) y[r + i] = (x[r + i] - mean) * inv * (weight ? weight[i] : 1) + (bias ? bias[i] : 0);
  }
  return y;
}

/** RMSNorm over rows of width `dim` with a learned scale. */
export function rmsNorm(x: Float32Array, dim: number, eps: number, weight: Float32Array): Float32Array {
  const y = new Float32Array(x.length);
  for (let r = 0; r < x.length; r += dim) {
    let sq = 0;
    for (let i = 0; i < dim; i++) sq += x[r + i] ** 2;
    const inv = 1 / Math.sqrt(sq / dim + eps);
    for (let i = 0; i < dim; i++) y[r + i] = x[r + i] * inv * weight[i];
  }
  return y;
}

export const silu = (x: Float32Array): Float32Array => x.map((v) => v / (1 + Math.exp(-v)));

/** GELU, tanh approximation ("gelu-approximate" / "gelu_tanh" in diffusers). */
export const geluTanh = (x: Float32Array): Float32Array =>
  x.map((v) => 0.5 * v * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (v + 0.044715 * v ** 3))));

/** x [N, dim] · (1 + scale) + shift, with scale and shift one row of width dim or one per row of x. */
export function modulate(x: Float32Array, shift: Float32Array, scale: Float32Array): Float32Array {
  return x.map((v, k) => v * (1 + scale[k % scale.length]) + shift[k % shift.length]);
}

/** x + y · gate, gate one row of x's width or one per row of x. */
export function gatedAdd(x: Float32Array, y: Float32Array, gate?: Float32Array): Float32Array {
  return x.map((v, k) => v + y[k] * (gate ? gate[k % gate.length] : 1));
}

/**
 * Scaled dot-product attention per head. q [Sq, H·d], k and v [Sk, H·d], heads in contiguous
 * column blocks.
 */
export function attention(
  q: Float32Array,
  k: Float32Array,
  v: Float32Array,
  headDim: number,
  width: number,
): Float32Array {
  const sq = q.length / width;
  const sk = k.length / width;
  const keys = sk;
  const heads = width / headDim;
  const scale = 1 / Math.sqrt(headDim);
  const out = new Float32Array(q.length);
  const scores = new Float64Array(keys);
  for (let h = 0; h < heads; h++) {
    const c = h * headDim;
    for (let i = 0; i < sq; i++) {
      let max = -Infinity;
      for (let j = 0; j < keys; j++) {
        let dot = 0;
        for (let e = 0; e < headDim; e++) dot += q[i * width + c + e] * k[j * width + c + e];
        scores[j] = dot * scale;
        if (scores[j] > max) max = scores[j];
      }
      let total = 0;
      for (let j = 0; j < keys; j++) total += scores[j] = Math.exp(scores[j] - max);
      for (let e = 0; e < headDim; e++) {
        let acc = 0;
        for (let j = 0; j < keys; j++) acc += scores[j] * v[j * width + c + e];
        out[i * width + c + e] = acc / total;
      }
    }
  }
  return out;
}

/** Rotates channel pairs (2p, 2p+1) of every head by the token's angle: diffusers' apply_rotary_emb. */
export function applyRope(
  x: Float32Array,
  width: number,
  headDim: number,
  cos: Float32Array,
  sin: Float32Array,
): Float32Array {
  const half = headDim / 2;
  const y = new Float32Array(x.length);
  for (let s = 0; s < x.length / width; s++)
    for (let c = 0; c < width; c += 2) {
      const p = s * half + (c % headDim) / 2;
      const x1 = x[s * width + c];
      const x2 = x[s * width + c + 1];
      y[s * width + c] = x1 * cos[p] - x2 * sin[p];
      y[s * width + c + 1] = x1 * sin[p] + x2 * cos[p];
    }
  return y;
}

/** Frequencies of diffusers' Timesteps embedding, in float32 as diffusers computes them. */
export function timestepFrequencyTable(dim: number): Float32Array {
  const half = dim / 2;
  return Float32Array.from({ length: half }, (_, i) => Math.exp((-Math.log(10000) * i) / half));
}

/** diffusers' Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0): [cos(t·f), sin(t·f)], t·f in float32. */
export function timestepFrequencies(t: number, dim: number): Float32Array {
  const table = timestepFrequencyTable(dim);
  const arg = table.map((f) => Math.fround(t) * f);
  return Float32Array.from([...arg.map(Math.cos), ...arg.map(Math.sin)]);
}
