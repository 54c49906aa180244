import type { TensorTag } from '../../core/net/protocol.ts';
import { payloadDigest, signPayload, toHex, verifyPayload, type MeshSigning } from '../../core/net/signing.ts';
import type { ExchangeReceipt, ForwardKey } from '../../core/worker-api.ts';
import { exchangePhase, ExchangePhase } from '../ulysses.ts';

/** An exchange that signs what its rank sends and keeps receipts of what it receives, from now on. */
export interface KeepsEvidence {
  keepEvidence(ledger: ExchangeLedger): void;
}

/** forwards whose receipts a rank keeps: a spot check asks for its forward's as soon as the forward is gathered */
export const FORWARDS_KEPT = 8;

const forwardKey = ({ job, step, pass }: ForwardKey) => `${job}/${step}/${pass}`;

/**
 * One rank's record of what it received in its forwards' exchanges (core/net/signing.ts): each
 * tensor's payload digest and its sender's signature, checked as it arrives. With `signing` absent
 * (a rank recomputing its group's exchanges in-process, for their true digests) nothing is signed
 * or checked, only recorded.
 */
export class ExchangeLedger {
  private readonly kept = new Map<string, ExchangeReceipt[]>();
  /** a part sent to several peers (displaced mode) is digested once */
  private readonly digests = new WeakMap<Uint8Array, Uint8Array>();

  constructor(
    readonly rank: number,
    private readonly signing?: MeshSigning,
  ) {}

  /** The signature a tensor to rank `to` travels with; none where the mesh signs nothing. */
  seal(tag: TensorTag, to: number, payload: Uint8Array): Uint8Array | undefined {
    if (!this.signing || !recorded(tag)) return undefined;
    let digest = this.digests.get(payload);
    if (!digest) this.digests.set(payload, (digest = payloadDigest(payload)));
    return signPayload(this.signing.secretKey, tag, this.rank, to, digest);
  }

  /** Checks the signature a peer's tensor came with and keeps its receipt: why it is refused, or null. */
  accept(tag: TensorTag, from: number, payload: Uint8Array, signature: Uint8Array | undefined): string | null {
    if (!recorded(tag)) return null;
    const digest = payloadDigest(payload);
    if (this.signing) {
      const publicKey = this.signing.publicKeys[from];
      if (!signature) return 'sent a tensor unsigned';
      if (!publicKey || !verifyPayload(publicKey, tag, from, this.rank, digest, signature))
        return 'sent a tensor its signature does not match';
    }
    const key = forwardKey(tag);
    let receipts = this.kept.get(key);
    if (!receipts) {
      this.kept.set(key, (receipts = []));
      for (const old of this.kept.keys()) if (this.kept.size > FORWARDS_KEPT) this.kept.delete(old);
    }
    receipts.push({
      block: tag.block,
      phase: tag.phase,
      group: tag.group,
      from,
      digest: toHex(digest),
      signature: signature ? toHex(signature) : '',
    });
    return null;
  }

  /** What this rank received in one forward, in the order it arrived; none where it is no longer kept. */
  receipts(forward: ForwardKey): ExchangeReceipt[] {
    return this.kept.get(forwardKey(forward)) ?? [];
  }
}

/** The probe's exchanges carry no model data: nothing to prove about them. */
const recorded = (tag: TensorTag) => exchangePhase(tag.phase) !== ExchangePhase.Probe;
