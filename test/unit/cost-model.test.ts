import { describe, expect, it } from 'vitest';
import {
  modelParams,
  predictStagedStep,
  candidatePlans,
  coreShares,
  fitLink,
  fitMeshProbe,
  forwardBytes,
  forwardFlops,
  planSwarm,
  predictStep,
  stageCallsPerForward,
  workerOrder,
  type Hardware,
  type LinkSpeed,
  type ModelShape,
  type Plan,
  type Workload,
} from '../../core/cost-model.ts';
import { SeededRandom } from '../../core/random.ts';

const small: ModelShape = {
  numHeads: 2,
  headDim: 2,
  dim: 4,
  ffnDim: 8,
  numLayers: 1,
  inChannels: 1,
  outChannels: 1,
  patchSize: [1, 1, 1],
  textDim: 3,
  freqDim: 2,
};
const wan13b: ModelShape = {
  numHeads: 12,
  headDim: 128,
  dim: 1536,
  ffnDim: 8960,
  numLayers: 30,
  inChannels: 16,
  outChannels: 16,
  patchSize: [1, 2, 2],
  textDim: 4096,
  freqDim: 256,
};
const bench: ModelShape = { ...wan13b, headDim: 48, dim: 576, ffnDim: 3456, numLayers: 2, textDim: 64 };

describe('cost model: FLOPs and bytes of one rank', () => {
  it("counts the busiest rank's forward by hand: D 4, FFN 8, 1 block, S 6 (or 5: tokens 3/2, no padding), L 2, P 2 → 1872 (1784) FLOPs", () => {
    for (const [tokens, attention, total] of [
      [6, 288, 1872],
      [5, 200, 1784],
    ]) {
      const f = forwardFlops(small, tokens, 2, 2);
      // rank 0: 3 tokens, 1 head of 2
      expect(f.block.selfProjections).toBe(4 * 2 * 3 * 16); // 384
      expect(f.block.attention).toBe((2 * 2 * tokens * tokens * 4) / 2); // 288 (200): one head over all S tokens
      expect(f.block.attention).toBe(attention);
      expect(f.block.crossProjections).toBe(2 * 2 * 3 * 16 + 2 * 2 * 2 * 16); // 320
      expect(f.block.crossAttention).toBe(2 * 2 * 3 * 2 * 4); // 96
      expect(f.block.ffn).toBe(2 * 2 * 3 * 4 * 8); // 384
      expect(f.embed).toBe(2 * 3 * 1 * 4 + 2 * (2 * 4 + 16 + 4 * 24) + 2 * 2 * (3 * 4 + 16)); // 376
      expect(f.head).toBe(2 * 3 * 4 * 1); // 24
      expect(f.total).toBe(total);
      // 1 head of 2 over S×S keys; cross: 2 heads × 3 tokens × 2 text tokens
      expect(f.scores).toBe(1 * tokens * tokens + 2 * 3 * 2);
    }
  });

  it('charges attention scores at the measured softmax rate on top of the FLOPs', () => {
    const work: Workload = { model: bench, tokens: 12288, textTokens: 32, passes: 1 };
    const hw: Hardware = { workerFlops: [2e10, 2e10], link: { bandwidth: 1e7, latency: 0 }, bytesPerElement: 4 };
    const withSoftmax = { ...hw, workerSoftmaxRates: [4e8, 4e8] };
    for (const P of [1, 2]) {
      const plan = { ulyssesDegree: P, cfgParallel: false };
      const f = forwardFlops(bench, 12288, 32, P);
      expect(f.scores).toBe(2 * ((12 / P) * 12288 * 12288 + 12 * (12288 / P) * 32));
      expect(predictStep(work, plan, withSoftmax).computeS - predictStep(work, plan, hw).computeS).toBeCloseTo(
        f.scores / 4e8,
        9,
      );
    }
  });

  it("charges each stage call its fixed cost, 3 per block and 2 more per forward, per pass, at the slowest chosen worker's", () => {
    const work: Workload = { model: bench, tokens: 48, textTokens: 32, passes: 2 };
    const hw: Hardware = { workerFlops: [2e10, 2e10], link: { bandwidth: 1e7, latency: 0 }, bytesPerElement: 4 };
    expect(stageCallsPerForward(bench)).toBe(3 * 2 + 2);
    for (const plan of [
      { ulyssesDegree: 1, cfgParallel: false },
      { ulyssesDegree: 2, cfgParallel: false },
      { ulyssesDegree: 1, cfgParallel: true },
    ]) {
      const passesPerGroup = plan.cfgParallel ? 1 : 2;
      const charged =
        predictStep(work, plan, { ...hw, workerStageS: [0.001, 0.003] }).computeS -
        predictStep(work, plan, hw).computeS;
      // one worker: the faster-computing first, whose calls cost 1 ms
      const slowest = plan.ulyssesDegree * (plan.cfgParallel ? 2 : 1) === 1 ? 0.001 : 0.003;
      expect(charged, JSON.stringify(plan)).toBeCloseTo(passesPerGroup * 8 * slowest, 12);
    }
  });

  it('predicts the bytes the busiest rank sends per forward: 4·(S/P)·D·(P−1)/P floats per block where P divides S, at 4 B, over 2 blocks of D 576', () => {
    // rank r sends q, k, v of its rows for the others' heads and its heads' output for the others' rows:
    // (3·rows·(H−h) + h·(S−rows))·d
    const cases: [tokens: number, P: number, bytes: number][] = [
      [12288, 1, 0], // one rank exchanges nothing
      [12288, 2, 56_623_104], // 4 · 6144 · 576 · 1/2 · 4 B · 2 blocks
      [12288, 4, 42_467_328], // 4 · 3072 · 576 · 3/4 · 4 B · 2 blocks
      [32760, 6, 83_865_600], // 4 · 5460 · 576 · 5/6 · 4 B · 2 blocks
      [35, 3, 145_920], // rows 12/12/11, rank 0: (3·12·8 + 4·23)·48 · 4 B · 2 blocks
      [35, 4, 123_264], // rows 9/9/9/8, rank 0: (3·9·9 + 3·26)·48 · 4 B · 2 blocks
      [35, 6, 91_392], // rows 6×5 and 5, rank 0: (3·6·10 + 2·29)·48 · 4 B · 2 blocks
    ];
    for (const [tokens, P, bytes] of cases) {
      expect(forwardBytes(bench, tokens, P, 4), `S ${tokens}, P ${P}`).toBe(bytes);
      expect(forwardBytes(bench, tokens, P, 2), `S ${tokens}, P ${P}, fp16`).toBe(bytes / 2);
      for (const passes of [1, 2] as const) {
        const step = predictStep(
          { model: bench, tokens, textTokens: 32, passes },
          { ulyssesDegree: P, cfgParallel: false },
          { workerFlops: Array<number>(P).fill(16e9), link: { bandwidth: 7e6, latency: 1e-3 }, bytesPerElement: 4 },
        );
        expect(step.bytesPerRank, `S ${tokens}, P ${P}, ${passes} passes per step`).toBe(passes * bytes);
      }
    }
  });

  it("two passes on one group run at once: each one's exchange waits only for what the other's compute does not hide", () => {
    const work: Workload = { model: wan13b, tokens: 32760, textTokens: 512, passes: 2 };
    for (const bandwidth of [1e7, 1e8, 1e10]) {
      const hw: Hardware = { workerFlops: [2e13, 2e13], link: { bandwidth, latency: 0 }, bytesPerElement: 4 };
      const guided = predictStep(work, { ulyssesDegree: 2, cfgParallel: false }, hw);
      // a pass alone, its heads in one group: its whole exchange waits
      const one = predictStep({ ...work, passes: 1 }, { ulyssesDegree: 2, cfgParallel: false, headGroups: 1 }, hw);
      expect(guided.headGroups, 'the other pass hides more than head groups would').toBe(1);
      expect(guided.computeS).toBeCloseTo(2 * one.computeS, 9);
      expect(guided.commS, `${bandwidth} B/s`).toBeCloseTo(2 * Math.max(0, one.commS - one.computeS), 9);
    }
  });

  it('ranks computing on one CPU (WASM tabs of one browser) hide none of their exchange: neither the other pass nor head groups, nor displaced mode; ranks of two CPUs, or unknown ones, do', () => {
    const work: Workload = { model: wan13b, tokens: 32760, textTokens: 512, passes: 2 };
    const hw: Hardware = { workerFlops: [2e13, 2e13], link: { bandwidth: 1e8, latency: 1e-3 }, bytesPerElement: 4 };
    const oneCpu: Hardware = { ...hw, workerCpus: ['browser a', 'browser a'] };
    for (const plan of [
      { ulyssesDegree: 2, cfgParallel: false },
      { ulyssesDegree: 2, cfgParallel: false, mode: 'displaced' as const },
    ]) {
      const shared = predictStep(work, plan, oneCpu);
      const apart = predictStep(work, plan, hw);
      expect(apart.commS, plan.mode ?? 'ulysses').toBeLessThan(shared.commS);
      expect(shared.headGroups).toBe(1); // groups hide nothing, and cost calls
      // every pass's whole exchange: what one pass alone in one group waits for, twice
      const alone = predictStep({ ...work, passes: 1 }, { ...plan, headGroups: 1 }, oneCpu);
      expect(shared.commS, plan.mode ?? 'ulysses').toBeCloseTo(2 * alone.commS, 9);
      expect(alone.commS).toBeCloseTo(
        forwardBytes(wan13b, work.tokens, 2, 4, plan.mode) / 1e8 + (plan.mode ? 1 : 2) * wan13b.numLayers * 1e-3,
        9,
      );
      for (const workerCpus of [
        ['browser a', 'browser b'],
        ['browser a', undefined],
        [undefined, undefined],
      ])
        expect(predictStep(work, plan, { ...hw, workerCpus }).commS).toBe(apart.commS);
    }
  });

  describe('workers of one machine share its cores (issue 66)', () => {
    const work: Workload = { model: wan13b, tokens: 4680, textTokens: 512, passes: 2 };
    const rate = 2e10;
    const onLaptop = (threads: number) => ({ machine: 'laptop', cores: 2, threads });
    const twoBrowsers: Hardware = {
      workerFlops: [rate, rate],
      workerSoftmaxRates: [rate / 10, rate / 10],
      workerStageS: [1e-3, 1e-3],
      workerCores: [onLaptop(2), onLaptop(2)],
      link: { bandwidth: 1e8, latency: 1e-3 },
      bytesPerElement: 4,
    };

    it('two workers with one machine hint and 2 threads each on its 2 cores each compute at half their speed alone', () => {
      expect(coreShares(twoBrowsers, [0, 1])).toEqual([0.5, 0.5]);
      expect(coreShares(twoBrowsers, [1])).toEqual([1]);
      const both = predictStep(work, { ulyssesDegree: 2, cfgParallel: false }, twoBrowsers);
      const alone = predictStep(work, { ulyssesDegree: 1, cfgParallel: false }, twoBrowsers);
      // half the work each at half the speed: a forward as long as one worker's forward of it all
      expect(both.computeS / alone.computeS).toBeGreaterThan(0.99);
      expect(both.stepS).toBeGreaterThanOrEqual(alone.stepS);
      expect(planSwarm(work, twoBrowsers).best.world).toBe(1);
    });

    it('two workers with different hints, or threads within the cores (the tabs of one browser), keep their speed', () => {
      const apart: Hardware = {
        ...twoBrowsers,
        workerCores: [onLaptop(2), { ...onLaptop(2), machine: 'desktop' }],
      };
      const tabsOfOneBrowser: Hardware = { ...twoBrowsers, workerCores: [onLaptop(1), onLaptop(1)] };
      const unsaid: Hardware = { ...twoBrowsers, workerCores: undefined };
      const both = (hw: Hardware) => predictStep(work, { ulyssesDegree: 2, cfgParallel: false }, hw);
      const alone = predictStep(work, { ulyssesDegree: 1, cfgParallel: false }, twoBrowsers);
      expect(coreShares(apart, [0, 1])).toEqual([1, 1]);
      expect(coreShares(tabsOfOneBrowser, [0, 1])).toEqual([1, 1]);
      expect(both(apart).computeS).toBeCloseTo(both(unsaid).computeS, 12);
      expect(both(tabsOfOneBrowser).computeS).toBeCloseTo(both(unsaid).computeS, 12);
      expect(both(apart).computeS).toBeLessThan(0.6 * alone.computeS);
      expect(planSwarm(work, apart).best.world).toBeGreaterThan(1);
    });

    it('a worker probed on more threads than its cores is not slowed again alone, and beside another by what it had', () => {
      const overcommitted: Hardware = { ...twoBrowsers, workerCores: [onLaptop(4), onLaptop(2)] };
      expect(coreShares(overcommitted, [0])).toEqual([1]);
      // 6 threads on 2 cores: the first's 4 get 4/3 cores of the 2 it had, the second's 2 get 2/3 of its 2
      const [first, second] = coreShares(overcommitted, [0, 1]);
      expect(first).toBeCloseTo(2 / 3, 12);
      expect(second).toBeCloseTo(1 / 3, 12);
    });

    it('a rehearsed forward, timed with all of them at once, is taken as it is: the sharing is in it already', () => {
      const rehearsed: Hardware = { ...twoBrowsers, rehearsedForwardS: () => 0.25 };
      const step = predictStep(work, { ulyssesDegree: 2, cfgParallel: false }, rehearsed);
      expect(step.computeS).toBeCloseTo(2 * 0.25, 12);
    });

    it('plans take a slower worker of a machine of its own before a second worker of a busy one', () => {
      const hw: Hardware = {
        ...twoBrowsers,
        workerFlops: [rate, rate, 0.75 * rate],
        workerSoftmaxRates: [rate / 10, rate / 10, rate / 10],
        workerStageS: [1e-3, 1e-3, 1e-3],
        workerCores: [onLaptop(2), onLaptop(2), { machine: 'desktop', cores: 2, threads: 2 }],
      };
      expect(workerOrder(hw)).toEqual([0, 2, 1]);
      expect(workerOrder({ workerFlops: [1, 3, 2, 3] })).toEqual([1, 3, 2, 0]);
    });
  });

  it("head groups hide all of a block's attention but the last group's behind its exchange, each group past the first a stage call more a block: the fastest is predicted (issue 20)", () => {
    const work: Workload = { model: bench, tokens: 12288, textTokens: 32, passes: 1 };
    const f = forwardFlops(bench, 12288, 32, 2);
    const attentionS = (bench.numLayers * f.block.attention) / 1e10; // softmax free
    const slowLink: Hardware = { workerFlops: [1e10, 1e10], link: { bandwidth: 1e6, latency: 0 }, bytesPerElement: 4 };
    const wireS = forwardBytes(bench, 12288, 2, 4) / 1e6;
    expect(wireS).toBeGreaterThan(attentionS); // the exchange is long enough to hide all of it
    const at = (headGroups: number, hw = slowLink) =>
      predictStep(work, { ulyssesDegree: 2, cfgParallel: false, headGroups }, hw);
    for (const G of [1, 2, 3]) {
      expect(at(G).commS, `${G} groups`).toBeCloseTo(wireS - attentionS * (1 - 1 / G), 9);
      expect(at(G).computeS).toBeCloseTo(f.total / 1e10, 9);
    }
    expect(predictStep(work, { ulyssesDegree: 2, cfgParallel: false }, slowLink).headGroups).toBe(3);
    // a stage call that costs more than a third of the attention a block hides: one group
    const dearCalls: Hardware = { ...slowLink, workerStageS: [attentionS, attentionS] };
    expect(at(2, dearCalls).computeS - at(1, dearCalls).computeS).toBeCloseTo(bench.numLayers * attentionS, 9);
    expect(predictStep(work, { ulyssesDegree: 2, cfgParallel: false }, dearCalls).headGroups).toBe(1);
    // displaced ranks and one rank exchange in one group whatever is asked
    expect(
      predictStep(work, { ulyssesDegree: 2, cfgParallel: false, mode: 'displaced', headGroups: 3 }, slowLink)
        .headGroups,
    ).toBe(1);
    expect(predictStep(work, { ulyssesDegree: 1, cfgParallel: false, headGroups: 3 }, slowLink).headGroups).toBe(1);
  });

  it('fp16 transport halves the bytes and the transfer time', () => {
    const work: Workload = { model: wan13b, tokens: 32760, textTokens: 512, passes: 1 };
    const hw = (bpe: 2 | 4): Hardware => ({
      workerFlops: [2e13, 2e13],
      link: { bandwidth: 125e6, latency: 0 },
      bytesPerElement: bpe,
    });
    const [f32, f16] = [4, 2].map((bpe) =>
      predictStep(work, { ulyssesDegree: 2, cfgParallel: false, headGroups: 1 }, hw(bpe as 2 | 4)),
    );
    expect(f16.bytesPerRank / f32.bytesPerRank).toBe(0.5);
    expect(f16.commS / f32.commS).toBeCloseTo(0.5, 12);
  });

  it('charges (P−1)·latency twice per block and one extra exchange per step for CFG parallel', () => {
    const work: Workload = { model: bench, tokens: 12288, textTokens: 32, passes: 2 };
    const hw: Hardware = {
      workerFlops: [1e10, 1e10, 1e10, 1e10],
      link: { bandwidth: Infinity, latency: 0.01 },
      bytesPerElement: 4,
    };
    expect(
      predictStep(
        { ...work, passes: 1 },
        { ulyssesDegree: 3, cfgParallel: false, headGroups: 1 },
        { ...hw, workerFlops: [1e10, 1e10, 1e10] },
      ).commS,
    ).toBeCloseTo(2 * 2 * 2 * 0.01, 12);
    const cfg = predictStep(work, { ulyssesDegree: 2, cfgParallel: true, headGroups: 1 }, hw);
    expect(cfg.world).toBe(4);
    expect(cfg.commS).toBeCloseTo(2 * 1 * 2 * 0.01 + 0.01, 12); // one pass per group + the CFG exchange
    expect(cfg.computeS).toBeCloseTo(forwardFlops(bench, 12288, 32, 2).total / 1e10, 9);
  });
});

describe("cost model: the coordinator's patches out and rows back", () => {
  it('costs (in + out) · pt·ph·pw · 4 bytes per token per pass over the coordinator link, whatever P', () => {
    const work: Workload = { model: bench, tokens: 12288, textTokens: 32, passes: 2 };
    const bytes = 2 * 12288 * (16 + 16) * 4 * 4; // 6.3 MB per step
    for (const P of [1, 2, 3]) {
      const hw: Hardware = {
        workerFlops: Array<number>(P).fill(1e10),
        link: { bandwidth: 1e7, latency: 0.01 },
        bytesPerElement: 4,
      };
      expect(predictStep(work, { ulyssesDegree: P, cfgParallel: false }, hw).ioS).toBeCloseTo(
        bytes / 1e7 + 2 * 2 * 0.01,
        12,
      );
    }
  });

  it('is free when the coordinator and the worker share a tab (local backend)', () => {
    const work: Workload = { model: bench, tokens: 12288, textTokens: 32, passes: 1 };
    const p = predictStep(
      work,
      { ulyssesDegree: 1, cfgParallel: false },
      { workerFlops: [1e10], link: { bandwidth: 1e7, latency: 0.01 }, bytesPerElement: 4, coordinatorLink: null },
    );
    expect(p.ioS).toBe(0);
    expect(p.stepS).toBe(p.computeS);
  });
});

describe('planSwarm', () => {
  const work: Workload = { model: bench, tokens: 12288, textTokens: 32, passes: 1 };

  it('keeps one worker when the link is too slow for the exchange to pay off', () => {
    const choice = planSwarm(work, {
      workerFlops: [16e9, 16e9, 16e9, 16e9],
      link: { bandwidth: 1e5, latency: 0.005 },
      bytesPerElement: 4,
    });
    expect(choice.best.plan).toEqual({ ulyssesDegree: 1, cfgParallel: false });
  });

  it('spreads over the workers when compute dominates the exchange', () => {
    const choice = planSwarm(work, {
      workerFlops: [16e9, 16e9, 16e9, 16e9],
      link: { bandwidth: 1e9, latency: 1e-4 },
      bytesPerElement: 4,
    });
    expect(choice.best.plan.ulyssesDegree).toBe(4);
    expect(choice.best.stepS).toBeLessThan(choice.baseline.stepS / 3);
  });

  it('uses the fastest workers and the slowest link among them', () => {
    const links = (i: number, j: number) => ({ bandwidth: i + j === 1 ? 1e9 : 1e3, latency: 0 });
    const choice = planSwarm(work, { workerFlops: [16e9, 16e9, 1e9], link: links, bytesPerElement: 4 }, [
      { ulyssesDegree: 2, cfgParallel: false },
    ]);
    expect(choice.best.plan.ulyssesDegree).toBe(2); // workers 0 and 1, over their fast link
  });

  it('never picks a plan predicted slower than one worker, whatever the hardware and candidates', () => {
    const random = new SeededRandom(5);
    for (let trial = 0; trial < 200; trial++) {
      const workers = 1 + Math.floor(random.uniform() * 8);
      const hw: Hardware = {
        workerFlops: Array.from({ length: workers }, () => 10 ** (9 + 5 * random.uniform())),
        link: { bandwidth: 10 ** (4 + 6 * random.uniform()), latency: 10 ** (-5 + 4 * random.uniform()) },
        bytesPerElement: random.uniform() < 0.5 ? 2 : 4,
      };
      const w: Workload = {
        model: random.uniform() < 0.5 ? bench : wan13b,
        tokens: 1 + Math.floor(random.uniform() * 40000),
        textTokens: 32,
        passes: random.uniform() < 0.5 ? 1 : 2,
      };
      const all = candidatePlans(w, workers);
      const onlyParallel = all.filter((p) => p.ulyssesDegree > 1 || p.cfgParallel);
      for (const candidates of [all, onlyParallel]) {
        const choice = planSwarm(w, hw, candidates);
        expect(choice.best.stepS).toBeLessThanOrEqual(choice.baseline.stepS);
        expect(choice.ranked[0]).toBe(choice.best);
      }
    }
  });

  it('refuses a degree of more ranks than heads, saying what it allows', () => {
    expect(() =>
      planSwarm(
        work,
        { workerFlops: new Array<number>(13).fill(1e9), link: { bandwidth: 1e9, latency: 0 }, bytesPerElement: 4 },
        [{ ulyssesDegree: 13, cfgParallel: false }],
      ),
    ).toThrow(/from 1 to the model's 12 heads/);
  });
});

describe('fitLink', () => {
  it('recovers latency and bandwidth from timed transfers of several sizes', () => {
    const link = fitLink([64e3, 256e3, 1e6, 4e6].map((bytes) => ({ bytes, seconds: 0.002 + bytes / 7e6 })));
    expect(link.bandwidth).toBeCloseTo(7e6, -2);
    expect(link.latency).toBeCloseTo(0.002, 9);
  });

  it('needs at least two transfer sizes', () => {
    expect(() =>
      fitLink([
        { bytes: 1e6, seconds: 0.1 },
        { bytes: 1e6, seconds: 0.2 },
      ]),
    ).toThrow(/at least two sizes/);
  });
});

// Hand-countable sizes where nothing is 1 that a formula multiplies by: C_in 2, C_out 3, patch 1×2×2.
const tiny: ModelShape = {
  numHeads: 2,
  headDim: 2,
  dim: 4,
  ffnDim: 8,
  numLayers: 1,
  inChannels: 2,
  outChannels: 3,
  patchSize: [1, 2, 2],
  textDim: 3,
  freqDim: 2,
};
// With P 2 over S 6 (Sl 3) and L 2, one rank's forward is 2304 FLOPs, and its all-to-alls send
// 4·Sl·D·(P−1)/P = 24 floats = 96 bytes per block.
const TOTAL_P2 = 2304;

describe('cost model: channels and patch volume', () => {
  it('counts the patch volume and the channels in the embedding and the head: C_in 2, C_out 3, patch 1×2×2, S 6, L 2, P 2', () => {
    const f = forwardFlops(tiny, 6, 2, 2);
    // patch embedding 2·Sl·C_in·(pt·ph·pw)·D = 2·3·2·4·4, time MLP and modulation 2·(F·D + D·D + D·6D),
    // text MLP 2·L·(T·D + D·D): 192 + 240 + 112
    expect(f.embed).toBe(2 * 3 * 2 * 4 * 4 + 2 * (2 * 4 + 4 * 4 + 4 * 6 * 4) + 2 * 2 * (3 * 4 + 4 * 4));
    expect(f.embed).toBe(544);
    expect(f.head).toBe(2 * 3 * 4 * 3 * 4); // 2·Sl·D·C_out·(pt·ph·pw) = 288
    expect(f.block.total).toBe(384 + 288 + 320 + 96 + 384);
    expect(f.total).toBe(TOTAL_P2); // 544 + 1 block of 1472 + 288
    expect(f.scores).toBe(1 * 6 * 6 + 2 * 3 * 2); // 48
  });
});

describe('predictStep', () => {
  const work: Workload = { model: tiny, tokens: 6, textTokens: 2, passes: 1 };

  it('runs on the fastest `world` workers, at the pace of the slowest of them and of the slowest link between them', () => {
    const slow: LinkSpeed = { bandwidth: 1, latency: 10 };
    // worker 0 is the slowest and has the worst links: a plan on 2 of 3 workers never touches it
    const link = (i: number, j: number): LinkSpeed =>
      i === 0 || j === 0 ? slow : i === 1 ? { bandwidth: 96, latency: 0.5 } : { bandwidth: 48, latency: 0.25 };
    const hw: Hardware = {
      workerFlops: [1152, 4608, 2304],
      workerSoftmaxRates: [12, 48, 24],
      link,
      bytesPerElement: 4,
    };
    expect(predictStep(work, { ulyssesDegree: 2, cfgParallel: false }, hw)).toEqual({
      plan: { ulyssesDegree: 2, cfgParallel: false },
      headGroups: 1, // a head each: one group
      world: 2,
      flopsPerRank: TOTAL_P2,
      bytesPerRank: 96,
      computeS: TOTAL_P2 / 2304 + 48 / 24, // workers 1 and 2 at the slower one's rates: 1 + 2
      commS: 96 / 48 + 2 * (2 - 1) * 0.5, // 48 B/s and 0.5 s: the worse of the two directions, 2 all-to-alls per block
      ioS: (6 * (2 + 3) * 4 * 4) / 48 + 2 * 1 * 0.5, // 480 patch bytes over the same slowest link, out and back: 11
      stepS: 3 + 3 + 11,
      measured: false,
    });
  });

  it('with CFG parallel on two groups of 2: one pass per group, its all-to-alls, and one exchange of output rows', () => {
    const hw: Hardware = {
      workerFlops: [2304, 2304, 2304, 2304],
      link: { bandwidth: 48, latency: 0.5 },
      bytesPerElement: 4,
      coordinatorLink: { bandwidth: 96, latency: 1 },
    };
    const p = predictStep({ ...work, passes: 2 }, { ulyssesDegree: 2, cfgParallel: true }, hw);
    // rows [S, pt·ph·pw·C_out] = 6 × 12 floats, 288 bytes, from one group to the other
    const cfgComm = 288 / 48 + 0.5;
    expect(p).toEqual({
      plan: { ulyssesDegree: 2, cfgParallel: true },
      headGroups: 1,
      world: 4,
      flopsPerRank: TOTAL_P2,
      bytesPerRank: 96 + 288,
      computeS: 1,
      commS: 96 / 48 + 2 * 0.5 + cfgComm, // 3 + 6.5
      ioS: (2 * 6 * (2 + 3) * 4 * 4) / 96 + 2 * 2 * 1, // both passes' patches over the coordinator's own link: 10 + 4
      stepS: 1 + 9.5 + 14,
      measured: false,
    });
  });

  it('takes the step the jobs that ran a plan measured as its prediction, in any head groups, asked with the plan and the bytes a value, and predicts the others', () => {
    const hw: Hardware = { workerFlops: [2304, 2304], link: { bandwidth: 48, latency: 0.5 }, bytesPerElement: 2 };
    const asked: [Plan, number][] = [];
    const measuredStepS = (plan: Plan, bytes: number) => (
      asked.push([plan, bytes]),
      plan.ulyssesDegree === 2 ? 42 : undefined
    );
    const plan: Plan = { ulyssesDegree: 2, cfgParallel: false, headGroups: 1 };
    const predicted = predictStep(work, plan, hw);
    const p = predictStep(work, plan, { ...hw, measuredStepS });
    expect(asked).toEqual([[plan, 2]]);
    expect([p.stepS, p.measured]).toEqual([42, true]);
    // what it would have predicted is still there to compare
    expect([p.computeS, p.commS, p.ioS]).toEqual([predicted.computeS, predicted.commS, predicted.ioS]);
    const one = predictStep(work, { ulyssesDegree: 1, cfgParallel: false }, { ...hw, measuredStepS });
    expect(one.measured).toBe(false);
    expect(one.stepS).toBe(one.computeS + one.commS + one.ioS);
  });

  it('on one worker never reads the rank-to-rank link, even one measured dead', () => {
    const p = predictStep(
      work,
      { ulyssesDegree: 1, cfgParallel: false },
      { workerFlops: [4128], link: { bandwidth: 0, latency: 0 }, bytesPerElement: 4, coordinatorLink: null },
    );
    expect(p.computeS).toBe(1); // 4128 FLOPs of the whole forward at 4128 FLOP/s
    expect(p.commS).toBe(0);
    expect(p.stepS).toBe(1);
  });

  it('refuses CFG parallel without guidance, and a plan on more workers than were measured', () => {
    const hw: Hardware = { workerFlops: [1e9], link: { bandwidth: 1e6, latency: 0 }, bytesPerElement: 4 };
    expect(() =>
      predictStep(work, { ulyssesDegree: 1, cfgParallel: true }, { ...hw, workerFlops: [1e9, 1e9] }),
    ).toThrow('cfgParallel needs two passes per step (guidance ≠ 1); this workload has one');
    expect(() => predictStep(work, { ulyssesDegree: 2, cfgParallel: false }, hw)).toThrow(
      'plan needs 2 workers, 1 measured',
    );
  });
});

describe('candidatePlans and planSwarm', () => {
  const guided: Workload = { model: tiny, tokens: 6, textTokens: 2, passes: 2 };

  it('offers CFG parallel for a degree exactly when two groups of it fit the workers, and only with guidance', () => {
    const plans = (work: Workload, workers: number) =>
      candidatePlans(work, workers).map((p) => `${p.ulyssesDegree}${p.cfgParallel ? '×2' : ''}`);
    expect(plans(guided, 4)).toEqual(['1', '1×2', '2', '2×2']);
    expect(plans(guided, 2)).toEqual(['1', '1×2', '2']); // 2×2 needs 4
    expect(plans(guided, 1)).toEqual(['1']);
    expect(plans({ ...guided, passes: 1 }, 4)).toEqual(['1', '2']);
  });

  it('ranks each candidate once: the one-worker plan among them is the baseline, not a second entry', () => {
    const choice = planSwarm(
      { ...guided, passes: 1 },
      { workerFlops: [1e9, 1e9], link: { bandwidth: 1e6, latency: 0 }, bytesPerElement: 4 },
    );
    expect(choice.ranked.map((p) => p.plan.ulyssesDegree).sort()).toEqual([1, 2]);
  });

  it('breaks a tie in predicted time toward fewer workers: free compute and links tie every plan at 0 s', () => {
    const work: Workload = { model: { ...tiny, numHeads: 4 }, tokens: 8, textTokens: 2, passes: 1 };
    const free: Hardware = {
      workerFlops: [Infinity, Infinity, Infinity, Infinity],
      link: { bandwidth: Infinity, latency: 0 },
      bytesPerElement: 4,
      coordinatorLink: null,
    };
    const choice = planSwarm(work, free, [
      { ulyssesDegree: 4, cfgParallel: false },
      { ulyssesDegree: 2, cfgParallel: false },
    ]);
    expect(choice.ranked.map((p) => p.stepS)).toEqual([0, 0, 0]);
    expect(choice.ranked.map((p) => p.world)).toEqual([1, 2, 4]);
  });
});

describe('fitLink and fitMeshProbe', () => {
  it('refuse timings where the larger transfer was not slower: equal, or faster', () => {
    const message = 'fitLink: larger transfers were not slower; probe with larger messages';
    expect(() =>
      fitLink([
        { bytes: 1000, seconds: 0.01 },
        { bytes: 2000, seconds: 0.01 },
      ]),
    ).toThrow(message);
    expect(() =>
      fitLink([
        { bytes: 1000, seconds: 0.02 },
        { bytes: 2000, seconds: 0.01 },
      ]),
    ).toThrow(message);
  });

  it('count a large exchange as at least 0.5 ms slower than the small one: 1000 B in 2 ms and 6000 B in 2.2 ms fit as 1e7 B/s after 1.9 ms', () => {
    // 2.2 ms is raised to 2 + 0.5: the line through (1000, 0.002) and (6000, 0.0025) has slope 1e-7 s/B
    const link = fitMeshProbe({
      rank: 0,
      bytesPerPeer: 6000,
      smallBytes: 1000,
      bytesSent: 6000,
      smallMs: 2,
      largeMs: 2.2,
    });
    expect(link.bandwidth).toBeCloseTo(1e7, 3);
    expect(link.latency).toBeCloseTo(0.0019, 12);
  });
});

describe('cost model: pipeline stages (pooled memory)', () => {
  const wan14b: ModelShape = { ...wan13b, numHeads: 40, dim: 5120, ffnDim: 13824, numLayers: 40 };
  const work14b: Workload = { model: wan14b, tokens: 32760, textTokens: 512, passes: 2 };
  const gpus: Hardware = {
    workerFlops: Array<number>(8).fill(20e12),
    link: { bandwidth: 125e6, latency: 1e-3 },
    bytesPerElement: 2,
  };

  it("counts the published 1.3B folder's 1,418,996,800 parameters, and 14.29 B for the 14B layout", () => {
    const count = (m: ModelShape) => {
      const p = modelParams(m);
      return m.numLayers * p.block + p.embedders + p.head;
    };
    expect(count(wan13b)).toBe(1_418_996_800);
    expect(modelParams(wan14b).block).toBe(351_394_304);
    expect(count(wan14b)).toBe(14_288_491_584);
  });

  it('one stage is the Ulysses step; more stages add only the fill of the pipeline, which PipeFusion shrinks', () => {
    const whole = predictStep(work14b, { ulyssesDegree: 2, cfgParallel: false }, { ...gpus, coordinatorLink: null });
    const one = predictStagedStep(work14b, { stages: 1, ulyssesDegree: 2, cfgParallel: false, mode: 'exact' }, gpus);
    expect(one.stepS).toBeCloseTo(whole.computeS + whole.commS, 6);
    expect(one.schedule).toBe('batched');
    expect(one.boundaryBytesPerRank).toBe(0);
    const exact = predictStagedStep(work14b, { stages: 4, ulyssesDegree: 2, cfgParallel: false, mode: 'exact' }, gpus);
    // two passes one behind the other through four stages of a quarter of the blocks: 2 + 3 stage slots, 3 hand-overs
    expect(exact.schedule).toBe('pipelined');
    expect(exact.stepS).toBeCloseTo(5 * exact.stageForwardS + 3 * exact.boundaryS, 6);
    const fused = predictStagedStep(
      work14b,
      { stages: 4, ulyssesDegree: 2, cfgParallel: false, mode: 'pipefusion', patches: 12 },
      gpus,
    );
    expect(fused.stepS).toBeCloseTo(2 * fused.stageForwardS + (3 * (fused.stageForwardS + fused.boundaryS)) / 12, 6);
    expect(fused.stepS).toBeLessThan(exact.stepS);
    // where a call has a fixed cost, each patch pays a stage forward's calls again: 10 blocks of 3 calls, and 2
    const calling = { ...gpus, workerStageS: Array<number>(8).fill(0.05) };
    const plan = { stages: 4, ulyssesDegree: 2, cfgParallel: false } as const;
    const exactCalling = predictStagedStep(work14b, { ...plan, mode: 'exact' }, calling);
    const fusedCalling = predictStagedStep(work14b, { ...plan, mode: 'pipefusion', patches: 12 }, calling);
    const callS = 32 * 0.05;
    const patchS = (fusedCalling.stageForwardS - callS) / 12 + callS;
    expect(fusedCalling.stepS).toBeCloseTo(2 * 12 * patchS + 3 * (patchS + fusedCalling.boundaryS / 12), 6);
    expect(fusedCalling.stepS - fused.stepS).toBeGreaterThan(exactCalling.stepS - exact.stepS);
    // each rank hands the next stage its tokens' hidden state (bfloat16 on the wire) and the conditioning, per pass
    expect(exact.boundaryBytesPerRank).toBe(2 * ((32760 / 2) * 5120 * 2 + (512 + 7) * 5120 * 4));
  });

  it('stages cut what each rank holds; PipeFusion pays for its speed in keys and values of the step before', () => {
    const p = modelParams(wan14b);
    const plan = (stages: number) =>
      predictStagedStep(work14b, { stages, ulyssesDegree: 1, cfgParallel: false, mode: 'exact' }, gpus);
    expect(plan(1).weightBytesPerRank).toBe(2 * (40 * p.block + p.embedders));
    expect(plan(4).weightBytesPerRank).toBe(2 * (10 * p.block + p.embedders));
    expect(plan(4).staleKeysValuesBytesPerRank).toBe(0);
    const fused = predictStagedStep(
      work14b,
      { stages: 4, ulyssesDegree: 2, cfgParallel: false, mode: 'pipefusion' },
      gpus,
    );
    // both passes' k and v of all tokens, for the stage's 10 blocks and the rank's half of the heads
    expect(fused.staleKeysValuesBytesPerRank).toBe((2 * 2 * 32760 * 5120 * 10 * 2) / 2);
    expect(() => predictStagedStep(work14b, { ...fused.plan, stages: 41 }, gpus)).toThrow('41 stages of 40 blocks');
  });
});
