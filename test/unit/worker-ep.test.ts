import { EXACT_SETTINGS } from './in-process-executor.ts';
import { beforeAll, describe, expect, it } from 'vitest';
import { fastestEp } from '../../core/cost-model.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import type { ExecutionProvider, WorkerInfo } from '../../core/worker-api.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { WorkerRuntime } from '../../rank/runtime.ts';
import { referenceStages } from '../../rank/stages.ts';
import { machineNamed, stubEngine, tinyModelFiles } from './fixtures.ts';

// 'auto' means the faster EP, as this worker measured it: the runtime chooses, the planner predicts
// with the same rule (fastestEp), and both say why in words a user can check.
let model: WanModel;
beforeAll(async () => {
  model = await loadTransformer(tinyModelFiles);
});

describe('fastestEp: the EP with the higher measured matrix-multiply rate, and why', () => {
  it('names the faster first, with both rates in GFLOP/s to three figures', () => {
    expect(fastestEp({ wasm: { flops: 21.3e9 }, webgpu: { flops: 0.2e9 } })).toEqual({
      ep: 'wasm',
      why: 'WASM: 21.3 GFLOP/s vs WebGPU 0.2',
    });
    expect(fastestEp({ wasm: { flops: 21.3e9 }, webgpu: { flops: 5012e9 } })).toEqual({
      ep: 'webgpu',
      why: 'WebGPU: 5010 GFLOP/s vs WASM 21.3',
    });
  });

  it('without a WebGPU adapter, WASM and that reason; with nothing measured, WASM and that reason', () => {
    expect(fastestEp({ wasm: { flops: 16e9 } })).toEqual({ ep: 'wasm', why: 'WASM: 16 GFLOP/s (no WebGPU adapter)' });
    expect(fastestEp({})).toEqual({ ep: 'wasm', why: 'WASM: nothing measured yet' });
  });

  it('never a software WebGPU adapter, even measured faster; the reason says why', () => {
    expect(fastestEp({ wasm: { flops: 21.3e9 }, webgpu: { flops: 0.2e9 } }, true)).toEqual({
      ep: 'wasm',
      why: 'WASM: 21.3 GFLOP/s (WebGPU: a software adapter)',
    });
    expect(fastestEp({ wasm: { flops: 21.3e9 }, webgpu: { flops: 50e9 } }, true).ep).toBe('wasm');
    expect(fastestEp({ wasm: { flops: 21.3e9 } }, true)).toEqual({
      ep: 'wasm',
      why: 'WASM: 21.3 GFLOP/s (WebGPU: a software adapter)',
    });
    expect(fastestEp({}, true)).toEqual({ ep: 'wasm', why: 'WASM: nothing measured yet (WebGPU: a software adapter)' });
  });

  it('with WebGPU alone, names it and its rate and says nothing about a missing adapter', () => {
    expect(fastestEp({ webgpu: { flops: 2e9 } })).toEqual({ ep: 'webgpu', why: 'WebGPU: 2 GFLOP/s' });
  });

  it("calls a worker process's 'wasm' EP by its native device, a tab's (and a process's without one) WASM", () => {
    expect(fastestEp({ wasm: { flops: 98.4e9 } }, false, 'cpu')).toEqual({ ep: 'wasm', why: 'CPU: 98.4 GFLOP/s' });
    expect(fastestEp({}, false, 'cpu').why).toBe('CPU: nothing measured yet');
    expect(fastestEp({ wasm: { flops: 3.1e12 } }, false, 'cuda').why).toBe('CUDA: 3100 GFLOP/s');
    expect(fastestEp({ wasm: { flops: 0.2e9 } }, false, 'webgpu').why).toBe('WebGPU (Dawn): 0.2 GFLOP/s');
    expect(fastestEp({ wasm: { flops: 16e9 } }, false).why).toBe('WASM: 16 GFLOP/s (no WebGPU adapter)');
  });
});

describe("a worker's runtime with ep 'auto'", () => {
  /** A prepared runtime whose engine measures these rates, on `threads` threads; it records what it loaded on. */
  function runtimeWith(rates: Partial<Record<ExecutionProvider, number>>, info: Partial<WorkerInfo> = {}) {
    const loads: ExecutionProvider[] = [];
    const probes: ExecutionProvider[] = [];
    const base = stubEngine(referenceStages(model), model.config);
    const engine = {
      ...base,
      load: async (url: string, ep: ExecutionProvider) => (loads.push(ep), { ...(await base.load(url, ep)), ep }),
      probe: (ep: ExecutionProvider) => {
        probes.push(ep);
        const flops = rates[ep];
        // as a real engine's probe of an EP the machine lacks, one without a rate fails
        return flops === undefined
          ? Promise.reject(new Error(`no ${ep} here`))
          : Promise.resolve({ ep, flops, softmaxRate: 1e8, stageMs: 1 });
      },
    };
    const described: WorkerInfo = {
      ep: 'webgpu',
      adapter: 'test',
      softwareAdapter: false,
      threads: 1,
      memoryGiB: null,
      userAgent: 'node',
      cores: 1,
      machine: machineNamed('node'),
      ...info,
    };
    const runtime = new WorkerRuntime(engine, {
      connectMesh: () => Promise.resolve(memoryExchanges(1)[0]),
      describe: () => Promise.resolve(described),
    });
    return { runtime, loads, probes, described };
  }

  it('loads on the EP it measured faster, says why, and measures each EP once', async () => {
    const slowGpu = runtimeWith({ wasm: 21.3e9, webgpu: 0.2e9 });
    await slowGpu.runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    expect(await slowGpu.runtime.loadModel({ modelUrl: 'x', ep: 'auto' })).toMatchObject({
      ep: 'wasm',
      why: 'WASM: 21.3 GFLOP/s vs WebGPU 0.2',
    });
    await slowGpu.runtime.loadModel({ modelUrl: 'x', ep: 'auto' });
    expect([slowGpu.loads, slowGpu.probes]).toEqual([
      ['wasm', 'wasm'],
      ['wasm', 'webgpu'],
    ]);

    const realGpu = runtimeWith({ wasm: 21.3e9, webgpu: 5000e9 });
    await realGpu.runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    expect(await realGpu.runtime.loadModel({ modelUrl: 'x', ep: 'auto' })).toMatchObject({
      ep: 'webgpu',
      why: 'WebGPU: 5000 GFLOP/s vs WASM 21.3',
    });
  });

  it('reuses the probes the coordinator took at join, but not those of another share of the cores', async () => {
    const { runtime, probes, described } = runtimeWith({ wasm: 21.3e9, webgpu: 0.2e9 });
    await runtime.probeCompute({ ep: 'wasm' });
    await runtime.probeCompute({ ep: 'webgpu' });
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    await runtime.loadModel({ modelUrl: 'x', ep: 'auto' });
    expect(probes).toEqual(['wasm', 'webgpu']);
    described.threads = 2; // another worker tab left: this one now has two threads
    await runtime.loadModel({ modelUrl: 'x', ep: 'auto' });
    expect(probes).toEqual(['wasm', 'webgpu', 'wasm', 'webgpu']);
  });

  it("a load while the coordinator's probes are still running waits for them instead of probing again", async () => {
    const { runtime, probes } = runtimeWith({ wasm: 21.3e9, webgpu: 0.2e9 });
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    const joined = [runtime.probeCompute({ ep: 'wasm' }), runtime.probeCompute({ ep: 'webgpu' })]; // not awaited: still measuring
    expect(await runtime.loadModel({ modelUrl: 'x', ep: 'auto' })).toMatchObject({ ep: 'wasm' });
    await Promise.all(joined);
    expect(probes).toEqual(['wasm', 'webgpu']);
  });

  it('on a software adapter, loads on WASM without waiting for a WebGPU probe', async () => {
    const { runtime, loads, probes } = runtimeWith(
      { wasm: 21.3e9, webgpu: 0.2e9 },
      { softwareAdapter: true, adapter: 'google swiftshader' },
    );
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    expect(await runtime.loadModel({ modelUrl: 'x', ep: 'auto' })).toMatchObject({
      ep: 'wasm',
      why: 'WASM: 21.3 GFLOP/s (WebGPU: a software adapter)',
    });
    expect([loads, probes]).toEqual([['wasm'], ['wasm']]);
  });

  it('a probe that failed is taken again by the next load, not kept as a failure', async () => {
    const { runtime, probes } = runtimeWith({ wasm: 21.3e9, webgpu: 0.2e9 });
    let failures = 1;
    const engineProbe = (runtime as unknown as { engine: { probe: (ep: ExecutionProvider) => Promise<unknown> } })
      .engine;
    const probe = engineProbe.probe;
    engineProbe.probe = (ep) =>
      ep === 'webgpu' && failures-- > 0 ? Promise.reject(new Error('device lost')) : probe(ep);
    await expect(runtime.probeCompute({ ep: 'webgpu' })).rejects.toThrow('device lost');
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    expect(await runtime.loadModel({ modelUrl: 'x', ep: 'auto' })).toMatchObject({
      ep: 'wasm',
      why: 'WASM: 21.3 GFLOP/s vs WebGPU 0.2',
    });
    expect(probes).toEqual(['wasm', 'webgpu']);
  });

  it('a job that names its EP gets it, measured or not, and the reason says so; no adapter means no WebGPU probe', async () => {
    const { runtime, loads, probes } = runtimeWith({ wasm: 21.3e9, webgpu: 0.2e9 });
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    expect(await runtime.loadModel({ modelUrl: 'x', ep: 'webgpu' })).toMatchObject({
      ep: 'webgpu',
      why: 'WebGPU: asked for by the job',
    });
    expect([loads, probes]).toEqual([['webgpu'], []]);

    const cpuOnly = runtimeWith({ wasm: 16e9 }, { ep: 'wasm', adapter: 'WebAssembly (no WebGPU adapter)' });
    await cpuOnly.runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
    expect(await cpuOnly.runtime.loadModel({ modelUrl: 'x', ep: 'auto' })).toMatchObject({
      ep: 'wasm',
      why: 'WASM: 16 GFLOP/s (no WebGPU adapter)',
    });
    expect(cpuOnly.probes).toEqual(['wasm']);
  });
});
