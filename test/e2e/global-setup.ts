import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defined } from '../../core/defined.ts';
import { loadTransformer, TRANSFORMER_WEIGHTS, TRANSFORMER_WEIGHTS_NAME } from '../../core/model/transformer.ts';
import {
  folderFiles,
  writeCheckpoint,
  writeTinyTi2vFolder,
  writeUmt5Folder,
  writeWanVaeFolder,
} from '../../server/model-folder.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';
import { PRELOAD_LARGE_ONLY } from '../../coordinator/preload.ts';
import { startServer } from '../../server/serve.ts';

const TINY_MODEL = join(import.meta.dirname, '../../public/models/tiny-wan');
/** the tiny model's transformer as shards of at most 300 kB with their index, as a page reads a published checkpoint */
export const SHARDED_MODEL_PATH = '/models/tiny-wan-sharded';
/** the same with its last shard cut short: a broken download */
export const TRUNCATED_MODEL_PATH = '/models/tiny-wan-truncated';
/**
 * The tiny model in a published folder's full layout: umT5's encoder (3 layers of width 64, the
 * transformer's text_dim) and a tokenizer, AutoencoderKLWan at base width 8 (its published
 * structure and latent statistics), UniPC as Wan2.1's scheduler config names it.
 */
export const FULL_LAYOUT_MODEL_PATH = '/models/tiny-wan-full';
/** its VAE's config */
export const FULL_LAYOUT_VAE = { ...WAN21_T2V_1_3B.vae, base_dim: 8 };

/** The tiny model's folder with its stand-ins replaced by small models of the published classes, in their layouts. */
async function fullLayoutCopy(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'ditswarm-e2e-full-'));
  cpSync(TINY_MODEL, dir, { recursive: true });
  for (const part of ['text_encoder', 'vae']) rmSync(join(dir, part), { recursive: true });
  const published = JSON.parse(readFileSync(join(dir, 'model_index.json'), 'utf8')) as Record<string, unknown>;
  delete published.flow_shift; // the scheduler's config holds the shift
  writeFileSync(
    join(dir, 'model_index.json'),
    JSON.stringify({
      ...published,
      text_encoder: ['transformers', 'UMT5EncoderModel'],
      tokenizer: ['transformers', 'T5TokenizerFast'],
      vae: ['diffusers', 'AutoencoderKLWan'],
      scheduler: ['diffusers', 'UniPCMultistepScheduler'],
    }),
  );
  mkdirSync(join(dir, 'scheduler'));
  writeFileSync(join(dir, 'scheduler/scheduler_config.json'), JSON.stringify(WAN21_T2V_1_3B.scheduler));
  await writeWanVaeFolder(dir, FULL_LAYOUT_VAE, { seed: '16' });
  await writeUmt5Folder(
    dir,
    {
      architectures: ['UMT5EncoderModel'],
      model_type: 'umt5',
      d_model: 64,
      d_kv: 8,
      num_heads: 8,
      d_ff: 128,
      num_layers: 3,
      relative_attention_num_buckets: 32,
      relative_attention_max_distance: 128,
      layer_norm_epsilon: 1e-6,
      feed_forward_proj: 'gated-gelu',
      dense_act_fn: 'gelu_new',
    },
    { seed: '15', maxShardBytes: 100_000 },
  );
  return dir;
}

/** Wan2.2-TI2V-5B's layout at a tiny width (writeTinyTi2vFolder): image to video with the same model. */
export const TINY_TI2V_MODEL_PATH = '/models/tiny-ti2v';

/** The tiny model's folder with its transformer in shards; `truncate` cuts the last one to 1000 bytes. */
async function shardedCopy(truncate: boolean): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'ditswarm-e2e-model-'));
  cpSync(TINY_MODEL, dir, { recursive: true });
  rmSync(join(dir, TRANSFORMER_WEIGHTS));
  const { weights } = await loadTransformer(folderFiles(TINY_MODEL));
  const files = await writeCheckpoint(
    join(dir, 'transformer'),
    TRANSFORMER_WEIGHTS_NAME,
    [...weights].map(([name, t]) => ({ name, shape: t.shape })),
    ({ name }) => defined(weights.get(name), name).data,
    { maxShardBytes: 300_000 },
  );
  if (truncate) truncateSync(join(dir, 'transformer', files[files.length - 2]), 1000);
  return dir;
}

/**
 * Starts the ditswarm server in-process on a free port for the whole run and publishes
 * its URL as DITSWARM_URL. With DITSWARM_URL already set, the tests use that server instead.
 */
export default async function globalSetup(): Promise<(() => Promise<void>) | undefined> {
  if (process.env.DITSWARM_URL) return undefined;
  const [sharded, truncated, full] = [await shardedCopy(false), await shardedCopy(true), await fullLayoutCopy()];
  const ti2v = mkdtempSync(join(tmpdir(), 'ditswarm-e2e-ti2v-'));
  await writeTinyTi2vFolder(ti2v);
  const server = await startServer({
    port: 0,
    quiet: true,
    modelFolders: {
      [SHARDED_MODEL_PATH]: sharded,
      [TRUNCATED_MODEL_PATH]: truncated,
      [FULL_LAYOUT_MODEL_PATH]: full,
      [TINY_TI2V_MODEL_PATH]: ti2v,
    },
    // the tests' jobs are their own: a test of the form's job, or of preloading, says preloadFrom(0)
    preloadFromBytes: PRELOAD_LARGE_ONLY,
  });
  process.env.DITSWARM_URL = server.url;
  process.env.DITSWARM_SHARDED_DIR = sharded; // where a test may change a served file
  process.env.DITSWARM_FULL_LAYOUT_DIR = full; // where a test may compute in Node what the tabs compute
  process.env.DITSWARM_TI2V_DIR = ti2v;
  return async () => {
    await server.close();
    for (const dir of [sharded, truncated, full, ti2v]) rmSync(dir, { recursive: true, force: true });
  };
}
