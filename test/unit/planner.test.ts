import { beforeAll, describe, expect, it } from 'vitest';
import type { WorkerMeasurement } from '../../coordinator/measure.ts';
import { Measurements, type WorkerGroup } from '../../coordinator/measurements.ts';
import { loadArgsOf, type PlacementRequest, type ResolvedPlacement } from '../../coordinator/placement.ts';
import {
  planPlacement,
  rehearsalsNeeded,
  workerPlanNotes,
  type PlannerContext,
  type PlanningWorker,
} from '../../coordinator/planner.ts';
import { predictStep, type Hardware, type Workload } from '../../core/cost-model.ts';
import { defined } from '../../core/defined.ts';
import { DEFAULT_JOB, jobParams, type JobParams } from '../../core/job.ts';
import { latentShape, wan21Latent } from '../../core/model/family.ts';
import { parseWanConfig } from '../../core/model/config.ts';
import { readJson } from '../../core/model/files.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { TRANSFORMER_CONFIG } from '../../core/model/transformer.ts';
import { proportionalShares } from '../../core/parallel.ts';
import type { WorkerInfo } from '../../core/worker-api.ts';
import { machineNamed, tinyModelFiles } from './fixtures.ts';

// The planner is pure: from the request, the job, the live workers and what they measured, every
// decision of a placement. These tests give it plain workers with hand-made measurements and a
// store of rehearsals, and read the ResolvedPlacement it returns; nothing is placed.
let ctx: PlannerContext; // the bundled tiny model: 12 heads

beforeAll(async () => {
  const config = parseWanConfig(await readJson(tinyModelFiles, TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
  ctx = {
    config,
    latent: wan21Latent(config.inChannels),
    modelUrl: '/models/tiny-wan',
    backend: 'swarm',
    textTokens: 16,
  };
});

const guided = jobParams(DEFAULT_JOB);
const unguided = jobParams({ ...DEFAULT_JOB, guidance: 1 });
const link = { rttMs: 2, bandwidth: 1e9 };

/** A WASM worker measured at `gflops` (its softmax and stage-call rates in proportion), or unmeasured (null). */
function worker(id: string, gflops: number | null): PlanningWorker {
  const measurement: WorkerMeasurement | null =
    gflops === null
      ? null
      : {
          threads: 1,
          compute: { wasm: { ep: 'wasm', flops: gflops * 1e9, softmaxRate: gflops * 1e8, stageMs: 1 / gflops } },
          auto: { ep: 'wasm', why: 'WASM only' },
          ...link,
        };
  const info: WorkerInfo = {
    ep: 'wasm',
    adapter: 'stub',
    softwareAdapter: false,
    threads: 1,
    memoryGiB: null,
    userAgent: id,
    cores: 1,
    machine: machineNamed(id),
  };
  return { id, info, measurement };
}

/** Workers w0, w1, … measured at these GFLOP/s, in the order they joined. */
const workersAt = (...gflops: (number | null)[]): PlanningWorker[] => gflops.map((g, i) => worker(`w${i}`, g));

const plan = (
  params: JobParams,
  request: PlacementRequest,
  workers: readonly PlanningWorker[],
  extra: { measurements?: Measurements; maxWorld?: number } = {},
): ResolvedPlacement =>
  planPlacement(ctx, { params, request, workers, measurements: extra.measurements ?? new Measurements(), ...extra });

const workload = (params: JobParams): Workload => ({
  model: ctx.config,
  tokens: tokenGrid(ctx.config, latentShape(params, wan21Latent(ctx.config.inChannels))).count,
  textTokens: 16,
  passes: params.guidance === 1 ? 1 : 2,
});

/** What the cost model is given for exactly these workers over the coordinator's links, at float32. */
function hardwareOf(workers: readonly PlanningWorker[]): Hardware {
  const rates = workers.map((w) => defined(defined(w.measurement, w.id).compute.wasm, `${w.id}'s wasm rates`));
  return {
    workerFlops: rates.map((r) => r.flops),
    workerSoftmaxRates: rates.map((r) => r.softmaxRate),
    workerStageS: rates.map((r) => r.stageMs / 1000),
    link: { bandwidth: link.bandwidth, latency: link.rttMs / 2000 },
    bytesPerElement: 4,
  };
}

/** The placed workers' ids, in rank order. */
const idsOf = (placement: ResolvedPlacement) => placement.workers.map((w) => w.id);
/** The placed workers themselves, in rank order. */
const placedOf = (workers: readonly PlanningWorker[], placement: ResolvedPlacement) =>
  idsOf(placement).map((id) =>
    defined(
      workers.find((w) => w.id === id),
      id,
    ),
  );

describe('the cost model and the placement use the same workers', () => {
  it('measured workers joined slowest first are placed fastest first, and a degree asked for is predicted on exactly those it places', () => {
    // joined slowest first; nothing rehearsed, so the cost model predicts from the probe rates
    const workers = workersAt(1, 2, 4);
    const placement = plan(unguided, { ulyssesDegree: 2, ep: 'wasm', shares: 'speed' }, workers);
    expect(placement.workers).toEqual([
      { id: 'w2', ep: 'wasm' },
      { id: 'w1', ep: 'wasm' },
    ]);
    // the heads shared by the placed workers' speeds, 4 : 2, not the first two to join (1 : 2)
    expect(placement.layout.heads).toEqual([proportionalShares(12, [4, 2])]);
    const placed = hardwareOf(placedOf(workers, placement));
    const prediction = defined(placement.prediction, 'a prediction');
    const heads = defined(placement.layout.heads?.[0], 'uneven heads');
    const expected = predictStep(workload(unguided), { ulyssesDegree: 2, cfgParallel: false, heads }, placed);
    expect(prediction.predictedStepMs).toBeCloseTo(expected.stepS * 1000, 9);
    expect(prediction.oneWorkerStepMs).toBeCloseTo(
      predictStep(workload(unguided), { ulyssesDegree: 1, cfgParallel: false }, placed).stepS * 1000,
      9,
    );
  });

  it("'auto' places the plan it predicts on the fastest workers, and its prediction is that plan's on exactly them", () => {
    const workers = workersAt(1, 2, 4, 4);
    const placement = plan(unguided, { ep: 'wasm' }, workers);
    const { layout } = placement;
    const fastestFirst = ['w2', 'w3', 'w1', 'w0'];
    expect(idsOf(placement)).toEqual(fastestFirst.slice(0, layout.world));
    const expected = predictStep(
      workload(unguided),
      {
        ulyssesDegree: layout.ulyssesDegree,
        cfgParallel: layout.cfgParallel,
        heads: layout.heads?.[0],
        mode: placement.settings.parallel,
        headGroups: placement.settings.headGroups,
      },
      hardwareOf(placedOf(workers, placement)),
    );
    expect(defined(placement.prediction, 'a prediction').predictedStepMs).toBeCloseTo(expected.stepS * 1000, 9);
  });
});

describe('the planner decides every default', () => {
  it('an empty request: float32 Ulysses in one head group, no emulated link, 2 warm-up steps, a spot check in 16 within 2e-3, and the timeouts', () => {
    for (const [backend, workers] of [
      ['swarm', workersAt(null, null)],
      ['local', []],
    ] as const) {
      const placement = planPlacement(
        { ...ctx, backend },
        { params: guided, request: {}, workers, measurements: new Measurements() },
      );
      expect(placement.settings, backend).toEqual({
        dtype: 'f32',
        parallel: 'ulysses',
        headGroups: 1,
        emulateLink: null,
      });
      expect(placement.warmupSteps).toBe(2);
      expect(placement.spotChecks).toEqual({ rate: 1 / 16, tolerance: 2e-3 });
      expect(placement.timeouts).toEqual({ rpcMs: 120_000, loadMs: 1_800_000, exchangeMs: 60_000 });
      expect([placement.ep, placement.prediction, placement.cfgFallback]).toEqual(['auto', null, null]);
    }
  });

  it("a job's adapters reach every rank's load, checked; none unless asked", () => {
    const loras = [{ url: 'http://h/loras/0/a.safetensors', strength: 0.8 }];
    const placement = plan(guided, { ulyssesDegree: 2, loras }, workersAt(1, 1));
    expect(placement.loras).toEqual(loras);
    expect([0, 1].map((rank) => loadArgsOf(placement, rank).loras)).toEqual([loras, loras]);
    const plain = plan(guided, { ulyssesDegree: 2 }, workersAt(1, 1));
    expect([plain.loras, loadArgsOf(plain, 0).loras]).toEqual([[], undefined]);
    expect(() => plan(guided, { loras: [{ url: 'http://h/a', strength: 99 }] }, workersAt(1, 1))).toThrow(
      'lora http://h/a: its strength is a number from -10 to 10, got 99',
    );
  });

  it('an empty request keeps float32 Ulysses where the cost model predicts a less exact exchange faster', () => {
    const over = (bandwidth: number) =>
      workersAt(1, 1).map((w) => ({ ...w, measurement: { ...defined(w.measurement, w.id), rttMs: 1, bandwidth } }));
    for (const bandwidth of [1e5, 1e6]) {
      const workers = over(bandwidth);
      const exact = plan(unguided, { ulyssesDegree: 2 }, workers);
      expect([exact.settings.dtype, exact.settings.parallel], `${bandwidth} B/s`).toEqual(['f32', 'ulysses']);
      const settings = (request: PlacementRequest) =>
        plan(unguided, { ulyssesDegree: 2, ...request }, workers).settings;
      // what the cost model would take, left the choice
      if (bandwidth === 1e5) expect(settings({ dtype: 'auto' }).dtype).toBe('i8');
      else expect(settings({ parallel: 'auto' }).parallel).toBe('displaced');
    }
  });

  it('head groups asked above the fewest heads a rank has are that many, measured or not', () => {
    // 12 heads on 5 ranks: 3/3/2/2/2, so at most 2 groups
    for (const workers of [workersAt(null, null, null, null, null), workersAt(1, 1, 1, 1, 1)]) {
      const placement = plan(unguided, { ulyssesDegree: 5, headGroups: 6, shares: 'even' }, workers);
      expect(placement.settings.headGroups).toBe(2);
    }
    // shares 8/4 by speed: at most 4
    const uneven = plan(unguided, { ulyssesDegree: 2, headGroups: 6, shares: 'speed' }, workersAt(2, 1));
    expect([uneven.layout.heads, uneven.settings.headGroups]).toEqual([[[8, 4]], 4]);
  });

  it('displaced mode gets one head group whatever was asked, measured or not', () => {
    for (const workers of [workersAt(null, null), workersAt(1, 1)]) {
      const placement = plan(unguided, { ulyssesDegree: 2, parallel: 'displaced', headGroups: 3 }, workers);
      expect([placement.settings.parallel, placement.settings.headGroups]).toEqual(['displaced', 1]);
    }
  });
});

describe('the rehearsals the planner asks for', () => {
  const groupOf = (workers: PlanningWorker[]): WorkerGroup => ({
    modelUrl: '/models/tiny-wan',
    ep: 'wasm',
    shape: latentShape(guided, wan21Latent(ctx.config.inChannels)),
    members: workers.map((w) => ({ id: w.id, threads: 1 })),
  });
  const needed = (workers: PlanningWorker[], measurements: Measurements) =>
    rehearsalsNeeded(ctx, { params: guided, request: { ep: 'wasm' }, workers, measurements }).map((r) => ({
      group: r.group,
      workers: r.workers.map((w) => w.id),
      degrees: r.degrees,
    }));

  it('none while any worker is unmeasured: the planner does not predict then', () => {
    expect(needed(workersAt(1, null), new Measurements())).toEqual([]);
    expect(needed(workersAt(null, 1, 1), new Measurements())).toEqual([]);
  });

  it("each plan's forward on the workers it would run on, all at once, fastest first, the largest group first (it warms every engine up side by side); each degree of a group once, and none once rehearsed", () => {
    // joined slowest first
    const workers = workersAt(1, 2);
    const [w0, w1] = workers;
    const measurements = new Measurements();
    // two at once: CFG parallel (degree 1 on each) and Ulysses (degree 2), asked once; then one worker alone (degree 1)
    expect(needed(workers, measurements)).toEqual([
      { group: groupOf([w1, w0]), workers: ['w1', 'w0'], degrees: [1, 2] },
      { group: groupOf([w1]), workers: ['w1'], degrees: [1] },
    ]);
    measurements.setRehearsal(groupOf([w1, w0]), 1, [0.1, 0.2]);
    expect(needed(workers, measurements)).toEqual([
      { group: groupOf([w1, w0]), workers: ['w1', 'w0'], degrees: [2] },
      { group: groupOf([w1]), workers: ['w1'], degrees: [1] },
    ]);
    measurements.setRehearsal(groupOf([w1, w0]), 2, [0.05, 0.1]);
    measurements.setRehearsal(groupOf([w1]), 1, [0.08]);
    expect(needed(workers, measurements)).toEqual([]);
  });

  it('an asked degree is the only plan rehearsed: one rehearsal on its workers, no one-worker baseline before it', () => {
    const workers = workersAt(1, 2);
    const [w0, w1] = workers;
    const asked = (ulyssesDegree: number, measurements = new Measurements()) =>
      rehearsalsNeeded(ctx, {
        params: guided,
        request: { ep: 'wasm', ulyssesDegree },
        workers,
        measurements,
      }).map((r) => ({ group: r.group, workers: r.workers.map((w) => w.id), degrees: r.degrees }));
    expect(asked(2)).toEqual([{ group: groupOf([w1, w0]), workers: ['w1', 'w0'], degrees: [2] }]);
    expect(asked(1)).toEqual([{ group: groupOf([w1]), workers: ['w1'], degrees: [1] }]);
    const rehearsed = new Measurements();
    rehearsed.setRehearsal(groupOf([w1, w0]), 2, [0.05, 0.1]);
    expect(asked(2, rehearsed)).toEqual([]);
  });

  it('a prediction says it came from probe rates where these workers were never rehearsed together, else from the rehearsals', () => {
    const workers = workersAt(1, 2);
    const [w0, w1] = workers;
    const byOf = (measurements: Measurements) =>
      plan(guided, { ep: 'wasm' }, workers, { measurements }).prediction?.by ?? '';
    const measurements = new Measurements();
    expect(byOf(measurements)).toContain('probe rates (these workers were not rehearsed together)');
    measurements.setRehearsal(groupOf([w1, w0]), 2, [0.05, 0.1]);
    expect(byOf(measurements)).toContain('forwards rehearsed on these workers');
  });
});

describe('a job planned again after a lost rank (maxWorld: the ranks it had)', () => {
  const cfg = { ulyssesDegree: 2, cfgParallel: true, ep: 'wasm' } as const;

  it('asked for CFG parallel on 2 × 2 with 3 workers left: 1 × 2 on the fastest two, not plain Ulysses', () => {
    const again = plan(guided, cfg, workersAt(1, 2, 2), { maxWorld: 4 });
    expect([again.layout.ulyssesDegree, again.layout.cfgGroups, again.cfgFallback]).toEqual([1, 2, null]);
    expect(idsOf(again)).toEqual(['w1', 'w2']);
    // the degree follows the request (the largest that still fits), not the cost model's choice
    expect(defined(again.prediction, 'a prediction').asked).toBe(true);
  });

  it('one worker left: one rank, saying why there is no CFG parallel', () => {
    const alone = plan(guided, { ...cfg, untrustedAlone: 'continue' }, workersAt(1), { maxWorld: 4 });
    expect([alone.layout.world, alone.layout.cfgParallel, alone.cfgFallback]).toEqual([
      1,
      false,
      'no CFG parallel: one worker is left, and CFG parallel needs two groups',
    ]);
  });

  it('the degree asked where it still fits, on no more workers than the job had', () => {
    const again = plan(unguided, { ulyssesDegree: 2, ep: 'wasm', shares: 'even' }, workersAt(1, 1, 1), {
      maxWorld: 2,
    });
    expect([again.layout.ulyssesDegree, idsOf(again), defined(again.prediction, 'a prediction').asked]).toEqual([
      2,
      ['w0', 'w1'],
      true,
    ]);
    const auto = plan(unguided, { ep: 'wasm' }, workersAt(1, 1, 1, 1), { maxWorld: 2 });
    expect(auto.layout.world).toBeLessThanOrEqual(2);
    expect(defined(auto.prediction, 'a prediction').leftOut).toBeNull();
  });
});

describe('workers that look like one machine share its cores (issue 66)', () => {
  /** Two slow workers (compute outweighs their exchanges) of 2 threads each, on one 2-core machine or on two. */
  const pair = (oneMachine: boolean) =>
    workersAt(0.05, 0.05).map((w, i) => ({
      ...w,
      info: { ...w.info, threads: 2, cores: 2, machine: machineNamed(oneMachine ? 'laptop' : `machine ${i}`) },
    }));

  it('two browsers on one machine, each claiming both its cores: one is left out, saying why in words', () => {
    expect(plan(guided, { ep: 'wasm' }, pair(false)).layout.world).toBe(2);
    const placement = plan(guided, { ep: 'wasm' }, pair(true));
    const prediction = defined(placement.prediction, 'a prediction');
    expect(placement.layout.world).toBe(1);
    expect(prediction.sharedCores).toBeNull();
    expect(prediction.leftOut).toMatch(/^1 of 2 workers left out: with 2 the cost model predicts \d+ ms a step, not /);
    expect(prediction.leftOut).toContain(
      'workers w0 and w1 look like one machine (their pages see the same cores, memory, OS, time zone and adapter) ' +
        'and share its 2 cores: with 4 threads between them each computes at about 50% of its speed alone, so ' +
        'together they compute a step no sooner than fewer of them; they would be used beside each other with ' +
        'cores of their own',
    );
  });

  it('asked for both, the plan of both is predicted no faster than one alone, and its notes say they share the cores', () => {
    const placement = plan(guided, { ulyssesDegree: 2, ep: 'wasm', shares: 'even' }, pair(true));
    const prediction = defined(placement.prediction, 'a prediction');
    expect(prediction.predictedStepMs).toBeGreaterThanOrEqual(prediction.oneWorkerStepMs);
    expect(prediction.sharedCores).toEqual({
      workers: ['w0', 'w1'],
      note:
        'workers w0 and w1 look like one machine (their pages see the same cores, memory, OS, time zone and ' +
        'adapter) and share its 2 cores: with 4 threads between them each computes at about 50% of its speed alone',
    });
    const apart = defined(plan(guided, { ulyssesDegree: 2, ep: 'wasm', shares: 'even' }, pair(false)).prediction, '');
    expect(apart.sharedCores).toBeNull();
    expect(apart.predictedStepMs).toBeLessThan(0.7 * apart.oneWorkerStepMs);
  });

  it('the tabs of one browser are on one machine whatever their hints say: their threads split its cores', () => {
    const tabs = pair(true).map((w, i) => ({
      ...w,
      info: { ...w.info, threads: 1, browser: 'one browser', machine: machineNamed(`screen ${i}`) },
    }));
    expect(defined(plan(guided, { ulyssesDegree: 2, ep: 'wasm' }, tabs).prediction, '').sharedCores).toBeNull();
    const crowded = tabs.map((w) => ({ ...w, info: { ...w.info, threads: 2 } }));
    expect(defined(plan(guided, { ulyssesDegree: 2, ep: 'wasm' }, crowded).prediction, '').sharedCores?.note).toMatch(
      /^workers w0 and w1 look like one machine/,
    );
  });

  it("the swarm table's words for each worker are the placement's notes: why it was left out and what would use it, that it shares its machine's cores", () => {
    const workers = pair(true);
    const auto = plan(guided, { ep: 'wasm' }, workers);
    const leftOut = defined(auto.prediction?.leftOut, 'why one is left out');
    const [placed, spare] = [auto.workers[0].id, workers.find((w) => w.id !== auto.workers[0].id)?.id ?? ''];
    expect(workerPlanNotes(auto, spare)).toEqual([leftOut]);
    expect(workerPlanNotes(auto, placed)).toEqual([]);
    const both = plan(guided, { ulyssesDegree: 2, ep: 'wasm', shares: 'even' }, workers);
    const shared = defined(both.prediction?.sharedCores, 'shared cores').note;
    expect(['w0', 'w1'].map((id) => workerPlanNotes(both, id))).toEqual([[shared], [shared]]);
    expect(workerPlanNotes(plan(guided, { ulyssesDegree: 2, ep: 'wasm' }, pair(false)), 'w0')).toEqual([]);
  });

  it('a worker given the fewest heads is told so, with what would give it more; the others are not', () => {
    const uneven = plan(unguided, { ulyssesDegree: 2, ep: 'wasm', shares: 'speed' }, workersAt(1, 4));
    expect(uneven.layout.heads).toEqual([proportionalShares(12, [4, 1])]);
    expect(workerPlanNotes(uneven, 'w0')).toEqual([
      'worker w0 was given 2 of the 12 heads: its forward was the slowest when rehearsed; on more of its cores ' +
        '(fewer tabs beside it) or on WebGPU, it would be given more',
    ]);
    expect(workerPlanNotes(uneven, 'w1')).toEqual([]);
  });
});
