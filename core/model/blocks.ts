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

/**
 * What passes from one pipeline stage to the next for one rank's tokens: the residual stream and the
 * forward's conditioning, which only the first stage, holding the embedders, can compute.
 */
export interface HiddenState {
  x: Float32Array; // [Sl, D]
  temb: Float32Array; // [D]
  tproj: Float32Array; // [6, D]
  context: Float32Array; // [L, D]
}

/** Floats of a hidden state of `rows` tokens over a text of `textRows` rows: x, temb and tproj (7 rows), context. */
export const hiddenStateFloats = (dim: number, rows: number, textRows: number): number => (rows + 7 + textRows) * dim;

/**
 * Why a hidden state that came over the wire is not one of `rows` tokens of a forward over a text of
 * `textRows` rows, or null where it is: each part its exact size, every value finite.
 */
export function hiddenStateError(
  cfg: Pick<WanConfig, 'dim'>,
  hidden: HiddenState,
  rows: number,
  textRows: number,
): string | null {
  const D = cfg.dim;
  const expected: [keyof HiddenState, number, string][] = [
    ['x', rows * D, `${rows}×${D}`],
    ['temb', D, `${D}`],
    ['tproj', 6 * D, `6×${D}`],
    ['context', textRows * D, `${textRows}×${D}`],
  ];
  for (const [part, floats, shape] of expected) {
    const values = hidden[part];
    if (values.length !== floats) return `its ${part} has ${values.length} values, not ${shape}`;
    if (!values.every(Number.isFinite)) return `its ${part} has NaN or infinite values`;
  }
  return null;
}
