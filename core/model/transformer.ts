import { readTensors, type TensorEntry } from '../safetensors.ts';
import { allBlocks, checkBlockRange, holdsTensor, type BlockRange } from './blocks.ts';
import { openCheckpoint, type Checkpoint } from './checkpoint.ts';
import { checkWeights, parseWanConfig, type WanConfig } from './config.ts';
import { readJson, type LoadProgress, type ModelFiles } from './files.ts';
import type { WanModel } from './reference.ts';

export const TRANSFORMER_CONFIG = 'transformer/config.json';
/** the checkpoint's name in transformer/: one file of it, or shards and their index */
export const TRANSFORMER_WEIGHTS_NAME = 'diffusion_pytorch_model';
/** the checkpoint as one file */
export const TRANSFORMER_WEIGHTS = `transformer/${TRANSFORMER_WEIGHTS_NAME}.safetensors`;

/**
 * A diffusers WanTransformer3DModel folder's config and checkpoint, single-file or sharded, checked against each
 * other (every tensor's name and shape, every shard as long as its header says) without reading a weight: what the
 * coordinator asks of a folder before a worker loads it.
 */
export async function openTransformer(files: ModelFiles): Promise<{ config: WanConfig; checkpoint: Checkpoint }> {
  const config = parseWanConfig(await readJson(files, TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
  const checkpoint = await openCheckpoint(files, 'transformer', TRANSFORMER_WEIGHTS_NAME);
  checkWeights(config, checkpoint.tensors, checkpoint.source);
  return { config, checkpoint };
}

/**
 * Loads a diffusers WanTransformer3DModel folder, single-file or sharded: the config and every shard's header are
 * checked against each other before a weight is read (openTransformer), then the weights are read a run of
 * neighbouring tensors at a time (one request each: a model's norms and biases do not cost a request apiece) and
 * widened to float32. With `blocks`, only a pipeline stage's tensors are read (blocks.ts): the rest of the checkpoint
 * is never fetched.
 */
export async function loadTransformer(
  files: ModelFiles,
  onProgress?: LoadProgress,
  blocks?: BlockRange,
): Promise<WanModel> {
  const { config, checkpoint } = await openTransformer(files);
  const range = checkBlockRange(config, blocks ?? allBlocks(config));
  const held = [...checkpoint.tensors.values()].filter((t) => holdsTensor(config, range, t.name));
  const weights = await readTensors(files, held, onProgress);
  return { config, weights, ...(blocks ? { blocks: range } : {}) };
}

/**
 * What loadTransformer would read, unread: the checkpoint's entries of the blocks asked (all where none are), and a
 * model of their shapes alone (every weight's data empty), which graphs are built from before the weights are read in
 * the type a rank holds them in (held-weights.ts).
 */
export async function openTransformerShapes(
  files: ModelFiles,
  blocks?: BlockRange,
): Promise<{ shapes: WanModel; entries: TensorEntry[] }> {
  const { config, checkpoint } = await openTransformer(files);
  const range = checkBlockRange(config, blocks ?? allBlocks(config));
  const entries = [...checkpoint.tensors.values()].filter((t) => holdsTensor(config, range, t.name));
  const weights = new Map(entries.map((e) => [e.name, { shape: e.shape, data: new Float32Array(0) }]));
  return { shapes: { config, weights, ...(blocks ? { blocks: range } : {}) }, entries };
}
