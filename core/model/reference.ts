// diffusers' WanTransformer3DModel.forward in plain TypeScript, cut at the same stage boundaries
// as the ONNX graphs a worker runs (embed → per block: pre-attention, attention, post-attention →
// head), so each graph and the Ulysses split can be checked against it stage by stage.

import type { TensorMap } from '../safetensors.ts';
import type { Tensor } from '../tensor.ts';
import type { BlockRange } from './blocks.ts';
import type { WanConfig } from './config.ts';
import {
  attention,
  applyRope,
  gatedAdd,
  geluTanh,
  layerNorm,
  linear,
  modulate,
  rmsNorm,
  silu,
  timestepFrequencies,
} from './ops.ts';
import { timestepLevels, type Timestep } from './timesteps.ts';
import { patchify, ropeTables, tokenGrid, unpatchify } from './tokens.ts';

export interface WanModel {
  config: WanConfig;
  weights: TensorMap;
  /** the blocks whose weights this copy holds (a pipeline stage's: transformer.ts); all of them without it */
  blocks?: BlockRange;
}

/** A forward's conditioning, its time embeddings one per distinct timestep (timesteps.ts). */
export interface Conditioning {
  temb: Float32Array; // [T, D]
  tproj: Float32Array; // [T, 6, D]: block modulation time_proj(silu(temb))
  context: Float32Array; // [L, D]: projected text
}

function param(m: WanModel, name: string): Float32Array {
  const t = m.weights.get(name);
  if (!t) throw new Error(`weight ${name} is missing`);
  return t.data;
}

const lin = (m: WanModel, name: string, x: Float32Array, inDim: number) =>
  linear(x, param(m, `${name}.weight`), param(m, `${name}.bias`), inDim);

/**
 * A table of `n` rows [n, D] plus each token's level's rows of `perLevel` [T, n, D]: n modulations, each [S, D].
 * diffusers' `(scale_shift_table + temb).chunk(n)` with a timestep per token.
 */
function perTokenModulation(table: Float32Array, perLevel: Float32Array, n: number, levels: Int32Array) {
  const D = table.length / n;
  return Array.from({ length: n }, (_, r) => {
    const rows = new Float32Array(levels.length * D);
    levels.forEach((level, token) => {
      for (let i = 0; i < D; i++) rows[token * D + i] = table[r * D + i] + perLevel[(level * n + r) * D + i];
    });
    return rows;
  });
}

/** The six modulation rows of a block for each token: scale_shift_table + its timestep's projection. */
const blockModulation = (m: WanModel, block: number, tproj: Float32Array, levels: Int32Array): Float32Array[] =>
  perTokenModulation(param(m, `blocks.${block}.scale_shift_table`), tproj, 6, levels);

/** patches [S, C·pt·ph·pw] → tokens [S, D]. */
export function embedPatches(m: WanModel, patches: Float32Array): Float32Array {
  const D = m.config.dim;
  const w = param(m, 'patch_embedding.weight'); // [D, C, pt, ph, pw] read as [D, C·pt·ph·pw]
  return linear(patches, w, param(m, 'patch_embedding.bias'), w.length / D);
}

/** the distinct timesteps [T], text [L, text_dim] → the conditioning every block reads. */
export function embedConditions(m: WanModel, timesteps: Float32Array, text: Float32Array): Conditioning {
  const { dim: D, freqDim, textDim } = m.config;
  const prefix = 'condition_embedder';
  const freq = new Float32Array(timesteps.length * freqDim);
  timesteps.forEach((t, level) => freq.set(timestepFrequencies(t, freqDim), level * freqDim));
  const temb = lin(
    m,
    `${prefix}.time_embedder.linear_2`,
    silu(lin(m, `${prefix}.time_embedder.linear_1`, freq, freqDim)),
    D,
  );
  const tproj = lin(m, `${prefix}.time_proj`, silu(temb), D);
  const context = lin(
    m,
    `${prefix}.text_embedder.linear_2`,
    geluTanh(lin(m, `${prefix}.text_embedder.linear_1`, text, textDim)),
    D,
  );
  return { temb, tproj, context };
}

/** tokens [S, D] → q, k, v [S, D] of all heads: AdaLN, projections, RMSNorm across heads, RoPE. */
export function preAttention(
  m: WanModel,
  block: number,
  x: Float32Array,
  tproj: Float32Array,
  levels: Int32Array,
  cos: Float32Array,
  sin: Float32Array,
) {
  const { dim: D, eps, headDim } = m.config;
  const [shift, scale] = blockModulation(m, block, tproj, levels);
  const a = `blocks.${block}.attn1`;
  const n = modulate(layerNorm(x, D, eps), shift, scale);
  const q = rmsNorm(lin(m, `${a}.to_q`, n, D), D, eps, param(m, `${a}.norm_q.weight`));
  const k = rmsNorm(lin(m, `${a}.to_k`, n, D), D, eps, param(m, `${a}.norm_k.weight`));
  const v = lin(m, `${a}.to_v`, n, D);
  return { q: applyRope(q, D, headDim, cos, sin), k: applyRope(k, D, headDim, cos, sin), v };
}

/** tokens [S, D], self-attention output [S, D] → tokens [S, D]: gated residual, cross-attention, FFN. */
export function postAttention(
  m: WanModel,
  block: number,
  x: Float32Array,
  attn: Float32Array,
  cond: Conditioning,
  levels: Int32Array,
): Float32Array {
  const { dim: D, eps, headDim, ffnDim } = m.config;
  const [, , gate, ffnShift, ffnScale, ffnGate] = blockModulation(m, block, cond.tproj, levels);
  const b = `blocks.${block}`;
  let h = gatedAdd(x, lin(m, `${b}.attn1.to_out.0`, attn, D), gate);

  const n2 = m.config.crossAttnNorm
    ? layerNorm(h, D, eps, param(m, `${b}.norm2.weight`), param(m, `${b}.norm2.bias`))
    : h;
  const q = rmsNorm(lin(m, `${b}.attn2.to_q`, n2, D), D, eps, param(m, `${b}.attn2.norm_q.weight`));
  const k = rmsNorm(lin(m, `${b}.attn2.to_k`, cond.context, D), D, eps, param(m, `${b}.attn2.norm_k.weight`));
  const v = lin(m, `${b}.attn2.to_v`, cond.context, D);
  h = gatedAdd(h, lin(m, `${b}.attn2.to_out.0`, attention(q, k, v, headDim, D), D));

  const n3 = modulate(layerNorm(h, D, eps), ffnShift, ffnScale);
  const ff = lin(m, `${b}.ffn.net.2`, geluTanh(lin(m, `${b}.ffn.net.0.proj`, n3, D)), ffnDim);
  return gatedAdd(h, ff, ffnGate);
}

/** tokens [S, D] → proj_out rows [S, pt·ph·pw·C]; the output modulation has no SiLU on temb. */
export function head(m: WanModel, x: Float32Array, temb: Float32Array, levels: Int32Array): Float32Array {
  const { dim: D, eps } = m.config;
  // temb [T, D] read as [T, 1, D]: added to both of the table's rows
  const perLevel = new Float32Array(2 * temb.length);
  for (let level = 0; level < temb.length / D; level++)
    for (const r of [0, 1]) perLevel.set(temb.subarray(level * D, (level + 1) * D), (2 * level + r) * D);
  const [shift, scale] = perTokenModulation(param(m, 'scale_shift_table'), perLevel, 2, levels);
  return lin(m, 'proj_out', modulate(layerNorm(x, D, eps), shift, scale), D);
}

/** The whole forward pass: latent [C, T, H, W], timestep, text [L, text_dim] → velocity [C, T, H, W]. */
export function referenceForward(m: WanModel, latent: Tensor, timestep: Timestep, text: Float32Array): Tensor {
  const grid = tokenGrid(m.config, latent.shape);
  const { cos, sin } = ropeTables(m.config, grid, 0, grid.count);
  const { values, index } = timestepLevels(timestep, grid.count);
  const cond = embedConditions(m, values, text);
  let x = embedPatches(m, patchify(m.config, latent).data);
  for (let block = 0; block < m.config.numLayers; block++) {
    const { q, k, v } = preAttention(m, block, x, cond.tproj, index, cos, sin);
    x = postAttention(m, block, x, attention(q, k, v, m.config.headDim, m.config.dim), cond, index);
  }
  return unpatchify(m.config, head(m, x, cond.temb, index), latent.shape);
}
