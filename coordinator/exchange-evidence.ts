// Who sent a wrong tensor (issue 33). A rank that sends its peers queries, keys, values or attention
// outputs within the model's bounds but wrong spoils every rank's rows of the forward alike: a spot
// check sees the group's rows wrong, not whose doing it was. Every rank keeps a receipt of each
// tensor it received, signed by its sender (core/net/signing.ts); a rank recomputing the group's
// forward in-process gives what each tensor should have been. The first exchange of the forward at
// which a received tensor differs from it names its senders: the tensors before it were right, so
// what those senders computed from them was theirs alone. A receipt whose signature does not hold
// names its holder, who kept what no sender signed.
// Exact only where every rank computes bit for bit alike (the executor asks it of tabs on WASM alone).
import { fromHex, verifyPayload } from '../core/net/signing.ts';
import { SIGNATURE_BYTES } from '../core/net/protocol.ts';
import type { ExchangeReceipt, ForwardKey } from '../core/worker-api.ts';
import { exchangePhase, ExchangePhase } from '../rank/ulysses.ts';

/** What the receipts prove, by rank of the group's mesh. */
export interface ExchangeVerdict {
  /** ranks that sent a signed tensor that differs from the recomputation's, at the first exchange where any did */
  senders: number[];
  /** ranks holding a receipt their sender never signed */
  forgers: number[];
  /** where the first wrong tensor was: "block 3's attention output" */
  where: string;
}

const keyOf = (r: Pick<ExchangeReceipt, 'block' | 'phase' | 'group' | 'from'>, to: number) =>
  `${r.block}/${r.phase}/${r.group}/${r.from}>${to}`;

/** An exchange's place in a forward: a block's queries, keys and values go before its attention output. */
const roundOf = (r: ExchangeReceipt) => 2 * r.block + (exchangePhase(r.phase) === ExchangePhase.Output ? 1 : 0);

/** The receipts the recomputation gives, as one table (tensor → digest): equal tables are the same forward. */
export function trueDigests(received: ExchangeReceipt[][]): Map<string, string> {
  return new Map(received.flatMap((receipts, to) => receipts.map((r) => [keyOf(r, to), r.digest] as const)));
}

export function sameDigests(a: Map<string, string>, b: Map<string, string>): boolean {
  return a.size === b.size && [...a].every(([key, digest]) => b.get(key) === digest);
}

/**
 * Judges the group's receipts of one forward (`evidence`, by mesh rank) against the recomputation's (`truth`), the
 * signatures by each mesh rank's public key. Null where no receipt proves a lie.
 */
export function judgeExchanges(
  forward: ForwardKey,
  truth: Map<string, string>,
  evidence: ExchangeReceipt[][],
  publicKeys: string[],
): ExchangeVerdict | null {
  const forgers: number[] = [];
  const wrong: ExchangeReceipt[] = [];
  evidence.forEach((receipts, to) => {
    for (const r of receipts) {
      const tag = { ...forward, block: r.block, phase: r.phase, group: r.group };
      // the receipts' contract holds their digests and signatures to their sizes in hex
      const digest = fromHex(r.digest, 32);
      const signed = verifyPayload(
        publicKeys[r.from] ?? '',
        tag,
        r.from,
        to,
        digest,
        fromHex(r.signature, SIGNATURE_BYTES),
      );
      if (!signed) {
        forgers.push(to);
        return;
      }
      const expected = truth.get(keyOf(r, to));
      if (expected !== undefined && expected !== r.digest) wrong.push(r);
    }
  });
  const first = Math.min(...wrong.map(roundOf));
  const senders = [...new Set(wrong.filter((r) => roundOf(r) === first).map((r) => r.from))].sort((a, b) => a - b);
  if (!senders.length && !forgers.length) return null;
  const where = senders.length
    ? `block ${Math.floor(first / 2)}'s ${first % 2 ? 'attention output' : 'queries, keys and values'}`
    : '';
  return { senders, forgers: [...new Set(forgers)], where };
}
