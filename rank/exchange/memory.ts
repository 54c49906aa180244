import { tensorPayload, tensorValues, type DType } from '../../core/net/protocol.ts';
import type { Exchange, ExchangeTag } from '../ulysses.ts';

/**
 * The all-to-all of P ranks in one process: each (tag, from, to) message waits in a mailbox until
 * its receiver asks. Counts payload bytes sent per rank like the WebRTC transport does.
 */
export function memoryExchanges(world: number, dtype: DType = 'f32'): (Exchange & { bytesSent: number })[] {
  const mailbox = new Map<string, { value?: Float32Array; resolve?: (v: Float32Array) => void }>();
  const key = (t: ExchangeTag, from: number, to: number) => `${t.job}/${t.step}/${t.pass}/${t.block}/${t.phase}/${from}>${to}`;
  const slot = (k: string) => mailbox.get(k) ?? mailbox.set(k, {}).get(k)!;

  return Array.from({ length: world }, (_, rank) => ({
    rank,
    world,
    bytesSent: 0,
    dtype,
    async allToAll(tag: ExchangeTag, parts: Float32Array[]) {
      parts.forEach((values, to) => {
        if (to === rank) return;
        const payload = tensorPayload(values, dtype);
        this.bytesSent += payload.byteLength;
        const part = tensorValues(payload, dtype); // what the receiver would get off the wire
        const s = slot(key(tag, rank, to));
        if (s.resolve) s.resolve(part);
        else s.value = part;
      });
      return Promise.all(
        parts.map((own, from) => {
          if (from === rank) return own;
          const k = key(tag, from, rank);
          const s = slot(k);
          const take = (v: Float32Array) => (mailbox.delete(k), v);
          return s.value ? take(s.value) : new Promise<Float32Array>((resolve) => (s.resolve = (v) => resolve(take(v))));
        }),
      );
    },
  }));
}
