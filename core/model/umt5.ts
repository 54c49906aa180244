// Wan2.1's text encoder: the encoder of umT5-XXL (transformers' UMT5EncoderModel, modeling_umt5.py)
// as the published folder holds it in text_encoder/ — config.json, model.safetensors.index.json and
// shards whose tensors are named as transformers saves them:
//   shared.weight                                           [vocab, d_model]  token embedding
//   encoder.block.{i}.layer.0.layer_norm.weight             [d_model]         before self-attention
//   encoder.block.{i}.layer.0.SelfAttention.{q,k,v}.weight  [H·d_kv, d_model]
//   encoder.block.{i}.layer.0.SelfAttention.o.weight        [d_model, H·d_kv]
//   encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight  [buckets, H] (every layer its own)
//   encoder.block.{i}.layer.1.layer_norm.weight             [d_model]         before the FFN
//   encoder.block.{i}.layer.1.DenseReluDense.wi_{0,1}.weight [d_ff, d_model]
//   encoder.block.{i}.layer.1.DenseReluDense.wo.weight      [d_model, d_ff]
//   encoder.final_layer_norm.weight                         [d_model]
// What sets umT5 apart from the transformer's blocks: RMS norms without mean or bias, attention
// without the 1/√d scaling, a learned bias per head on the bucketed relative position (key − query;
// both directions, log-spaced buckets past half of them), and a gated FFN gelu_new(wi_0·x)·(wi_1·x).
// This file holds the layout, the buckets and a plain TypeScript reference of one layer, written
// from modeling_umt5.py: the ONNX graphs (umt5-graphs.ts) are checked against it.

import { defined } from '../defined.ts';
import { readTensor, type ByteRanges, type TensorEntry } from '../safetensors.ts';
import { openCheckpoint } from './checkpoint.ts';
import { checkShapes, ModelConfigError } from './config.ts';
import { readJson, type ModelFiles } from './files.ts';
import { geluTanh, linear, rmsNorm } from './ops.ts';

export const TEXT_ENCODER_CONFIG = 'text_encoder/config.json';
/** the checkpoint's name in text_encoder/: model.safetensors or its shards and index */
export const TEXT_ENCODER_WEIGHTS_NAME = 'model';
export const TOKEN_EMBEDDING = 'shared.weight';
export const FINAL_NORM = 'encoder.final_layer_norm.weight';

export interface Umt5Config {
  dModel: number;
  dKv: number;
  numHeads: number;
  dFf: number;
  numLayers: number;
  numBuckets: number;
  maxDistance: number;
  vocabSize: number;
  eps: number;
}

/** transformers' config of a umT5 encoder (as Wan2.1's text_encoder/config.json is) */
export function isUmt5Config(json: unknown): boolean {
  const c = (json ?? {}) as Record<string, unknown>;
  return c.model_type === 'umt5' || (Array.isArray(c.architectures) && c.architectures.includes('UMT5EncoderModel'));
}

export function parseUmt5Config(json: unknown, source: string): Umt5Config {
  const fail = (what: string) => new ModelConfigError(`${source}: ${what}`);
  if (typeof json !== 'object' || json === null) throw fail('config is not a JSON object');
  const c = json as Record<string, unknown>;
  if (!isUmt5Config(c)) {
    throw fail(
      `model_type is ${JSON.stringify(c.model_type)}; ` +
        'expected "umt5" (UMT5EncoderModel, as Wan2.1 publishes its text encoder)',
    );
  }
  if ((c.feed_forward_proj ?? 'gated-gelu') !== 'gated-gelu' || (c.dense_act_fn ?? 'gelu_new') !== 'gelu_new') {
    throw fail(
      `feed_forward_proj ${JSON.stringify(c.feed_forward_proj)} with ${JSON.stringify(c.dense_act_fn)} ` +
        'is not supported; expected "gated-gelu" with "gelu_new"',
    );
  }
  const int = (key: string): number => {
    const v = c[key];
    if (!Number.isInteger(v) || (v as number) <= 0)
      throw fail(`${key} must be a positive integer, got ${JSON.stringify(v)}`);
    return v as number;
  };
  const cfg: Umt5Config = {
    dModel: int('d_model'),
    dKv: int('d_kv'),
    numHeads: int('num_heads'),
    dFf: int('d_ff'),
    numLayers: int('num_layers'),
    numBuckets: int('relative_attention_num_buckets'),
    maxDistance: int('relative_attention_max_distance'),
    vocabSize: int('vocab_size'),
    eps: typeof c.layer_norm_epsilon === 'number' ? c.layer_norm_epsilon : 1e-6,
  };
  if (cfg.numBuckets < 4 || cfg.numBuckets % 4 !== 0)
    throw fail(`relative_attention_num_buckets must be a multiple of 4, got ${cfg.numBuckets}`);
  return cfg;
}

/** Layer i's tensor names, by their short names in the layer graph. */
export function umt5LayerWeightNames(layer: number): Record<Umt5LayerWeight, string> {
  const a = `encoder.block.${layer}.layer.0`;
  const f = `encoder.block.${layer}.layer.1`;
  return {
    attnNorm: `${a}.layer_norm.weight`,
    q: `${a}.SelfAttention.q.weight`,
    k: `${a}.SelfAttention.k.weight`,
    v: `${a}.SelfAttention.v.weight`,
    o: `${a}.SelfAttention.o.weight`,
    positionBias: `${a}.SelfAttention.relative_attention_bias.weight`,
    ffnNorm: `${f}.layer_norm.weight`,
    wi0: `${f}.DenseReluDense.wi_0.weight`,
    wi1: `${f}.DenseReluDense.wi_1.weight`,
    wo: `${f}.DenseReluDense.wo.weight`,
  };
}
export type Umt5LayerWeight = 'attnNorm' | 'q' | 'k' | 'v' | 'o' | 'positionBias' | 'ffnNorm' | 'wi0' | 'wi1' | 'wo';

/** Every tensor the encoder's checkpoint holds, in transformers' state-dict order (which decides the shards). */
export function umt5WeightShapes(cfg: Umt5Config): Map<string, number[]> {
  const { dModel: d, numHeads, dKv, dFf, numBuckets, vocabSize } = cfg;
  const inner = numHeads * dKv;
  const shapes = new Map<string, number[]>([[TOKEN_EMBEDDING, [vocabSize, d]]]);
  for (let i = 0; i < cfg.numLayers; i++) {
    const n = umt5LayerWeightNames(i);
    shapes.set(n.q, [inner, d]).set(n.k, [inner, d]).set(n.v, [inner, d]).set(n.o, [d, inner]);
    shapes.set(n.positionBias, [numBuckets, numHeads]).set(n.attnNorm, [d]);
    shapes.set(n.wi0, [dFf, d]).set(n.wi1, [dFf, d]).set(n.wo, [d, dFf]).set(n.ffnNorm, [d]);
  }
  return shapes.set(FINAL_NORM, [d]);
}

/**
 * The relative-position bucket of every (query, key) pair of a T-token prompt, [T, T] row-major:
 * transformers' `_relative_position_bucket` for the encoder (bidirectional).
 */
export function relativePositionBuckets(tokens: number, numBuckets: number, maxDistance: number): Int32Array {
  const half = numBuckets / 2; // one half for keys after the query, one for keys before
  const maxExact = half / 2;
  const buckets = new Int32Array(tokens * tokens);
  for (let q = 0; q < tokens; q++) {
    for (let k = 0; k < tokens; k++) {
      const relative = k - q;
      const distance = Math.abs(relative);
      // log-spaced past maxExact; Math.trunc as torch's .to(long) of the positive log ratio
      const large = Math.min(
        half - 1,
        maxExact + Math.trunc((Math.log(distance / maxExact) / Math.log(maxDistance / maxExact)) * (half - maxExact)),
      );
      buckets[q * tokens + k] = (relative > 0 ? half : 0) + (distance < maxExact ? distance : large);
    }
  }
  return buckets;
}

/** One layer's weights, by short name. */
export type Umt5LayerWeights = Record<Umt5LayerWeight, Float32Array>;

/** UMT5Block of the encoder on hidden states [T, d_model]: self-attention then the gated FFN, each residual. */
export function umt5LayerReference(
  cfg: Umt5Config,
  w: Umt5LayerWeights,
  hidden: Float32Array,
  buckets: Int32Array,
): Float32Array {
  const { dModel: d, numHeads: H, dKv, dFf, eps } = cfg;
  const inner = H * dKv;
  const T = hidden.length / d;
  const n = rmsNorm(hidden, d, eps, w.attnNorm);
  const [q, k, v] = [linear(n, w.q, null, d), linear(n, w.k, null, d), linear(n, w.v, null, d)];
  const context = new Float32Array(T * inner);
  const scores = new Float64Array(T);
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < T; i++) {
      let max = -Infinity;
      for (let j = 0; j < T; j++) {
        let s = w.positionBias[buckets[i * T + j] * H + h]; // no 1/√d_kv: T5 folds it into the weights
        for (let e = 0; e < dKv; e++) s += q[i * inner + h * dKv + e] * k[j * inner + h * dKv + e];
        scores[j] = s;
        max = Math.max(max, s);
      }
      let sum = 0;
      for (let j = 0; j < T; j++) sum += scores[j] = Math.exp(scores[j] - max);
      for (let e = 0; e < dKv; e++) {
        let acc = 0;
        for (let j = 0; j < T; j++) acc += scores[j] * v[j * inner + h * dKv + e];
        context[i * inner + h * dKv + e] = acc / sum;
      }
    }
  }
  const attended = linear(context, w.o, null, inner).map((x, idx) => x + hidden[idx]);
  const m = rmsNorm(attended, d, eps, w.ffnNorm);
  const gate = geluTanh(linear(m, w.wi0, null, d)); // gelu_new is the tanh approximation
  const gated = linear(m, w.wi1, null, d).map((x, idx) => x * gate[idx]);
  return linear(gated, w.wo, null, dFf).map((x, idx) => x + attended[idx]);
}

/** The encoder's last step: final_layer_norm. */
export function umt5FinalNorm(cfg: Umt5Config, weight: Float32Array, hidden: Float32Array): Float32Array {
  return rmsNorm(hidden, cfg.dModel, cfg.eps, weight);
}

/**
 * The token embedding's rows for `ids`, [T, d_model], read row by row: the embedding is a quarter
 * of the encoder (1.05 B values, 4.2 GB in fp32) and a prompt needs at most 512 of its rows.
 */
export async function readTokenRows(files: ByteRanges, embedding: TensorEntry, ids: number[]): Promise<Float32Array> {
  const [vocab, d] = embedding.shape;
  const rowBytes = (embedding.end - embedding.begin) / vocab;
  // each distinct id read once: a prompt repeats tokens
  const read = new Map<number, Promise<Float32Array>>();
  const rowOf = (id: number) => {
    if (!Number.isInteger(id) || id < 0 || id >= vocab)
      throw new Error(`token id ${id} is outside the text encoder's vocabulary of ${vocab}`);
    const begin = embedding.begin + id * rowBytes;
    let row = read.get(id);
    if (!row) {
      row = readTensor(files, {
        ...embedding,
        name: `${embedding.name}[${id}]`,
        shape: [1, d],
        begin,
        end: begin + rowBytes,
      }).then((t) => t.data);
      read.set(id, row);
    }
    return row;
  };
  const rows = new Float32Array(ids.length * d);
  await Promise.all(ids.map(async (id, t) => rows.set(await rowOf(id), t * d)));
  return rows;
}

/** A text encoder's checkpoint, opened and checked: its layers and rows are read when asked for. */
export interface Umt5Checkpoint {
  config: Umt5Config;
  /** the embedding rows of a prompt's token ids, [T, d_model] */
  tokenRows(ids: number[]): Promise<Float32Array>;
  /** one layer's weights, read from its shard */
  layer(index: number): Promise<Umt5LayerWeights>;
  /** the bytes `layer(index)` reads, by the checkpoint's header */
  layerBytes(index: number): number;
  finalNorm(): Promise<Float32Array>;
}

/**
 * Opens text_encoder/ of a model folder: config and every shard's header, checked against each
 * other before a weight is read. Nothing more is read until asked for: a worker reads only its
 * layers, and of the token embedding only the prompt's rows.
 */
export async function openUmt5(files: ModelFiles): Promise<Umt5Checkpoint> {
  const config = parseUmt5Config(await readJson(files, TEXT_ENCODER_CONFIG), TEXT_ENCODER_CONFIG);
  const checkpoint = await openCheckpoint(files, 'text_encoder', TEXT_ENCODER_WEIGHTS_NAME);
  // transformers saves the tied copy of the token embedding only when asked to: accepted, not read
  const tensors = new Map([...checkpoint.tensors].filter(([name]) => name !== 'encoder.embed_tokens.weight'));
  checkShapes(umt5WeightShapes(config), tensors, checkpoint.source);
  // checkShapes has seen every name the layers ask for
  const entry = (name: string) => defined(tensors.get(name), `${checkpoint.source}: tensor "${name}"`);
  const read = async (name: string) => (await readTensor(files, entry(name))).data;
  const namesOf = (index: number) => {
    if (!Number.isInteger(index) || index < 0 || index >= config.numLayers)
      throw new Error(`the text encoder has layers 0–${config.numLayers - 1}, not ${index}`);
    return Object.entries(umt5LayerWeightNames(index)) as [Umt5LayerWeight, string][];
  };
  return {
    config,
    tokenRows: (ids) => readTokenRows(files, entry(TOKEN_EMBEDDING), ids),
    layerBytes: (index) =>
      namesOf(index).reduce((sum, [, name]) => {
        const { begin, end } = entry(name);
        return sum + end - begin;
      }, 0),
    async layer(index) {
      const names = namesOf(index);
      return Object.fromEntries(
        await Promise.all(names.map(async ([short, name]) => [short, await read(name)] as const)),
      ) as Umt5LayerWeights;
    },
    finalNorm: () => read(FINAL_NORM),
  };
}

/** One encoder layer as some backend computes it (the reference, or onnxruntime's graph). */
export type Umt5LayerFn = (
  weights: Umt5LayerWeights,
  hidden: Float32Array,
  buckets: Int32Array,
) => Promise<Float32Array>;

/**
 * Hidden states through layers [from, to): each layer's weights asked for while the one before it
 * computes (`weightsOf` reads them, or hands over ones held), then run; `onLayer` hears each
 * layer's compute time.
 */
export async function runLayers(
  range: { from: number; to: number },
  hidden: Float32Array,
  buckets: Int32Array,
  weightsOf: (layer: number) => Promise<Umt5LayerWeights>,
  runLayer: Umt5LayerFn,
  onLayer?: (layer: number, ms: number) => void,
): Promise<Float32Array> {
  let next: Promise<Umt5LayerWeights> | undefined;
  for (let layer = range.from; layer < range.to; layer++) {
    const weights = await (next ?? weightsOf(layer));
    next = layer + 1 < range.to ? weightsOf(layer + 1) : undefined;
    const started = performance.now();
    hidden = await runLayer(weights, hidden, buckets);
    onLayer?.(layer, performance.now() - started);
  }
  return hidden;
}

/**
 * last_hidden_state [T, d_model] of a prompt's token ids: its embedding rows through every layer, a
 * layer's weights read when it runs and dropped after (the whole encoder is 22.7 GB), then the
 * final norm.
 */
export async function encodeIds(
  encoder: Umt5Checkpoint,
  ids: number[],
  runLayer: Umt5LayerFn,
  onLayer?: (layer: number, ms: number) => void,
): Promise<Float32Array> {
  const { config } = encoder;
  const buckets = relativePositionBuckets(ids.length, config.numBuckets, config.maxDistance);
  const hidden = await runLayers(
    { from: 0, to: config.numLayers },
    await encoder.tokenRows(ids),
    buckets,
    (layer) => encoder.layer(layer),
    runLayer,
    onLayer,
  );
  return umt5FinalNorm(config, await encoder.finalNorm(), hidden);
}

/** What WanPipeline hands the transformer: the prompt's rows, then zero rows up to maxLength ([maxLength, d_model]). */
export function padPromptEmbeds(lastHiddenState: Float32Array, dModel: number, maxLength: number): Float32Array {
  const padded = new Float32Array(maxLength * dModel);
  padded.set(lastHiddenState.subarray(0, maxLength * dModel));
  return padded;
}
