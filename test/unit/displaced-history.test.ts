import { describe, expect, it } from 'vitest';
import type { WanConfig } from '../../core/model/config.ts';
import { tensorPayload, tensorValues, type DType } from '../../core/net/protocol.ts';
import type { UlyssesPlan } from '../../core/parallel.ts';
import { add, subtract } from '../../core/tensor.ts';
import { displacedAttention, heldStaleAttention, KeysValuesHistory } from '../../rank/displaced.ts';
import type { QKV, StageRunner } from '../../rank/stages.ts';
import type { BlockIO, Exchange, ExchangeTag } from '../../rank/ulysses.ts';

// What a rank keeps of displaced mode's gathers (rank/displaced.ts): the newest two of each pass and block, which a
// stale forward attends to and a spot check recomputes from; and one block's attention over an exchange whose peers
// are scripted, so that what it sends, what it attends to and what it refuses can be read to the value. The forwards
// on real ranks are in displaced.test.ts.
const gather = (step: number, parts: Promise<Float32Array[]> = Promise.resolve([Float32Array.of(step)])) => ({
  step,
  sent: Float32Array.of(step),
  parts,
});

describe("a rank's history of displaced keys and values", () => {
  it('keeps the newest two gathers of each pass and block apart, and finds one by its step', () => {
    const history = new KeysValuesHistory();
    expect(history.latest(0, 0)).toBeNull();
    expect(history.ofStep(0, 0, 0)).toBeNull();
    const [g3, g4, g5] = [gather(3), gather(4), gather(5)];
    history.keep(0, 1, g3);
    expect(history.latest(0, 1)).toBe(g3);
    expect([history.latest(1, 1), history.latest(0, 0), history.latest(1, 0)]).toEqual([null, null, null]);
    history.keep(0, 1, g4);
    expect(history.latest(0, 1)).toBe(g4);
    expect(history.ofStep(0, 1, 3)).toBe(g3);
    expect(history.ofStep(0, 1, 4)).toBe(g4);
    expect(history.ofStep(0, 1, 2)).toBeNull();
    expect(history.ofStep(1, 1, 4)).toBeNull();
    history.keep(0, 1, g5);
    expect([history.ofStep(0, 1, 3), history.ofStep(0, 1, 4), history.ofStep(0, 1, 5)]).toEqual([null, g4, g5]);
    // pass 1 block 0 and pass 0 block 10 are not pass 0 block 1 (nor pass 10 block 1)
    history.keep(1, 0, gather(7));
    history.keep(10, 1, gather(8));
    expect(history.latest(0, 1)).toBe(g5);
    expect(history.latest(1, 0)?.step).toBe(7);
    expect(history.latest(10, 1)?.step).toBe(8);
    expect(history.latest(1, 10)).toBeNull();
    history.clear();
    expect([history.latest(0, 1), history.latest(1, 0), history.ofStep(0, 1, 4)]).toEqual([null, null, null]);
  });

  it("keeps a gather that failed as the next forward's error, not an unhandled one now", async () => {
    const history = new KeysValuesHistory();
    history.keep(0, 0, gather(1, Promise.reject(new Error('rank 2 is gone'))));
    await new Promise((resolve) => setTimeout(resolve, 0));
    await expect(history.latest(0, 0)?.parts).rejects.toThrow('rank 2 is gone');
  });
});

// rank 0 of 3, tokens 2/1/1, width D = 2: its k and v, and each peer's part [k; v] of its token
const D = 2;
const plan = { degree: 3, rows: [2, 1, 1] } as UlyssesPlan;
const cfg = { dim: D } as WanConfig;
const qkv = (step: number): QKV => ({
  q: Float32Array.of(0, 0, 0, 0),
  k: Float32Array.of(1, 2, 3, 4).map((x) => x + step),
  v: Float32Array.of(5, 6, 7, 8).map((x) => x + step),
});
const peerParts = (step: number) =>
  [Float32Array.of(10, 11, 12, 13), Float32Array.of(20, 21, 22, 23)].map((p) => p.map((x) => x + step));

/** A block's world as displacedAttention sees it: peers' parts scripted per call; what it sent and attended kept. */
function scripted(dtype: DType, peers: Float32Array[][], limits: { k: number; v: number } | null = null) {
  const sent: { tag: ExchangeTag; parts: Float32Array[] }[] = [];
  const verdicts: (string | null)[][] = [];
  const attended: QKV[] = [];
  const exchange: Exchange = {
    rank: 0,
    world: 3,
    bytesSent: 0,
    dtype,
    allToAll(tag, parts, judge) {
      sent.push({ tag, parts });
      const got = [new Float32Array(0), ...(peers.shift() ?? [])];
      verdicts.push(got.map((part, j) => (j === 0 || !judge ? null : judge(j, part))));
      return Promise.resolve(got);
    },
  };
  const stages = {
    attention: (x: QKV, width: number) => {
      expect(width).toBe(D);
      attended.push(x);
      return Promise.resolve(x.q);
    },
  } as unknown as StageRunner;
  const io: BlockIO = {
    tag: (block, phase) => ({ job: 1, step: 0, pass: 0, block, phase, group: 0 }),
    compute: (work) => work,
    wait: (work) => work,
    onWire: (work) => work,
    limits: () =>
      limits && {
        q: Float32Array.of(1e9, 1e9),
        k: Float32Array.of(limits.k, limits.k),
        v: Float32Array.of(limits.v, limits.v),
      },
  };
  return { exchange, stages, io, sent, verdicts, attended };
}

describe("a block's displaced attention", () => {
  it("sends its k and v to every peer and attends to every rank's, in token order; the gather is kept as the step's", async () => {
    const world = scripted('f32', [peerParts(0)]);
    const history = new KeysValuesHistory();
    const attention = displacedAttention(cfg, plan, world.stages, world.exchange, history, {
      step: 0,
      pass: 1,
      stale: true,
    });
    await attention(4, qkv(0), world.io);
    expect(world.sent).toHaveLength(1);
    expect(world.sent[0].tag).toMatchObject({ block: 4, phase: 3 });
    expect(world.sent[0].parts).toEqual(Array(3).fill(Float32Array.of(1, 2, 3, 4, 5, 6, 7, 8)));
    expect(world.attended[0].k).toEqual(Float32Array.of(1, 2, 3, 4, 10, 11, 20, 21));
    expect(world.attended[0].v).toEqual(Float32Array.of(5, 6, 7, 8, 12, 13, 22, 23));
    const kept = history.latest(1, 4);
    expect(kept?.step).toBe(0);
    expect(kept?.sent).toEqual(Float32Array.of(1, 2, 3, 4, 5, 6, 7, 8));
    expect(await kept?.parts).toEqual([Float32Array.of(1, 2, 3, 4, 5, 6, 7, 8), ...peerParts(0)]);
    expect(world.verdicts[0]).toEqual([null, null, null]); // no limits: nothing judged
  });

  it("a stale forward attends to the peers' keys and values of the step before; one with no gather of that step waits for this step's", async () => {
    const world = scripted('f32', [peerParts(0), peerParts(1), peerParts(3)]);
    const history = new KeysValuesHistory();
    const at = (step: number, stale: boolean) =>
      displacedAttention(cfg, plan, world.stages, world.exchange, history, { step, pass: 0, stale });
    await at(0, false)(0, qkv(0), world.io);
    await at(1, true)(0, qkv(1), world.io);
    // its own k, v fresh; the peers' from step 0
    expect(world.attended[1].k).toEqual(Float32Array.of(2, 3, 4, 5, 10, 11, 20, 21));
    expect(await history.latest(0, 0)?.parts).toEqual([Float32Array.of(2, 3, 4, 5, 6, 7, 8, 9), ...peerParts(1)]);
    await at(3, true)(0, qkv(3), world.io); // step 2 was never gathered here
    expect(world.attended[2].k).toEqual(Float32Array.of(4, 5, 6, 7, 13, 14, 23, 24));
  });

  it('over int8, the first gather goes as values and the next as their change since, rebuilt on what the peers hold', async () => {
    const delta = [Float32Array.of(0.5, -0.5, 1, 0), Float32Array.of(0, 0.25, -1, 2)];
    const world = scripted('i8', [peerParts(0), delta]);
    const history = new KeysValuesHistory();
    const at = (step: number) =>
      displacedAttention(cfg, plan, world.stages, world.exchange, history, { step, pass: 0, stale: false });
    const roundTrip = (x: Float32Array) => tensorValues(tensorPayload(x, 'i8'), 'i8');
    await at(0)(0, qkv(0), world.io);
    const own0 = Float32Array.of(1, 2, 3, 4, 5, 6, 7, 8);
    expect(world.sent[0].parts[1]).toEqual(own0);
    const sent0 = roundTrip(own0); // what the peers hold of it
    expect(history.latest(0, 0)?.sent).toEqual(sent0);
    await at(1)(0, qkv(1), world.io);
    const own1 = own0.map((x) => x + 1);
    expect(world.sent[1].parts[2]).toEqual(subtract(own1, sent0));
    expect(history.latest(0, 0)?.sent).toEqual(add(sent0, roundTrip(subtract(own1, sent0))));
    const rebuilt = peerParts(0).map((p, j) => add(p, delta[j]));
    expect(await history.latest(0, 0)?.parts).toEqual([add(sent0, roundTrip(subtract(own1, sent0))), ...rebuilt]);
    expect(world.attended[1].k).toEqual(
      Float32Array.of(2, 3, 4, 5, ...rebuilt[0].slice(0, 2), ...rebuilt[1].slice(0, 2)),
    );
    expect(world.attended[1].v).toEqual(Float32Array.of(6, 7, 8, 9, ...rebuilt[0].slice(2), ...rebuilt[1].slice(2)));
  });

  it("judges each peer's k and v within its layer's limits: the values over a float transport, the rebuilt values over deltas", async () => {
    const float = scripted('f32', [[Float32Array.of(10, 11, 12, 13), Float32Array.of(20, 1000, 22, 23)]], {
      k: 100,
      v: 100,
    });
    await displacedAttention(cfg, plan, float.stages, float.exchange, new KeysValuesHistory(), {
      step: 0,
      pass: 0,
      stale: false,
    })(0, qkv(0), float.io);
    expect(float.verdicts[0]).toEqual([
      null,
      null,
      'sent k 1.00e+3 (row 0, column 1 of its part), beyond the 101 its layer can produce',
    ]);
    // each delta in bounds, the values they rebuild walked out of them
    const walk = Float32Array.of(0, 0, 0, 70);
    const deltas = scripted('i8', [peerParts(0), [walk, walk], [walk, walk]], { k: 100, v: 100 });
    const history = new KeysValuesHistory();
    for (const step of [0, 1, 2])
      await displacedAttention(cfg, plan, deltas.stages, deltas.exchange, history, { step, pass: 0, stale: false })(
        0,
        qkv(step),
        deltas.io,
      );
    expect(deltas.verdicts[1]).toEqual([null, null, null]); // 13 + 70, 23 + 70: within 100
    // the allowance of two crossings of int8: 100·1.01² + 2·100/(2·127)
    expect(deltas.verdicts[2][1]).toBe(
      'sent v (rebuilt from its change) 153 (row 0, column 1 of its part), beyond the 103 its layer can produce',
    );
    expect(deltas.verdicts[2][2]).toMatch(/^sent v \(rebuilt from its change\) 163 /);
  });
});

describe("a checker's recompute of a stale forward", () => {
  it('attends to the keys and values of the step before that it holds, sending nothing; without them it says it cannot', async () => {
    const world = scripted('f32', [peerParts(0)]);
    const history = new KeysValuesHistory();
    await displacedAttention(cfg, plan, world.stages, world.exchange, history, { step: 0, pass: 1, stale: false })(
      2,
      qkv(0),
      world.io,
    );
    await heldStaleAttention(cfg, plan, world.stages, history, { step: 1, pass: 1 }, 0)(2, qkv(1), world.io);
    expect(world.sent).toHaveLength(1);
    expect(world.attended[1].k).toEqual(Float32Array.of(2, 3, 4, 5, 10, 11, 20, 21));
    expect(world.attended[1].v).toEqual(Float32Array.of(6, 7, 8, 9, 12, 13, 22, 23));
    await expect(
      heldStaleAttention(cfg, plan, world.stages, history, { step: 3, pass: 1 }, 0)(2, qkv(3), world.io),
    ).rejects.toThrow(
      'a stale recompute of step 3 (pass 1) needs the keys and values of the step before, which this rank does not ' +
        'hold: the checker must be a rank of the group that ran it',
    );
    await expect(
      heldStaleAttention(cfg, plan, world.stages, history, { step: 1, pass: 0 }, 0)(2, qkv(1), world.io),
    ).rejects.toThrow('a stale recompute of step 1 (pass 0)');
  });
});
