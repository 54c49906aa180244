import { describe, expect, it } from 'vitest';
import { judgeExchanges, trueDigests } from '../../coordinator/exchange-evidence.ts';
import { encodeFrames, Reassembler, type Message } from '../../core/net/protocol.ts';
import { newSigningKeys, payloadDigest, signPayload, toHex, verifyPayload } from '../../core/net/signing.ts';
import { PeerLost, type ExchangeReceipt } from '../../core/worker-api.ts';
import { ExchangeLedger, FORWARDS_KEPT } from '../../rank/exchange/ledger.ts';
import { MeshExchange } from '../../rank/exchange/mesh.ts';
import { ExchangePhase } from '../../rank/ulysses.ts';
import { channelPair } from './fixtures.ts';

// Issue 33: a wrong tensor within the model's bounds, sent signed, is named by its receipts.
const forward = { job: 3, step: 5, pass: 1 };
const tag = { ...forward, block: 2, phase: ExchangePhase.QKV, group: 0 };
const bytesOf = (...values: number[]) => new Uint8Array(Float32Array.from(values).buffer);

describe('signed tensors', () => {
  it("verify under their sender's public key for their one place, receiver and payload, and nothing else", () => {
    const [a, b] = [newSigningKeys(), newSigningKeys()];
    const digest = payloadDigest(bytesOf(1, 2));
    const signature = signPayload(a.secretKey, tag, 0, 1, digest);
    expect(verifyPayload(a.publicKey, tag, 0, 1, digest, signature)).toBe(true);
    expect(verifyPayload(b.publicKey, tag, 0, 1, digest, signature)).toBe(false);
    expect(verifyPayload(a.publicKey, tag, 0, 2, digest, signature)).toBe(false);
    expect(verifyPayload(a.publicKey, { ...tag, block: 3 }, 0, 1, digest, signature)).toBe(false);
    expect(verifyPayload(a.publicKey, tag, 0, 1, payloadDigest(bytesOf(1, 3)), signature)).toBe(false);
    expect(verifyPayload('00'.repeat(32), tag, 0, 1, digest, signature)).toBe(false);
    expect(verifyPayload(a.publicKey, tag, 0, 1, digest, signature.subarray(1))).toBe(false);
  });

  it('cross the wire with their signature split over frames, and a frame whose flags are not known is dropped', () => {
    const signature = Uint8Array.from({ length: 64 }, (_, i) => i);
    const msg: Message = {
      kind: 'tensor',
      from: 1,
      tag,
      dtype: 'f32',
      shape: [40],
      data: new Uint8Array(new Float32Array(40).fill(7).buffer),
    };
    const frames = encodeFrames({ ...msg, signature }, 9, 60 + 100); // 224 bytes in strides of 100
    expect(frames).toHaveLength(3);
    const r = new Reassembler();
    const out = frames.map((f) => r.push(new Uint8Array(f))).filter(Boolean);
    expect(out).toEqual([{ ...msg, signature }]);
    const unknown = new Uint8Array(encodeFrames(msg, 10)[0]);
    unknown[7] = 2;
    expect(r.push(unknown)).toBeNull();
    expect(r.lastError).toMatch('unknown flags 2');
  });
});

describe("a mesh rank's ledger", () => {
  const signedPair = () => {
    const keys = [newSigningKeys(), newSigningKeys()];
    const publicKeys = keys.map((k) => k.publicKey);
    const [a, b] = channelPair();
    const rank0 = new MeshExchange(0, 2);
    const rank1 = new MeshExchange(1, 2);
    rank0.addPeer(1, a);
    rank1.addPeer(0, b);
    const ledgers = [0, 1].map((rank) => new ExchangeLedger(rank, { secretKey: keys[rank].secretKey, publicKeys }));
    rank0.keepEvidence(ledgers[0]);
    rank1.keepEvidence(ledgers[1]);
    return { rank0, rank1, ledgers, keys, linkFrom1: b };
  };

  it('keeps a receipt of each tensor received, its digest and its signature, that the dashboard can check', async () => {
    const { rank0, rank1, ledgers, keys } = signedPair();
    await Promise.all([
      rank0.allToAll(tag, [Float32Array.of(1), Float32Array.of(2)]),
      rank1.allToAll(tag, [Float32Array.of(3), Float32Array.of(4)]),
    ]);
    const [receipt] = ledgers[0].receipts(forward);
    expect(receipt).toMatchObject({ block: 2, phase: 0, group: 0, from: 1, digest: toHex(payloadDigest(bytesOf(3))) });
    expect(ledgers[0].receipts({ ...forward, step: 4 })).toEqual([]);
    expect(
      judgeExchanges(
        forward,
        trueDigests([[receipt], ledgers[1].receipts(forward)]),
        [[receipt], []],
        keys.map((k) => k.publicKey),
      ),
    ).toBeNull();
  });

  it('refuses a tensor unsigned or signed by another key, and blames its sender', async () => {
    const { rank0, linkFrom1 } = signedPair();
    const msg = { kind: 'tensor' as const, from: 1, tag, dtype: 'f32' as const, shape: [1], data: bytesOf(3) };
    const forged = signPayload(newSigningKeys().secretKey, tag, 1, 0, payloadDigest(msg.data));
    await linkFrom1.send({ ...msg, signature: forged });
    const error = await rank0.allToAll(tag, [Float32Array.of(1), Float32Array.of(2)]).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PeerLost);
    expect((error as PeerLost).detail).toMatchObject({ rank: 1, cause: 'misbehaved' });
    expect((error as PeerLost).detail.evidence).toMatch(
      /^sent a tensor its signature does not match in step 6, block 2/,
    );
    const unsigned = signedPair();
    await unsigned.linkFrom1.send(msg);
    await expect(unsigned.rank0.allToAll(tag, [Float32Array.of(1), Float32Array.of(2)])).rejects.toThrow(
      'sent a tensor unsigned',
    );
  });

  it(`keeps the receipts of its last ${FORWARDS_KEPT} forwards`, () => {
    const ledger = new ExchangeLedger(0);
    for (let step = 0; step <= FORWARDS_KEPT; step++) ledger.accept({ ...tag, step }, 1, bytesOf(step), undefined);
    expect(ledger.receipts({ ...forward, step: 0 })).toEqual([]);
    expect(ledger.receipts({ ...forward, step: 1 })).toHaveLength(1);
    expect(ledger.receipts({ ...forward, step: FORWARDS_KEPT })).toHaveLength(1);
  });
});

describe('judging the receipts of a forward against its recomputation', () => {
  const keys = [0, 1, 2].map(() => newSigningKeys());
  const publicKeys = keys.map((k) => k.publicKey);
  /** what `to` received from `from` at block and phase: payload `value`, signed by `signer` (the sender) */
  const receipt = (
    block: number,
    phase: number,
    from: number,
    to: number,
    value: number,
    signer = from,
  ): ExchangeReceipt => {
    const digest = payloadDigest(bytesOf(value));
    const signature = signPayload(keys[signer].secretKey, { ...forward, block, phase, group: 0 }, from, to, digest);
    return { block, phase, group: 0, from, digest: toHex(digest), signature: toHex(signature) };
  };
  /** a forward of 3 blocks on 3 ranks, every tensor `value(block, phase, from, to)` */
  const forwardOf = (
    value: (block: number, phase: ExchangePhase, from: number, to: number) => number,
    signer?: number,
  ) =>
    [0, 1, 2].map((to) =>
      [0, 1, 2].flatMap((block) =>
        [ExchangePhase.QKV, ExchangePhase.Output].flatMap((phase) =>
          [0, 1, 2]
            .filter((from) => from !== to)
            .map((from) => receipt(block, phase, from, to, value(block, phase, from, to), signer)),
        ),
      ),
    );
  const truth = trueDigests(forwardOf(() => 0).map((rs) => rs.map((r) => ({ ...r, signature: '' }))));

  it('agree where every tensor is as recomputed', () => {
    expect(
      judgeExchanges(
        forward,
        truth,
        forwardOf(() => 0),
        publicKeys,
      ),
    ).toBeNull();
  });

  it('name the senders of the first exchange that differs, not the ranks who computed from it afterwards', () => {
    // rank 2 sends rank 0 a wrong attention output in block 1; from then on every rank sends wrong tensors
    const spoiled = (block: number, phase: ExchangePhase, from: number, to: number) =>
      block > 1 || (block === 1 && phase === ExchangePhase.Output && from === 2 && to === 0) ? 1 : 0;
    expect(judgeExchanges(forward, truth, forwardOf(spoiled), publicKeys)).toEqual({
      senders: [2],
      forgers: [],
      where: "block 1's attention output",
    });
    // a block's queries, keys and values come before its attention output
    const early = (block: number, phase: ExchangePhase, from: number) =>
      block === 2 && (phase === ExchangePhase.QKV ? from === 1 : true) ? 1 : 0;
    expect(judgeExchanges(forward, truth, forwardOf(early), publicKeys)?.senders).toEqual([1]);
  });

  it('name a rank holding a receipt its sender never signed, and take nobody else on its word', () => {
    const evidence = forwardOf(() => 0);
    // rank 1 says rank 0 sent it something else, signing the receipt itself
    evidence[1][0] = receipt(0, ExchangePhase.QKV, 0, 1, 5, 1);
    expect(judgeExchanges(forward, truth, evidence, publicKeys)).toEqual({ senders: [], forgers: [1], where: '' });
  });
});
