import { EXACT_SETTINGS } from './in-process-executor.ts';
import { beforeAll, describe, expect, it, vi } from 'vitest';
import type { WanModel } from '../../core/model/reference.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { planUlysses } from '../../core/parallel.ts';
import type { ExecutionProvider } from '../../core/worker-api.ts';
import type { EngineApi } from '../../rank/engine.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { WorkerRuntime, type RuntimeHooks } from '../../rank/runtime.ts';
import { referenceStages, type DeviceStageRunner } from '../../rank/stages.ts';
import type { Exchange } from '../../rank/ulysses.ts';
import { stubEngine, tinyModelFiles, describeInProcess } from './fixtures.ts';

// A rehearsal times what a rank of a job computes, before the job: the same stage calls on the same
// shapes, without peers (rank/rehearsal.ts); the planner plans with it (placement.test.ts).
let model: WanModel;
beforeAll(async () => {
  model = await loadTransformer(tinyModelFiles);
});

/** A wasm rank's hooks in this process, its mesh from `mesh` (by default a lone rank's). */
function wasmHooks(mesh: () => Exchange = () => memoryExchanges(1)[0]): RuntimeHooks {
  return {
    connectMesh: () => Promise.resolve(mesh()),
    describe: describeInProcess('node'),
  };
}

/** The shapes of every stage call's first array, per stage, in order. */
function recording(stages: DeviceStageRunner) {
  const calls: string[] = [];
  const lengths = (args: unknown[]) =>
    args
      .map((a) =>
        a instanceof Float32Array
          ? a.length
          : a && typeof a === 'object' && 'q' in a
            ? `q${(a as { q: Float32Array }).q.length}`
            : typeof a === 'number'
              ? 'n'
              : '?',
      )
      .join(',');
  const wrap = <K extends 'embed' | 'preAttention' | 'attention' | 'postAttention' | 'head'>(k: K) =>
    ((...args: unknown[]) => (
      calls.push(`${k}(${lengths(args)})`),
      (stages[k] as (...a: unknown[]) => unknown)(...args)
    )) as DeviceStageRunner[K];
  return {
    calls,
    stages: {
      ...stages,
      embed: wrap('embed'),
      preAttention: wrap('preAttention'),
      attention: wrap('attention'),
      postAttention: wrap('postAttention'),
      head: wrap('head'),
    },
  };
}

/** one token: a new engine's warm-up forwards are quick on it */
const WARM_UP_SHAPE = [16, 1, 2, 2];
/** a job of more forwards than a warm-up's (24): warmed up in full */
const LONG_JOB = 50;
/** a rehearsal that warms a new engine up (for a long job), on one token */
const WARM_UP_JOB = {
  modelUrl: 'tiny',
  ep: 'wasm' as const,
  latentShape: WARM_UP_SHAPE,
  textTokens: 4,
  degrees: [1],
  forwards: LONG_JOB,
};

describe('a rehearsal', () => {
  const shape = [16, 1, 14, 10]; // 35 tokens: padded at degrees 2 and 3

  it('makes exactly the stage calls of a rank of a job at each degree, and times each', async () => {
    const cfg = model.config;
    for (const degree of [1, 2, 3]) {
      // a real job's rank 0 of `degree`, through the in-memory mesh
      const jobs = memoryExchanges(degree).map(() => recording(referenceStages(model)));
      const jobRuntimes = memoryExchanges(degree).map(
        (exchange, rank) =>
          new WorkerRuntime(
            stubEngine(jobs[rank].stages, cfg),
            wasmHooks(() => exchange),
          ),
      );
      const plan = planUlysses(cfg, tokenGrid(cfg, shape).count, degree);
      const text = new Float32Array(4 * cfg.textDim);
      await Promise.all(
        jobRuntimes.map(async (r, rank) => {
          await r.initWorker({
            ...EXACT_SETTINGS,
            rank,
            world: degree,
            peers: jobRuntimes.map((_, i) => `p${i}`),
            session: 's',
          });
          await r.loadModel({ modelUrl: 'tiny', ep: 'wasm' });
          await r.prepareJob({ job: 1, texts: [text], latentShape: shape });
        }),
      );
      const patchWidth = cfg.inChannels * 4;
      await Promise.all(
        jobRuntimes.map((r, rank) =>
          r.executeModel({
            job: 1,
            step: 0,
            pass: 0,
            timestep: 500,
            latentShape: shape,
            patches: new Float32Array(plan.rows[rank] * patchWidth),
          }),
        ),
      );

      const rehearsal = recording(referenceStages(model));
      const runtime = new WorkerRuntime(stubEngine(rehearsal.stages, cfg), wasmHooks());
      await runtime.rehearse(WARM_UP_JOB); // the engine's warm-up, on one token
      rehearsal.calls.length = 0;
      const { forwardMs } = await runtime.rehearse({
        modelUrl: 'tiny',
        ep: 'wasm',
        latentShape: shape,
        textTokens: 4,
        degrees: [degree],
        forwards: LONG_JOB,
      });
      expect(forwardMs).toHaveLength(1);
      expect(forwardMs[0]).toBeGreaterThan(0);
      // a one-block forward (embed, block 0, head), then whole forwards, as rank 0 of the job made them
      const forward = 3 * cfg.numLayers + 2;
      expect(jobs[0].calls).toHaveLength(forward);
      expect(rehearsal.calls.slice(0, 5), `degree ${degree}`).toEqual([
        ...jobs[0].calls.slice(0, 4),
        jobs[0].calls[forward - 1],
      ]);
      expect((rehearsal.calls.length - 5) % forward).toBe(0);
      expect(rehearsal.calls.slice(5, 5 + forward), `degree ${degree}`).toEqual(jobs[0].calls);
    }
  });

  it('warms a new engine up first, leaving out its first, slower forwards: it times the forwards the job will run', async () => {
    // an engine whose first 12 attention calls take 150 ms longer, as the browser's first runs of
    // onnxruntime's WebAssembly are slower until it optimises them
    let calls = 0;
    const warming = referenceStages(model);
    const cold = {
      ...warming,
      attention: (async (...args: Parameters<typeof warming.attention>) => (
        calls++ < 12 && (await new Promise((r) => setTimeout(r, 150))),
        warming.attention(...args)
      )) as typeof warming.attention,
    };
    const runtime = new WorkerRuntime(stubEngine(cold, model.config), wasmHooks());
    const [first] = (await runtime.rehearse(WARM_UP_JOB)).forwardMs;
    // a one-block forward, 24 whole ones to warm up, then those timed
    expect(calls).toBeGreaterThan(1 + 24 * model.config.numLayers);
    const before = calls;
    const [again] = (await runtime.rehearse(WARM_UP_JOB)).forwardMs; // warm: no warm-up
    expect(calls - before).toBeLessThan(24 * model.config.numLayers);
    // a cold attention call in the timed forwards would add 150 ms
    expect(first).toBeLessThan(again + 100);
  });

  it("warms a new engine up for no more forwards than the job computes, and again for the next job's rehearsal after a short one", async () => {
    const { calls, stages } = recording(referenceStages(model));
    const runtime = new WorkerRuntime(stubEngine(stages, model.config), wasmHooks());
    /** the forwards a rehearsal ran: a one-block one, the warm-up's, then 1 to 6 timed (core/median.ts's) */
    const forwardsOf = async (forwards: number) => {
      calls.length = 0;
      await runtime.rehearse({ ...WARM_UP_JOB, forwards });
      return calls.filter((c) => c.startsWith('embed')).length;
    };
    const short = await forwardsOf(10);
    expect(short).toBeGreaterThanOrEqual(1 + 10 + 1);
    expect(short).toBeLessThanOrEqual(1 + 10 + 6);
    expect(await forwardsOf(10)).toBeGreaterThanOrEqual(1 + 10 + 1); // still not warm for a longer job
    expect(await forwardsOf(LONG_JOB)).toBeGreaterThanOrEqual(1 + 24 + 1); // a warm-up's 24 at most
    expect(await forwardsOf(LONG_JOB)).toBeLessThanOrEqual(1 + 6); // warm: none
  });

  it('of a long forward is one block after a warm-up block, times the blocks', async () => {
    const { calls, stages } = recording(referenceStages(model));
    let slow = false;
    const slowed = {
      ...stages,
      preAttention: (async (...args: Parameters<typeof stages.preAttention>) => (
        slow && (await new Promise((r) => setTimeout(r, 1_100))),
        stages.preAttention(...args)
      )) as typeof stages.preAttention,
    };
    const runtime = new WorkerRuntime(stubEngine(slowed, model.config), wasmHooks());
    await runtime.rehearse(WARM_UP_JOB); // the engine's warm-up
    [slow, calls.length] = [true, 0];
    const { forwardMs } = await runtime.rehearse({
      modelUrl: 'tiny',
      ep: 'wasm',
      latentShape: shape,
      textTokens: 4,
      degrees: [1],
      forwards: LONG_JOB,
    });
    // 2 blocks × ≥ 1.1 s would pass 2 s: two one-block forwards, no whole one
    expect(calls.map((c) => c.slice(0, c.indexOf('('))).join(' ')).toBe(
      'embed preAttention attention postAttention head '.repeat(2).trim(),
    );
    expect(forwardMs[0]).toBeGreaterThanOrEqual(2 * 1_100);
    expect(forwardMs[0]).toBeLessThan(2 * 1_600);
  });

  it('puts back the model the placement loaded when it rehearsed another, and is refused while a job computes', async () => {
    const loads: string[] = [];
    const base = stubEngine(referenceStages(model), model.config);
    const engine: EngineApi = {
      ...base,
      load: async (url: string, ep: ExecutionProvider) => (loads.push(`${url} ${ep}`), base.load(url, ep)),
    };
    const runtime = new WorkerRuntime(engine, wasmHooks());
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    await runtime.loadModel({ modelUrl: 'placed', ep: 'wasm' });
    await runtime.rehearse({ ...WARM_UP_JOB, modelUrl: 'placed' });
    expect(loads).toEqual(['placed wasm', 'placed wasm']); // the same model: nothing to put back
    await runtime.rehearse({ ...WARM_UP_JOB, modelUrl: 'other' });
    expect(loads).toEqual(['placed wasm', 'placed wasm', 'other wasm', 'placed wasm']);
    runtime.state = 'computing';
    await expect(runtime.rehearse({ ...WARM_UP_JOB, modelUrl: 'placed' })).rejects.toThrow(
      'rehearse while a job is computing on this worker',
    );
  });

  it("rehearses with the job's adapters, so the job finds its model loaded, and puts them back after one without; all read where the page reads them", async () => {
    const loads: string[] = [];
    const base = stubEngine(referenceStages(model), model.config);
    const engine: EngineApi = {
      ...base,
      load: async (url, ep, _progress, { loras = [] } = {}) => (
        loads.push(`${url} ${loras.map((l) => `${l.url}:${l.strength}`).join(',')}`),
        base.load(url, ep)
      ),
    };
    const refused: string[] = [];
    const runtime = new WorkerRuntime(engine, {
      ...wasmHooks(),
      // the page reads what its coordinator calls http://here at its own origin, http://mine
      modelSource: (url) => {
        if (url.startsWith('http://elsewhere')) throw new Error((refused.push(url), 'not from here'));
        return url.replace('http://here', 'http://mine');
      },
    });
    const loras = [{ url: 'http://here/loras/0/a.safetensors', strength: 0.8 }];
    const job = { ...WARM_UP_JOB, modelUrl: 'http://here/m' };
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    await runtime.rehearse({ ...job, degrees: [1], loras });
    await runtime.loadModel({ modelUrl: job.modelUrl, ep: 'wasm', loras });
    await runtime.rehearse({ ...job, degrees: [1], loras });
    const merged = 'http://mine/m http://mine/loras/0/a.safetensors:0.8';
    expect(loads).toEqual([merged, merged, merged]); // the same model and adapters: nothing to put back
    await runtime.rehearse({ ...job, degrees: [1] });
    expect(loads.slice(3)).toEqual(['http://mine/m ', merged]);
    // an adapter is fetched only from where the page fetches models
    await expect(
      runtime.loadModel({ ...job, loras: [{ url: 'http://elsewhere/x.safetensors', strength: 1 }] }),
    ).rejects.toThrow('not from here');
    expect(refused).toEqual(['http://elsewhere/x.safetensors']);
    expect(loads).toHaveLength(5);
  });

  it("rehearses on the job's weight type, so a float16 job never holds its model as float32 on the way, and puts the placed one back after", async () => {
    const loads: string[] = [];
    const base = stubEngine(referenceStages(model), model.config);
    const engine: EngineApi = {
      ...base,
      load: async (url, ep, _progress, { weightType } = {}) => (
        loads.push(`${url} ${weightType ?? "the EP's"}`),
        base.load(url, ep)
      ),
    };
    const runtime = new WorkerRuntime(engine, wasmHooks());
    const job = { ...WARM_UP_JOB, modelUrl: 'http://here/m' };
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    await runtime.rehearse({ ...job, degrees: [1], weightType: 'float16' });
    await runtime.loadModel({ modelUrl: job.modelUrl, ep: 'wasm', weightType: 'float16' });
    await runtime.rehearse({ ...job, degrees: [1], weightType: 'float16' });
    const half = 'http://here/m float16';
    expect(loads).toEqual([half, half, half]); // the same weights as placed: nothing to put back
    await runtime.rehearse({ ...job, degrees: [1] });
    expect(loads.slice(3)).toEqual(["http://here/m the EP's", half]);
  });

  it('refuses a degree the heads do not allow, a latent of the wrong channels and more tokens than any video, before computing', async () => {
    const runtime = new WorkerRuntime(stubEngine(referenceStages(model), model.config), wasmHooks());
    const args = { modelUrl: 'tiny', ep: 'wasm' as const, latentShape: shape, textTokens: 4, forwards: LONG_JOB };
    await expect(runtime.rehearse({ ...args, degrees: [13] })).rejects.toThrow(/13/);
    await expect(runtime.rehearse({ ...args, latentShape: [15, 2, 7, 5], degrees: [1] })).rejects.toThrow(
      'rehearse needs a latent shape [16, T, H, W], got [15,2,7,5]',
    );
    await expect(
      runtime.rehearse({ ...args, latentShape: [16, 1 << 10, 1 << 10, 1 << 10], degrees: [1] }),
    ).rejects.toThrow('rehearse of 268435456 tokens: at most 131072');
  });
});

describe("a model's download", () => {
  it('shows on the page a per cent at a time while it loads, and a rehearsal leaves the state as it found it', async () => {
    const states: string[] = [];
    const base = stubEngine(referenceStages(model), model.config);
    const engine: EngineApi = {
      ...base,
      load: async (url, ep, onProgress) => {
        // 100 MB/s, all of it over the network
        for (const bytes of [0, 1e6, 1.004e6, 2e8, 4e8])
          onProgress?.({ bytes, totalBytes: 4e8, networkBytes: bytes, elapsedMs: bytes / 1e5, note: '' });
        return base.load(url, ep);
      },
    };
    const runtime = new WorkerRuntime(engine, {
      ...wasmHooks(),
      onState: (s, d) => states.push(`${s}: ${d}`),
    });
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    await runtime.loadModel({ modelUrl: 'big', ep: 'wasm' });
    expect(states.slice(1)).toEqual([
      'loading: loading big',
      'loading: loading big: 0 of 400.0 MB',
      'loading: loading big: 200.0 MB of 400.0 MB from the network · 100.0 MB/s · 2 s left',
      'loading: loading big: 400.0 MB of 400.0 MB from the network · 100.0 MB/s',
      'ready: model loaded on wasm in 0 ms (WASM: asked for by the job); weights: none read',
    ]);
    states.length = 0;
    await runtime.rehearse({ ...WARM_UP_JOB, modelUrl: 'big' });
    expect(states.at(-1)).toBe('ready: model loaded on wasm in 0 ms (WASM: asked for by the job); weights: none read');
    expect(runtime.state).toBe('ready');
  });
});

describe('a preloaded worker', () => {
  it('warms its engine up once the weights are in, so the first rehearsal times warm forwards at once', async () => {
    const states: string[] = [];
    const runtime = new WorkerRuntime(stubEngine(referenceStages(model), model.config), {
      ...wasmHooks(),
      onState: (s, d) => states.push(`${s}: ${d}`),
    });
    await runtime.preload({ modelUrl: 'big' });
    const warmed = states.findIndex((s) => /warming up its engine \(wasm on \d+ threads?\) for the first job/.test(s));
    expect(warmed).toBeGreaterThan(-1);
    expect(states.findIndex((s) => s.includes('model preloaded on wasm'))).toBeGreaterThan(warmed);
    states.length = 0;
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    await runtime.rehearse({ ...WARM_UP_JOB, modelUrl: 'big' });
    expect(states.filter((s) => s.includes('warming up'))).toEqual([]);
  });

  it('a rehearsal asked for while the preload is under way waits for it, and does not warm up again', async () => {
    const states: string[] = [];
    const runtime = new WorkerRuntime(stubEngine(referenceStages(model), model.config), {
      ...wasmHooks(),
      onState: (s, d) => states.push(`${s}: ${d}`),
    });
    const preload = runtime.preload({ modelUrl: 'big' });
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    await runtime.rehearse({ ...WARM_UP_JOB, modelUrl: 'big' });
    await preload;
    const warmUps = states.filter((s) => s.includes('warming up'));
    expect(warmUps).toHaveLength(1);
    expect(warmUps[0]).toMatch(/warming up its engine \(wasm on 1 thread\) for the first job$/);
  });

  it('a preload asked for while a rehearsal loads leaves the state as both found it, whichever load ends first', async () => {
    // each load says it has begun, then waits to be let go: the rehearsal's ends first, the preload's after it
    const base = stubEngine(referenceStages(model), model.config);
    const gates: (() => void)[] = [];
    const engine: EngineApi = {
      ...base,
      load: async (url, ep, onProgress) => {
        onProgress?.({ bytes: 0, totalBytes: 4e8, networkBytes: 0, elapsedMs: 1, note: '' });
        await new Promise<void>((go) => gates.push(go));
        onProgress?.({ bytes: 4e8, totalBytes: 4e8, networkBytes: 4e8, elapsedMs: 2, note: '' });
        return base.load(url, ep);
      },
    };
    const runtime = new WorkerRuntime(engine, wasmHooks());
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    const rehearsal = runtime.rehearse({ ...WARM_UP_JOB, modelUrl: 'big' });
    await vi.waitFor(() => expect(gates).toHaveLength(1));
    const preload = runtime.preload({ modelUrl: 'big' });
    await vi.waitFor(() => expect(gates).toHaveLength(2));
    gates[0]();
    await rehearsal;
    gates[1]();
    await preload;
    expect(runtime.state).toBe('initialized');
  });

  it('a worker that did not preload warms up in its first rehearsal, and says so', async () => {
    const states: string[] = [];
    const runtime = new WorkerRuntime(stubEngine(referenceStages(model), model.config), {
      ...wasmHooks(),
      onState: (s, d) => states.push(`${s}: ${d}`),
    });
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    await runtime.rehearse({ ...WARM_UP_JOB, modelUrl: 'big' });
    expect(states.filter((s) => s.includes('warming up'))).toEqual([
      "initialized: warming up its engine (wasm on 1 thread) before timing the job's forwards",
    ]);
  });
});
