// The Wan2.1 transformer and the byte-level text encoder as differentiable functions on a tape,
// for a batch of samples with one token grid. The math is core/model/reference.ts's, step for
// step (reference: embedConditions, preAttention, postAttention, head), with weights under
// diffusers' names so they save to the same safetensors the loaders read.

import { expectedWeightShapes, type WanConfig } from '../core/model/config.ts';
import { timestepFrequencies } from '../core/model/ops.ts';
import { ropeTables, type TokenGrid } from '../core/model/tokens.ts';
import { SeededRandom } from '../core/random.ts';
import type { TensorMap } from '../core/safetensors.ts';
import { constant, parameter, type Tape, type Var } from './tape.ts';
import { defined } from '../core/defined.ts';

export interface TrainableWan {
  config: WanConfig;
  /** transformer weights by diffusers name */
  weights: Map<string, Var>;
  /** text encoder weights: token_embedding.weight [256, text_dim], position_embedding.weight [L, text_dim] */
  text: Map<string, Var>;
  textLength: number;
}

export interface Batch {
  /** x_t patches of every sample, [G·S, C·pt·ph·pw] */
  patches: Float32Array;
  /** per sample: σ · 1000 */
  timesteps: number[];
  /** per sample; "" is the unconditional prompt (all-zero text rows) */
  prompts: string[];
  grid: TokenGrid;
}

/**
 * Fresh weights: fan-in-scaled normals, norms at 1, the output projection and the timestep
 * modulation zero (so every block starts near identity, as DiT trains), tables as Wan's N(0, 1/D).
 */
export function initialWan(config: WanConfig, textLength: number, seed: number): TrainableWan {
  const random = new SeededRandom(seed);
  const weights = new Map<string, Var>();
  for (const [name, shape] of expectedWeightShapes(config)) {
    const n = shape.reduce((a, b) => a * b, 1);
    let data: Float32Array;
    if (name.endsWith('scale_shift_table')) data = random.normals(n, 1 / Math.sqrt(config.dim));
    else if (/norm[_\w]*\.weight$/.test(name)) data = new Float32Array(n).fill(1);
    else if (name.endsWith('.bias') || name.startsWith('proj_out') || name.startsWith('condition_embedder.time_proj'))
      data = new Float32Array(n);
    else data = random.normals(n, 1 / Math.sqrt(n / shape[0]));
    weights.set(name, parameter(data));
  }
  const text = new Map([
    ['token_embedding.weight', parameter(random.normals(256 * config.textDim))],
    ['position_embedding.weight', parameter(random.normals(textLength * config.textDim, 0.3))],
  ]);
  return { config, weights, text, textLength };
}

export function fromWeights(
  config: WanConfig,
  transformer: TensorMap,
  textEncoder: TensorMap,
  textLength: number,
): TrainableWan {
  const vars = (m: TensorMap) => new Map([...m].map(([name, t]) => [name, parameter(t.data.slice())]));
  return { config, weights: vars(transformer), text: vars(textEncoder), textLength };
}

export function toTensorMaps(model: TrainableWan): { transformer: TensorMap; textEncoder: TensorMap } {
  const shapes = expectedWeightShapes(model.config);
  const { textDim } = model.config;
  const textShapes = new Map([
    ['token_embedding.weight', [256, textDim]],
    ['position_embedding.weight', [model.textLength, textDim]],
  ]);
  const maps = (vars: Map<string, Var>, shape: Map<string, number[]>): TensorMap =>
    new Map(
      [...vars].map(([name, v]) => [name, { shape: defined(shape.get(name), `the shape of ${name}`), data: v.data }]),
    );
  return { transformer: maps(model.weights, shapes), textEncoder: maps(model.text, textShapes) };
}

/** Every trainable Var, transformer then text encoder, in a fixed order. */
export const parametersOf = (model: TrainableWan): [string, Var][] => [
  ...model.weights,
  ...[...model.text].map(([n, v]): [string, Var] => [`text_encoder.${n}`, v]),
];

/** One batched forward pass → proj_out rows [G·S, pt·ph·pw·C], as `head` returns them. */
export async function forwardBatch(tape: Tape, model: TrainableWan, batch: Batch): Promise<Var> {
  const { config: cfg } = model;
  const { dim: D, eps, headDim, textDim, freqDim, ffnDim } = cfg;
  const w = (name: string) => {
    const v = model.weights.get(name);
    if (!v) throw new Error(`weight ${name} is missing`);
    return v;
  };
  const lin = (name: string, x: Var, inDim: number) => tape.linear(x, w(`${name}.weight`), w(`${name}.bias`), inDim);
  const S = batch.grid.count;
  const L = model.textLength;
  const G = batch.timesteps.length;

  // text encoder: byte embeddings → layer norm (no affine)
  const bytes = batch.prompts.map((p) => new TextEncoder().encode(p));
  const text = tape.layerNorm(
    tape.embedBytes(
      defined(model.text.get('token_embedding.weight'), 'text encoder weight token_embedding.weight'),
      defined(model.text.get('position_embedding.weight'), 'text encoder weight position_embedding.weight'),
      bytes,
      L,
      textDim,
    ),
    textDim,
    1e-6,
  );

  // conditions: embedConditions
  const freq = new Float32Array(G * freqDim);
  batch.timesteps.forEach((t, g) => freq.set(timestepFrequencies(t, freqDim), g * freqDim));
  const p = 'condition_embedder';
  const temb = await lin(
    `${p}.time_embedder.linear_2`,
    tape.silu(await lin(`${p}.time_embedder.linear_1`, constant(freq), freqDim)),
    D,
  ); // [G, D]
  const tproj = await lin(`${p}.time_proj`, tape.silu(temb), D); // [G, 6D]
  const context = await lin(
    `${p}.text_embedder.linear_2`,
    tape.gelu(await lin(`${p}.text_embedder.linear_1`, text, textDim)),
    D,
  ); // [G·L, D]

  const patchWidth = w('patch_embedding.weight').data.length / D;
  let x = await tape.linear(
    constant(batch.patches),
    w('patch_embedding.weight'),
    w('patch_embedding.bias'),
    patchWidth,
  ); // [G·S, D]
  const { cos, sin } = ropeTables(cfg, batch.grid, 0, S);

  for (let block = 0; block < cfg.numLayers; block++) {
    const b = `blocks.${block}`;
    const mod = tape.addRow(tproj, w(`${b}.scale_shift_table`), 6 * D); // [G, 6D]
    const [shift, scale, gate, ffnShift, ffnScale, ffnGate] = [0, 1, 2, 3, 4, 5].map((r) =>
      tape.sliceCols(mod, 6 * D, r * D, D),
    );
    // preAttention
    const n = tape.modulate(tape.layerNorm(x, D, eps), D, S, shift, scale);
    const q = tape.rope(
      tape.rmsNorm(await lin(`${b}.attn1.to_q`, n, D), D, eps, w(`${b}.attn1.norm_q.weight`)),
      D,
      headDim,
      S,
      cos,
      sin,
    );
    const k = tape.rope(
      tape.rmsNorm(await lin(`${b}.attn1.to_k`, n, D), D, eps, w(`${b}.attn1.norm_k.weight`)),
      D,
      headDim,
      S,
      cos,
      sin,
    );
    const v = await lin(`${b}.attn1.to_v`, n, D);
    const attn = await tape.attention(q, k, v, headDim, D, S, S);
    // postAttention
    let h = tape.gatedAdd(x, await lin(`${b}.attn1.to_out.0`, attn, D), D, S, gate);
    const n2 = cfg.crossAttnNorm ? tape.layerNorm(h, D, eps, w(`${b}.norm2.weight`), w(`${b}.norm2.bias`)) : h;
    const q2 = tape.rmsNorm(await lin(`${b}.attn2.to_q`, n2, D), D, eps, w(`${b}.attn2.norm_q.weight`));
    const k2 = tape.rmsNorm(await lin(`${b}.attn2.to_k`, context, D), D, eps, w(`${b}.attn2.norm_k.weight`));
    const v2 = await lin(`${b}.attn2.to_v`, context, D);
    h = tape.gatedAdd(h, await lin(`${b}.attn2.to_out.0`, await tape.attention(q2, k2, v2, headDim, D, S, L), D), D, S);
    const n3 = tape.modulate(tape.layerNorm(h, D, eps), D, S, ffnShift, ffnScale);
    const ff = await lin(`${b}.ffn.net.2`, tape.gelu(await lin(`${b}.ffn.net.0.proj`, n3, D)), ffnDim);
    x = tape.gatedAdd(h, ff, D, S, ffnGate);
  }

  // head: shift, scale = scale_shift_table + temb (no SiLU)
  const table = w('scale_shift_table');
  const shift = tape.addRow(temb, table, D, 0);
  const scale = tape.addRow(temb, table, D, D);
  return lin('proj_out', tape.modulate(tape.layerNorm(x, D, eps), D, S, shift, scale), D);
}
