// A model folder on disk: the loaders' file source in Node (whole files, and byte ranges of the
// large ones), and the writer of checkpoints in the layout diffusers publishes them in: one
// `<name>.safetensors`, or shards of at most 5 GB and their `<name>.safetensors.index.json`.
import { createWriteStream, mkdirSync, statSync } from 'node:fs';
import { cp, mkdir, open, readFile, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { MissingFile, type ModelFiles } from '../core/model/files.ts';
import { expectedWeightShapes, parseWanConfig } from '../core/model/config.ts';
import { TRANSFORMER_CONFIG, TRANSFORMER_WEIGHTS_NAME } from '../core/model/transformer.ts';
import { WAN22_TI2V_5B } from './wan22-layout.ts';
import {
  narrow,
  planShards,
  safetensorsHeader,
  storedBytes,
  type SafetensorsDType,
  type TensorSpec,
} from '../core/safetensors.ts';
import { sizeOf } from '../core/tensor.ts';
import { SeededRandom } from '../core/random.ts';
import {
  parseUmt5Config,
  TEXT_ENCODER_CONFIG,
  TEXT_ENCODER_WEIGHTS_NAME,
  TOKEN_EMBEDDING,
  umt5WeightShapes,
  type Umt5Config,
} from '../core/model/umt5.ts';
import { makeTestTokenizerJson, TEST_TOKENIZER_PIECES } from '../core/model/umt5-tokenizer.ts';
import {
  parseWanVaeConfig,
  VAE_CONFIG,
  VAE_WEIGHTS,
  wanVaeWeightShapes,
  type WanVaeConfig,
} from '../core/model/wan-vae.ts';

/** where ditswarm keeps what it makes or fetches on this machine (test models, the CLIs' browser profile) */
export const CACHE_ROOT = join(homedir(), '.cache/ditswarm');
/** where make-model's wan2.1-t2v-1.3b preset writes, and the benchmarks read */
export const FULL_SIZE_MODEL_DIR = join(CACHE_ROOT, 'models/wan2.1-t2v-1.3b');
/** make-model's wan2.1-few-layers: the published layout at full width, with 2 transformer blocks and 2 umT5 layers */
export const FEW_LAYERS_MODEL_DIR = join(CACHE_ROOT, 'models/wan2.1-few-layers');
/** where `make-model --preset wan2.1-t2v-14b` writes the 14B layout (all its blocks: 56 GB in float32) */
export const WAN_14B_MODEL_DIR = join(CACHE_ROOT, 'models/wan2.1-t2v-14b');
/** `npm run make-model -- --preset wan2.2-ti2v-5b`: Wan2.2-TI2V-5B-Diffusers' layout, git-ignored (by default 20 GB) */
export const WAN22_TI2V_5B_MODEL_DIR = join(CACHE_ROOT, 'models/wan2.2-ti2v-5b');

export function folderFiles(dir: string): ModelFiles {
  const missing = (e: unknown, path: string) =>
    (e as NodeJS.ErrnoException).code === 'ENOENT' ? new MissingFile(`${join(dir, path)}: no such file`) : e;
  return {
    async read(path) {
      try {
        return new Uint8Array(await readFile(join(dir, path)));
      } catch (e) {
        throw missing(e, path);
      }
    },
    async readRange(path, begin, end) {
      let file;
      try {
        file = await open(join(dir, path), 'r');
      } catch (e) {
        throw missing(e, path);
      }
      try {
        const bytes = new Uint8Array(Math.max(0, end - begin));
        const { bytesRead } = await file.read(bytes, 0, bytes.length, begin);
        return bytes.subarray(0, bytesRead);
      } finally {
        await file.close();
      }
    },
  };
}

/** save_pretrained's max_shard_size, "5GB" */
export const MAX_SHARD_BYTES = 5e9;

/**
 * Writes tensors, given in state-dict order with float32 values, stored as `dtype` (F32 by default,
 * as the 1.3B folder is published), as save_pretrained does: one file, or past
 * `maxShardBytes` `<name>-0000i-of-0000n.safetensors` shards with `<name>.safetensors.index.json`.
 * `values` makes one tensor's values when it is written, so at most one tensor is in memory.
 * Returns the files written, relative to `dir`.
 */
export async function writeCheckpoint(
  dir: string,
  name: string,
  tensors: TensorSpec[],
  values: (tensor: TensorSpec) => Float32Array,
  {
    maxShardBytes = MAX_SHARD_BYTES,
    metadata = { format: 'pt' },
    dtype = 'F32',
  }: { maxShardBytes?: number; metadata?: Record<string, string>; dtype?: SafetensorsDType } = {},
): Promise<string[]> {
  mkdirSync(dir, { recursive: true });
  const shards = planShards(tensors, maxShardBytes, dtype);
  const fileOf = (i: number) =>
    shards.length === 1
      ? `${name}.safetensors`
      : `${name}-${String(i + 1).padStart(5, '0')}-of-${String(shards.length).padStart(5, '0')}.safetensors`;
  for (const [i, shard] of shards.entries()) {
    const { head, order } = safetensorsHeader(shard, metadata, dtype);
    const out = createWriteStream(join(dir, fileOf(i)));
    const write = (bytes: Uint8Array) =>
      new Promise<void>((resolve, reject) => out.write(bytes, (e) => (e ? reject(e) : resolve())));
    await write(head);
    for (const tensor of order) {
      const data = values(tensor);
      if (data.length !== sizeOf(tensor.shape))
        throw new Error(
          `tensor "${tensor.name}": shape [${tensor.shape.join(',')}] ` +
            `needs ${sizeOf(tensor.shape)} values, got ${data.length}`,
        );
      await write(narrow(data, dtype));
    }
    await new Promise<void>((resolve, reject) => out.end((e?: Error | null) => (e ? reject(e) : resolve())));
  }
  if (shards.length === 1) return [fileOf(0)];
  const weightMap = Object.fromEntries(
    shards.flatMap((shard, i) => shard.map((t) => [t.name, fileOf(i)] as const)).sort(([a], [b]) => (a < b ? -1 : 1)),
  );
  const totalSize = tensors.reduce((n, t) => n + storedBytes(t.shape, dtype), 0);
  await writeFile(
    join(dir, `${name}.safetensors.index.json`),
    JSON.stringify({ metadata: { total_size: totalSize }, weight_map: weightMap }, null, 2) + '\n',
  );
  return [...shards.map((_, i) => fileOf(i)), `${name}.safetensors.index.json`];
}

/** A tensor's own stream of numbers: FNV-1a of the seed and its name (whatever shards the checkpoint has). */
export function seededRandom(seed: string, name: string): SeededRandom {
  let hash = 0x811c9dc5;
  for (const c of `${seed}:${name}`) hash = Math.imul(hash ^ c.charCodeAt(0), 0x01000193);
  return new SeededRandom(hash);
}

/**
 * A umT5 encoder in a model folder's text_encoder/ (config, safetensors shards and index as
 * transformers saves them) with seeded random weights, initialised as transformers initialises
 * UMT5 (unit-variance embeddings, projections scaled by their fan-in), and tokenizer/ with the
 * test tokenizer (makeTestTokenizerJson), whose vocabulary the encoder's is: no real tokenizer can
 * be fetched here. `config` is transformers' config.json; its vocab_size becomes the tokenizer's.
 */
export async function writeUmt5Folder(
  folder: string,
  config: Record<string, unknown>,
  {
    seed = '0',
    maxShardBytes = MAX_SHARD_BYTES,
    onProgress,
  }: { seed?: string; maxShardBytes?: number; onProgress?: (done: number, total: number) => void } = {},
): Promise<{ config: Umt5Config; files: string[] }> {
  const tokenizer = makeTestTokenizerJson(TEST_TOKENIZER_PIECES);
  const json = { ...config, vocab_size: tokenizer.model.vocab.length };
  const umt5 = parseUmt5Config(json, 'writeUmt5Folder');
  const specs = [...umt5WeightShapes(umt5)].map(([name, shape]) => ({ name, shape }));
  const total = 4 * specs.reduce((n, t) => n + sizeOf(t.shape), 0);
  const { dModel: d, dKv, numHeads, dFf } = umt5;
  const std = (name: string): number => {
    if (name === TOKEN_EMBEDDING) return 1;
    if (name.endsWith('.q.weight')) return (d * dKv) ** -0.5;
    if (name.endsWith('.o.weight')) return (numHeads * dKv) ** -0.5;
    if (name.endsWith('.wo.weight')) return dFf ** -0.5;
    return d ** -0.5; // k, v, wi_0, wi_1, the relative-attention bias
  };
  let done = 0;
  const files = await writeCheckpoint(
    join(folder, 'text_encoder'),
    TEXT_ENCODER_WEIGHTS_NAME,
    specs,
    ({ name, shape }) => {
      onProgress?.((done += 4 * sizeOf(shape)), total);
      const random = seededRandom(seed, name);
      return /norm\.weight$/.test(name)
        ? random.normals(sizeOf(shape), 0.05).map((v) => 1 + v)
        : random.normals(sizeOf(shape), std(name));
    },
    { maxShardBytes },
  );
  await writeFile(join(folder, TEXT_ENCODER_CONFIG), JSON.stringify(json, null, 2) + '\n');
  mkdirSync(join(folder, 'tokenizer'), { recursive: true });
  await writeFile(join(folder, 'tokenizer/tokenizer.json'), JSON.stringify(tokenizer));
  await writeFile(
    join(folder, 'tokenizer/tokenizer_config.json'),
    JSON.stringify(
      {
        tokenizer_class: 'T5Tokenizer',
        model_max_length: 512,
        eos_token: '</s>',
        pad_token: '<pad>',
        unk_token: '<unk>',
      },
      null,
      2,
    ) + '\n',
  );
  return { config: umt5, files };
}

/**
 * A transformer tensor's seeded values, initialised so activations stay O(1) through the blocks as a trained model's
 * do: scale_shift_table N(0, 1/D), norms' weights near 1, small biases, matrices N(0, 1/fan_in).
 */
export function seededTransformerWeight(seed: string, name: string, shape: number[], dim: number): Float32Array {
  const random = seededRandom(seed, name);
  const n = sizeOf(shape);
  if (name.endsWith('scale_shift_table')) return random.normals(n, 1 / Math.sqrt(dim));
  if (/norm[_\w]*\.weight$/.test(name)) return random.normals(n, 0.05).map((v) => 1 + v);
  if (name.endsWith('.bias')) return random.normals(n, 0.02);
  return random.normals(n, 1 / Math.sqrt(n / shape[0]));
}

/**
 * A VAE tensor's seeded values: convolutions N(0, 1/fan_in), norms' γ near 1, small biases, so
 * activations stay O(1) as a trained model's do.
 */
export function seededVaeWeight(seed: string, name: string, shape: number[]): Float32Array {
  const random = seededRandom(seed, name);
  const n = sizeOf(shape);
  if (name.endsWith('.gamma')) return random.normals(n, 0.05).map((v) => 1 + v);
  if (name.endsWith('.bias')) return random.normals(n, 0.02);
  return random.normals(n, 1 / Math.sqrt(n / shape[0]));
}

/**
 * AutoencoderKLWan in a model folder's vae/ (config.json and diffusion_pytorch_model.safetensors,
 * the encoder's and the decoder's tensors in the published layout, Wan2.1's or Wan2.2's as the
 * config says) with seeded random weights (seededVaeWeight). `config` is diffusers' config.json.
 */
export async function writeWanVaeFolder(
  folder: string,
  config: Record<string, unknown>,
  { seed = '0', onProgress }: { seed?: string; onProgress?: (done: number, total: number) => void } = {},
): Promise<{ config: WanVaeConfig; bytes: number }> {
  const vae = parseWanVaeConfig(config, 'writeWanVaeFolder');
  const specs = [...wanVaeWeightShapes(vae)].map(([name, shape]) => ({ name, shape }));
  const total = 4 * specs.reduce((n, t) => n + sizeOf(t.shape), 0);
  let done = 0;
  await writeCheckpoint(join(folder, 'vae'), 'diffusion_pytorch_model', specs, ({ name, shape }) => {
    onProgress?.((done += 4 * sizeOf(shape)), total);
    return seededVaeWeight(seed, name, shape);
  });
  await writeFile(join(folder, VAE_CONFIG), JSON.stringify(config, null, 2) + '\n');
  return { config: vae, bytes: statSync(join(folder, VAE_WEIGHTS)).size };
}

/** Wan2.2's published VAE config (z_dim 48, residual, 2×2 patches, its latent statistics) 8 and 12 channels wide */
export const TINY_WAN22_VAE = { ...WAN22_TI2V_5B.vae, base_dim: 8, decoder_base_dim: 12 };

/** the bundled tiny model, whose stand-in text encoder a tiny TI2V folder shares */
const TINY_MODEL_DIR = join(import.meta.dirname, '../public/models/tiny-wan');

/**
 * Wan2.2-TI2V-5B's folder in its published layout at a tiny width, for tests: its model_index.json (expand_timesteps),
 * its transformer's config with 24 heads of 12 (width 288), 2 blocks and the stand-in text encoder's 64-wide text,
 * seeded weights; Wan2.2's VAE (z_dim 48, residual, 2×2 patches) 8 and 12 channels wide; its scheduler; the tiny
 * model's stand-in text encoder.
 */
export async function writeTinyTi2vFolder(dir: string, seed = 'tiny-ti2v'): Promise<void> {
  const transformer = {
    ...WAN22_TI2V_5B.transformer,
    attention_head_dim: 12,
    ffn_dim: 768,
    num_layers: 2,
    text_dim: 64,
  };
  const config = parseWanConfig(transformer, 'the tiny TI2V transformer');
  await writeCheckpoint(
    join(dir, 'transformer'),
    TRANSFORMER_WEIGHTS_NAME,
    [...expectedWeightShapes(config)].map(([name, shape]) => ({ name, shape })),
    ({ name, shape }) => seededTransformerWeight(seed, name, shape, config.dim),
  );
  await writeFile(join(dir, TRANSFORMER_CONFIG), JSON.stringify(transformer, null, 2) + '\n');
  await writeWanVaeFolder(dir, TINY_WAN22_VAE, { seed });
  await cp(join(TINY_MODEL_DIR, 'text_encoder'), join(dir, 'text_encoder'), { recursive: true });
  const textEncoder = JSON.parse(await readFile(join(TINY_MODEL_DIR, 'model_index.json'), 'utf8')) as {
    text_encoder: unknown;
  };
  await mkdir(join(dir, 'scheduler'), { recursive: true });
  await writeFile(join(dir, 'scheduler/scheduler_config.json'), JSON.stringify(WAN22_TI2V_5B.scheduler, null, 2));
  await writeFile(
    join(dir, 'model_index.json'),
    JSON.stringify({ ...WAN22_TI2V_5B.modelIndex, text_encoder: textEncoder.text_encoder, tokenizer: [null, null] }),
  );
}
