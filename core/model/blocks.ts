// Which of a transformer's tensors a pipeline stage holds: its blocks [from, to), the embedders
// (patch embedding and condition embedder) where it is the first stage, the output head where it is
// the last. A rank loads only these (transformer.ts), so no worker need hold the whole model.
import type { WanConfig } from './config.ts';

export interface BlockRange {
  from: number;
  to: number;
}

export const allBlocks = (cfg: Pick<WanConfig, 'numLayers'>): BlockRange => ({ from: 0, to: cfg.numLayers });

/** The first stage computes the forward's conditioning and tokens from its inputs. */
export const holdsEmbedders = (range: BlockRange): boolean => range.from === 0;
/** The last stage turns the tokens into the velocity's rows. */
export const holdsHead = (cfg: Pick<WanConfig, 'numLayers'>, range: BlockRange): boolean => range.to === cfg.numLayers;

/** Whether the stage holding `range` holds the tensor `name` (a diffusers state-dict key). */
export function holdsTensor(cfg: Pick<WanConfig, 'numLayers'>, range: BlockRange, name: string): boolean {
  const block = /^blocks\.(\d+)\./.exec(name);
  if (block) return Number(block[1]) >= range.from && Number(block[1]) < range.to;
  if (name.startsWith('patch_embedding.') || name.startsWith('condition_embedder.')) return holdsEmbedders(range);
  return holdsHead(cfg, range); // scale_shift_table, proj_out
}

/** A range of the model's blocks, checked: [from, to) non-empty within 0–numLayers. */
export function checkBlockRange(cfg: Pick<WanConfig, 'numLayers'>, range: BlockRange): BlockRange {
  const { from, to } = range;
  if (!(Number.isInteger(from) && Number.isInteger(to) && from >= 0 && from < to && to <= cfg.numLayers))
    throw new Error(`the transformer has blocks 0–${cfg.numLayers - 1}: a stage cannot hold [${from}, ${to})`);
  return range;
}
