// What a rank's peers can honestly send it, implied by the model's own weights: a finite tensor can
// still be a lie (3e38 overflows the receiver's attention), so each part received is held to the
// largest value the sender's layer could have produced from any input.
//   q, k   RMSNorm across all D columns gives |x_c / rms(x)| ≤ √D, so |q_c| ≤ √D·|w_c|; RoPE rotates
//          the pair (2p, 2p+1), whose length is at most √D·max(|w_2p|, |w_2p+1|), and so is each of it.
//   v      the modulated LayerNorm n = (1 + scale)·LN(x) + shift has ‖n‖ ≤ max|1 + scale|·√D + ‖shift‖
//          (LN without affine has norm at most √D), so |v_c| ≤ ‖W_v row c‖·‖n‖ + |b_c|; scale and
//          shift are the block's scale_shift_table plus this step's timestep projection.
//   o      attention output is a convex combination of v rows: each column within v's bound.
// The weights' part is taken once when the model loads (modelBounds), the modulation's per forward
// (stepLimits), and each exchange judges the parts it receives against them (judgeMatrices).
import { allBlocks, type BlockRange } from '../core/model/blocks.ts';
import type { WanConfig } from '../core/model/config.ts';
import { rowNorm } from '../core/model/held-weights.ts';
import type { WanModel } from '../core/model/reference.ts';
import { QUANTIZED_LEVELS, type DType } from '../core/net/protocol.ts';

/** One block's bounds from its weights alone, per column of D. */
export interface BlockBounds {
  /** |q_c| of any input, after RMSNorm and RoPE */
  q: Float32Array;
  /** |k_c| of any input, after RMSNorm and RoPE */
  k: Float32Array;
  /** ‖attn1.to_v.weight row c‖₂ */
  vRowNorms: Float32Array;
  /** |attn1.to_v.bias c| */
  vBias: Float32Array;
  /** [2, D]: the shift and scale rows of the block's scale_shift_table (the self-attention's modulation) */
  modulation: Float32Array;
}

/**
 * Every block's bounds, as an engine hands them to its rank (plain data: it crosses to the page);
 * null for a block another pipeline stage holds.
 */
export interface ModelBounds {
  dim: number;
  blocks: (BlockBounds | null)[];
}

/** The largest |q|, |k|, |v| a block can send at one forward's timestep, per column of D. */
export interface ColumnLimits {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
}

/**
 * How far past a bound an honest value may land: float32 rounding of the forward, weights stored as
 * float16 on a WebGPU device, float16 on the wire. Orders of magnitude below what a lie needs.
 */
export const ROUNDING_ALLOWANCE = 1e-2;

function weight(m: WanModel, name: string): Float32Array {
  const t = m.weights.get(name);
  if (!t) throw new Error(`weight ${name} is missing: the exchange's bounds are read from it`);
  return t.data;
}

/** √D · the larger |w| of each column's RoPE pair. */
function normedBound(w: Float32Array): Float32Array {
  const root = Math.sqrt(w.length);
  const bound = new Float32Array(w.length);
  for (let c = 0; c < w.length; c += 2) bound[c] = bound[c + 1] = root * Math.max(Math.abs(w[c]), Math.abs(w[c + 1]));
  return bound;
}

/** The bounds the weights of every block the model holds imply; taken once, when the model loads. */
export function modelBounds(m: WanModel): ModelBounds {
  const D = m.config.dim;
  return heldBounds(
    m.config,
    m.blocks ?? allBlocks(m.config),
    (name) => weight(m, name),
    (name) => {
      const w = weight(m, name);
      return Float32Array.from({ length: D }, (_, c) => rowNorm(w.subarray(c * D, (c + 1) * D)));
    },
  );
}

/**
 * The same from weights as a load holds them (core/model/held-weights.ts): `valuesOf` a small weight's values (norms,
 * a bias, a table), `rowNormsOf` the row norms of a block's [D, D] value matrix.
 */
export function heldBounds(
  config: Pick<WanConfig, 'dim' | 'numLayers'>,
  held: BlockRange,
  valuesOf: (name: string) => Float32Array,
  rowNormsOf: (name: string) => Float32Array,
): ModelBounds {
  const D = config.dim;
  const blocks = Array.from({ length: config.numLayers }, (_, b) => {
    if (b < held.from || b >= held.to) return null;
    const a = `blocks.${b}.attn1`;
    const vRowNorms = rowNormsOf(`${a}.to_v.weight`); // of [D, D]
    return {
      q: normedBound(valuesOf(`${a}.norm_q.weight`)),
      k: normedBound(valuesOf(`${a}.norm_k.weight`)),
      vRowNorms,
      vBias: valuesOf(`${a}.to_v.bias`).map(Math.abs),
      modulation: valuesOf(`blocks.${b}.scale_shift_table`).slice(0, 2 * D),
    };
  });
  return { dim: D, blocks };
}

/**
 * Each held block's column limits at the timestep projection `tproj` [6T, D] of this forward: at the largest any of
 * its T timesteps (core/model/timesteps.ts) allows.
 */
export function stepLimits(bounds: ModelBounds, tproj: Float32Array): (ColumnLimits | null)[] {
  const D = bounds.dim;
  return bounds.blocks.map((block) => {
    if (!block) return null;
    const { q, k, vRowNorms, vBias, modulation } = block;
    let normed = 0; // ‖n‖ of any input
    for (let level = 0; level < tproj.length / (6 * D); level++) {
      const at = level * 6 * D;
      let maxScale = 0;
      let shiftSq = 0;
      for (let i = 0; i < D; i++) {
        maxScale = Math.max(maxScale, Math.abs(1 + modulation[D + i] + tproj[at + D + i]));
        shiftSq += (modulation[i] + tproj[at + i]) ** 2;
      }
      normed = Math.max(normed, maxScale * Math.sqrt(D) + Math.sqrt(shiftSq));
    }
    return { q, k, v: vRowNorms.map((r, c) => r * normed + vBias[c]) };
  });
}

/** Why a peer's part is beyond what its layer can produce, or null where it is within. */
export type PartJudge = (part: Float32Array) => string | null;

/** One matrix [rows, width] of a part: what it is, and each column's limit [width]. */
export interface BoundedMatrix {
  name: string;
  limits: Float32Array;
}

/**
 * A judge of parts made of `matrices` one after another, each [rows, its width], sent as `dtype`.
 * `hops`: how many times the values crossed the wire before (attention output: its v did), each
 * adding its transport's error. A quantizing transport rounds each value by half a scale, and a
 * scale is at most the largest limit over the levels.
 */
export function judgeMatrices(matrices: BoundedMatrix[], dtype: DType, hops = 1): PartJudge {
  const levels = dtype === 'i8' || dtype === 'i4' ? QUANTIZED_LEVELS[dtype] : 0;
  // a group of scaled values may span two matrices: its scale is the larger one's
  let largest = 0;
  for (const { limits } of matrices) for (const l of limits) largest = Math.max(largest, l);
  const quantization = levels ? (hops * largest) / (2 * levels) : 0;
  const rounding = (1 + ROUNDING_ALLOWANCE) ** hops;
  const allowed = matrices.map(({ limits }) => limits.map((l) => l * rounding + quantization));
  const widths = matrices.reduce((n, m) => n + m.limits.length, 0);
  return (part) => {
    if (part.length % widths !== 0)
      return `sent ${part.length} values, not whole rows of ${matrices.map((m) => m.name).join(', ')}`;
    const rows = part.length / widths;
    let at = 0;
    for (let m = 0; m < matrices.length; m++) {
      const limit = allowed[m];
      const width = limit.length;
      for (let r = 0; r < rows; r++, at += width)
        for (let c = 0; c < width; c++)
          if (!(Math.abs(part[at + c]) <= limit[c]))
            return (
              `sent ${matrices[m].name} ${part[at + c].toPrecision(3)} (row ${r}, column ${c} of its part), ` +
              `beyond the ${limit[c].toPrecision(3)} its layer can produce`
            );
    }
    return null;
  };
}

/** The largest |value| / limit over a part: how close an honest part comes to its bounds (1: at them). */
export function boundUse(matrices: BoundedMatrix[], part: Float32Array): number {
  const widths = matrices.reduce((n, m) => n + m.limits.length, 0);
  const rows = part.length / widths;
  let worst = 0;
  let at = 0;
  for (const { limits } of matrices)
    for (let r = 0; r < rows; r++, at += limits.length)
      for (let c = 0; c < limits.length; c++) worst = Math.max(worst, Math.abs(part[at + c]) / limits[c]);
  return worst;
}
