// PipeFusion (xDiT: Fang et al., "PipeFusion: Patch-level Pipeline Parallelism for Diffusion Transformers
// Inference", 2024), on a pipeline stage's worker: the coordinator sends the sequence a patch at a time, so
// that while this stage computes patch m the stage after it computes patch m − 1, and every stage is busy.
// Each block keeps every token's keys and values [2, S, D] per pass: a patch's own, just computed, are written
// over the ones held, and its queries attend over all of them: the patches before it as of this step, those
// after it as of the step before (activations change little between neighbouring steps, as displaced mode
// relies on too). A forward of the whole sequence as one patch is exact, and fills them.
import type { WanConfig } from '../core/model/config.ts';
import { tokenStart, type UlyssesPlan } from '../core/parallel.ts';
import type { StageRunner } from './stages.ts';
import type { BlockAttention } from './ulysses.ts';

/** Every token's keys and values per pass and block, as this rank last computed them, and the step it did. */
export class PatchKeysValues {
  private readonly held = new Map<string, { step: number; kv: Float32Array }>();

  get(pass: number, block: number) {
    return this.held.get(`${pass}/${block}`) ?? null;
  }

  set(pass: number, block: number, step: number, kv: Float32Array): void {
    this.held.set(`${pass}/${block}`, { step, kv });
  }

  clear(): void {
    this.held.clear();
  }
}

/**
 * A block's attention for patch `at.patch` of `plan` (its rank), all heads: its fresh keys and values written over
 * the held ones, its queries [Sl, D] over all of them [S, D]. A patch of several needs every token's of this pass
 * from this step or the one before (an exact forward of the whole sequence first).
 */
export function pipeFusionAttention(
  cfg: WanConfig,
  plan: UlyssesPlan,
  stages: StageRunner,
  held: PatchKeysValues,
  at: { step: number; pass: number; patch: number },
): BlockAttention {
  const D = cfg.dim;
  const S = plan.tokens;
  return async (block, { q, k, v }, io) => {
    const before = held.get(at.pass, block);
    const whole = plan.degree === 1;
    if (!whole && !(before && before.kv.length === 2 * S * D && before.step >= at.step - 1))
      throw new Error(
        `PipeFusion's patch ${at.patch + 1} of ${plan.degree} (step ${at.step}, pass ${at.pass}, block ${block}) ` +
          `attends to every token's keys and values of this step or the one before, and this rank holds ` +
          (before ? `step ${before.step}'s` : 'none') +
          ': a forward of the whole sequence comes first',
      );
    const kv = whole ? new Float32Array(2 * S * D) : (before?.kv ?? new Float32Array(0));
    const start = tokenStart(plan, at.patch) * D;
    kv.set(k, start);
    kv.set(v, S * D + start);
    held.set(at.pass, block, at.step, kv);
    return io.compute(stages.attention({ q, k: kv.subarray(0, S * D), v: kv.subarray(S * D) }, D));
  };
}
