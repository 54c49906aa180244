import { tensorPayload, tensorValues, type DType } from '../../core/net/protocol.ts';
import { PeerLost } from '../../core/worker-api.ts';
import type { Exchange, ExchangeTag, PeerPartJudge, PointToPoint } from '../ulysses.ts';
import type { ExchangeLedger, KeepsEvidence } from './ledger.ts';
import { Mailbox } from './mailbox.ts';
import { tensorOf } from './mesh.ts';

/** A tensor as it crosses: its payload as the wire carries it, with its sender's signature where it signs. */
interface Sent {
  payload: Uint8Array;
  signature: Uint8Array | undefined;
}

/**
 * The all-to-all of P ranks in one process: each (tag, from, to) message waits in a mailbox until
 * its receiver asks. Counts payload bytes sent per rank like the WebRTC transport does, and signs
 * and receipts tensors as it does where a rank keeps evidence (keepEvidence).
 */
export function memoryExchanges(world: number, dtype: DType = 'f32'): (Exchange & PointToPoint & KeepsEvidence)[] {
  const mailbox = new Mailbox<Sent>();
  const key = (t: ExchangeTag, from: number, to: number) =>
    `${t.job}/${t.step}/${t.pass}/${t.block}/${t.phase}/${t.group}/${from}>${to}`;

  return Array.from({ length: world }, (_, rank) => {
    let ledger: ExchangeLedger | null = null;
    const exchange = {
      rank,
      world,
      bytesSent: 0,
      dtype,
      keepEvidence(kept: ExchangeLedger) {
        ledger = kept;
      },
      send(tag: ExchangeTag, to: number, values: Float32Array) {
        const payload = tensorPayload(values, dtype);
        exchange.bytesSent += payload.byteLength;
        mailbox.deliver(key(tag, rank, to), { payload, signature: ledger?.seal(tag, to, payload) });
        return Promise.resolve();
      },
      // a part beyond its bounds, or unsigned, is its sender's lie, as over links (exchange/mesh.ts)
      receive(tag: ExchangeTag, from: number, judge?: PeerPartJudge) {
        return mailbox.receive(key(tag, from, rank)).then((sent) => {
          const part = tensorValues(sent.payload, dtype); // what the receiver gets off the wire
          const beyond = judge?.(from, part) ?? ledger?.accept(tag, from, sent.payload, sent.signature);
          if (beyond)
            throw new PeerLost({ rank: from, cause: 'misbehaved', evidence: `${beyond}, in ${tensorOf(tag)}` });
          return part;
        });
      },
      allToAll(tag: ExchangeTag, parts: Float32Array[], judge?: PeerPartJudge) {
        // delivered at once, in this call: a peer already waiting has its part before this rank waits for theirs
        parts.forEach((values, to) => void (to === rank || exchange.send(tag, to, values)));
        return Promise.all(
          parts.map((own, from) => (from === rank ? Promise.resolve(own) : exchange.receive(tag, from, judge))),
        );
      },
    };
    return exchange;
  });
}
