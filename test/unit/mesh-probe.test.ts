import { EXACT_SETTINGS } from './in-process-executor.ts';
import { beforeAll, describe, expect, it } from 'vitest';
import type { WanModel } from '../../core/model/reference.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { fitMeshProbe } from '../../core/cost-model.ts';
import type { MeshProbe } from '../../core/worker-api.ts';
import { PROBE_FLOATS, probeMesh } from '../../rank/mesh-probe.ts';
import { referenceStages } from '../../rank/stages.ts';
import { inProcessRanks, stubEngine, tinyModelFiles } from './fixtures.ts';

let model: WanModel;
beforeAll(async () => {
  model = await loadTransformer(tinyModelFiles);
});

/** P ranks in one process, each prepared for job 5 over one in-memory mesh. */
async function preparedRanks(world: number, heads?: number[], headGroups?: number) {
  const prepared = inProcessRanks(world, stubEngine(referenceStages(model), model.config));
  const peers = prepared.ranks.map((_, r) => `p${r}`);
  for (const [rank, api] of prepared.ranks.entries()) {
    await api.initWorker({
      ...EXACT_SETTINGS,
      rank,
      world,
      peers,
      session: 's',
      ...(heads && { heads }),
      ...(headGroups && { headGroups }),
    });
    await api.loadModel({ modelUrl: 'x', ep: 'wasm' });
    await api.prepareJob({ job: 5, texts: [new Float32Array(32 * model.config.textDim)], latentShape: [16, 1, 8, 8] });
  }
  return prepared;
}

describe('mesh probe: the rank-to-rank link timed on the job’s own all-to-all', () => {
  it('every rank of 3 times its exchanges and says what it sent', async () => {
    const { ranks } = await preparedRanks(3);
    const probes = await Promise.all(ranks.map((r) => r.probeMesh({ job: 5 })));
    expect(probes.map((p) => p.rank)).toEqual([0, 1, 2]);
    for (const p of probes) {
      expect(p.bytesPerPeer).toBe(PROBE_FLOATS[2] * 4);
      expect(p.bytesSent).toBe(2 * PROBE_FLOATS[2] * 4);
      expect(p.smallBytes).toBe(2 * 4);
      expect(p.smallMs).toBeGreaterThanOrEqual(0);
    }
  });

  it('is refused for a job that is not the prepared one, and probes over f16 send half the bytes', async () => {
    const [rank] = (await preparedRanks(1)).ranks;
    await expect(rank.probeMesh({ job: 4 })).rejects.toThrow('probeMesh for job 4 but job 5 was prepared');
    const f16 = await Promise.all(memoryExchanges(2, 'f16').map((e) => probeMesh(e, 1)));
    expect(f16[0].bytesSent).toBe(PROBE_FLOATS[2] * 2);
  });

  it('fits bandwidth from the difference between the large and the small exchange', () => {
    const probe: MeshProbe = {
      rank: 0,
      bytesPerPeer: 524_288,
      smallBytes: 8,
      bytesSent: 1_048_576,
      smallMs: 2,
      largeMs: 102,
    };
    const link = fitMeshProbe(probe);
    expect(link.bandwidth).toBeCloseTo((1_048_576 - 8) / 0.1, -2); // ≈ 10.5 MB/s
    expect(link.latency).toBeCloseTo(0.002, 5);
  });

  it('a peer may send probe tensors only at the probe sizes, and only for the prepared job', async () => {
    const [rank] = (await preparedRanks(2)).runtimes;
    const tag = (step: number, job = 5) => ({ job, step, pass: 0, block: 0, phase: 2, group: 0 });
    expect(rank.judgeTensor(1, tag(0), 4)).toBeNull();
    expect(rank.judgeTensor(1, tag(2), PROBE_FLOATS[2] * 4)).toBeNull();
    expect(rank.judgeTensor(1, tag(2), 4)).toMatch(/the plan says 524288/);
    expect(rank.judgeTensor(1, tag(3), 4)).toMatch(/unknown exchange phase 2 step 3/);
    expect(rank.judgeTensor(1, tag(0, 6), 4)).toMatch(/job 6/);
    expect(rank.judgeTensor(1, { ...tag(0), phase: 3 }, 4)).toMatch(/unknown exchange phase 3/);
  });

  it("with uneven shares (heads 6/4/2 of 12, tokens 9/5/2 of 16) a peer's tensor is judged at the size of its share and this rank's, a head group at a time (issue 18)", async () => {
    // three head groups asked, two given: rank 2 has two heads. Rank 0's 6 heads go as 3 + 3, rank 2's as 1 + 1
    const { runtimes } = await preparedRanks(3, [6, 4, 2], 3);
    const d = model.config.headDim;
    const tag = (phase: number, group = 0) => ({ job: 5, step: 0, pass: 0, block: 0, phase, group });
    // rank 0 gets q, k, v of rank 2's 2 tokens for 3 of its heads, and one of rank 2's heads' output for its 9 tokens
    for (const group of [0, 1]) {
      expect(runtimes[0].judgeTensor(2, tag(0, group), 4 * 3 * 2 * 3 * d)).toBeNull();
      expect(runtimes[0].judgeTensor(2, tag(1, group), 4 * 9 * 1 * d)).toBeNull();
      // rank 2 gets rank 0's 9 tokens for one of its heads, and 3 of rank 0's heads' output for its 2 tokens
      expect(runtimes[2].judgeTensor(0, tag(0, group), 4 * 3 * 9 * 1 * d)).toBeNull();
      expect(runtimes[2].judgeTensor(0, tag(1, group), 4 * 2 * 3 * d)).toBeNull();
    }
    expect(runtimes[0].judgeTensor(2, tag(0, 2), 4 * 3 * 2 * 3 * d)).toMatch(/head group 2 of 2/);
    // all of a rank's heads at once, or an even share's size, is refused
    expect(runtimes[0].judgeTensor(2, tag(0), 4 * 3 * 2 * 6 * d)).toMatch(
      new RegExp(`the plan says ${4 * 3 * 2 * 3 * d}$`),
    );
    expect(runtimes[0].judgeTensor(2, tag(0), 4 * 3 * 5 * 2 * d)).toMatch(
      new RegExp(`the plan says ${4 * 3 * 2 * 3 * d}$`),
    );
    expect(runtimes[1].judgeTensor(3, tag(0), 0)).toMatch(/from rank 3 of a mesh of 3/);
    await expect(
      runtimes[0].initWorker({
        ...EXACT_SETTINGS,
        rank: 0,
        world: 3,
        peers: ['a', 'b', 'c'],
        session: 't',
        heads: [6, 6],
      }),
    ).rejects.toThrow(/a head share for each of 3 ranks/);
  });
});
