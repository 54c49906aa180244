import type { Link } from '../../core/net/link.ts';
import {
  quantizedScalesHonest,
  tensorPayload,
  tensorValues,
  type DType,
  type Message,
  type TensorTag,
} from '../../core/net/protocol.ts';
import {
  exchangePhase,
  ExchangePhase,
  type Exchange,
  type ExchangeTag,
  type PeerPartJudge,
  type PointToPoint,
} from '../ulysses.ts';
import { PeerLost } from '../../core/worker-api.ts';
import { allWithin } from '../../core/tensor.ts';
import { Mailbox } from './mailbox.ts';
import type { ExchangeLedger, KeepsEvidence } from './ledger.ts';

/** the largest finite float16 */
const FLOAT16_MAX = 65504;
/** tensors a peer may send ahead of this rank: one phase at most in lockstep, with room (head groups: allowAhead) */
export const MAX_AHEAD = 4;
/**
 * How long a rank waits for a peer's tensor, hearing nothing from it, before naming it silent,
 * until its job says (prepareJob: half the coordinator's patience for a forward).
 */
export const EXCHANGE_TIMEOUT_MS = 60_000;

/** A tensor's place in a job, for evidence against its sender: "step 3, block 1, phase 0, head group 2". */
export const tensorOf = (tag: TensorTag): string =>
  `step ${tag.step + 1}, block ${tag.block}, phase ${tag.phase}${tag.group ? `, head group ${tag.group}` : ''}`;

/**
 * Whether what a rank sends under `tag` was computed from its peers' tensors: attention output
 * always is, and so is every block's input after the first (the attention before it was).
 */
function computedFromPeers(tag: ExchangeTag): boolean {
  const phase = exchangePhase(tag.phase);
  return phase === ExchangePhase.Output || (phase !== ExchangePhase.Probe && tag.block > 0);
}

/**
 * A rank's own activations went NaN or infinite from its peers' tensors, each within the bounds the
 * model implies (rank/bounds.ts): the bounds did not hold, and the rank can convict nobody, itself
 * included. Its peers' tensors were checked; its own arithmetic is the same as theirs.
 */
export class UnboundedFromPeers extends Error {
  override name = 'UnboundedFromPeers';
}

/**
 * The all-to-all of one rank over direct data channels to every other rank of its job. Tensors
 * arrive tagged; each waits in a mailbox until this rank's forward pass asks for it, so a fast
 * peer may run ahead by a phase without anything being lost.
 */
export class MeshExchange implements Exchange, PointToPoint, KeepsEvidence {
  bytesSent = 0;
  /** each tensor's values, with its payload and signature for the ledger */
  private readonly mailbox = new Mailbox<{ values: Float32Array; data: Uint8Array; signature?: Uint8Array }>();
  private failure: Error | null = null;
  /** the newest step this rank's forwards are in (a guided step runs its two passes at once), the probe's aside */
  private current: { job: number; step: number } | null = null;
  /** per peer, the keys of tensors kept for phases this rank has not reached */
  private readonly ahead = new Map<number, Set<string>>();
  /** tensors refused whole: of a forward already past, or of another dtype */
  private refused = 0;
  /** the newest job seen on this mesh */
  private newestJob: number | null = null;
  /** tensors a peer may send ahead of this rank (allowAhead) */
  private maxAhead = MAX_AHEAD;
  /** what signs this rank's tensors and keeps receipts of its peers' (keepEvidence) */
  private ledger: ExchangeLedger | null = null;

  /** links to the other ranks, by rank */
  private readonly links = new Map<number, Link>();

  constructor(
    readonly rank: number,
    readonly world: number,
    readonly dtype: DType = 'f32',
    private timeoutMs = EXCHANGE_TIMEOUT_MS,
  ) {}

  waitAtMost(ms: number): void {
    this.timeoutMs = ms;
  }

  keepEvidence(ledger: ExchangeLedger): void {
    this.ledger = ledger;
  }

  allowAhead(tensors: number): void {
    this.maxAhead = Math.max(MAX_AHEAD, tensors);
  }

  addPeer(peerRank: number, link: Link): void {
    this.links.set(peerRank, link);
    link.onMessage((msg) => this.deliver(peerRank, msg));
  }

  /** bad frames dropped on the links to the other ranks, and tensors refused whole */
  framesDropped(): number {
    let n = this.refused;
    for (const link of this.links.values()) n += link.stats.framesDropped;
    return n;
  }

  closeLinks(reason: string): void {
    for (const link of this.links.values()) link.close(reason);
  }

  private static key(tag: TensorTag, from: number): string {
    return `${tag.job}/${tag.step}/${tag.pass}/${tag.block}/${tag.phase}/${tag.group}<${from}`;
  }

  private deliver(peerRank: number, msg: Message): void {
    if (msg.kind !== 'tensor') return;
    const key = MeshExchange.key(msg.tag, peerRank);
    // a gather this rank still waits for is never past (displaced mode awaits it a step later)
    const past = this.isPast(msg.tag) && !this.mailbox.awaited(key);
    // a rank speaks only for itself (its link refuses it too)
    if (msg.dtype !== this.dtype || msg.from !== peerRank || past) {
      this.refused++;
      return;
    }
    const values = tensorValues(msg.data, this.dtype);
    // well-formed garbage: the right size, but NaN or infinite. Every rank checks what it sends
    // (allToAll), so such values are the sender's doing: it is blamed, and its link closed.
    if (!allWithin(values)) {
      this.misbehaved(peerRank, `sent NaN or infinite values in step ${msg.tag.step + 1}, block ${msg.tag.block}`);
      return;
    }
    // a scale no quantizer writes (beyond every value of its group) is a lie of its own
    if ((this.dtype === 'i8' || this.dtype === 'i4') && !quantizedScalesHonest(msg.data, this.dtype)) {
      this.misbehaved(peerRank, `sent ${this.dtype} scales its values do not reach in ${tensorOf(msg.tag)}`);
      return;
    }
    this.dropBefore(msg.tag.job);
    const kept = this.ahead.get(peerRank) ?? new Set<string>();
    this.ahead.set(peerRank, kept);
    // in lockstep a peer is at most a phase or two ahead (a forward's blocks, displaced): more is a
    // flood, the same tensor twice a lie
    if (kept.size >= this.maxAhead || kept.has(key)) {
      this.misbehaved(
        peerRank,
        kept.has(key)
          ? `sent the tensor of ${tensorOf(msg.tag)} twice`
          : `sent ${this.maxAhead + 1} tensors ahead of this rank`,
      );
      return;
    }
    const received = { values, data: msg.data, ...(msg.signature && { signature: msg.signature }) };
    if (this.mailbox.deliver(key, received) === 'kept') kept.add(key);
  }

  /**
   * A new job on this mesh (this rank's, or a peer's tensors of it arriving first): what earlier
   * jobs left unasked (a forward cut short) is dropped, not held against its sender.
   */
  private dropBefore(job: number): void {
    if (this.newestJob !== null && job <= this.newestJob) return;
    this.newestJob = job;
    for (const kept of this.ahead.values())
      for (const key of kept) {
        if (Number(key.split('/')[0]) >= job) continue;
        this.mailbox.drop(key);
        kept.delete(key);
      }
  }

  private misbehaved(peerRank: number, evidence: string): PeerLost {
    const error = new PeerLost({ rank: peerRank, cause: 'misbehaved', evidence: `${evidence}; disconnected` });
    this.fail(error);
    this.links.get(peerRank)?.close(evidence);
    return error;
  }

  /** A tensor of a forward this rank has left (the probe's exchanges aside, which precede every forward). */
  private isPast(tag: TensorTag): boolean {
    const now = this.current;
    if (!now || exchangePhase(tag.phase) === ExchangePhase.Probe) return false;
    if (tag.job !== now.job) return tag.job < now.job; // a coordinator numbers its jobs upwards
    return tag.step < now.step; // both passes of a step before were done before this one started
  }

  async allToAll(tag: ExchangeTag, parts: Float32Array[], judge?: PeerPartJudge): Promise<Float32Array[]> {
    if (this.failure) throw this.failure;
    this.enter(tag);
    // displaced mode sends one part to every peer: each distinct part is checked and encoded once
    this.checkOwn(tag, [...new Set(parts)]);
    // encoded once each where sent: this rank's own part stays here
    const payloads = new Map<Float32Array, Uint8Array>();
    const payloadOf = (part: Float32Array) => {
      let payload = payloads.get(part);
      if (!payload) payloads.set(part, (payload = tensorPayload(part, this.dtype)));
      return payload;
    };
    const sends = parts.map((part, to) =>
      to === this.rank ? Promise.resolve() : this.sendPayload(tag, to, payloadOf(part), part.length),
    );
    const receives = parts.map((own, from) =>
      from === this.rank ? Promise.resolve(own) : this.receive(tag, from, judge),
    );
    await Promise.all(sends);
    return await Promise.all(receives);
  }

  /** One part to one peer (a pipeline stage's hand-off): checked as allToAll checks what it sends. */
  send(tag: ExchangeTag, to: number, part: Float32Array): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    this.enter(tag);
    this.checkOwn(tag, [part]);
    return this.sendPayload(tag, to, tensorPayload(part, this.dtype), part.length);
  }

  /** this rank's job and step from now on: a peer's tensor of a step before is past (isPast) */
  private enter(tag: ExchangeTag): void {
    this.dropBefore(tag.job);
    const now = this.current;
    if (
      tag.phase !== ExchangePhase.Probe &&
      (!now || tag.job > now.job || (tag.job === now.job && tag.step > now.step))
    )
      this.current = { job: tag.job, step: tag.step };
  }

  /** What this rank sends is finite (and fits float16 when it sends float16): else the fault is its own. */
  private checkOwn(tag: ExchangeTag, parts: Float32Array[]): void {
    const limit = this.dtype === 'f16' ? FLOAT16_MAX : Number.MAX_VALUE;
    if (parts.every((part) => allWithin(part, limit))) return;
    // its peers hear of it at once (their links close), rather than wait for what will not come
    const beyond = this.dtype === 'f16' ? ' or beyond float16 (send float32 instead)' : '';
    const error = computedFromPeers(tag)
      ? new UnboundedFromPeers(
          `rank ${this.rank} computed NaN, infinite${beyond} activations for ${tensorOf(tag)} from its ` +
            "peers' tensors, each within the bounds its model implies: the bounds do not hold here, " +
            'so it blames no rank, itself included',
        )
      : new Error(
          `rank ${this.rank}'s activations in step ${tag.step + 1}, block ${tag.block} are NaN, infinite${beyond}`,
        );
    this.fail(error);
    this.closeLinks(error.message);
    throw error;
  }

  private sendPayload(tag: ExchangeTag, to: number, data: Uint8Array, values: number): Promise<void> {
    const link = this.links.get(to);
    if (!link) throw new Error(`rank ${this.rank} has no link to rank ${to}`);
    this.bytesSent += data.byteLength;
    const signature = this.ledger?.seal(tag, to, data);
    return link.send({
      kind: 'tensor',
      from: this.rank,
      tag,
      dtype: this.dtype,
      shape: [values],
      data,
      ...(signature && { signature }),
    });
  }

  /**
   * Peer `from`'s part of `tag`, judged: a peer that withholds it is named before the coordinator's call times out.
   * Silent means nothing heard from it for timeoutMs (its part still arriving over a slow link is not).
   */
  receive(tag: ExchangeTag, from: number, judge?: PeerPartJudge): Promise<Float32Array> {
    if (this.failure) return Promise.reject(this.failure);
    this.enter(tag);
    const key = MeshExchange.key(tag, from);
    this.ahead.get(from)?.delete(key);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const watch = (since: number) => {
      timer = setTimeout(
        () => {
          const heard = this.links.get(from)?.lastHeardAt ?? 0;
          if (heard > since) {
            watch(heard);
            return;
          }
          this.fail(
            new PeerLost({
              rank: from,
              cause: 'silent',
              evidence: `sent no tensor for ${tensorOf(tag)} in ${(this.timeoutMs / 1000).toFixed(0)} s`,
            }),
          );
        },
        Math.max(0, since + this.timeoutMs - Date.now()),
      );
    };
    watch(Date.now());
    return this.mailbox
      .receive(key)
      .finally(() => clearTimeout(timer))
      .then(({ values, data, signature }) => {
        // finite, but beyond what the sender's layer can produce: a lie, never computed from
        const beyond = judge?.(from, values);
        if (beyond) throw this.misbehaved(from, `${beyond}, in ${tensorOf(tag)}`);
        // within, and unsigned or not as signed: the sender's doing (or its link's, which is its own)
        const unproven = this.ledger?.accept(tag, from, data, signature);
        if (unproven) throw this.misbehaved(from, `${unproven} in ${tensorOf(tag)}`);
        return values;
      });
  }

  /** A peer is gone: every pending and future exchange fails with this error instead of hanging. */
  fail(error: Error): void {
    this.failure = error;
    this.mailbox.rejectAll(error);
  }
}
