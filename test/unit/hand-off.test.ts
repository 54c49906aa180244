// A pipeline stage's hidden state crosses to the next stage's rank directly (rank/hand-off.ts): in tensors of bounded
// size whatever the hidden state's, exact in float32, signed by its sender, judged by its receiver, and provable to
// a spot check from the receiver's receipts alone.
import { describe, expect, it } from 'vitest';
import { hiddenStateFloats, type HiddenState } from '../../core/model/blocks.ts';
import { newSigningKeys } from '../../core/net/signing.ts';
import { PeerLost } from '../../core/worker-api.ts';
import { ExchangeLedger } from '../../rank/exchange/ledger.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import {
  HAND_OFF_CHUNK_FLOATS,
  handOffChunks,
  handOn,
  partnerBlamed,
  ReceivedHandOffs,
  RECEIVER,
  SENDER,
  takeHandOff,
  unprovenHandOff,
} from '../../rank/hand-off.ts';

/** the largest message a link reassembles (core/net/protocol.ts Reassembler's default cap) */
const LINK_MESSAGE_BYTES = 64 * 1024 * 1024;

const hiddenOf = (dim: number, rows: number, textRows: number, seed = 1): HiddenState => {
  const fill = (n: number, k: number) =>
    Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 7 + k * 3 + i * 0.37));
  return { temb: fill(dim, 1), tproj: fill(6 * dim, 2), context: fill(textRows * dim, 3), x: fill(rows * dim, 4) };
};

/** A signed pair: the sender's and the receiver's ends, each with its ledger, and the receiver's kept hand-offs. */
function signedPair(dtype: 'f32' | 'f16' = 'f32') {
  const [sender, receiver] = memoryExchanges(2, dtype);
  const keys = [newSigningKeys(), newSigningKeys()];
  const publicKeys = keys.map((k) => k.publicKey);
  sender.keepEvidence(new ExchangeLedger(SENDER, { secretKey: keys[0].secretKey, publicKeys }));
  const kept = new ReceivedHandOffs();
  receiver.keepEvidence(kept.ledger(new ExchangeLedger(RECEIVER, { secretKey: keys[1].secretKey, publicKeys })));
  return { sender, receiver, kept, senderKey: publicKeys[0] };
}

const of = { tag: { job: 2, step: 3, pass: 1 }, block: 5 };

describe('a hand-off between pipeline stages', () => {
  it("travels in tensors a link carries, however large the hidden state: the 14B's at 480p × 81 frames too", () => {
    // Wan2.1-14B: dim 5120, 512 text rows, 32,760 tokens on one rank: 671 MB of x alone
    const floats = hiddenStateFloats(5120, 32_760, 512);
    expect(4 * 32_760 * 5120).toBe(670_924_800);
    const chunks = handOffChunks(floats);
    expect(chunks.reduce((a, b) => a + b, 0)).toBe(floats);
    expect(Math.max(...chunks) * 4).toBeLessThanOrEqual(LINK_MESSAGE_BYTES);
    expect(chunks.length).toBe(Math.ceil(floats / HAND_OFF_CHUNK_FLOATS));
    expect(chunks.length).toBeLessThanOrEqual(256); // a PipeFusion patch's numbering
    // one far larger than any video still fits the numbering, in larger tensors
    const huge = handOffChunks(2 ** 31);
    expect(huge.length).toBeLessThanOrEqual(256);
    expect(Math.max(...huge) * 4).toBeLessThanOrEqual(LINK_MESSAGE_BYTES);
    expect(handOffChunks(10)).toEqual([10]);
  });

  it('arrives exact in float32 over several tensors, signed, and its receipts prove it to a spot check', async () => {
    const { sender, receiver, kept, senderKey } = signedPair();
    // more than one tensor: the x alone is 2.5 chunks
    const shape = { dim: 64, rows: Math.ceil((2.5 * HAND_OFF_CHUNK_FLOATS) / 64), textRows: 3 };
    const hidden = hiddenOf(shape.dim, shape.rows, shape.textRows);
    const bytes = handOn(sender, of, hidden);
    expect(bytes).toBe(4 * hiddenStateFloats(shape.dim, shape.rows, shape.textRows));
    const taken = await takeHandOff(receiver, of, shape);
    expect(taken.bytes).toBe(bytes);
    // bit for bit (compared as bytes: a deep equality of millions of floats takes a test's whole budget)
    for (const part of ['x', 'temb', 'tproj', 'context'] as const)
      expect(Buffer.compare(Buffer.from(taken.hidden[part].slice().buffer), Buffer.from(hidden[part].buffer))).toBe(0);
    kept.keep(of, taken.hidden);
    const evidence = kept.evidence(of.tag);
    expect(evidence.receipts).toHaveLength(handOffChunks(hiddenStateFloats(64, shape.rows, 3)).length);
    expect(unprovenHandOff(evidence, of, senderKey, 'f32')).toBeNull();
    // a receiver that gives other values than it received, or claims another sender signed them, proves nothing
    const x = evidence.hidden.x.slice();
    x[x.length - 1] += 1e-3;
    expect(unprovenHandOff({ ...evidence, hidden: { ...evidence.hidden, x } }, of, senderKey, 'f32')).toMatch(
      'not those it kept a receipt of',
    );
    expect(unprovenHandOff(evidence, of, newSigningKeys().publicKey, 'f32')).toMatch('not signed by its sender');
    expect(unprovenHandOff(evidence, { ...of, block: 4 }, senderKey, 'f32')).toMatch('missing or of another tensor');
    expect(() => kept.evidence({ ...of.tag, step: 9 })).toThrow('is kept here');
  });

  it('in float16 where the job exchanges float16: within its rounding, half the bytes', async () => {
    const { sender, receiver } = signedPair('f16');
    const shape = { dim: 16, rows: 10, textRows: 2 };
    const hidden = hiddenOf(16, 10, 2);
    expect(handOn(sender, of, hidden)).toBe(2 * hiddenStateFloats(16, 10, 2));
    const taken = await takeHandOff(receiver, of, shape);
    const worst = taken.hidden.x.reduce((m, v, i) => Math.max(m, Math.abs(v - hidden.x[i])), 0);
    expect(worst).toBeGreaterThan(0);
    expect(worst).toBeLessThan(1e-3); // |x| ≤ 1: float16's step there is 2^-11
  });

  it("a malformed or poisoned hand-off is its sender's lie: blamed as the rank of the stage before, never used", async () => {
    const shape = { dim: 8, rows: 4, textRows: 1 };
    const refusal = async (hidden: HiddenState) => {
      const [sender, receiver] = memoryExchanges(2); // an in-memory link checks nothing a sender sends
      handOn(sender, of, hidden);
      return partnerBlamed('before', 2, () => takeHandOff(receiver, of, shape)).then(
        () => null,
        (e: unknown) => e,
      );
    };
    const nan = hiddenOf(8, 4, 1);
    nan.x[3] = NaN;
    for (const lie of [nan, hiddenOf(8, 3, 1), hiddenOf(8, 5, 1)]) {
      const refused = await refusal(lie);
      expect(refused).toBeInstanceOf(PeerLost);
      expect(refused).toMatchObject({ detail: { rank: 2, stage: 'before', cause: 'misbehaved' } });
    }
    expect(await refusal(hiddenOf(8, 4, 1))).toBeNull();
    // a tensor its signature does not match (signed with a key not the sender's) is refused as it arrives
    const [forger, receiver] = memoryExchanges(2);
    const keys = [newSigningKeys(), newSigningKeys()];
    const publicKeys = keys.map((k) => k.publicKey);
    forger.keepEvidence(new ExchangeLedger(SENDER, { secretKey: newSigningKeys().secretKey, publicKeys }));
    receiver.keepEvidence(new ExchangeLedger(RECEIVER, { secretKey: keys[1].secretKey, publicKeys }));
    handOn(forger, of, hiddenOf(8, 4, 1));
    await expect(partnerBlamed('before', 0, () => takeHandOff(receiver, of, shape))).rejects.toMatchObject({
      detail: { rank: 0, stage: 'before', cause: 'misbehaved', evidence: stringMatching('signature') },
    });
  });
});

const stringMatching = (s: string) => expect.stringMatching(s) as unknown;
