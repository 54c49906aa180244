import type { Link } from '../../core/net/link.ts';
import { tensorPayload, tensorValues, type DType, type Message, type TensorTag } from '../../core/net/protocol.ts';
import type { Exchange, ExchangeTag } from '../ulysses.ts';
import { PeerLost } from '../../core/worker-api.ts';
import { Mailbox } from './mailbox.ts';

/** the largest finite float16 */
const FLOAT16_MAX = 65504;

/**
 * The all-to-all of one rank over direct data channels to every other rank of its job. Tensors
 * arrive tagged; each waits in a mailbox until this rank's forward pass asks for it, so a fast
 * peer may run ahead by a phase without anything being lost.
 */
export class MeshExchange implements Exchange {
  bytesSent = 0;
  private readonly mailbox = new Mailbox<Float32Array>();
  private failure: Error | null = null;

  /** links to the other ranks, by rank */
  private readonly links = new Map<number, Link>();

  constructor(
    readonly rank: number,
    readonly world: number,
    readonly dtype: DType = 'f32',
  ) {}

  addPeer(peerRank: number, link: Link): void {
    this.links.set(peerRank, link);
    link.onMessage((msg) => this.deliver(peerRank, msg));
  }

  /** bad frames dropped on the links to the other ranks */
  framesDropped(): number {
    let n = 0;
    for (const link of this.links.values()) n += link.stats.framesDropped;
    return n;
  }

  closeLinks(reason: string): void {
    for (const link of this.links.values()) link.close(reason);
  }

  private static key(tag: TensorTag, from: number): string {
    return `${tag.job}/${tag.step}/${tag.pass}/${tag.block}/${tag.phase}<${from}`;
  }

  private deliver(peerRank: number, msg: Message): void {
    if (msg.kind !== 'tensor' || msg.dtype !== this.dtype) return;
    if (msg.from !== peerRank) return; // a rank may only speak for itself (also refused by the link's accept hook)
    const values = tensorValues(msg.data, this.dtype);
    // well-formed garbage: the right size, but NaN or infinite. Every rank checks what it sends
    // (allToAll), so such values are the sender's doing: it is blamed, and its link closed.
    if (!values.every(Number.isFinite)) {
      this.fail(new PeerLost({ rank: peerRank, cause: 'misbehaved', evidence: `sent NaN or infinite values in step ${msg.tag.step + 1}, block ${msg.tag.block}; disconnected` }));
      this.links.get(peerRank)?.close('it sent NaN or infinite values');
      return;
    }
    this.mailbox.deliver(MeshExchange.key(msg.tag, peerRank), values);
  }

  async allToAll(tag: ExchangeTag, parts: Float32Array[]): Promise<Float32Array[]> {
    if (this.failure) throw this.failure;
    // what this rank sends is finite (and fits float16 when it sends float16): else the fault is its own, not a peer's
    const limit = this.dtype === 'f16' ? FLOAT16_MAX : Number.MAX_VALUE;
    if (!parts.every((part) => part.every((v) => Math.abs(v) <= limit))) {
      throw new Error(`rank ${this.rank}'s activations in step ${tag.step + 1}, block ${tag.block} are NaN, infinite${this.dtype === 'f16' ? ' or beyond float16 (send float32 instead)' : ''}`);
    }
    const sends = parts.map((part, to) => {
      if (to === this.rank) return Promise.resolve();
      const link = this.links.get(to);
      if (!link) throw new Error(`rank ${this.rank} has no link to rank ${to}`);
      const data = tensorPayload(part, this.dtype);
      this.bytesSent += data.byteLength;
      return link.send({ kind: 'tensor', from: this.rank, tag, dtype: this.dtype, shape: [part.length], data });
    });
    const receives = parts.map((own, from) =>
      from === this.rank ? Promise.resolve(own) : this.mailbox.receive(MeshExchange.key(tag, from)),
    );
    await Promise.all(sends);
    return Promise.all(receives);
  }

  /** A peer is gone: every pending and future exchange fails with this error instead of hanging. */
  fail(error: Error): void {
    this.failure = error;
    this.mailbox.rejectAll(error);
  }
}
