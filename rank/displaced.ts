// Displaced patch parallelism (DistriFusion, Li et al., CVPR 2024), beside Ulysses: each rank owns
// its tokens for all heads, and a block's attention takes this rank's fresh keys and values with
// the other ranks' from the previous denoising step, while this step's are gathered in the
// background for the next one. The exchange leaves the critical path; the price is attention over
// keys one step stale, small because activations change little between neighbouring steps. An
// exact forward (the warm-up steps, a spot-checked forward, the first after a placement) waits
// for this step's keys and values instead, and equals Ulysses and one rank.
import type { WanConfig } from '../core/model/config.ts';
import type { UlyssesPlan } from '../core/parallel.ts';
import { concat } from '../core/tensor.ts';
import type { StageRunner } from './stages.ts';
import { ExchangePhase, type BlockAttention, type Exchange } from './ulysses.ts';

/**
 * The keys and values every rank gathered for one job, per pass and block: the newest step's
 * all-gather (still arriving, or arrived), [2, rows[j], D] from each rank j. One step per pass and
 * block is kept; a new placement starts with none.
 */
export class KeysValuesHistory {
  private readonly gathered = new Map<string, { step: number; parts: Promise<Float32Array[]> }>();

  private static key(pass: number, block: number): string {
    return `${pass}/${block}`;
  }

  /** The gather of the step before `step`, where this rank took part in it. */
  previous(pass: number, block: number, step: number): Promise<Float32Array[]> | null {
    const held = this.gathered.get(KeysValuesHistory.key(pass, block));
    return held && held.step === step - 1 ? held.parts : null;
  }

  keep(pass: number, block: number, step: number, parts: Promise<Float32Array[]>): void {
    // a gather that fails is the next forward's error, when it is awaited; not an unhandled one now
    parts.catch(() => {});
    this.gathered.set(KeysValuesHistory.key(pass, block), { step, parts });
  }

  clear(): void {
    this.gathered.clear();
  }
}

/**
 * A rank's block attention in displaced mode: its queries [Sl, D] over every rank's keys and values
 * [S, D], all heads. `stale`: the other ranks' as of the previous step where this rank holds them
 * (else this step's, waited for: exact). Sends [2, Sl, D] to each peer per block, whichever.
 */
export function displacedAttention(cfg: WanConfig, plan: UlyssesPlan, stages: StageRunner, exchange: Exchange, history: KeysValuesHistory, at: { step: number; pass: number; stale: boolean }): BlockAttention {
  const D = cfg.dim;
  const { degree: P, rows } = plan;
  const me = exchange.rank;
  return async (block, { q, k, v }, io) => {
    const own = concat([k, v]); // [2, Sl, D]
    const gather = exchange.allToAll(io.tag(block, ExchangePhase.KeysValues), new Array<Float32Array>(P).fill(own));
    const previous = at.stale ? history.previous(at.pass, block, at.step) : null;
    history.keep(at.pass, block, at.step, gather);
    const parts = await io.wait(previous ?? gather);
    // every rank's rows in token order; this rank's own always this step's
    const half = (which: 0 | 1) => concat(parts.map((part, j) => (j === me ? (which === 0 ? k : v) : part.subarray(which * rows[j] * D, (which + 1) * rows[j] * D))));
    return io.compute(stages.attention({ q, k: half(0), v: half(1) }, D)); // [Sl, D]
  };
}
