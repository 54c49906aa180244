import { describe, expect, it } from 'vitest';
import { PeerLost } from '../../core/worker-api.ts';
import { MAX_AHEAD, MeshExchange } from '../../rank/exchange/mesh.ts';
import { ExchangePhase } from '../../rank/ulysses.ts';
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
  const tag = { job: 1, step: 2, pass: 0, block: 1, phase: ExchangePhase.QKV, group: 0 };

  it('a NaN tensor from a peer fails the exchange with PeerLost naming that peer as misbehaving', async () => {
    const { rank0, linkFrom1 } = pair();
    const poisoned = new Float32Array(8).fill(1);
    poisoned[3] = NaN;
    await linkFrom1.send({
      kind: 'tensor',
      from: 1,
      tag,
      dtype: 'f32',
      shape: [8],
      data: new Uint8Array(poisoned.buffer),
    });
    const error = await rank0.allToAll(tag, [new Float32Array(8), new Float32Array(8)]).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PeerLost);
    expect((error as PeerLost).detail).toEqual({
      rank: 1,
      cause: 'misbehaved',
      evidence: 'sent NaN or infinite values in step 3, block 1; disconnected',
    });
  });

  it('finite tensors go through', async () => {
    const { rank0, rank1 } = pair();
    const [got0, got1] = await Promise.all([
      rank0.allToAll(tag, [new Float32Array([1]), new Float32Array([2])]),
      rank1.allToAll(tag, [new Float32Array([3]), new Float32Array([4])]),
    ]);
    expect([...got0[1], ...got1[0]]).toEqual([3, 2]);
  });

  it("a rank's own NaN in a block's first exchange, or float16 overflow when it sends float16, is its own error: nothing is sent", async () => {
    const { rank1 } = pair();
    const first = { ...tag, block: 0 };
    await expect(rank1.allToAll(first, [new Float32Array([Infinity]), new Float32Array(1)])).rejects.toThrow(
      "rank 1's activations in step 3, block 0 are NaN, infinite",
    );
    const half = new MeshExchange(1, 2, 'f16');
    half.addPeer(0, channelPair()[1]);
    await expect(half.allToAll(first, [new Float32Array([70_000]), new Float32Array(1)])).rejects.toThrow(
      'beyond float16 (send float32 instead)',
    );
    expect(half.bytesSent).toBe(0);
  });
});

// A peer that floods the mesh: tensors for steps far ahead, the same tensor twice, tensors of a
// forward already past, of another dtype (issue 17, finding 6).
describe('the mesh exchange and a flooding peer', () => {
  const pair = () => {
    const [a, b] = channelPair();
    const rank0 = new MeshExchange(0, 2);
    rank0.addPeer(1, a);
    return {
      rank0,
      from1: (tag: object, data = new Float32Array(2), dtype: 'f32' | 'f16' = 'f32') =>
        b.send({
          kind: 'tensor',
          from: 1,
          tag: { job: 1, step: 0, pass: 0, block: 0, phase: 0, group: 0, ...tag },
          dtype,
          shape: [dtype === 'f16' ? 2 * data.length : data.length],
          data: new Uint8Array(data.buffer),
        }),
    };
  };
  const settle = () => new Promise((r) => setTimeout(r, 20));

  it(`keeps at most ${MAX_AHEAD} tensors ahead of this rank: the next one is a flood, its sender misbehaving`, async () => {
    const { rank0, from1 } = pair();
    for (let step = 0; step < 2000; step++) await from1({ step });
    await settle();
    const error = await rank0
      .allToAll({ job: 1, step: 0, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 }, [
        new Float32Array(2),
        new Float32Array(2),
      ])
      .catch((e: unknown) => e);
    expect((error as PeerLost).detail).toEqual({
      rank: 1,
      cause: 'misbehaved',
      evidence: `sent ${MAX_AHEAD + 1} tensors ahead of this rank; disconnected`,
    });
  });

  it('the same tensor twice is a lie', async () => {
    const { rank0, from1 } = pair();
    await from1({ block: 1 });
    await from1({ block: 1 });
    await settle();
    await expect(
      rank0.allToAll({ job: 1, step: 0, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 }, [
        new Float32Array(2),
        new Float32Array(2),
      ]),
    ).rejects.toThrow('sent the tensor of step 1, block 1, phase 0 twice');
  });

  it("one block's head groups are tensors of their own, each received by its own exchange; one group twice is a lie naming it (issue 20)", async () => {
    const { rank0, from1 } = pair();
    await from1({ block: 1, group: 1 }, Float32Array.of(1, 1));
    await from1({ block: 1, group: 0 }, Float32Array.of(0, 0));
    const tag = { job: 1, step: 0, pass: 0, block: 1, phase: ExchangePhase.QKV };
    const [first, second] = await Promise.all(
      [0, 1].map((group) => rank0.allToAll({ ...tag, group }, [new Float32Array(2), new Float32Array(2)])),
    );
    expect([...first[1], ...second[1]]).toEqual([0, 0, 1, 1]);
    const again = pair();
    await again.from1({ block: 1, group: 2 });
    await again.from1({ block: 1, group: 2 });
    await settle();
    await expect(
      again.rank0.allToAll({ ...tag, block: 0, group: 0 }, [new Float32Array(2), new Float32Array(2)]),
    ).rejects.toThrow('sent the tensor of step 1, block 1, phase 0, head group 2 twice');
  });

  it('a tensor of a forward already past, or of another dtype, is refused whole and counted; the exchange goes on', async () => {
    const { rank0, from1 } = pair();
    const now = { job: 1, step: 3, pass: 1, block: 0, phase: ExchangePhase.QKV, group: 0 };
    const exchange = rank0.allToAll(now, [new Float32Array(2), new Float32Array(2)]);
    await from1({ step: 2 }); // an earlier step
    // this step's other pass: a guided step runs both at once, so it is kept
    await from1({ step: 3, pass: 0 }, Float32Array.of(7, 8));
    await from1({ job: 0, step: 9 }); // an earlier job
    await from1({ ...now }, new Float32Array(1), 'f16'); // float16 on a float32 mesh (2 values in 4 bytes)
    await from1({ ...now }, Float32Array.of(5, 6));
    const [, got] = await exchange;
    expect([...got]).toEqual([5, 6]);
    expect(rank0.framesDropped()).toBe(3);
    const [, other] = await rank0.allToAll({ ...now, pass: 0 }, [new Float32Array(2), new Float32Array(2)]);
    expect([...other]).toEqual([7, 8]);
  });
});

// A peer that withholds its part (issue 17, finding 7): the waiting rank names it once it has heard
// nothing from it for the job's wait (half the coordinator's patience), not at the coordinator's timeout.
describe('the mesh exchange and a peer that withholds its tensors', () => {
  it('fails the exchange naming the silent peer', async () => {
    const [a] = channelPair();
    const rank0 = new MeshExchange(0, 2, 'f32', 50);
    rank0.addPeer(1, a);
    const started = performance.now();
    const error = await rank0
      .allToAll({ job: 1, step: 4, pass: 0, block: 2, phase: ExchangePhase.Output, group: 0 }, [
        new Float32Array(1),
        new Float32Array(1),
      ])
      .catch((e: unknown) => e);
    expect(performance.now() - started).toBeGreaterThanOrEqual(45);
    expect((error as PeerLost).detail).toMatchObject({ rank: 1, cause: 'silent' });
    expect((error as PeerLost).detail.evidence).toMatch(/^sent no tensor for step 5, block 2, phase 1 in \d+ s$/);
  });

  it('a peer still heard from (its part crossing a slow link) is not silent, however long it takes', async () => {
    const [a, b] = channelPair();
    const rank0 = new MeshExchange(0, 2, 'f32', 80);
    rank0.addPeer(1, a);
    const tag = { job: 1, step: 0, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 };
    const exchange = rank0.allToAll(tag, [new Float32Array(1), new Float32Array(1)]);
    // frames keep coming for 300 ms (here: an RPC the mesh ignores), then its part
    for (let i = 0; i < 6; i++) {
      await new Promise((r) => setTimeout(r, 50));
      await b.send({ kind: 'rpc', from: 1, body: 'still sending', tensors: [] });
    }
    await b.send({
      kind: 'tensor',
      from: 1,
      tag,
      dtype: 'f32',
      shape: [1],
      data: new Uint8Array(Float32Array.of(7).buffer),
    });
    const [, got] = await exchange;
    expect([...got]).toEqual([7]);
  });
});

describe('the mesh exchange across jobs', () => {
  it('what a job cut short left unasked is dropped when the next job starts, not counted against the peer', async () => {
    const [a, b] = channelPair();
    const rank0 = new MeshExchange(0, 2);
    rank0.addPeer(1, a);
    const send = (tag: object, value: number) =>
      b.send({
        kind: 'tensor',
        from: 1,
        tag: { job: 1, step: 0, pass: 0, block: 0, phase: 0, group: 0, ...tag },
        dtype: 'f32',
        shape: [1],
        data: new Uint8Array(Float32Array.of(value).buffer),
      });
    // job 1: one exchange done, then the peer's parts for three blocks this rank never reached
    const first = rank0.allToAll({ job: 1, step: 0, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 }, [
      new Float32Array(1),
      new Float32Array(1),
    ]);
    await send({}, 1);
    await first;
    for (const block of [1, 2, 3]) await send({ block }, 9);
    await new Promise((r) => setTimeout(r, 20));
    // job 2 runs as usual: two tensors ahead of it are not a flood on top of job 1's leftovers
    const second = rank0.allToAll({ job: 2, step: 0, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 }, [
      new Float32Array(1),
      new Float32Array(1),
    ]);
    await send({ job: 2, block: 1 }, 5);
    await send({ job: 2, block: 2 }, 6);
    await send({ job: 2 }, 4);
    expect([...(await second)[1]]).toEqual([4]);
    expect([
      ...(
        await rank0.allToAll({ job: 2, step: 0, pass: 0, block: 1, phase: ExchangePhase.QKV, group: 0 }, [
          new Float32Array(1),
          new Float32Array(1),
        ])
      )[1],
    ]).toEqual([5]);
  });
});
