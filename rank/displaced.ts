// Displaced patch parallelism (DistriFusion, Li et al., CVPR 2024), beside Ulysses: each rank owns
// its tokens for all heads, and a block's attention takes this rank's fresh keys and values with
// the other ranks' from the previous denoising step, while this step's are gathered in the
// background for the next one. The exchange leaves the critical path; the price is attention over
// keys one step stale, small because activations change little between neighbouring steps. An
// exact forward (the warm-up steps, the first after a placement) waits for this step's keys and
// values instead, and equals Ulysses and one rank. Over a quantizing transport (int8, int4) keys
// and values go as deltas with error feedback (sendsDeltas). A spot-checked forward goes as any
// other: the checker, a rank of the group, recomputes each rank's rows from the step before's keys
// and values it holds too (heldStaleAttention), so the group cannot tell a checked forward.
import type { WanConfig } from '../core/model/config.ts';
import type { UlyssesPlan } from '../core/parallel.ts';
import { tensorPayload, tensorValues, type DType } from '../core/net/protocol.ts';
import { add, concat, subtract } from '../core/tensor.ts';
import type { QKV, StageRunner } from './stages.ts';
import { ExchangePhase, type BlockAttention, type BlockIO, type Exchange } from './ulysses.ts';
import { judgeMatrices } from './bounds.ts';

/** One gather of a pass and block: its step, what this rank's peers hold of its keys and values, and every rank's. */
interface Gathered {
  step: number;
  /** this rank's keys and values as its peers reconstruct them (the values themselves without deltas) */
  sent: Float32Array;
  /** [2, rows[j], D] of each rank j, as this rank holds them (still arriving, or arrived) */
  parts: Promise<Float32Array[]>;
}

/**
 * The keys and values every rank gathered for one job, per pass and block: the newest step's
 * all-gather, and the one before it (what a spot check of the newest step's forward attends to).
 * A new placement or job starts with none, on every rank alike (so senders and receivers of deltas
 * agree on what they are deltas of).
 */
export class KeysValuesHistory {
  private readonly gathered = new Map<string, { latest: Gathered; before: Gathered | null }>();

  private static key(pass: number, block: number): string {
    return `${pass}/${block}`;
  }

  /** The newest gather of this pass and block, where this rank took part in one. */
  latest(pass: number, block: number): Gathered | null {
    return this.gathered.get(KeysValuesHistory.key(pass, block))?.latest ?? null;
  }

  /** This pass and block's gather of `step`, where this rank holds it (of the newest two). */
  ofStep(pass: number, block: number, step: number): Gathered | null {
    const held = this.gathered.get(KeysValuesHistory.key(pass, block));
    return [held?.latest, held?.before].find((g) => g?.step === step) ?? null;
  }

  keep(pass: number, block: number, gathered: Gathered): void {
    // a gather that fails is the next forward's error, when it is awaited; not an unhandled one now
    gathered.parts.catch(() => {});
    const key = KeysValuesHistory.key(pass, block);
    this.gathered.set(key, { latest: gathered, before: this.gathered.get(key)?.latest ?? null });
  }

  clear(): void {
    this.gathered.clear();
  }
}

/**
 * Whether keys and values go as their change since the last gather (error feedback): a quantizing
 * transport's error is then a fraction of a step's change, not of the values, and does not pile
 * up, since each delta is taken from what the peers reconstructed. Float transports send values.
 */
const sendsDeltas = (dtype: DType): boolean => dtype === 'i8' || dtype === 'i4';

/**
 * A rank's block attention in displaced mode: its queries [Sl, D] over every rank's keys and values
 * [S, D], all heads. `stale`: the other ranks' as of the previous step where this rank holds them
 * (else this step's, waited for: exact up to the transport). Sends [2, Sl, D] (or its delta) to
 * each peer per block, whichever.
 */
export function displacedAttention(
  cfg: WanConfig,
  plan: UlyssesPlan,
  stages: StageRunner,
  exchange: Exchange,
  history: KeysValuesHistory,
  at: { step: number; pass: number; stale: boolean },
): BlockAttention {
  const P = plan.degree;
  const me = exchange.rank;
  const deltas = sendsDeltas(exchange.dtype);
  return async (block, { q, k, v }, io) => {
    const own = concat([k, v]); // [2, Sl, D]
    const before = history.latest(at.pass, block);
    // over deltas, each peer's keys and values are rebuilt on the ones held from its last gather
    const held = deltas && before ? await io.wait(before.parts) : null;
    let send = own;
    let sent = own;
    if (held && before) {
      // the delta as the peers will have it off the wire: what they reconstruct, exactly as here
      send = subtract(own, before.sent);
      sent = add(before.sent, tensorValues(tensorPayload(send, exchange.dtype), exchange.dtype));
    } else if (deltas) sent = tensorValues(tensorPayload(own, exchange.dtype), exchange.dtype);
    // each peer's part rebuilt once: by its judge where it has one, else as the parts are gathered
    const rebuilt: Float32Array[] = [];
    const rebuild = (from: number, part: Float32Array) => (rebuilt[from] ??= held ? add(held[from], part) : part);
    // a peer's k and v of its tokens, all heads, as rebuilt: a delta in bounds each step can still walk the
    // values out of them, so the values are judged, each within the error of the transport's last crossing
    // (error feedback: the rebuilt values are the sender's own up to its newest delta's rounding, whose scale
    // a delta spanning two values in bounds sets)
    const limits = io.limits(block);
    const judge =
      limits &&
      judgeMatrices(
        (['k', 'v'] as const).map((name) => ({
          name: held ? `${name} (rebuilt from its change)` : name,
          limits: limits[name],
        })),
        exchange.dtype,
        held ? 2 : 1,
      );
    const received = io.onWire(
      exchange.allToAll(
        io.tag(block, ExchangePhase.KeysValues),
        new Array<Float32Array>(P).fill(send),
        judge ? (from, part) => judge(rebuild(from, part)) : undefined,
      ),
    );
    const parts = received.then((got) => got.map((part, j) => (j === me ? sent : rebuild(j, part))));
    const previous = at.stale && before?.step === at.step - 1 ? before.parts : null;
    history.keep(at.pass, block, { step: at.step, sent, parts });
    const kv = await io.wait(previous ?? parts);
    return attendOver(cfg, plan, stages, me, { q, k, v }, kv, io);
  };
}

/**
 * Rank `me`'s attention: its queries [Sl, D] over its own keys and values, this step's, and the other ranks' in `kv`
 * ([2, rows[j], D] of each rank j), in token order.
 */
function attendOver(
  cfg: WanConfig,
  plan: UlyssesPlan,
  stages: StageRunner,
  me: number,
  { q, k, v }: QKV,
  kv: Float32Array[],
  io: BlockIO,
): Promise<Float32Array> {
  const D = cfg.dim;
  const { rows } = plan;
  const half = (which: 0 | 1) =>
    concat(
      kv.map((part, j) =>
        j === me ? (which === 0 ? k : v) : part.subarray(which * rows[j] * D, (which + 1) * rows[j] * D),
      ),
    );
  return io.compute(stages.attention({ q, k: half(0), v: half(1) }, D)); // [Sl, D]
}

/**
 * Rank `me`'s block attention as its group ran a stale forward of `at.step`, recomputed by another rank of the
 * group (a spot check): `me`'s own keys and values fresh, the other ranks' as this rank holds them from the step
 * before, which are what `me` held too (deltas are reconstructed alike on every rank). Sends nothing.
 */
export function heldStaleAttention(
  cfg: WanConfig,
  plan: UlyssesPlan,
  stages: StageRunner,
  history: KeysValuesHistory,
  at: { step: number; pass: number },
  me: number,
): BlockAttention {
  return async (block, qkv, io) => {
    const before = history.ofStep(at.pass, block, at.step - 1);
    if (!before)
      throw new Error(
        `a stale recompute of step ${at.step} (pass ${at.pass}) needs the keys and values of the step before, ` +
          'which this rank does not hold: the checker must be a rank of the group that ran it',
      );
    return attendOver(cfg, plan, stages, me, qkv, await io.wait(before.parts), io);
  };
}
