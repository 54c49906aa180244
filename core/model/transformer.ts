import { defined } from '../defined.ts';
import { readTensorRun, tensorRuns, type TensorMap } from '../safetensors.ts';
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

const READS_IN_FLIGHT = 4;

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
  const total = held.reduce((sum, t) => sum + t.end - t.begin, 0);
  const weights: TensorMap = new Map();
  let loaded = 0;
  // a few reads in flight: one request at a time leaves a page's link idle between them
  const queue = tensorRuns(held);
  const reader = async () => {
    try {
      for (let run = queue.shift(); run; run = queue.shift()) {
        const tensors = await readTensorRun(files, run);
        run.forEach((entry, i) => weights.set(entry.name, tensors[i]));
        onProgress?.((loaded += run.reduce((sum, e) => sum + e.end - e.begin, 0)), total);
      }
    } catch (e) {
      queue.length = 0; // one read failed: the other readers stop rather than read on after the load
      throw e;
    }
  };
  await Promise.all(Array.from({ length: READS_IN_FLIGHT }, reader));
  // in the checkpoint's order, not the order the reads finished in
  const ordered = held.map(({ name }) => [name, defined(weights.get(name), name)] as const);
  return { config, weights: new Map(ordered), ...(blocks ? { blocks: range } : {}) };
}
