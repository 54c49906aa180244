import { beforeAll, describe, expect, it } from 'vitest';
import type { WorkerMeasurement } from '../../coordinator/measure.ts';
import { Measurements } from '../../coordinator/measurements.ts';
import type { PlacementRequest, ResolvedPlacement } from '../../coordinator/placement.ts';
import {
  groupOf,
  placedStepCache,
  placeTextLayers,
  placeVaeTiles,
  planPlacement,
  rankOrder,
  rehearsalsNeeded,
  runOf,
  workersToWaitFor,
  type PlannerContext,
  type PlanningWorker,
} from '../../coordinator/planner.ts';
import { defined } from '../../core/defined.ts';
import { DEFAULT_JOB, jobParams, type JobParams } from '../../core/job.ts';
import { latentShape, wan21Latent } from '../../core/model/family.ts';
import { parseWanConfig, wanConfigOfSize } from '../../core/model/config.ts';
import { readJson } from '../../core/model/files.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { TRANSFORMER_CONFIG } from '../../core/model/transformer.ts';
import { staleKeysValuesBytes } from '../../core/parallel.ts';
import { formatBytes, type WorkerInfo } from '../../core/worker-api.ts';
import { machineNamed, tinyModelFiles } from './fixtures.ts';

// The planner's refusals and limits, each on both sides of its boundary: what a request may ask, how much a
// rank may hold or send, and which workers a placement is planned and predicted on.
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

/** A test worker: what it measured (GFLOP/s on WASM, its link) and the memory its browser reports. */
interface WorkerSpec {
  /** GFLOP/s on WASM; null: unmeasured */
  gflops?: number | null;
  memoryGiB?: number | null;
  rttMs?: number;
  bandwidth?: number;
}

function worker(
  id: string,
  { gflops = 1, memoryGiB = null, rttMs = 2, bandwidth = 1e9 }: WorkerSpec = {},
): PlanningWorker {
  const measurement: WorkerMeasurement | null =
    gflops === null
      ? null
      : {
          threads: 1,
          compute: { wasm: { ep: 'wasm', flops: gflops * 1e9, softmaxRate: gflops * 1e8, stageMs: 1 / gflops } },
          auto: { ep: 'wasm', why: 'WASM only' },
          rttMs,
          bandwidth,
        };
  const info: WorkerInfo = {
    ep: 'wasm',
    adapter: 'stub',
    softwareAdapter: false,
    threads: 1,
    memoryGiB,
    userAgent: id,
    cores: 1,
    machine: machineNamed(id),
  };
  return { id, info, measurement };
}
/** Workers w0, w1, … measured at these GFLOP/s (null: unmeasured), in the order they joined. */
const workersAt = (...gflops: (number | null)[]): PlanningWorker[] =>
  gflops.map((g, i) => worker(`w${i}`, { gflops: g }));
const unmeasured = (n: number) => workersAt(...Array.from({ length: n }, () => null));

const plan = (
  params: JobParams,
  request: PlacementRequest,
  workers: readonly PlanningWorker[],
  extra: { measurements?: Measurements; maxWorld?: number; context?: PlannerContext } = {},
): ResolvedPlacement =>
  planPlacement(extra.context ?? ctx, {
    params,
    request,
    workers,
    measurements: extra.measurements ?? new Measurements(),
    maxWorld: extra.maxWorld,
  });
const ask = (request: PlacementRequest) => () => plan(guided, request, unmeasured(2));
const idsOf = (placement: ResolvedPlacement) => placement.workers.map((w) => w.id);
const byOf = (placement: ResolvedPlacement) => defined(placement.prediction, 'a prediction').by;

describe('a request is checked before anything is placed, on both sides of each bound', () => {
  it("int4 is displaced mode's alone: asked with Ulysses (or unset, Ulysses) it is refused saying what to ask", () => {
    const refusal =
      "dtype 'i4' carries displaced mode's deltas of keys and values only: " +
      "ask for parallel 'displaced' too (or 'f32', 'f16', 'i8' for Ulysses)";
    expect(ask({ dtype: 'i4' })).toThrow(refusal);
    expect(ask({ dtype: 'i4', parallel: 'ulysses' })).toThrow(refusal);
    expect(ask({ dtype: 'i4', parallel: 'displaced' })().settings).toMatchObject({
      dtype: 'i4',
      parallel: 'displaced',
    });
    // left to choose the mode, int4 takes the one that carries it
    expect(ask({ dtype: 'i4', parallel: 'auto' })().settings).toMatchObject({ dtype: 'i4', parallel: 'displaced' });
  });

  it('warm-up steps are a whole number from 0', () => {
    expect(ask({ warmupSteps: -1 })).toThrow(
      'warmupSteps is a whole number ≥ 0 of exact steps before displaced ones, got -1',
    );
    expect(ask({ warmupSteps: 0.5 })).toThrow('warmupSteps is a whole number ≥ 0');
    expect(ask({ warmupSteps: 0 })().warmupSteps).toBe(0);
  });

  it('head groups are a whole number from 1', () => {
    expect(ask({ headGroups: 0 })).toThrow(
      "headGroups is a whole number ≥ 1 of head groups a block's exchange goes in (1: all heads at once), got 0",
    );
    expect(ask({ headGroups: 1.5 })).toThrow('headGroups is a whole number ≥ 1');
    expect(ask({ headGroups: 1, ulyssesDegree: 2 })().settings.headGroups).toBe(1);
  });

  it('a spot-check rate is from 0 to 1, both ends included', () => {
    for (const rate of [-0.01, 1.01, Number.NaN])
      expect(ask({ spotCheckRate: rate }), String(rate)).toThrow(
        new RangeError(`a spot-check rate is between 0 and 1, got ${rate}`),
      );
    for (const rate of [0, 1]) expect(ask({ spotCheckRate: rate })().spotChecks.rate).toBe(rate);
  });

  it("a lone untrusted worker is 'stop' or 'continue'", () => {
    expect(ask({ untrustedAlone: 'maybe' as never })).toThrow('untrustedAlone is stop or continue, got "maybe"');
    expect(ask({ untrustedAlone: 'continue' })().untrustedAlone).toBe('continue');
  });

  it('pipeline stages are a whole number from 1, for the placement and for the workers it waits for', () => {
    for (const stages of [0, -2, 1.5]) {
      const refusal = `stages is a whole number ≥ 1 of pipeline stages, got ${stages}`;
      expect(ask({ stages }), String(stages)).toThrow(refusal);
      expect(() => workersToWaitFor(ctx, { stages }, guided), String(stages)).toThrow(refusal);
    }
    expect(ask({ stages: 1 })().stages).toBeNull();
    expect(workersToWaitFor(ctx, { stages: 1, ulyssesDegree: 2 }, guided)).toBe(2);
  });

  it('the local backend runs one rank: degree 1 or auto, and refuses more saying where to run it', () => {
    const local = { ...ctx, backend: 'local' as const };
    for (const ulyssesDegree of [1, 'auto'] as const)
      expect(plan(guided, { ulyssesDegree }, [], { context: local }).layout.world).toBe(1);
    expect(() => plan(guided, { ulyssesDegree: 2 }, [], { context: local })).toThrow(
      'the local backend runs one rank in this tab, not 2: use the swarm backend for more',
    );
  });

  it("the local backend's one rank is this tab: it places no worker and never stops for a lone untrusted one", () => {
    const local = { ...ctx, backend: 'local' as const };
    const placement = plan(guided, {}, workersAt(1), { context: local, maxWorld: 1 });
    expect([placement.workers, placement.layout.world]).toEqual([[], 1]);
  });
});

describe("a staged placement's spot checks need a stage's whole hidden state in one message", () => {
  // dim 240 divides one message's 15 Mi floats: 65,536 rows of it, the tokens, 7 rows of time embedding and the text's
  const config = wanConfigOfSize({ headDim: 20, textDim: 32, ffnDim: 64, numLayers: 4 }, 'dim 240');
  const tokens = tokenGrid(config, latentShape(guided, wan21Latent(config.inChannels))).count;
  const rows = 65_536;
  const staged = (textTokens: number) => () =>
    plan(guided, { stages: 2, ulyssesDegree: 2, spotCheckRate: 0.1 }, unmeasured(4), {
      context: { config, latent: wan21Latent(config.inChannels), modelUrl: '/m', backend: 'swarm', textTokens },
    });

  it('exactly one message: checked as asked; a row more: refused, saying how large it would be', () => {
    expect(config.dim * rows).toBe(15 << 20);
    expect(staged(rows - 7 - tokens)().spotChecks.rate).toBe(0.1);
    expect(staged(rows - 7 - tokens + 1)).toThrow(
      "pipeline stages cannot be spot-checked here: the hidden state of every token that a stage's recomputation " +
        'starts from would be 62.9 MB, more than the 62.9 MB one message carries; or ask spotCheckRate 0',
    );
  });

  it('re-placed after a loss, such a job goes on unchecked rather than stop', () => {
    const again = plan(guided, { stages: 2, ulyssesDegree: 2, spotCheckRate: 0.1 }, unmeasured(4), {
      context: {
        config,
        latent: wan21Latent(config.inChannels),
        modelUrl: '/m',
        backend: 'swarm',
        textTokens: rows - 7 - tokens + 1,
      },
      maxWorld: 4,
    });
    expect(again.spotChecks.rate).toBe(0);
  });
});

describe("displaced mode's stale keys and values take at most half the least memory a placed worker has", () => {
  it('holding exactly half fits; a byte less memory is refused, naming the bytes and the GiB', () => {
    const job = unguided;
    const tokens = tokenGrid(ctx.config, latentShape(job, wan21Latent(ctx.config.inChannels))).count;
    const stale = staleKeysValuesBytes({ model: ctx.config, tokens, passes: 1 }, 2);
    const gib = (2 * stale) / 2 ** 30;
    const at = (memoryGiB: number) => [worker('a', { memoryGiB }), worker('b', { memoryGiB })];
    expect(plan(job, { ulyssesDegree: 2, parallel: 'displaced' }, at(gib)).settings.parallel).toBe('displaced');
    const less = gib - 1 / 2 ** 30;
    expect(() => plan(job, { ulyssesDegree: 2, parallel: 'displaced' }, at(less))).toThrow(
      `displaced mode would hold ${formatBytes(stale)} of keys and values on each rank, more than half of the ` +
        `${less} GiB its workers have: use Ulysses, or a shorter or smaller video`,
    );
  });

  it('the least memory of the workers placed counts: not the most, and not a worker left out', () => {
    const job = unguided;
    const tokens = tokenGrid(ctx.config, latentShape(job, wan21Latent(ctx.config.inChannels))).count;
    const gib = (2 * staleKeysValuesBytes({ model: ctx.config, tokens, passes: 1 }, 2)) / 2 ** 30;
    const small = gib / 2;
    // the small worker placed (second fastest): refused
    const placed = [worker('big', { gflops: 2, memoryGiB: 2 * gib }), worker('small', { memoryGiB: small })];
    expect(() => plan(job, { ulyssesDegree: 2, parallel: 'displaced' }, placed)).toThrow(
      `more than half of the ${small} GiB its workers have`,
    );
    // the small worker slowest, so left out of a degree of 2: it fits
    const leftOut = [...placed.slice(0, 1), worker('big2', { gflops: 2, memoryGiB: gib }), placed[1]];
    const placement = plan(job, { ulyssesDegree: 2, parallel: 'displaced' }, leftOut);
    expect([placement.settings.parallel, idsOf(placement)]).toEqual(['displaced', ['big', 'big2']]);
  });

  it("'auto' keeps displaced mode out where its stale keys and values would not fit the widest plan's workers", () => {
    const tokens = tokenGrid(ctx.config, latentShape(unguided, wan21Latent(ctx.config.inChannels))).count;
    const gib = (2 * staleKeysValuesBytes({ model: ctx.config, tokens, passes: 1 }, 2)) / 2 ** 30;
    const slow = (memoryGiB: number) => ['a', 'b'].map((id) => worker(id, { bandwidth: 1e6, rttMs: 1, memoryGiB }));
    const request = { ep: 'wasm', parallel: 'auto', shares: 'even' } as const;
    // where it fits, displaced mode is what the slow link makes fastest
    expect(plan(unguided, request, slow(gib)).settings.parallel).toBe('displaced');
    expect(plan(unguided, request, slow(gib / 2)).settings.parallel).toBe('ulysses');
  });
});

describe("'auto' says which exchange it took and why", () => {
  it('float32 kept where nothing else is predicted 1.1× faster: said so, for Ulysses and for displaced mode', () => {
    const fast = workersAt(1, 1);
    expect(byOf(plan(unguided, { ulyssesDegree: 2, dtype: 'auto' }, fast))).toContain(
      '; float32 transport: no other predicted 1.1× faster',
    );
    expect(byOf(plan(unguided, { ulyssesDegree: 2, dtype: 'auto', parallel: 'displaced' }, fast))).toContain(
      '; displaced float32: no other predicted 1.1× faster',
    );
  });

  it('a less exact transport taken is named with its deviation and both predicted steps in ms', () => {
    const slow = [worker('a', { bandwidth: 1e5 }), worker('b', { bandwidth: 1e5 })];
    const chosen = plan(unguided, { ulyssesDegree: 2, dtype: 'auto' }, slow);
    const exact = plan(unguided, { ulyssesDegree: 2, dtype: 'f32' }, slow);
    const ms = (p: ResolvedPlacement) => defined(p.prediction, 'a prediction').predictedStepMs.toFixed(0);
    expect(chosen.settings.dtype).toBe('i8');
    expect(Number(ms(exact))).toBeGreaterThan(100);
    expect(byOf(chosen)).toContain(
      `; int8 transport (about 3e-3 from exact): predicted ${ms(chosen)} ms a step, float32 ${ms(exact)} ms`,
    );
  });

  it('one head group asked for is said to be asked for', () => {
    expect(byOf(plan(unguided, { ulyssesDegree: 2, headGroups: 1 }, workersAt(1, 1)))).toContain(
      '; q, k, v in one head group (asked for)',
    );
    expect(byOf(plan(unguided, { ulyssesDegree: 2 }, workersAt(1, 1)))).not.toContain('head group');
  });
});

describe('which workers a placement is planned on', () => {
  it('measured workers rank fastest first (ties in join order); while any is unmeasured, in join order', () => {
    const ids = (ws: PlanningWorker[]) => rankOrder(ws, 'auto').map((w) => w.id);
    expect(ids(workersAt(1, 2, 2))).toEqual(['w1', 'w2', 'w0']);
    expect(ids(workersAt(null, 1, 2))).toEqual(['w0', 'w1', 'w2']);
    expect(ids(workersAt(1, 2, null))).toEqual(['w0', 'w1', 'w2']);
  });

  it('a degree asked for is kept on a first placement whatever has joined yet; it is not predicted on fewer workers', () => {
    expect(plan(unguided, { ulyssesDegree: 4 }, unmeasured(2)).layout.ulyssesDegree).toBe(4);
    const measured = plan(unguided, { ulyssesDegree: 4 }, workersAt(1, 1));
    expect([measured.layout.ulyssesDegree, measured.prediction]).toEqual([4, null]);
  });

  it('after a loss, a degree asked for stays where the workers left still hold it, even one not the largest even', () => {
    // 12 heads: 3 workers would make the largest even degree 3, 5 workers 4
    const two = plan(unguided, { ulyssesDegree: 2, shares: 'even' }, unmeasured(3), { maxWorld: 3 });
    expect([two.layout.ulyssesDegree, idsOf(two)]).toEqual([2, ['w0', 'w1']]);
    const five = plan(unguided, { ulyssesDegree: 5, shares: 'even' }, unmeasured(5), { maxWorld: 5 });
    expect(five.layout.ulyssesDegree).toBe(5);
    // one fewer than it needs: the largest even degree the workers left allow
    expect(
      plan(unguided, { ulyssesDegree: 5, shares: 'even' }, unmeasured(4), { maxWorld: 5 }).layout.ulyssesDegree,
    ).toBe(4);
  });

  it('CFG parallel falls back to one group only after a loss leaves one worker, and only where it was asked', () => {
    const cfg = { ulyssesDegree: 1, cfgParallel: true, ep: 'wasm' } as const;
    // a first placement waits for the second group's worker: CFG parallel as asked
    const first = plan(guided, cfg, workersAt(1));
    expect([first.layout.cfgGroups, first.cfgFallback]).toEqual([2, null]);
    // after a loss, two workers still make two groups
    const two = plan(guided, cfg, workersAt(1, 1), { maxWorld: 4 });
    expect([two.layout.cfgGroups, two.cfgFallback]).toEqual([2, null]);
    // unasked, one worker left is no fallback from anything
    const plain = plan(guided, { ulyssesDegree: 1, untrustedAlone: 'continue' }, workersAt(1), { maxWorld: 2 });
    expect([plain.layout.world, plain.cfgFallback]).toEqual([1, null]);
  });

  it('a lone untrusted worker after a loss stops the job, saying every way on', () => {
    expect(() => plan(guided, { ulyssesDegree: 1 }, workersAt(1), { maxWorld: 2 })).toThrow(
      'only worker w0 is left for this job and it is not trusted: one worker alone, with nobody to check it, would ' +
        'decide the video. The job stops; run it again once more workers have joined, mark a worker trusted on the ' +
        "dashboard, open a worker tab on this machine, or ask untrustedAlone 'continue'",
    );
  });

  it("an asked degree's prediction uses the link of the workers placed, not of one left out", () => {
    const workers = [worker('a', { gflops: 2 }), worker('b', { gflops: 2 }), worker('far', { rttMs: 100 })];
    const placement = plan(unguided, { ulyssesDegree: 2, ep: 'wasm', shares: 'even' }, workers);
    expect(idsOf(placement)).toEqual(['a', 'b']);
    expect(defined(placement.prediction, 'a prediction').link).toEqual({
      bandwidth: 1e9,
      latency: 0.001,
      from: 'coordinator links',
    });
  });

  it("a step measured by the last job on the placed workers is the asked degree's prediction", () => {
    const workers = [worker('a', { gflops: 2 }), worker('b', { gflops: 2 }), worker('c')];
    const measurements = new Measurements();
    const members = [
      { id: 'a', threads: 1 },
      { id: 'b', threads: 1 },
    ];
    measurements.recordStep(
      groupOf(ctx, unguided, 'wasm', members),
      runOf({ ulyssesDegree: 2, cfgParallel: false }, 4),
      0.5,
    );
    const placement = plan(unguided, { ulyssesDegree: 2, ep: 'wasm', shares: 'even' }, workers, { measurements });
    const prediction = defined(placement.prediction, 'a prediction');
    expect(prediction.predictedStepMs).toBeCloseTo(500, 9);
    expect(prediction.by).toContain('its steps as the last jobs of this shape on these workers measured them');
  });

  it("a plan's measured steps are kept by how it runs: one rank has no exchange, one group of one no transport", () => {
    expect(runOf({ ulyssesDegree: 1, cfgParallel: false }, 4)).toEqual({
      ulyssesDegree: 1,
      cfgParallel: false,
      heads: null,
      mode: null,
      bytesPerElement: 0,
    });
    expect(runOf({ ulyssesDegree: 1, cfgParallel: true }, 2)).toMatchObject({ mode: null, bytesPerElement: 2 });
    expect(runOf({ ulyssesDegree: 2, cfgParallel: false }, 1)).toMatchObject({ mode: 'ulysses', bytesPerElement: 1 });
    expect(runOf({ ulyssesDegree: 2, cfgParallel: false, mode: 'displaced', heads: [7, 5] }, 4)).toMatchObject({
      mode: 'displaced',
      heads: [7, 5],
    });
  });

  it("'auto' with shares 'even' never shares the heads by speed, where by speed it would", () => {
    const workers = workersAt(1, 2);
    expect(plan(unguided, { ep: 'wasm' }, workers).layout.heads).toEqual([[8, 4]]);
    expect(plan(unguided, { ep: 'wasm', shares: 'even' }, workers).layout.heads).toBeNull();
  });

  it("'auto' leaving workers out says how many and what the next wider plan was predicted, in ms", () => {
    const workers = [
      worker('a', { gflops: 1, bandwidth: 1e5 }),
      ...['b', 'c'].map((id) => worker(id, { gflops: 0.01, bandwidth: 1e5 })),
    ];
    const prediction = defined(plan(unguided, { ep: 'wasm' }, workers).prediction, 'a prediction');
    const best = prediction.predictedStepMs.toFixed(0);
    expect(Number(best)).toBeGreaterThan(10);
    expect(prediction.leftOut).toMatch(
      new RegExp(
        `^2 of 3 workers left out: with [23] the cost model predicts \\d+ ms a step, not ${best}: ` +
          'the workers it would add compute their share no sooner than those chosen compute theirs',
      ),
    );
  });

  it('says where workers are left out for their exchanges, and that a job of more tokens would use them (issue 66)', () => {
    // as fast as each other, on a slow link: a small job's exchanges cost more than its compute saves
    const workers = ['a', 'b'].map((id) => worker(id, { gflops: 1, bandwidth: 1e5 }));
    const prediction = defined(plan(unguided, { ep: 'wasm' }, workers).prediction, 'a prediction');
    expect(prediction.leftOut).toMatch(
      /^1 of 2 workers left out: with 2 the cost model predicts \d+ ms a step, not \d+: /,
    );
    expect(prediction.leftOut?.replace(/^[^:]*:[^:]*: /, '')).toBe(
      'the compute they would save is less than their exchanges would cost; a job of more tokens (more frames, a ' +
        'larger size) gives each worker more to compute per exchange, and would use them',
    );
  });
});

describe('the rehearsals a job needs', () => {
  const needed = (request: PlacementRequest, workers: PlanningWorker[], context = ctx, params = unguided) =>
    rehearsalsNeeded(context, { params, request, workers, measurements: new Measurements() }).map((r) => [
      r.workers.length,
      r.degrees,
    ]);

  it("'auto' on 5 workers rehearses every even degree and all 5 at once, which shares uneven heads, the largest first", () => {
    expect(needed({ ep: 'wasm' }, workersAt(1, 1, 1, 1, 1))).toEqual([
      [5, [5]],
      [4, [4]],
      [3, [3]],
      [2, [2]],
      [1, [1]],
    ]);
    // 4 workers: all at once is an even degree already
    expect(needed({ ep: 'wasm' }, workersAt(1, 1, 1, 1))).toEqual([
      [4, [4]],
      [3, [3]],
      [2, [2]],
      [1, [1]],
    ]);
  });

  it('asked for CFG parallel, only CFG-parallel plans are rehearsed (and one worker), not all the workers in one group', () => {
    expect(needed({ ep: 'wasm', cfgParallel: true }, workersAt(1, 1, 1, 1), ctx, guided)).toEqual([
      [4, [2]],
      [2, [1]],
      [1, [1]],
    ]);
  });

  it('none for the local backend, a staged job, or an asked degree more workers than have joined', () => {
    expect(needed({}, workersAt(1, 1), { ...ctx, backend: 'local' })).toEqual([]);
    expect(needed({ stages: 2 }, workersAt(1, 1))).toEqual([]);
    expect(needed({ ulyssesDegree: 4 }, workersAt(1, 1))).toEqual([]);
    expect(needed({ ulyssesDegree: 2 }, workersAt(1, 1))).toEqual([[2, [2]]]);
  });

  it("'auto' on 8 workers of a guided job rehearses all 8 at once beside CFG parallel's 2 × 4", () => {
    const rehearsals = rehearsalsNeeded(ctx, {
      params: guided,
      request: { ep: 'wasm' },
      workers: workersAt(1, 1, 1, 1, 1, 1, 1, 1),
      measurements: new Measurements(),
    });
    expect(rehearsals.map((r) => [r.workers.length, r.degrees])).toContainEqual([8, [4, 8]]);
  });
});

describe('pipeline stages', () => {
  // four blocks: two stages of two, or four of one
  const four = wanConfigOfSize({ headDim: 24, textDim: 32, ffnDim: 64, numLayers: 4 }, 'four blocks');
  const staged: PlannerContext = {
    config: four,
    latent: wan21Latent(four.inChannels),
    modelUrl: '/m',
    backend: 'swarm',
    textTokens: 16,
  };
  const place = (request: PlacementRequest, workers: readonly PlanningWorker[], maxWorld?: number) =>
    plan(guided, request, workers, { context: staged, maxWorld });
  const shape = (p: ResolvedPlacement) => [p.layout.ulyssesDegree, p.layout.cfgGroups, p.layout.stages];
  const cfg = { stages: 2, ulyssesDegree: 2, cfgParallel: true } as const;

  it("with CFG parallel, each group's mesh holds every stage: ranks group after group, each's stages in turn", () => {
    const placement = place(cfg, unmeasured(8));
    expect(shape(placement)).toEqual([2, 2, 2]);
    expect(idsOf(placement)).toEqual(['w0', 'w1', 'w4', 'w5', 'w2', 'w3', 'w6', 'w7']);
    expect(() => place(cfg, unmeasured(3))).toThrow(
      '2 pipeline stages of 2 workers in each of 2 CFG groups need 8 workers but 3 are live',
    );
  });

  it('re-placed after a loss: two CFG groups while the workers left make two meshes, in as many stages as they fill', () => {
    expect(shape(place(cfg, unmeasured(6), 8))).toEqual([2, 2, 1]);
    expect(shape(place(cfg, unmeasured(4), 8))).toEqual([2, 2, 1]);
    expect(shape(place(cfg, unmeasured(3), 8))).toEqual([2, 1, 1]);
  });

  it("a staged job's ranks that would compute on WebGPU are all named when int8 is asked, and placed otherwise", () => {
    const onGpu = (id: string): PlanningWorker => {
      const w = worker(id);
      const m = defined(w.measurement, id);
      return { ...w, measurement: { ...m, auto: { ep: 'webgpu', why: 'WebGPU: faster' } } };
    };
    expect(place({ stages: 2 }, [onGpu('a'), onGpu('b')]).workers).toEqual([
      { id: 'a', ep: 'webgpu' },
      { id: 'b', ep: 'webgpu' },
    ]);
    expect(() => place({ stages: 2, weightType: 'int8' }, [onGpu('a'), onGpu('b')])).toThrow(
      "int8 weights are held on WASM alone, and a, b would compute on WebGPU, holding more than its stage was cut for: ask ep 'wasm', or weightType 'float16'",
    );
  });

  it('PipeFusion may cut a forward into as many patches as the heads, not one more', () => {
    expect(place({ stages: 2, pipeFusionPatches: 12 }, unmeasured(2)).pipeFusion).toEqual({ patches: 12 });
    expect(() => place({ stages: 2, pipeFusionPatches: 13 }, unmeasured(2))).toThrow(
      "pipeFusionPatches 13 is more than this job can be cut into: at most 12 (the model's 12 heads, the job's 48 tokens)",
    );
  });

  it("'auto' PipeFusion stays exact, whether predicted slower or faster; said so with both predictions", () => {
    // each stage call costs stageMs, and PipeFusion's four patches make more calls than exact stages
    const at = (stageMs: number) =>
      ['a', 'b'].map((id) => {
        const w = worker(id, { gflops: 10 });
        const m = defined(w.measurement, id);
        return { ...w, measurement: { ...m, compute: { wasm: { ...defined(m.compute.wasm, id), stageMs } } } };
      });
    const stepMs = (request: PlacementRequest, stageMs: number) =>
      defined(place({ stages: 2, ...request }, at(stageMs)).prediction, 'a prediction').predictedStepMs;
    // 0.25 ms a call: PipeFusion predicted within 1.1× of exact; 1 ms: slower
    const [exact, fused] = [stepMs({}, 0.25), stepMs({ pipeFusionPatches: 4 }, 0.25)];
    expect([fused / 1.1 < exact, fused * 1.1 > exact]).toEqual([true, true]);
    expect(stepMs({ pipeFusionPatches: 4 }, 1)).toBeGreaterThan(1.1 * stepMs({}, 1));
    for (const stageMs of [0, 0.25, 1]) {
      const auto = place({ stages: 2, pipeFusionPatches: 'auto' }, at(stageMs));
      expect(auto.pipeFusion, `${stageMs} ms`).toBeNull();
      expect(byOf(auto)).toMatch(/; exact: 'auto' takes no PipeFusion, measured slower than exact stages \(/);
      expect(byOf(auto)).toMatch(/\(predicted \d+ ms a step, exact \d+ ms\)$/);
    }
  });

  it("a staged prediction says how it was made: stages, workers a stage, and PipeFusion's choice only where 'auto'", () => {
    const measured = workersAt(1, 1, 1, 1);
    const exact = place({ stages: 2 }, measured);
    expect(byOf(exact)).toMatch(
      /^the cost model: 2 pipeline stages of 1 worker, a step's passes (pipelined|batched), /,
    );
    expect(byOf(exact)).toMatch(/, at the pace of the stage slowest for its blocks \(probe rates\)$/);
    expect(defined(exact.prediction, 'exact').asked).toBe(true);
    expect(byOf(place({ stages: 2, ulyssesDegree: 2 }, measured))).toMatch(
      /^the cost model: 2 pipeline stages of 2 workers, /,
    );
    expect(byOf(place({ stages: 2, cfgParallel: true }, measured))).toMatch(
      /^the cost model: 2 pipeline stages of 1 worker, /,
    );
    // PipeFusion impossible on stages of two workers: exact, saying why
    expect(byOf(place({ stages: 2, ulyssesDegree: 2, pipeFusionPatches: 'auto' }, measured))).toMatch(
      /; exact: PipeFusion not possible here$/,
    );
  });

  it('a step paces at the stage slowest for its blocks: where memory caps a worker to one block, the other three', () => {
    const even = defined(place({ stages: 2 }, workersAt(10, 10)).prediction, 'even').predictedStepMs;
    const capped = (first: number | null, second: number | null) =>
      place({ stages: 2 }, [
        worker('a', { gflops: 10, memoryGiB: first }),
        worker('b', { gflops: 10, memoryGiB: second }),
      ]);
    const lastSmall = capped(null, 0.01);
    const firstSmall = capped(0.015, null);
    expect(lastSmall.stages?.map((s) => s.blocks)).toEqual([
      [0, 3],
      [3, 4],
    ]);
    expect(firstSmall.stages?.map((s) => s.blocks)).toEqual([
      [0, 1],
      [1, 4],
    ]);
    for (const placement of [lastSmall, firstSmall]) {
      const ms = defined(placement.prediction, 'capped').predictedStepMs;
      expect(ms).toBeGreaterThan(1.3 * even);
    }
  });

  it('the step cache needs ranks holding every block: refused with stages, saying to turn it off', () => {
    expect(() => placedStepCache({}, { cache: 'calibrate', stages: 2 })).toThrow(
      'the step cache skips all the blocks of a forward at once, so it needs ranks that hold them all: ' +
        'ask cache off with pipeline stages',
    );
    expect(placedStepCache({}, { cache: 'calibrate', stages: 1 })?.settings.threshold).toBe(0);
  });

  it('a staged job on a worker whose probe measured no compute is not predicted, as if unmeasured', () => {
    const placedOn = (ws: PlanningWorker[]) => place({ stages: 2, ulyssesDegree: 2 }, ws);
    expect(placedOn(workersAt(1, 1, 1, 1)).prediction).not.toBeNull();
    expect(placedOn(workersAt(1, 1, 1, 0)).prediction).toBeNull();
    expect(place({ stages: 2 }, workersAt(1, 0)).prediction).toBeNull();
  });
});

describe('the text encoder and the VAE', () => {
  it("the text encoder's layers go fastest first, by speed; evenly while any speed is unknown or nothing", () => {
    const runs = (workers: PlanningWorker[], layers: number) =>
      placeTextLayers(workers, layers).map(({ worker: w, from, to }) => [w.id, from, to]);
    expect(runs(workersAt(1, 3), 4)).toEqual([
      ['w1', 0, 3],
      ['w0', 3, 4],
    ]);
    // at most one worker a layer
    expect(runs(workersAt(1, 1, 1), 2)).toEqual([
      ['w0', 0, 1],
      ['w1', 1, 2],
    ]);
    expect(runs(workersAt(null, 3), 4)).toEqual([
      ['w0', 0, 2],
      ['w1', 2, 4],
    ]);
    expect(runs(workersAt(0, 3), 4)).toEqual([
      ['w1', 0, 2],
      ['w0', 2, 4],
    ]);
  });

  it("the VAE's tiles go to every worker, sized for the smallest buffer any of them allows", () => {
    const workers = workersAt(1, 1, 1);
    const measurements = new Measurements();
    expect(placeVaeTiles(workers, measurements)).toEqual({ hosts: workers, maxBufferBytes: Infinity });
    measurements.setMaxBufferBytes({ id: 'w1' }, 2000);
    measurements.setMaxBufferBytes({ id: 'w2' }, 1000);
    expect(placeVaeTiles(workers, measurements)).toEqual({ hosts: workers, maxBufferBytes: 1000 });
  });
});
