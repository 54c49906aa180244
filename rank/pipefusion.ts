// PipeFusion (xDiT: Fang et al., "PipeFusion: Patch-level Pipeline Parallelism for Diffusion Transformers
// Inference", 2024), on a pipeline stage's worker: the coordinator sends the sequence a patch at a time, so
// that while this stage computes patch m the stage after it computes patch m − 1, and every stage is busy.
// Each block keeps every token's keys and values [2, S, D] per pass: a patch's own, just computed, are written
// over the ones held, and its queries attend over all of them: the patches before it as of this step, those
// after it as of the step before (activations change little between neighbouring steps, as displaced mode
// relies on too). A forward of the whole sequence as one patch is exact, and fills them.
import type { WanConfig } from '../core/model/config.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { gatherLatent, planUlysses, scatterLatent, tokenStart, type UlyssesPlan } from '../core/parallel.ts';
import type { Tensor } from '../core/tensor.ts';
import type { StageRunner } from './stages.ts';
import { forwardRank, placeOnly, type BlockAttention, type ForwardInput } from './ulysses.ts';

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

/**
 * A whole forward in `count` PipeFusion patches in this process (demo/generate.ts): each patch in turn through every
 * block, as stages pass it on (a stage's boundary moves the hidden state, it changes no number); one patch is exact.
 */
export async function forwardInPatches(
  cfg: WanConfig,
  stages: StageRunner,
  { latent, timestep, text, tag }: { latent: Tensor; timestep: number; text: Float32Array; tag: ForwardInput['tag'] },
  count: number,
  held: PatchKeysValues,
): Promise<Tensor> {
  const grid = tokenGrid(cfg, latent.shape);
  const plan = planUlysses(cfg, grid.count, count);
  const patches = scatterLatent(cfg, plan, latent);
  const rows: Float32Array[] = [];
  for (let patch = 0; patch < count; patch++) {
    const attend = pipeFusionAttention(cfg, plan, stages, held, { ...tag, patch });
    const input = { patches: patches[patch], timestep, text, grid, tag };
    rows.push(
      await forwardRank(cfg, plan, stages, placeOnly(patch, count, 'a PipeFusion patch'), input, undefined, attend),
    );
  }
  return gatherLatent(cfg, plan, rows, latent.shape);
}
