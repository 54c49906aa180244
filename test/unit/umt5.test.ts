import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { SeededRandom } from '../../core/random.ts';
import { maxAbsDiff } from '../../core/tensor.ts';
import {
  FINAL_NORM,
  isUmt5Config,
  openUmt5,
  parseUmt5Config,
  readTokenRows,
  relativePositionBuckets,
  runLayers,
  TEXT_ENCODER_CONFIG,
  TEXT_ENCODER_WEIGHTS_NAME,
  TOKEN_EMBEDDING,
  umt5FinalNorm,
  umt5LayerReference,
  umt5WeightShapes,
  type Umt5Checkpoint,
  type Umt5Config,
  type Umt5LayerFn,
  type Umt5LayerWeights,
} from '../../core/model/umt5.ts';
import { readSafetensorsHeader, type ByteRanges } from '../../core/safetensors.ts';
import { onnxUmt5Layers } from '../../rank/umt5-layers.ts';
import { folderFiles, writeCheckpoint } from '../../server/model-folder.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';

// umT5-XXL's layout and math at a small width: 8 heads of 8, the published 32 buckets and distance 128
const CONFIG = {
  architectures: ['UMT5EncoderModel'],
  model_type: 'umt5',
  d_model: 64,
  d_kv: 8,
  num_heads: 8,
  d_ff: 96,
  num_layers: 2,
  relative_attention_num_buckets: 32,
  relative_attention_max_distance: 128,
  vocab_size: 300,
  layer_norm_epsilon: 1e-6,
  feed_forward_proj: 'gated-gelu',
  dense_act_fn: 'gelu_new',
};

let dir: string;
let encoder: Umt5Checkpoint;
let cfg: Umt5Config;

/** A random umT5 encoder folder in the published layout, its shards small enough to split it in three. */
async function writeEncoder(
  folder: string,
  config: Record<string, unknown>,
  shapes?: Map<string, number[]>,
): Promise<void> {
  const { parseUmt5Config } = await import('../../core/model/umt5.ts');
  const specs = [...(shapes ?? umt5WeightShapes(parseUmt5Config(config, 'test')))].map(([name, shape]) => ({
    name,
    shape,
  }));
  writeFileSync(join(folder, 'config.json'), '{}');
  await writeCheckpoint(
    join(folder, 'text_encoder'),
    TEXT_ENCODER_WEIGHTS_NAME,
    specs,
    ({ name, shape }) => {
      const n = shape.reduce((a, b) => a * b, 1);
      const random = new SeededRandom(
        Array.from(name, (c) => c.charCodeAt(0)).reduce((h, code) => Math.imul(h ^ code, 0x01000193), 0x811c9dc5),
      );
      return name.endsWith('norm.weight')
        ? random.normals(n, 0.05).map((v) => 1 + v)
        : random.normals(n, name.includes('relative') ? 1 : 1 / Math.sqrt(shape[1]));
    },
    { maxShardBytes: 60_000 },
  );
  writeFileSync(join(folder, 'text_encoder/config.json'), JSON.stringify(config));
}

describe("umT5's config and names, as Wan2.1's folders publish them", () => {
  it("the published text_encoder/config.json reads as umT5-XXL; its files and tensors are found by transformers' names", () => {
    expect(parseUmt5Config(WAN21_T2V_1_3B.textEncoder, TEXT_ENCODER_CONFIG)).toEqual({
      dModel: 4096,
      dKv: 64,
      numHeads: 64,
      dFf: 10240,
      numLayers: 24,
      numBuckets: 32,
      maxDistance: 128,
      vocabSize: 256384,
      eps: 1e-6,
    });
    // text_encoder/model.safetensors.index.json and model-0000{1..5}-of-00005.safetensors, as published
    expect([TEXT_ENCODER_CONFIG, TEXT_ENCODER_WEIGHTS_NAME]).toEqual(['text_encoder/config.json', 'model']);
    expect([TOKEN_EMBEDDING, FINAL_NORM]).toEqual(['shared.weight', 'encoder.final_layer_norm.weight']);
  });

  it('is told by its model_type or by its architectures, either alone', () => {
    expect(isUmt5Config({ model_type: 'umt5' })).toBe(true);
    expect(isUmt5Config({ architectures: ['T5EncoderModel', 'UMT5EncoderModel'] })).toBe(true);
    expect(isUmt5Config({ model_type: 't5', architectures: ['T5EncoderModel'] })).toBe(false);
    expect(isUmt5Config({ architectures: 'UMT5EncoderModel' })).toBe(false);
    expect(isUmt5Config(null)).toBe(false);
  });

  it("takes transformers' defaults where a field is absent: eps 1e-6, gated-gelu with gelu_new", () => {
    const { layer_norm_epsilon, feed_forward_proj, dense_act_fn, ...rest } = CONFIG;
    expect([layer_norm_epsilon, feed_forward_proj, dense_act_fn]).toEqual([1e-6, 'gated-gelu', 'gelu_new']);
    expect(parseUmt5Config(rest, 'c').eps).toBe(1e-6);
    expect(parseUmt5Config({ ...CONFIG, layer_norm_epsilon: 1e-5 }, 'c').eps).toBe(1e-5);
  });

  it('refuses a config it cannot run, naming the file, the field and what it takes', () => {
    const refused = (config: unknown) => () => parseUmt5Config(config, 'te/config.json');
    expect(refused(null)).toThrow('te/config.json: config is not a JSON object');
    expect(refused('umt5')).toThrow('te/config.json: config is not a JSON object');
    expect(refused({ ...CONFIG, feed_forward_proj: 'relu' })).toThrow(
      'te/config.json: feed_forward_proj "relu" with "gelu_new" is not supported; expected "gated-gelu" with "gelu_new"',
    );
    expect(refused({ ...CONFIG, dense_act_fn: 'gelu' })).toThrow(
      'te/config.json: feed_forward_proj "gated-gelu" with "gelu" is not supported',
    );
    const keys = [
      'd_model',
      'd_kv',
      'num_heads',
      'd_ff',
      'num_layers',
      'relative_attention_num_buckets',
      'relative_attention_max_distance',
      'vocab_size',
    ];
    for (const key of keys)
      for (const bad of [0, -8, 1.5, '8'])
        expect(refused({ ...CONFIG, [key]: bad })).toThrow(
          `te/config.json: ${key} must be a positive integer, got ${JSON.stringify(bad)}`,
        );
    // 4 is the fewest: an exact and a log-spaced bucket each way
    expect(parseUmt5Config({ ...CONFIG, relative_attention_num_buckets: 4 }, 'c').numBuckets).toBe(4);
    expect(refused({ ...CONFIG, relative_attention_num_buckets: 30 })).toThrow(
      'te/config.json: relative_attention_num_buckets must be a multiple of 4, got 30',
    );
  });
});

describe("umT5's relative-position buckets", () => {
  it('are exact up to 8 apart, log-spaced to 128, and keys after the query take the upper half', () => {
    const T = 200;
    const b = relativePositionBuckets(T, 32, 128);
    const at = (q: number, k: number) => b[q * T + k];
    // key before the query (relative < 0): buckets 0–15; after: 16–31
    expect([0, 1, 7].map((d) => at(d, 0))).toEqual([0, 1, 7]);
    expect([1, 7].map((d) => at(0, d))).toEqual([17, 23]);
    // 8 + trunc(8 · ln(d/8) / ln 16): 8 → 8, 31 → 11, 32 → 12, 127 → 15, and everything farther → 15
    expect([8, 31, 32, 127, 128, 199].map((d) => at(d, 0))).toEqual([8, 11, 12, 15, 15, 15]);
    expect([8, 32, 199].map((d) => at(0, d))).toEqual([24, 28, 31]);
  });
});

describe('the umT5 encoder layer', () => {
  // here, not at the file's top: a file-level hook that fails fails no test in Stryker's count (the tests are
  // skipped), so a mutant that broke it would look alive
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ditswarm-umt5-'));
    await writeEncoder(dir, CONFIG);
    encoder = await openUmt5(folderFiles(dir));
    cfg = encoder.config;
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('on ONNX equals the plain-TS reference within 1e-4 relative, for prompts of 1, 7 and 40 tokens', async () => {
    const onnx = await onnxUmt5Layers(cfg, 'wasm');
    const layer = await encoder.layer(1);
    for (const tokens of [1, 7, 40]) {
      const ids = Array.from({ length: tokens }, (_, t) => (t * 37 + 5) % cfg.vocabSize);
      const hidden = await encoder.tokenRows(ids);
      const buckets = relativePositionBuckets(tokens, cfg.numBuckets, cfg.maxDistance);
      const [reference, graph] = [
        umt5LayerReference(cfg, layer, hidden, buckets),
        await onnx.run(layer, hidden, buckets),
      ];
      const scale = reference.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
      expect(maxAbsDiff(graph, reference) / scale, `${tokens} tokens`).toBeLessThan(1e-4);
      // the layer did something: its output is not its input
      expect(maxAbsDiff(reference, hidden)).toBeGreaterThan(0.01);
    }
    const normed = umt5FinalNorm(cfg, await encoder.finalNorm(), new Float32Array(cfg.dModel).fill(2));
    expect(normed[0]).toBeCloseTo((await encoder.finalNorm())[0], 4); // RMS of a constant row is the constant
  });

  it("reads a prompt's embedding rows alone, each the embedding's row of its id", async () => {
    const { readSafetensors } = await import('../../core/safetensors.ts');
    const { readdirSync, readFileSync } = await import('node:fs');
    const first = readdirSync(join(dir, 'text_encoder'))
      .filter((f) => f.endsWith('.safetensors'))
      .sort()[0];
    const embedding = defined(
      readSafetensors(readFileSync(join(dir, 'text_encoder', first)), first).get('shared.weight'),
      'shared.weight',
    );
    const rows = await encoder.tokenRows([299, 0, 299]);
    const d = cfg.dModel;
    expect(rows.subarray(0, d)).toEqual(embedding.data.subarray(299 * d, 300 * d));
    expect(rows.subarray(d, 2 * d)).toEqual(embedding.data.subarray(0, d));
    expect(rows.subarray(2 * d)).toEqual(rows.subarray(0, d));
    for (const id of [300, -1, 1.5])
      await expect(encoder.tokenRows([id])).rejects.toThrow(
        `token id ${id} is outside the text encoder's vocabulary of 300`,
      );
    // a layer is asked for by its index, 0 to 1 here
    for (const index of [2, -1, 0.5]) {
      expect(() => encoder.layerBytes(index)).toThrow(`the text encoder has layers 0–1, not ${index}`);
      await expect(encoder.layer(index)).rejects.toThrow(`the text encoder has layers 0–1, not ${index}`);
    }
    expect(encoder.layerBytes(1)).toBe(
      4 *
        [...umt5WeightShapes(cfg)]
          .filter(([name]) => name.startsWith('encoder.block.1.'))
          .reduce((n, [, shape]) => n + shape.reduce((a, b) => a * b, 1), 0),
    );
  });

  it("reads each distinct id's row once; a row the file holds too little of is named by its id", async () => {
    const files = folderFiles(dir);
    const shard = readdirSync(join(dir, 'text_encoder'))
      .filter((f) => f.endsWith('.safetensors'))
      .sort()[0];
    const header = await readSafetensorsHeader(files, `text_encoder/${shard}`);
    const embedding = defined(
      header.find((e) => e.name === TOKEN_EMBEDDING),
      TOKEN_EMBEDDING,
    );
    const reads: number[] = [];
    const counted: ByteRanges = {
      readRange: (file, begin, end) => (reads.push(begin), files.readRange(file, begin, end)),
    };
    const d = cfg.dModel;
    const rows = await readTokenRows(counted, embedding, [5, 7, 5, 5]);
    expect(reads).toHaveLength(2);
    expect(rows.subarray(2 * d, 3 * d)).toEqual(rows.subarray(0, d));
    const short: ByteRanges = { readRange: async (...range) => (await files.readRange(...range)).subarray(1) };
    await expect(readTokenRows(short, embedding, [3])).rejects.toThrow(`tensor "${TOKEN_EMBEDDING}[3]" needs bytes`);
  });

  it('attends alike under a position bias shifted by a constant: its softmax subtracts the largest score, so a bias of +500 (exp past float64) changes nothing', async () => {
    const layer = await encoder.layer(1);
    const T = 5;
    const hidden = new SeededRandom(9).normals(T * cfg.dModel);
    const buckets = relativePositionBuckets(T, cfg.numBuckets, cfg.maxDistance);
    const plain = umt5LayerReference(cfg, layer, hidden, buckets);
    const shifted = umt5LayerReference(
      cfg,
      { ...layer, positionBias: layer.positionBias.map((b) => b + 500) },
      hidden,
      buckets,
    );
    const scale = plain.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    // float32's step at 500 (6e-5) is what the shifted bias loses
    expect(maxAbsDiff(shifted, plain) / scale).toBeLessThan(1e-3);
  });

  it("asks for the next layer's weights while the one before it computes", async () => {
    const heard: string[] = [];
    await runLayers(
      { from: 0, to: 3 },
      new Float32Array(cfg.dModel),
      relativePositionBuckets(1, 32, 128),
      (i) => {
        heard.push(`read ${i}`);
        return Promise.resolve({} as Umt5LayerWeights);
      },
      async (_, h) => {
        heard.push('run');
        await new Promise((resolve) => setTimeout(resolve, 1));
        return h;
      },
    );
    expect(heard).toEqual(['read 0', 'read 1', 'run', 'read 2', 'run', 'run']);
  });

  it("opens a folder that also holds transformers' tied copy of the token embedding (encoder.embed_tokens.weight)", async () => {
    const tied = mkdtempSync(join(tmpdir(), 'ditswarm-umt5-tied-'));
    try {
      const shapes = umt5WeightShapes(cfg);
      await writeEncoder(tied, CONFIG, new Map([...shapes, ['encoder.embed_tokens.weight', [300, 64]]]));
      expect((await openUmt5(folderFiles(tied))).config).toEqual(cfg);
    } finally {
      rmSync(tied, { recursive: true, force: true });
    }
  });

  it('hears each layer it runs with the time that layer took', async () => {
    const heard: [number, number][] = [];
    const hidden = new Float32Array(3 * cfg.dModel).fill(0.5);
    const slow: Umt5LayerFn = async (_, h) => {
      await new Promise((resolve) => setTimeout(resolve, 30));
      return h;
    };
    const started = performance.now();
    await runLayers(
      { from: 0, to: 2 },
      hidden,
      relativePositionBuckets(3, 32, 128),
      (i) => encoder.layer(i),
      slow,
      (layer, ms) => heard.push([layer, ms]),
    );
    const elapsed = performance.now() - started;
    expect(heard.map(([layer]) => layer)).toEqual([0, 1]);
    for (const [, ms] of heard) {
      expect(ms).toBeGreaterThanOrEqual(25);
      expect(ms).toBeLessThanOrEqual(elapsed);
    }
  });

  it('refuses a folder whose weights disagree with its config, naming the file and the tensor', async () => {
    const bad = mkdtempSync(join(tmpdir(), 'ditswarm-umt5-bad-'));
    try {
      const shapes = umt5WeightShapes(cfg);
      shapes.set('encoder.block.1.layer.1.DenseReluDense.wo.weight', [64, 95]);
      shapes.delete('encoder.final_layer_norm.weight');
      await writeEncoder(bad, CONFIG, shapes);
      await expect(openUmt5(folderFiles(bad))).rejects.toThrow(
        new RegExp(
          'text_encoder/model\\.safetensors\\.index\\.json does not match its config: missing keys: encoder\\.final_layer_norm\\.weight\\. wrong shapes: encoder\\.block\\.1\\.layer\\.1\\.DenseReluDense\\.wo\\.weight in text_encoder/model-0000\\d-of-0000\\d\\.safetensors is \\[64,95\\], expected \\[64,96\\]',
        ),
      );
      writeFileSync(
        join(bad, 'text_encoder/config.json'),
        JSON.stringify({ ...CONFIG, model_type: 't5', architectures: ['T5EncoderModel'] }),
      );
      await expect(openUmt5(folderFiles(bad))).rejects.toThrow(
        'text_encoder/config.json: model_type is "t5"; expected "umt5"',
      );
    } finally {
      rmSync(bad, { recursive: true, force: true });
    }
  });
});
