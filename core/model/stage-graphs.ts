// The ONNX graphs a worker runs for one forward pass, built from config + weights, the sequence
// length symbolic ("S" tokens). They compute exactly what `reference.ts` computes at the same
// stage boundaries:
//   embed            patches [S, C·pt·ph·pw], timesteps [T], text [L, text_dim]
//                    → x [S, D], temb [T, D], tproj [6T, D], context [L, D]
//   block i pre      x, tproj, levels [S], rope cos/sin [S, d/2] → q, k, v [S, D]   (all heads, local tokens)
//   attention        q, k, v [S, h·d] → o [S, h·d]                                  (any number of heads h)
//   block i post     x, o [S, D], tproj, levels, context → x
//   head             x, temb, levels → rows [S, pt·ph·pw·C]
// The T timesteps are the forward's distinct ones (timesteps.ts): each token's modulation is gathered by its level.
// Every graph is fed its weights as inputs (FedGraph.weights names them); the block graphs are one
// pre and one post graph for every block, fed the running block's: a worker keeps the weights
// outside onnxruntime's wasm heap, which holds 4 GB and the 1.3B model is 5.7 GB in fp32, and only
// the running block's are in it. Those weight inputs may be float16 (half the memory; on WebGPU
// where the device has shader-f16), widened to float32 in the graph: the math stays float32; or int8
// (WeightType), the linear layers' matrices as bytes with a scale per output row, dequantized in the graph. The
// embedders are fed so too (not baked in as initializers, which the session would hold as float32
// and fold a widening of): at the 14B's width they are 0.46 B parameters.

import { buildChunkedAttentionGraph } from './attention-graph.ts';
import type { WanConfig } from './config.ts';
import { OnnxGraph } from './onnx-builder.ts';
import type { WeightType } from '../worker-api.ts';
import type { WanModel } from './reference.ts';
import { timestepFrequencyTable } from './ops.ts';
import { quantize, QUANTIZED_LEVELS } from '../net/protocol.ts';

export type StageName = 'embed' | 'pre' | 'attention' | 'post' | 'head';

const S = 'S';

/**
 * A graph fed its weights: its bytes, and the inputs it takes them by. A block graph serves every block: feed block
 * b's `blocks.{b}.{name}` as the input `name`; the embed and head graphs take each weight by its own name.
 */
export interface FedGraph {
  bytes: Uint8Array;
  /**
   * the input `name`, shaped `dims`, stored as `type`: the graph's `weightType`, but for int8 a linear layer's matrix
   * alone is int8 (fed as storedInt8's bytes and scales, the latter as the input scaleInput(name)), the rest (biases,
   * norms, tables: under 0.1 % of a block) float32
   */
  weights: { name: string; dims: number[]; type: WeightType }[];
  weightType: WeightType;
}

/** The input an int8 weight's scales, one per output row, are fed as. */
export const scaleInput = (name: string): string => `${name}.scale`;

/**
 * A weight matrix of `rows` rows as an int8 graph input takes it: each row rounded to 255 levels of its largest |w|
 * (its scale, w ≈ (byte − 128) × scale), the bytes offset by 128 (GPU buffers hold no int8).
 */
export function storedInt8(data: Float32Array, rows: number): { bytes: Uint8Array; scales: Float32Array } {
  const scales = new Float32Array(rows);
  const q = new Int8Array(data.length);
  quantize(data, scales, q, QUANTIZED_LEVELS.i8, data.length / rows);
  const bytes = new Uint8Array(q.buffer);
  // two's complement plus 128 is the sign bit flipped
  for (let i = 0; i < bytes.length; i++) bytes[i] ^= 0x80;
  return { bytes, scales };
}

/** The model's weight a fed graph's input `name` takes, for block `block` where it is a block graph's. */
export const fedWeightKey = (name: string, block: number | null): string =>
  block === null ? name : `blocks.${block}.${name}`;

/**
 * The block a block graph is built from: every block has the same weight names and shapes, so the
 * first the model holds (a pipeline stage holds some blocks only) stands for all.
 */
const templateBlock = (m: WanModel): number => m.blocks?.from ?? 0;

class WanGraph extends OnnxGraph {
  /** the weights the graph takes as inputs, by input name: each one's shape, how it is stored, its value in float32 */
  readonly weightInputs = new Map<string, { dims: number[]; type: WeightType; value: string }>();

  /** fed its weights stored as `weightType`; `perBlock`: a block graph, which reads its template block's alone */
  constructor(
    name: string,
    private readonly m: WanModel,
    private readonly weightType: WeightType,
    private readonly perBlock = false,
  ) {
    super(name);
  }

  get cfg(): WanConfig {
    return this.m.config;
  }

  /** The weight `name` (shaped `dims` where given) as a float32 value; `matrix`: a linear layer's [out, in] weight. */
  param(name: string, dims?: number[], matrix = false): string {
    const t = this.m.weights.get(name);
    if (!t) throw new Error(`weight ${name} is missing`);
    const block = this.perBlock ? fedWeightKey('', templateBlock(this.m)) : '';
    if (!name.startsWith(block)) throw new Error(`a block graph reads only its block's weights, not ${name}`);
    const input = name.slice(block.length);
    let known = this.weightInputs.get(input);
    if (!known) {
      const shape = dims ?? t.shape;
      const type = this.weightType === 'int8' && !matrix ? 'float32' : this.weightType;
      const value =
        type === 'int8'
          ? this.dequantizeRows(this.input(input, shape, 'uint8'), this.input(scaleInput(input), [shape[0]]), shape[0])
          : type === 'float16'
            ? this.widen(this.input(input, shape, 'float16'))
            : this.input(input, shape);
      known = { dims: shape, type, value };
      this.weightInputs.set(input, known);
    }
    return known.value;
  }

  /** This graph's bytes and the weights it is fed. */
  fedGraph(): FedGraph {
    return {
      bytes: this.toBytes(),
      weights: [...this.weightInputs].map(([name, { dims, type }]) => ({ name, dims, type })),
      weightType: this.weightType,
    };
  }

  /** x · Wᵀ + b with PyTorch's [out, in] weight, via Gemm(transB). */
  linear(x: string, name: string, dims?: number[]): string {
    return this.op('Gemm', [x, this.param(`${name}.weight`, dims, true), this.param(`${name}.bias`)], { transB: 1 });
  }

  layerNorm(x: string, weight?: string, bias?: string): string {
    const D = this.cfg.dim;
    const scale = weight ?? this.weight(`ones_${D}`, [D], new Float32Array(D).fill(1));
    const shift = bias ?? this.weight(`zeros_${D}`, [D], new Float32Array(D));
    return this.op('LayerNormalization', [x, scale, shift], { axis: -1, epsilon: this.cfg.eps });
  }

  rmsNorm(x: string, weight: string): string {
    return super.rmsNorm(x, this.param(weight), this.cfg.eps);
  }

  silu(x: string): string {
    return this.op('Mul', [x, this.op('Sigmoid', [x])]);
  }

  /** The six modulation rows of a block for each token, each [S, D]: of the token's level of tproj [6T, D]. */
  modulation(block: number, tproj: string, levels: string): string[] {
    const table = this.param(`blocks.${block}.scale_shift_table`, [6, this.cfg.dim]);
    return this.perToken(
      this.op('Add', [this.op('Reshape', [tproj, this.ints([-1, 6, this.cfg.dim])]), table]),
      6,
      levels,
    );
  }

  /** `rows` [T, n, D] as its n rows, each gathered for every token by its level: n × [S, D]. */
  perToken(rows: string, n: number, levels: string): string[] {
    return this.opMulti('Split', [rows], { axis: 1 }, n).map((row) =>
      this.op('Gather', [this.op('Reshape', [row, this.ints([-1, this.cfg.dim])]), levels], { axis: 0 }),
    );
  }

  modulate(x: string, shift: string, scale: string): string {
    return this.op('Add', [this.op('Mul', [x, this.op('Add', [scale, this.scalar(1)])]), shift]);
  }

  /** diffusers' apply_rotary_emb on [S, D] with cos/sin [S, d/2], all heads alike. */
  rope(x: string, cos: string, sin: string): string {
    const { numHeads, headDim, dim } = this.cfg;
    const pairs = this.op('Reshape', [x, this.ints([0, numHeads, headDim / 2, 2])]);
    const [x1, x2] = this.opMulti('Split', [pairs], { axis: 3 }, 2);
    const c = this.op('Reshape', [cos, this.ints([0, 1, headDim / 2, 1])]);
    const s = this.op('Reshape', [sin, this.ints([0, 1, headDim / 2, 1])]);
    const o1 = this.op('Sub', [this.op('Mul', [x1, c]), this.op('Mul', [x2, s])]);
    const o2 = this.op('Add', [this.op('Mul', [x1, s]), this.op('Mul', [x2, c])]);
    return this.op('Reshape', [this.op('Concat', [o1, o2], { axis: 3 }), this.ints([0, dim])]);
  }

  /** Softmax attention per head over [Sq, h·d] queries and [Sk, h·d] keys/values. */
  attend(q: string, k: string, v: string): string {
    const d = this.cfg.headDim;
    const heads = (x: string, perm: number[]) =>
      this.op('Transpose', [this.op('Reshape', [x, this.ints([0, -1, d])])], { perm });
    const scores = this.op('Mul', [
      this.op('MatMul', [heads(q, [1, 0, 2]), heads(k, [1, 2, 0])]),
      this.scalar(1 / Math.sqrt(d)),
    ]);
    const o = this.op('MatMul', [this.op('Softmax', [scores], { axis: -1 }), heads(v, [1, 0, 2])]);
    return this.op('Reshape', [this.op('Transpose', [o], { perm: [1, 0, 2] }), this.ints([0, -1])]);
  }
}

export function buildEmbedGraph(m: WanModel, weightType: WeightType = 'float32'): FedGraph {
  const g = new WanGraph('embed', m, weightType);
  const { dim: D, freqDim, textDim, inChannels } = m.config;
  const patchWidth = inChannels * m.config.patchSize.reduce((a, b) => a * b, 1);
  const patches = g.input('patches', [S, patchWidth]);
  const timesteps = g.input('timesteps', ['T']);
  const text = g.input('text', ['L', textDim]);

  const args = g.op('Mul', [
    g.op('Reshape', [timesteps, g.ints([-1, 1])]),
    g.weight('time_frequencies', [1, freqDim / 2], timestepFrequencyTable(freqDim)),
  ]);
  const freq = g.op('Concat', [g.op('Cos', [args]), g.op('Sin', [args])], { axis: 1 });
  const c = 'condition_embedder';
  const temb = g.linear(g.silu(g.linear(freq, `${c}.time_embedder.linear_1`)), `${c}.time_embedder.linear_2`);
  const tproj = g.op('Reshape', [g.linear(g.silu(temb), `${c}.time_proj`), g.ints([-1, D])]);
  const context = g.linear(g.geluTanh(g.linear(text, `${c}.text_embedder.linear_1`)), `${c}.text_embedder.linear_2`);
  const x = g.linear(patches, 'patch_embedding', [D, patchWidth]);

  g.output(x, 'x', [S, D]);
  g.output(temb, 'temb', ['T', D]);
  g.output(tproj, 'tproj', ['6T', D]);
  g.output(context, 'context', ['L', D]);
  return g.fedGraph();
}

export function buildPreAttentionGraph(m: WanModel, weightType: WeightType = 'float32'): FedGraph {
  const g = new WanGraph('block_pre', m, weightType, true);
  const block = templateBlock(m);
  const { dim: D, headDim } = m.config;
  const x = g.input('x', [S, D]);
  const tproj = g.input('tproj', ['6T', D]);
  const levels = g.input('levels', [S], 'int32');
  const cos = g.input('cos', [S, headDim / 2]);
  const sin = g.input('sin', [S, headDim / 2]);
  const [shift, scale] = g.modulation(block, tproj, levels);
  const n = g.modulate(g.layerNorm(x), shift, scale);
  const a = `blocks.${block}.attn1`;
  g.output(g.rope(g.rmsNorm(g.linear(n, `${a}.to_q`), `${a}.norm_q.weight`), cos, sin), 'q', [S, D]);
  g.output(g.rope(g.rmsNorm(g.linear(n, `${a}.to_k`), `${a}.norm_k.weight`), cos, sin), 'k', [S, D]);
  g.output(g.linear(n, `${a}.to_v`), 'v', [S, D]);
  return g.fedGraph();
}

/**
 * Weightless: the same graph serves every block and any number of local heads. Queries go a chunk
 * at a time so the [h, S, S] scores never exist whole (3.2 GB at 12 heads and 8192 tokens).
 */
export function buildAttentionGraph(m: WanModel): Uint8Array {
  return buildChunkedAttentionGraph(m.config.headDim);
}

export function buildPostAttentionGraph(m: WanModel, weightType: WeightType = 'float32'): FedGraph {
  const g = new WanGraph('block_post', m, weightType, true);
  const block = templateBlock(m);
  const { dim: D } = m.config;
  const b = `blocks.${block}`;
  const x = g.input('x', [S, D]);
  const o = g.input('o', [S, D]);
  const tproj = g.input('tproj', ['6T', D]);
  const levels = g.input('levels', [S], 'int32');
  const context = g.input('context', ['L', D]);
  const [, , gate, ffnShift, ffnScale, ffnGate] = g.modulation(block, tproj, levels);

  let h = g.op('Add', [x, g.op('Mul', [g.linear(o, `${b}.attn1.to_out.0`), gate])]);
  const n2 = m.config.crossAttnNorm ? g.layerNorm(h, g.param(`${b}.norm2.weight`), g.param(`${b}.norm2.bias`)) : h;
  const q = g.rmsNorm(g.linear(n2, `${b}.attn2.to_q`), `${b}.attn2.norm_q.weight`);
  const k = g.rmsNorm(g.linear(context, `${b}.attn2.to_k`), `${b}.attn2.norm_k.weight`);
  const v = g.linear(context, `${b}.attn2.to_v`);
  h = g.op('Add', [h, g.linear(g.attend(q, k, v), `${b}.attn2.to_out.0`)]);

  const n3 = g.modulate(g.layerNorm(h), ffnShift, ffnScale);
  const ff = g.linear(g.geluTanh(g.linear(n3, `${b}.ffn.net.0.proj`)), `${b}.ffn.net.2`);
  g.output(g.op('Add', [h, g.op('Mul', [ff, ffnGate])]), 'x_out', [S, D]);
  return g.fedGraph();
}

export function buildHeadGraph(m: WanModel, weightType: WeightType = 'float32'): FedGraph {
  const g = new WanGraph('head', m, weightType);
  const { dim: D, outChannels, patchSize } = m.config;
  const x = g.input('x', [S, D]);
  const temb = g.input('temb', ['T', D]);
  const levels = g.input('levels', [S], 'int32');
  // output modulation: scale_shift_table + temb, no SiLU (unlike the blocks)
  const table = g.param('scale_shift_table', [2, D]);
  const perLevel = g.op('Add', [g.op('Reshape', [temb, g.ints([-1, 1, D])]), table]);
  const [shift, scale] = g.perToken(perLevel, 2, levels);
  const rows = g.linear(g.modulate(g.layerNorm(x), shift, scale), 'proj_out');
  g.output(rows, 'rows', [S, outChannels * patchSize.reduce((a, b) => a * b, 1)]);
  return g.fedGraph();
}
