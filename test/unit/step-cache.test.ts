import { beforeAll, describe, expect, it } from 'vitest';
import { timestepLevels } from '../../core/model/timesteps.ts';
import { SpotCheckFailed, StepCacheMemory } from '../../coordinator/executor.ts';
import type { PlacedStepCache } from '../../coordinator/placement.ts';
import { placedStepCache } from '../../coordinator/planner.ts';
import { attention } from '../../core/model/ops.ts';
import {
  embedConditions,
  embedPatches,
  head,
  postAttention,
  preAttention,
  type WanModel,
} from '../../core/model/reference.ts';
import { patchify, ropeTables, tokenGrid, unpatchify } from '../../core/model/tokens.ts';
import { RankLayout } from '../../core/parallel.ts';
import { SeededRandom } from '../../core/random.ts';
import {
  cacheSchedule,
  nearestInterp,
  parseCacheFlags,
  parseMagnitudeCurve,
  publishedCurve,
  resolveStepCache,
  STEP_CACHE_DEFAULTS,
  type MagnitudeCurve,
} from '../../core/step-cache.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import type { EngineApi } from '../../rank/engine.ts';
import { InProcessExecutor, type InProcessOptions, onTinyModel } from './in-process-executor.ts';
import type { ExecuteArgs } from '../../core/worker-api.ts';

/**
 * MagCache4Wan2.1's magcache_forward as its script runs it, forward by forward, transcribed from its
 * state (cnt, accumulated_ratio/err/steps per cnt % 2): which forwards it skips, for a guided job.
 */
function upstreamSkips(interleaved: number[], steps: number, thresh: number, K: number, retention: number): boolean[] {
  const numSteps = steps * 2;
  const ratio = [1, 1];
  const err = [0, 0];
  const count = [0, 0];
  const skipped: boolean[] = [];
  for (let cnt = 0; cnt < numSteps; cnt++) {
    let skip = false;
    if (cnt >= Math.floor(numSteps * retention)) {
      const p = cnt % 2;
      ratio[p] *= interleaved[cnt];
      count[p] += 1;
      err[p] += Math.abs(1 - ratio[p]);
      if (err[p] < thresh && count[p] <= K) skip = true;
      else [ratio[p], err[p], count[p]] = [1, 0, 0];
    }
    skipped.push(skip);
  }
  return skipped;
}

describe('the step cache schedule (MagCache)', () => {
  const wan13 = publishedCurve({ dim: 1536, numLayers: 30 });

  it("the published Wan2.1 curves are the script's: 50 steps a pass, 1 at step 0, for the 1.3B and 14B shapes only", () => {
    expect(wan13?.ratios.map((r) => r.length)).toEqual([50, 50]);
    expect(wan13?.ratios.map((r) => r.slice(0, 3))).toEqual([
      [1, 1.0124, 1.00166],
      [1, 1.02213, 1.0041],
    ]);
    expect(wan13?.ratios.map((r) => r.at(-1))).toEqual([0.81838, 0.81939]);
    expect(publishedCurve({ dim: 5120, numLayers: 40 })?.ratios[1].at(-1)).toBe(0.86189);
    expect(publishedCurve({ dim: 1536, numLayers: 2 })).toBeNull();
  });

  it("at 50 steps with the script's settings, the forwards reused are the ones its magcache_forward skips", () => {
    const curve = wan13 as MagnitudeCurve;
    const interleaved = curve.ratios[0].flatMap((c, i) => [c, curve.ratios[1][i]]);
    const settings = { ...STEP_CACHE_DEFAULTS, finalSteps: 0 };
    for (const [threshold, K] of [
      [0.12, 2],
      [0.06, 2],
      [0.24, 4],
    ]) {
      const ours = cacheSchedule(curve, { ...settings, threshold, maxSkips: K }, 50, 2).flat();
      const theirs = upstreamSkips(interleaved, 50, threshold, K, 0.2);
      expect(ours.map((m) => m === 'reuse')).toEqual(theirs);
    }
    const schedule = cacheSchedule(curve, STEP_CACHE_DEFAULTS, 50, 2);
    const reused = schedule.flat().filter((m) => m === 'reuse').length;
    // retention 0.2 keeps the first 10 steps, the final step is computed, the rest reuse at most 2 in a row
    expect(
      schedule
        .slice(0, 10)
        .flat()
        .every((m) => m === 'keep'),
    ).toBe(true);
    expect(schedule[49]).toEqual(['keep', 'keep']);
    expect(reused).toBeGreaterThan(30);
    expect(reused).toBeLessThan(60);
  });

  it("another step count reads the curve by the script's nearest interpolation (numpy's rounding, halves to even)", () => {
    expect(nearestInterp([10, 11, 12, 13], 3)).toEqual([10, 12, 13]); // 1.5 → 2
    expect(nearestInterp([10, 11, 12, 13, 14, 15], 3)).toEqual([10, 12, 15]); // 2.5 → 2
    expect(nearestInterp([10, 11, 12], 1)).toEqual([12]);
    const curve = wan13 as MagnitudeCurve;
    const at20 = cacheSchedule(curve, STEP_CACHE_DEFAULTS, 20, 2);
    expect(at20).toHaveLength(20);
    // 20 steps move further a step: the ratios are read 49/19 steps apart, so less is reused than at 50
    expect(at20.flat().filter((m) => m === 'reuse').length).toBeGreaterThan(0);
    // no curve: a calibration run computes every forward
    expect(cacheSchedule(null, STEP_CACHE_DEFAULTS, 4, 1)).toEqual([['keep'], ['keep'], ['keep'], ['keep']]);
  });

  it('a request resolves against the curve: off, auto, a threshold; bad ones and a cache without a curve are refused saying what to do', () => {
    const curve = wan13 as MagnitudeCurve;
    expect(resolveStepCache(undefined, curve)).toBeNull();
    expect(resolveStepCache('off', curve)).toBeNull();
    expect(resolveStepCache('auto', null)).toBeNull();
    expect(resolveStepCache('auto', curve)).toEqual(STEP_CACHE_DEFAULTS);
    expect(resolveStepCache({ method: 'magcache', threshold: 0.2 }, curve)?.threshold).toBe(0.2);
    expect(() => resolveStepCache({ method: 'magcache', threshold: 2 }, curve)).toThrow(
      'threshold is a number from 0 to 1',
    );
    expect(() => resolveStepCache({ method: 'magcache', maxSkips: 0 }, curve)).toThrow('maxSkips is a whole number');
    expect(() => resolveStepCache({ method: 'teacache' } as never, curve)).toThrow("cache is 'off', 'auto' or");
    expect(() => resolveStepCache({ method: 'magcache' }, null)).toThrow('npm run calibrate-cache -- --model DIR');
    expect(() => placedStepCache({ stepCacheCurve: curve }, { cache: 'auto', stages: 2 })).toThrow(
      'ask cache off with pipeline stages',
    );
    expect(placedStepCache({}, { cache: 'calibrate' })?.curve).toBeNull();
    expect(parseCacheFlags(undefined, '0.1')).toEqual({ method: 'magcache', threshold: 0.1 });
    expect(parseCacheFlags('auto', undefined)).toBe('auto');
    expect(() => parseCacheFlags('auto', '0.1')).toThrow('give it with --cache magcache');
    expect(() => parseCacheFlags('tea', undefined)).toThrow('--cache is magcache, auto, off or calibrate');
  });

  it("a folder's curve is checked before use: anyone may serve a folder", () => {
    const good = {
      method: 'magcache',
      steps: 2,
      ratios: [
        [1, 0.9],
        [1, 0.95],
      ],
    };
    expect(parseMagnitudeCurve(good, 'step_cache.json').ratios[1]).toEqual([1, 0.95]);
    expect(() => parseMagnitudeCurve({ ...good, ratios: [[1, 0.9]] }, 'f')).toThrow('a pair of lists');
    expect(() =>
      parseMagnitudeCurve(
        {
          ...good,
          ratios: [
            [1, NaN],
            [1, 1],
          ],
        },
        'f',
      ),
    ).toThrow('positive finite');
    expect(() => parseMagnitudeCurve({ ...good, steps: 3 }, 'f')).toThrow('positive finite');
    expect(() => parseMagnitudeCurve({ ...good, method: 'teacache' }, 'f')).toThrow('expected "magcache"');
  });
});

describe('the step cache, to the letter', () => {
  it('knows the published curves by their exact shape, and says whose they are', () => {
    expect(publishedCurve({ dim: 1536, numLayers: 30 })?.source).toBe(
      "MagCache's published Wan2.1-T2V-1.3B calibration",
    );
    expect(publishedCurve({ dim: 5120, numLayers: 40 })).toMatchObject({
      method: 'magcache',
      steps: 50,
      source: "MagCache's published Wan2.1-T2V-14B calibration",
    });
    expect(publishedCurve({ dim: 5120, numLayers: 40 })?.ratios[0].slice(0, 3)).toEqual([1, 1.02504, 1.00025]);
    expect(publishedCurve({ dim: 1536, numLayers: 40 })).toBeNull();
    expect(publishedCurve({ dim: 5120, numLayers: 30 })).toBeNull();
  });

  it('rounds interpolation indices as numpy does: halves to even, the rest to nearest', () => {
    // indices i·(n−1)/(length−1): 0.5 → 0, 1.5 → 2, 2.5 → 2, 3.5 → 4
    expect(nearestInterp([0, 1, 2, 3, 4, 5, 6, 7], 3)).toEqual([0, 4, 7]); // 3.5 → 4
    expect(nearestInterp([0, 1], 3)).toEqual([0, 0, 1]); // 0.5 → 0
    expect(nearestInterp([0, 1, 2, 3], 3)).toEqual([0, 2, 3]); // 1.5 → 2
    expect(nearestInterp([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 4)).toEqual([0, 3, 6, 9]);
    expect(nearestInterp([0, 1, 2, 3, 4, 5, 6], 5)).toEqual([0, 2, 3, 4, 6]); // 1.5 → 2, 3, 4.5 → 4
    expect(nearestInterp([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 7)).toEqual([0, 2, 3, 5, 7, 8, 10]); // 1.67 → 2, 3.33 → 3
  });

  it('keeps the retained first forwards, the final steps and any forward whose error or run of skips is too long', () => {
    const flat = {
      method: 'magcache' as const,
      steps: 6,
      ratios: [Array(6).fill(0.95), Array(6).fill(0.9)] as [number[], number[]],
      source: 't',
    };
    const settings = { ...STEP_CACHE_DEFAULTS, threshold: 0.2, maxSkips: 2, retention: 0, finalSteps: 1 };
    // conditional: errors 0.05, 0.05 + 0.0975 = 0.1475 (reuse, reuse), then a third skip: keep
    // unconditional: 0.1 (reuse), 0.1 + 0.19 = 0.29 (keep)
    expect(cacheSchedule(flat, settings, 6, 2)).toEqual([
      ['keep', 'keep'],
      ['reuse', 'reuse'],
      ['reuse', 'keep'],
      ['keep', 'reuse'],
      ['reuse', 'keep'],
      ['keep', 'keep'],
    ]);
    expect(cacheSchedule(flat, settings, 6, 1)).toEqual([
      ['keep'],
      ['reuse'],
      ['reuse'],
      ['keep'],
      ['reuse'],
      ['keep'],
    ]);
    // retention 0.25 of 12 forwards: the first 3 (step 0, and step 1's conditional); two final steps
    expect(cacheSchedule(flat, { ...settings, retention: 0.25, finalSteps: 2 }, 6, 2)).toEqual([
      ['keep', 'keep'],
      ['keep', 'reuse'],
      ['reuse', 'keep'],
      ['reuse', 'reuse'],
      ['keep', 'keep'],
      ['keep', 'keep'],
    ]);
    // an error of exactly the threshold is too much: 1 − 0.5 against 0.5
    const halves = { ...flat, ratios: [Array(6).fill(0.5), Array(6).fill(0.5)] as [number[], number[]] };
    expect(cacheSchedule(halves, { ...settings, threshold: 0.5 }, 3, 1)).toEqual([['keep'], ['keep'], ['keep']]);
    // the ratios multiply: 0.5 then 0.25 (errors 0.5, 0.5 + 0.75), then 0.125 is past 1.3
    expect(cacheSchedule(halves, { ...settings, threshold: 1.3, maxSkips: 3, finalSteps: 0 }, 4, 1)).toEqual([
      ['keep'],
      ['reuse'],
      ['reuse'],
      ['keep'],
    ]);
    // read at 11 steps, the 6-step curve is stretched (the same values: flat), not refused
    expect(
      cacheSchedule(flat, settings, 11, 1)
        .flat()
        .filter((m) => m === 'reuse'),
    ).toHaveLength(6);
  });

  it('resolves the bounds of a request inclusively, and fills what it leaves out from the defaults', () => {
    const curve = publishedCurve({ dim: 1536, numLayers: 30 });
    expect(resolveStepCache({ method: 'magcache' }, curve)).toEqual(STEP_CACHE_DEFAULTS);
    expect(resolveStepCache({ method: 'magcache', threshold: 0, maxSkips: 1 }, curve)).toEqual({
      ...STEP_CACHE_DEFAULTS,
      threshold: 0,
      maxSkips: 1,
    });
    expect(resolveStepCache({ method: 'magcache', threshold: 1, maxSkips: 10 }, curve)).toEqual({
      ...STEP_CACHE_DEFAULTS,
      threshold: 1,
      maxSkips: 10,
    });
    expect(() => resolveStepCache({ method: 'magcache', threshold: -0.01 }, curve)).toThrow(
      "the cache's threshold is a number from 0 to 1, got -0.01",
    );
    expect(() => resolveStepCache({ method: 'magcache', threshold: '0.1' } as never, curve)).toThrow(
      `the cache's threshold is a number from 0 to 1, got "0.1"`,
    );
    expect(() => resolveStepCache({ method: 'magcache', maxSkips: 11 }, curve)).toThrow(
      "the cache's maxSkips is a whole number from 1 to 10, got 11",
    );
    expect(() => resolveStepCache({ method: 'magcache', maxSkips: 1.5 }, curve)).toThrow(/got 1.5$/);
    expect(() => resolveStepCache(null as never, curve)).toThrow(
      `cache is 'off', 'auto' or { method: 'magcache', threshold }, got null`,
    );
    expect(() => resolveStepCache('on' as never, curve)).toThrow(`got "on"`);
    expect(() => resolveStepCache({ method: 'magcache' }, null)).toThrow(
      'the model has no magnitude curve for MagCache (step_cache.json in its folder): ' +
        'run npm run calibrate-cache -- --model DIR once, or ask cache off',
    );
  });

  it("reads the command line's --cache and --cache-threshold", () => {
    expect(parseCacheFlags(undefined, undefined)).toBeUndefined();
    expect(parseCacheFlags('magcache', undefined)).toStrictEqual({ method: 'magcache' }); // no threshold: undefined
    expect(parseCacheFlags('magcache', '0')).toEqual({ method: 'magcache', threshold: 0 });
    expect(parseCacheFlags('off', undefined)).toBe('off');
    expect(parseCacheFlags('calibrate', undefined)).toBe('calibrate');
    expect(() => parseCacheFlags(undefined, '-0.1')).toThrow('--cache-threshold is a number from 0 to 1, got -0.1');
    expect(() => parseCacheFlags('magcache', 'x')).toThrow('--cache-threshold is a number from 0 to 1, got x');
    expect(() => parseCacheFlags(undefined, 'Infinity')).toThrow('got Infinity');
    expect(() => parseCacheFlags('off', '0.1')).toThrow(
      "--cache-threshold is MagCache's: give it with --cache magcache, not off",
    );
    expect(() => parseCacheFlags('calibrate', '0.1')).toThrow('not calibrate');
    expect(() => parseCacheFlags('tea', undefined)).toThrow('--cache is magcache, auto, off or calibrate, got tea');
  });

  it("checks a folder's curve field by field, saying which and how to write it again", () => {
    const good = {
      method: 'magcache',
      steps: 2,
      ratios: [
        [1, 0.9],
        [1, 9.99],
      ],
    };
    const refused = (json: unknown) => () => parseMagnitudeCurve(json, 'm/step_cache.json');
    const again = '; run npm run calibrate-cache -- --model DIR to write it again';
    expect(refused(null)).toThrow(`m/step_cache.json: not a JSON object${again}`);
    expect(refused('magcache')).toThrow('not a JSON object');
    expect(refused({ ...good, method: 'tea' })).toThrow(`m/step_cache.json: method "tea", expected "magcache"${again}`);
    for (const steps of [1, 1001, 2.5, '2'])
      expect(refused({ ...good, steps }), String(steps)).toThrow(
        `steps ${JSON.stringify(steps)}, expected a whole number from 2 to 1000`,
      );
    const long = { ...good, steps: 1000, ratios: [Array(1000).fill(1), Array(1000).fill(1)] };
    expect(parseMagnitudeCurve(long, 'f').steps).toBe(1000);
    expect(refused({ ...good, ratios: 'x' })).toThrow('ratios is not a pair of lists (conditional, unconditional)');
    expect(
      refused({
        ...good,
        ratios: [
          [1, 1],
          [1, 1],
          [1, 1],
        ],
      }),
    ).toThrow('ratios is not a pair');
    for (const bad of [[1, 0], [1, 10], [1, -1], [1, '1'], [1], 'x'])
      expect(refused({ ...good, ratios: [[1, 1], bad] }), JSON.stringify(bad)).toThrow(
        'each list of ratios holds 2 positive finite numbers below 10',
      );
    expect(parseMagnitudeCurve(good, 'f')).toEqual({ method: 'magcache', steps: 2, ratios: good.ratios, source: 'f' });
    expect(parseMagnitudeCurve({ ...good, source: 'x'.repeat(300) }, 'f').source).toBe(`f (${'x'.repeat(200)})`);
    expect(parseMagnitudeCurve({ ...good, source: 7 }, 'f').source).toBe('f');
  });
});

describe("a step cache's forwards on the ranks", () => {
  let model: WanModel;
  let engine: EngineApi;
  const random = new SeededRandom(11);
  let text: Float32Array;
  const shape = [16, 1, 14, 10]; // 35 tokens: 12/12/11 at P = 3

  beforeAll(async () => {
    ({ model, engine } = await onTinyModel());
    text = random.normals(16 * model.config.textDim);
  });

  /**
   * magcache_forward's own arithmetic on the reference blocks: a kept forward's residual is its blocks' output − input,
   * a reused forward's tokens are its embedding + the residual kept, then the head.
   */
  function cachedReference(forwards: { latent: Tensor; timestep: number; reuse: boolean }[]): Tensor[] {
    let residual: Float32Array | null = null;
    return forwards.map(({ latent, timestep, reuse }) => {
      const grid = tokenGrid(model.config, latent.shape);
      const { cos, sin } = ropeTables(model.config, grid, 0, grid.count);
      const { values, index: levels } = timestepLevels(timestep, grid.count);
      const cond = embedConditions(model, values, text);
      const entering = embedPatches(model, patchify(model.config, latent).data);
      let x = entering;
      if (reuse && residual) x = entering.map((v, i) => v + (residual as Float32Array)[i]);
      else {
        for (let block = 0; block < model.config.numLayers; block++) {
          const { q, k, v } = preAttention(model, block, x, cond.tproj, levels, cos, sin);
          x = postAttention(model, block, x, attention(q, k, v, model.config.headDim, model.config.dim), cond, levels);
        }
        residual = x.map((v, i) => v - entering[i]);
      }
      return unpatchify(model.config, head(model, x, cond.temb, levels), latent.shape);
    });
  }

  /** A rank's call to reuse a residual at step 1 (timestep 700) of `job`, from `latent`. */
  const reuseOfStep1 = (job: number, latent: Tensor): ExecuteArgs => ({
    job,
    step: 1,
    pass: 0,
    timestep: 700,
    latentShape: shape,
    patches: patchify(model.config, latent).data,
    cache: 'reuse',
  });

  it('kept then reused forwards over P = 1 and P = 3 give magcache_forward on the reference blocks; a reuse with no residual kept on the placement is computed and says so', async () => {
    const forwards = [
      { latent: { shape, data: random.normals(16 * 140) }, timestep: 900, reuse: false },
      { latent: { shape, data: random.normals(16 * 140) }, timestep: 700, reuse: true },
      { latent: { shape, data: random.normals(16 * 140) }, timestep: 500, reuse: true },
      { latent: { shape, data: random.normals(16 * 140) }, timestep: 300, reuse: false },
    ];
    const expected = cachedReference(forwards);
    const plain = cachedReference(forwards.map((f) => ({ ...f, reuse: false })));
    // a reused forward differs from computing it: the test would not see a cache that computes everything
    expect(maxAbsDiff(expected[1].data, plain[1].data)).toBeGreaterThan(1e-2);
    for (const P of [1, 3]) {
      const executor = new InProcessExecutor(
        { config: model.config, modelUrl: '/models/tiny-wan', layout: new RankLayout(P), spotCheckRate: 0 },
        engine,
        'rpc',
      );
      await executor.initialize();
      await executor.prepareJob(3, [text], shape);
      for (const [step, f] of forwards.entries()) {
        const { output } = await executor.executeModel({
          job: 3,
          step,
          steps: 4,
          pass: 0,
          timestep: f.timestep,
          latent: f.latent,
          cache: f.reuse ? 'reuse' : 'keep',
        });
        expect(maxAbsDiff(output.data, expected[step].data)).toBeLessThanOrEqual(1e-4);
      }
      const ran = executor.takeCacheForwards();
      expect(ran.map((f) => [f.step, f.reused, f.replayedFrom, f.recomputed])).toEqual([
        [0, false, null, false],
        [1, true, null, false],
        [2, true, null, false],
        [3, false, null, false],
      ]);
      // the kept forward after a kept one measured its residual's magnitude against the one before
      expect(ran[0].magnitudeRatio).toBeNull();
      expect(ran[3].magnitudeRatio).toBeGreaterThan(0);

      // a new job: its ranks hold no residual. A rank asked to reuse one refuses, saying what the coordinator must do
      // first; the executor computes the forward instead, as the uncached one, and says so
      await executor.prepareJob(4, [text], shape);
      if (P === 1)
        await expect(executor.runtimes[0].executeModel(reuseOfStep1(4, forwards[1].latent))).rejects.toThrow(
          "kept no residual of it for the prepared job: the coordinator asks 'keep' on a forward first",
        );
      const { output } = await executor.executeModel({
        job: 4,
        step: 1,
        steps: 4,
        pass: 0,
        timestep: 700,
        latent: forwards[1].latent,
        cache: 'reuse',
      });
      expect(maxAbsDiff(output.data, plain[1].data)).toBeLessThanOrEqual(1e-4);
      expect(executor.takeCacheForwards().map((f) => [f.reused, f.recomputed])).toEqual([[false, true]]);
      await executor.shutdown({ graceMs: 1_000 });
    }
  });

  it('a reused forward is spot-checked as any other, its checker computing the kept forward first: a rank that lies on reuses alone is convicted; a reuse of a stale kept forward goes unchecked', async () => {
    const forwards = [900, 700, 500].map((timestep, step) => ({
      job: 6,
      step,
      steps: 3,
      pass: 0,
      timestep,
      latent: { shape, data: random.normals(16 * 140) },
      cache: step === 0 ? ('keep' as const) : ('reuse' as const),
    }));
    const expected = cachedReference(forwards.map((f) => ({ ...f, reuse: f.cache === 'reuse' })));
    const executorOf = (options: Partial<InProcessOptions>) =>
      new InProcessExecutor(
        { config: model.config, modelUrl: '/models/tiny-wan', layout: new RankLayout(3), spotCheckRate: 1, ...options },
        engine,
        'rpc',
      );
    const honest = executorOf({});
    await honest.initialize();
    await honest.prepareJob(6, [text], shape);
    for (const f of forwards) await honest.executeModel(f);
    // the checker's recomputation of a reuse is the reuse: a plain forward differs from it by > 1e-2 of the scale
    const checks = honest.takeSpotChecks();
    expect(checks.map((c) => [c.step, c.verdict])).toEqual([
      [0, 'agreed'],
      [1, 'agreed'],
      [2, 'agreed'],
    ]);
    for (const c of checks) expect(c.difference).toBeLessThan(1e-5);
    // a rank asked to recompute a reuse without the forward it reuses refuses
    await expect(honest.runtimes[0].recompute(reuseOfStep1(6, forwards[1].latent))).rejects.toThrow(
      'recompute of a reused forward, and of that alone, is given the kept forward it reuses',
    );
    await honest.shutdown({ graceMs: 1_000 });

    // rank 1 computes every forward honestly but lies on each reuse, where it runs no block
    const liar = executorOf({});
    liar.fault = (rank, method, args) =>
      rank === 1 && method === 'executeModel' && (args as ExecuteArgs).cache === 'reuse'
        ? { alters: (r) => ({ ...r, rows: r.rows.map((v, i) => (i === 5 ? v + 0.01 : v)) }) }
        : null;
    await liar.initialize();
    await liar.prepareJob(6, [text], shape);
    const { output } = await liar.executeModel(forwards[0]);
    expect(maxAbsDiff(output.data, expected[0].data)).toBeLessThanOrEqual(1e-4);
    const caught = await liar.executeModel(forwards[1]).catch((e: unknown) => e);
    expect(caught).toBeInstanceOf(SpotCheckFailed);
    expect(caught).toMatchObject({ rank: 1 });
    expect(String(caught)).toMatch(/its rows of the pass differ from a recomputation/);
    await liar.shutdown({ graceMs: 1_000 });

    // displaced mode: a kept forward that attended to the step before's keys and values cannot be computed again
    // outside its group's history, so the reuse of it is not checked; one of an exact kept forward is
    const displaced = executorOf({ layout: new RankLayout(2), parallel: 'displaced', warmupSteps: 0 });
    await displaced.initialize();
    await displaced.prepareJob(6, [text], shape);
    const modes = ['keep', 'reuse', 'keep', 'keep', 'reuse'] as const;
    for (const [step, cache] of modes.entries())
      await displaced.executeModel({ ...forwards[step % 3], step, steps: 5, cache });
    expect(displaced.takeSpotChecks().map((c) => [c.step, c.verdict])).toEqual([
      [0, 'agreed'],
      [1, 'agreed'],
      [2, 'agreed'],
      [3, 'agreed'],
    ]);
    await displaced.shutdown({ graceMs: 1_000 });
  });

  it("a re-placement in a run of reused forwards runs the pass's last kept forward again on the new ranks: the same outputs as without the loss", async () => {
    const forwards = [900, 700, 500].map((timestep) => ({
      latent: { shape, data: random.normals(16 * 140) },
      timestep,
      reuse: timestep !== 900,
    }));
    const expected = cachedReference(forwards);
    // a curve that reuses every forward past the first: keep, reuse, reuse
    const cache = {
      settings: { ...STEP_CACHE_DEFAULTS, retention: 0, finalSteps: 0 },
      curve: {
        method: 'magcache',
        steps: 3,
        ratios: [
          [1, 1, 1],
          [1, 1, 1],
        ],
        source: 'test',
      },
    } as const satisfies PlacedStepCache;
    expect(cacheSchedule(cache.curve, cache.settings, 3, 1)).toEqual([['keep'], ['reuse'], ['reuse']]);
    const memory = new StepCacheMemory();
    const placed = async (P: number) => {
      const executor = new InProcessExecutor(
        { config: model.config, modelUrl: '/models/tiny-wan', layout: new RankLayout(P), spotCheckRate: 0 },
        engine,
        'direct',
      );
      executor.placement = { ...executor.placement, cache };
      await executor.initialize();
      await executor.prepareJob(5, [text], shape);
      return executor;
    };
    const step = async (executor: InProcessExecutor, at: number) => {
      const { timestep, latent } = forwards[at];
      const { velocity } = await executor.velocity({ job: 5, step: at, steps: 3, timestep, latent }, 1, memory);
      return maxAbsDiff(velocity, expected[at].data);
    };
    const first = await placed(3);
    for (const at of [0, 1]) expect(await step(first, at)).toBeLessThanOrEqual(1e-4);
    await first.shutdown({ graceMs: 1_000 });
    // a rank was lost: the job goes on on two, which kept no residual
    memory.placed();
    const second = await placed(2);
    expect(await step(second, 2)).toBeLessThanOrEqual(1e-4);
    expect(second.takeCacheForwards().map((f) => [f.step, f.reused, f.replayedFrom])).toEqual([[2, true, 0]]);
    // a conviction runs the steps since the placement again: what was kept before it is what a rerun rebuilds from
    memory.kept({ job: 5, step: 2, pass: 0, timestep: 500, latent: forwards[2].latent, cache: 'keep' });
    memory.rerun();
    expect(memory.lastKept(0, 2)?.step).toBe(0);
    await second.shutdown({ graceMs: 1_000 });
  });
});
