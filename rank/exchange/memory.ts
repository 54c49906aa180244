import { tensorPayload, tensorValues, type DType } from '../../core/net/protocol.ts';
import { PeerLost } from '../../core/worker-api.ts';
import type { Exchange, ExchangeTag, PeerPartJudge } from '../ulysses.ts';
import { Mailbox } from './mailbox.ts';
import { tensorOf } from './mesh.ts';

/**
 * The all-to-all of P ranks in one process: each (tag, from, to) message waits in a mailbox until
 * its receiver asks. Counts payload bytes sent per rank like the WebRTC transport does.
 */
export function memoryExchanges(world: number, dtype: DType = 'f32'): (Exchange & { bytesSent: number })[] {
  const mailbox = new Mailbox<Float32Array>();
  const key = (t: ExchangeTag, from: number, to: number) =>
    `${t.job}/${t.step}/${t.pass}/${t.block}/${t.phase}/${t.group}/${from}>${to}`;

  return Array.from({ length: world }, (_, rank) => ({
    rank,
    world,
    bytesSent: 0,
    dtype,
    async allToAll(tag: ExchangeTag, parts: Float32Array[], judge?: PeerPartJudge) {
      parts.forEach((values, to) => {
        if (to === rank) return;
        const payload = tensorPayload(values, dtype);
        this.bytesSent += payload.byteLength;
        const part = tensorValues(payload, dtype); // what the receiver would get off the wire
        mailbox.deliver(key(tag, rank, to), part);
      });
      // a part beyond its bounds is its sender's lie, as over links (exchange/mesh.ts)
      const judged = (from: number) => (part: Float32Array) => {
        const beyond = judge?.(from, part);
        if (beyond) throw new PeerLost({ rank: from, cause: 'misbehaved', evidence: `${beyond}, in ${tensorOf(tag)}` });
        return part;
      };
      return Promise.all(
        parts.map((own, from) =>
          from === rank ? Promise.resolve(own) : mailbox.receive(key(tag, from, rank)).then(judged(from)),
        ),
      );
    },
  }));
}
