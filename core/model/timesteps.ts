// A forward's timestep. WanTransformer3DModel takes one for the batch ([B]) or one per token ([B, S]): Wan2.2's
import type { TokenGrid } from './tokens.ts';
// pipelines set `expand_timesteps` and give the tokens of an image's first latent frame timestep 0, the rest the
// step's. The graphs compute the time embedding once per distinct value and gather each token's modulation by its
// index, so a forward whose tokens share one timestep gathers the same row for each and equals the scalar forward to
// the bit, and one whose tokens take two values costs two embeddings, not one per token.

/** One timestep for every token, or one per token in sequence order (a rank's: one per row it holds). */
export type Timestep = number | Float32Array;

/** the values a timestep may take: diffusers' schedulers give [0, num_train_timesteps = 1000] */
export const TIMESTEP_RANGE = { min: 0, max: 1000 } as const;

/** A forward's timesteps as the graphs take them: the distinct values, and each token's index into them. */
export interface TimestepLevels {
  values: Float32Array;
  /** [tokens]: each token's value's index in `values` */
  index: Int32Array;
}

/** The timesteps of `tokens` tokens as distinct values and each token's index; a per-token one must have `tokens`. */
export function timestepLevels(timestep: Timestep, tokens: number): TimestepLevels {
  if (typeof timestep === 'number') return { values: Float32Array.of(timestep), index: new Int32Array(tokens) };
  if (timestep.length !== tokens)
    throw new RangeError(`a timestep per token: ${timestep.length} timesteps for ${tokens} tokens`);
  const levelOf = new Map<number, number>();
  const index = Int32Array.from(timestep, (t) => {
    let level = levelOf.get(t);
    if (level === undefined) levelOf.set(t, (level = levelOf.size));
    return level;
  });
  return { values: Float32Array.from(levelOf.keys()), index };
}

/** The timesteps of tokens [start, start + count): a rank's rows of the sequence. */
export const timestepRows = (timestep: Timestep, start: number, count: number): Timestep =>
  typeof timestep === 'number' ? timestep : timestep.slice(start, start + count);

/** How many distinct values the timestep of `tokens` tokens has: the rows of its time embedding. */
export const timestepLevelCount = (timestep: Timestep, tokens: number): number =>
  timestepLevels(timestep, tokens).values.length;

/** Why a timestep from another peer cannot be this forward's of `tokens` tokens, or null where it can. */
export function timestepError(timestep: Timestep, tokens: number): string | null {
  const values = typeof timestep === 'number' ? [timestep] : timestep;
  if (typeof timestep !== 'number' && timestep.length !== tokens)
    return `it has ${timestep.length} timesteps for ${tokens} tokens`;
  for (const t of values)
    if (!(t >= TIMESTEP_RANGE.min && t <= TIMESTEP_RANGE.max))
      return `a timestep of ${t} is outside [${TIMESTEP_RANGE.min}, ${TIMESTEP_RANGE.max}]`;
  return null;
}

/**
 * An image held as the first latent frame (diffusers' expand_timesteps with an image): that frame's tokens at 0, the
 * rest at `t` — `(first_frame_mask[0][0][:, ::2, ::2] * t).flatten()`, the mask 0 on the first frame, 1 after.
 */
export function firstFrameHeldTimesteps(grid: Pick<TokenGrid, 'count' | 'frames'>, t: number): Float32Array {
  const firstFrameTokens = grid.count / grid.frames;
  return Float32Array.from({ length: grid.count }, (_, token) => (token < firstFrameTokens ? 0 : t));
}
