// Latent ↔ token layout of diffusers' Wan transformer: the Conv3d patch embedding flattened to a
// matrix product, tokens in (frame, row, column) order, and the RoPE angles of each token.

import type { Tensor } from '../tensor.ts';
import type { WanConfig } from './config.ts';

export interface TokenGrid {
  frames: number; // latent frames / pt
  rows: number; // latent height / ph
  cols: number; // latent width / pw
  /** S = frames · rows · cols */
  count: number;
}

export function tokenGrid(cfg: WanConfig, latentShape: readonly number[]): TokenGrid {
  const [, t, h, w] = latentShape;
  const [pt, ph, pw] = cfg.patchSize;
  if (t % pt || h % ph || w % pw) {
    throw new Error(`latent [${latentShape.join(',')}] does not divide into patches of (${cfg.patchSize.join(',')})`);
  }
  const grid = { frames: t / pt, rows: h / ph, cols: w / pw };
  return { ...grid, count: grid.frames * grid.rows * grid.cols };
}

/** latent [C, T, H, W] → patches [S, C·pt·ph·pw], each vector in Conv3d weight order (c, kt, kh, kw). */
export function patchify(cfg: WanConfig, latent: Tensor): Tensor {
  const [C, T, H, W] = latent.shape;
  const [pt, ph, pw] = cfg.patchSize;
  const g = tokenGrid(cfg, latent.shape);
  const width = C * pt * ph * pw;
  const out = new Float32Array(g.count * width);
  let s = 0;
  for (let f = 0; f < g.frames; f++)
    for (let i = 0; i < g.rows; i++)
      for (let j = 0; j < g.cols; j++, s++)
        for (let c = 0, k = s * width; c < C; c++)
          for (let a = 0; a < pt; a++)
            for (let b = 0; b < ph; b++)
              for (let e = 0; e < pw; e++, k++) {
                out[k] = latent.data[((c * T + f * pt + a) * H + i * ph + b) * W + j * pw + e];
              }
  return { shape: [g.count, width], data: out };
}

/** proj_out rows [S, pt·ph·pw·C] (diffusers reshapes them as (pt, ph, pw, C)) → latent [C, T, H, W]. */
export function unpatchify(cfg: WanConfig, rows: Float32Array, latentShape: readonly number[]): Tensor {
  const out = new Float32Array(latentShape.reduce((a, b) => a * b, 1));
  eachRowElement(cfg, latentShape, (k, l) => (out[l] = rows[k]));
  return { shape: [...latentShape], data: out };
}

/** latent [C, T, H, W] → rows [S, pt·ph·pw·C] in proj_out's order: the inverse of unpatchify (a training target). */
export function latentToRows(cfg: WanConfig, latent: Tensor): Float32Array {
  const out = new Float32Array(latent.data.length);
  eachRowElement(cfg, latent.shape, (k, l) => (out[k] = latent.data[l]));
  return out;
}

/** Visits every element of proj_out's rows in order: k its index there, l its index in the latent [C, T, H, W]. */
function eachRowElement(cfg: WanConfig, latentShape: readonly number[], visit: (k: number, l: number) => void): void {
  const [C, T, H, W] = latentShape;
  const [pt, ph, pw] = cfg.patchSize;
  const g = tokenGrid(cfg, latentShape);
  let k = 0;
  for (let f = 0; f < g.frames; f++)
    for (let i = 0; i < g.rows; i++)
      for (let j = 0; j < g.cols; j++)
        for (let a = 0; a < pt; a++)
          for (let b = 0; b < ph; b++)
            for (let e = 0; e < pw; e++)
              for (let c = 0; c < C; c++, k++) visit(k, ((c * T + f * pt + a) * H + i * ph + b) * W + j * pw + e);
}

/**
 * RoPE tables of tokens [start, start+count): cos and sin, each [count, headDim/2], one angle per
 * channel pair, the pairs split t/h/w as diffusers splits its tables (angles in float64 as there).
 */
export function ropeTables(
  cfg: WanConfig,
  grid: TokenGrid,
  start: number,
  count: number,
): { cos: Float32Array; sin: Float32Array } {
  const longest = Math.max(grid.frames, grid.rows, grid.cols);
  if (longest > cfg.ropeMaxSeqLen)
    throw new Error(`a token grid of ${longest} positions exceeds rope_max_seq_len ${cfg.ropeMaxSeqLen}`);
  const half = cfg.headDim / 2;
  const axisDim = Math.floor(cfg.headDim / 3); // h and w parts; t takes the rest
  const axisOf: number[] = [];
  const freqOf: number[] = [];
  [cfg.headDim - 2 * axisDim, axisDim, axisDim].forEach((dim, axis) => {
    for (let k = 0; k < dim / 2; k++) {
      axisOf.push(axis);
      freqOf.push(1 / 10000 ** ((2 * k) / dim));
    }
  });
  if (start < 0 || start + count > grid.count)
    throw new Error(`RoPE tables of tokens ${start}…${start + count - 1} of a grid of ${grid.count}`);
  const cos = new Float32Array(count * half);
  const sin = new Float32Array(count * half);
  for (let n = 0; n < count; n++) {
    const s = start + n;
    const pos = [Math.floor(s / (grid.rows * grid.cols)), Math.floor(s / grid.cols) % grid.rows, s % grid.cols];
    for (let p = 0; p < half; p++) {
      const angle = pos[axisOf[p]] * freqOf[p];
      cos[n * half + p] = Math.cos(angle);
      sin[n * half + p] = Math.sin(angle);
    }
  }
  return { cos, sin };
}
