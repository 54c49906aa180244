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
import { patchify, ropeTables, tokenGrid, unpatchify } from './tokens.ts';

export interface WanModel {
  config: WanConfig;
  weights: TensorMap;
  /** the blocks whose weights this copy holds (a pipeline stage's: transformer.ts); all of them without it */
  blocks?: BlockRange;
}

export interface Conditioning {
  temb: Float32Array; // [D]
  tproj: Float32Array; // [6, D]: block modulation time_proj(silu(temb))
  context: Float32Array; // [L, D]: projected text
}

function param(m: WanModel, name: string): Float32Array {
  const t = m.weights.get(name);
  if (!t) throw new Error(`weight ${name} is missing`);
  return t.data;
}

const lin = (m: WanModel, name: string, x: Float32Array, inDim: number) =>
  linear(x, param(m, `${name}.weight`), param(m, `${name}.bias`), inDim);

/** The six modulation rows of a block: scale_shift_table + timestep projection. */
function blockModulation(m: WanModel, block: number, tproj: Float32Array): Float32Array[] {
  const D = m.config.dim;
  const table = param(m, `blocks.${block}.scale_shift_table`);
  return Array.from({ length: 6 }, (_, r) =>
    Float32Array.from({ length: D }, (_, i) => table[r * D + i] + tproj[r * D + i]),
  );
}

/** patches [S, C·pt·ph·pw] → tokens [S, D]. */
export function embedPatches(m: WanModel, patches: Float32Array): Float32Array {
  const D = m.config.dim;
  const w = param(m, 'patch_embedding.weight'); // [D, C, pt, ph, pw] read as [D, C·pt·ph·pw]
  return linear(patches, w, param(m, 'patch_embedding.bias'), w.length / D);
}

/** timestep, text [L, text_dim] → the conditioning every block reads. */
export function embedConditions(m: WanModel, timestep: number, text: Float32Array): Conditioning {
  const { dim: D, freqDim, textDim } = m.config;
  const prefix = 'condition_embedder';
  const freq = timestepFrequencies(timestep, freqDim);
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
  cos: Float32Array,
  sin: Float32Array,
) {
  const { dim: D, eps, headDim } = m.config;
  const [shift, scale] = blockModulation(m, block, tproj);
  const a = `blocks.${block}.attn1`;
  const n = modulate(layerNorm(x, D, eps), D, shift, scale);
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
): Float32Array {
  const { dim: D, eps, headDim, ffnDim } = m.config;
  const [, , gate, ffnShift, ffnScale, ffnGate] = blockModulation(m, block, cond.tproj);
  const b = `blocks.${block}`;
  let h = gatedAdd(x, lin(m, `${b}.attn1.to_out.0`, attn, D), D, gate);

  const n2 = m.config.crossAttnNorm
    ? layerNorm(h, D, eps, param(m, `${b}.norm2.weight`), param(m, `${b}.norm2.bias`))
    : h;
  const q = rmsNorm(lin(m, `${b}.attn2.to_q`, n2, D), D, eps, param(m, `${b}.attn2.norm_q.weight`));
  const k = rmsNorm(lin(m, `${b}.attn2.to_k`, cond.context, D), D, eps, param(m, `${b}.attn2.norm_k.weight`));
  const v = lin(m, `${b}.attn2.to_v`, cond.context, D);
  h = gatedAdd(h, lin(m, `${b}.attn2.to_out.0`, attention(q, k, v, headDim, D), D), D);

  const n3 = modulate(layerNorm(h, D, eps), D, ffnShift, ffnScale);
  const ff = lin(m, `${b}.ffn.net.2`, geluTanh(lin(m, `${b}.ffn.net.0.proj`, n3, D)), ffnDim);
  return gatedAdd(h, ff, D, ffnGate);
}

/** tokens [S, D] → proj_out rows [S, pt·ph·pw·C]; the output modulation has no SiLU on temb. */
export function head(m: WanModel, x: Float32Array, temb: Float32Array): Float32Array {
  const { dim: D, eps } = m.config;
  const table = param(m, 'scale_shift_table');
  const shift = table.subarray(0, D).map((v, i) => v + temb[i]);
  const scale = table.subarray(D, 2 * D).map((v, i) => v + temb[i]);
  return lin(m, 'proj_out', modulate(layerNorm(x, D, eps), D, shift, scale), D);
}

/** The whole forward pass: latent [C, T, H, W], timestep, text [L, text_dim] → velocity [C, T, H, W]. */
export function referenceForward(m: WanModel, latent: Tensor, timestep: number, text: Float32Array): Tensor {
  const grid = tokenGrid(m.config, latent.shape);
  const { cos, sin } = ropeTables(m.config, grid, 0, grid.count);
  const cond = embedConditions(m, timestep, text);
  let x = embedPatches(m, patchify(m.config, latent).data);
  for (let block = 0; block < m.config.numLayers; block++) {
    const { q, k, v } = preAttention(m, block, x, cond.tproj, cos, sin);
    x = postAttention(m, block, x, attention(q, k, v, m.config.headDim, m.config.dim), cond);
  }
  return unpatchify(m.config, head(m, x, cond.temb), latent.shape);
}
