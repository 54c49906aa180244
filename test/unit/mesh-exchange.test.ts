import { describe, expect, it } from 'vitest';
import { PeerLost } from '../../core/worker-api.ts';
import { MeshExchange } from '../../rank/exchange/mesh.ts';
import { channelPair } from './fixtures.ts';

// Well-formed garbage between ranks: the right size, NaN or infinite. The receiver blames its
// sender (every rank checks what it sends, so the fault cannot be its own), and a rank whose own
// activations are not finite fails on its own account instead of sending them.
describe('the mesh exchange and non-finite tensors', () => {
  const pair = () => {
    const [a, b] = channelPair();
    const rank0 = new MeshExchange(0, 2);
    const rank1 = new MeshExchange(1, 2);
    rank0.addPeer(1, a);
    rank1.addPeer(0, b);
    return { rank0, rank1, linkFrom1: b };
  };
  const tag = { job: 1, step: 2, pass: 0, block: 1, phase: 0 };

  it('a NaN tensor from a peer fails the exchange with PeerLost naming that peer as misbehaving', async () => {
    const { rank0, linkFrom1 } = pair();
    const poisoned = new Float32Array(8).fill(1);
    poisoned[3] = NaN;
    await linkFrom1.send({ kind: 'tensor', from: 1, tag, dtype: 'f32', shape: [8], data: new Uint8Array(poisoned.buffer) });
    const error = await rank0.allToAll(tag, [new Float32Array(8), new Float32Array(8)]).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PeerLost);
    expect((error as PeerLost).detail).toEqual({ rank: 1, cause: 'misbehaved', evidence: 'sent NaN or infinite values in step 3, block 1; disconnected' });
  });

  it('finite tensors go through', async () => {
    const { rank0, rank1 } = pair();
    const [got0, got1] = await Promise.all([rank0.allToAll(tag, [new Float32Array([1]), new Float32Array([2])]), rank1.allToAll(tag, [new Float32Array([3]), new Float32Array([4])])]);
    expect([...got0[1], ...got1[0]]).toEqual([3, 2]);
  });

  it("a rank's own NaN, or float16 overflow when it sends float16, is its own error: nothing is sent", async () => {
    const { rank1 } = pair();
    await expect(rank1.allToAll(tag, [new Float32Array([Infinity]), new Float32Array(1)])).rejects.toThrow("rank 1's activations in step 3, block 1 are NaN, infinite");
    const half = new MeshExchange(1, 2, 'f16');
    half.addPeer(0, channelPair()[1]);
    await expect(half.allToAll(tag, [new Float32Array([70_000]), new Float32Array(1)])).rejects.toThrow('beyond float16 (send float32 instead)');
    expect(half.bytesSent).toBe(0);
  });
});
