import { beforeAll, describe, expect, it } from 'vitest';
import { BACKENDS, createExecutor, getExecutorClass } from '../../coordinator/backends.ts';
import { Executor, TimeoutError, withTimeout, WorkerError, type ExecutorOptions } from '../../coordinator/executor.ts';
import { LocalExecutor } from '../../coordinator/local-executor.ts';
import { SwarmExecutor } from '../../coordinator/swarm-executor.ts';
import { Link } from '../../core/net/link.ts';
import type { Channel } from '../../core/net/channel.ts';
import { referenceForward, type WanModel } from '../../core/model/reference.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { exchangeFloatsPerBlock, planUlysses } from '../../core/parallel.ts';
import { COORDINATOR } from '../../core/net/protocol.ts';
import { SeededRandom } from '../../core/random.ts';
import { RpcClient, serveRpc } from '../../core/net/rpc.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import type { EngineApi } from '../../rank/engine.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import { WORKER_METHODS, WorkerRuntime } from '../../rank/runtime.ts';
import { tinyModelFiles } from './fixtures.ts';

/**
 * The executor's lifecycle against P real WorkerRuntimes in this process: the all-to-all over
 * memory, the calls either straight into `dispatch` (as the local backend does) or through
 * Links, RpcClient and serveRpc over an in-memory channel (as the swarm backend does).
 */
type Transport = 'direct' | 'rpc';
/** What a rank does instead of answering normally. */
type Fault = { silent: true } | { throws: string } | { delayMs: number };

/** One direction of a data channel that delivers each frame on a later task, in order. */
function channelPair(): [Link, Link] {
  const channel = (deliver: (frame: ArrayBuffer) => void): Channel => ({
    bufferedAmount: 0,
    bufferedAmountLowThreshold: 0,
    send: (frame) => void setImmediate(() => deliver(frame)),
    addEventListener() {},
    removeEventListener() {},
  });
  const a: Link = new Link(channel((f) => b.receive(f)));
  const b: Link = new Link(channel((f) => a.receive(f)));
  return [a, b];
}

class InProcessExecutor extends Executor {
  readonly runtimes: WorkerRuntime[] = [];
  /** the methods each rank was asked to run, in arrival order */
  readonly received: string[][] = [];
  closeTransportCalls = 0;
  fault: (rank: number, method: string) => Fault | null = () => null;
  private calls: ((method: string, args: unknown, timeoutMs: number) => Promise<unknown>)[] = [];
  private links: Link[] = [];

  constructor(
    options: ExecutorOptions,
    private readonly ranks: number,
    private readonly engine: EngineApi,
    private readonly transport: Transport,
  ) {
    super(options);
  }

  /** Places the ranks without initWorker, loadModel or anything else. */
  async placeOnly(): Promise<void> {
    this.world = (await this.place()).length;
  }

  protected async place(): Promise<string[]> {
    const exchanges = memoryExchanges(this.ranks);
    for (let rank = 0; rank < this.ranks; rank++) {
      const runtime = new WorkerRuntime(this.engine, {
        connectMesh: async (init) => exchanges[init.rank],
        describe: async () => ({ ep: 'wasm', adapter: 'test', threads: 1, memoryGiB: null, userAgent: `in-process rank ${rank}` }),
      });
      this.runtimes.push(runtime);
      this.received.push([]);
      const serve = async (method: string, args: unknown): Promise<unknown> => {
        this.received[rank].push(method);
        const fault = this.fault(rank, method);
        if (fault && 'silent' in fault) return new Promise(() => {});
        if (fault && 'throws' in fault) throw new Error(fault.throws);
        if (fault && 'delayMs' in fault) await new Promise((r) => setTimeout(r, fault.delayMs));
        return runtime.dispatch(method, args);
      };
      if (this.transport === 'direct') {
        this.calls.push((method, args, timeoutMs) => withTimeout(serve(method, args), method, timeoutMs));
      } else {
        const [coordinatorSide, workerSide] = channelPair();
        serveRpc(workerSide, rank, serve);
        const client = new RpcClient(coordinatorSide, COORDINATOR);
        this.links.push(coordinatorSide, workerSide);
        this.calls.push((method, args, timeoutMs) => client.call(method, args, timeoutMs));
      }
    }
    return Array.from({ length: this.ranks }, (_, r) => `rank-${r}`);
  }

  protected callRank(rank: number, method: string, args: unknown, timeoutMs: number): Promise<unknown> {
    return this.calls[rank](method, args, timeoutMs);
  }

  protected closeTransport(): void {
    this.closeTransportCalls++;
    for (const link of this.links) link.close('the executor shut down');
  }
}

let model: WanModel;
let engine: EngineApi;
const random = new SeededRandom(5);
let text: Float32Array;
const latent: Tensor = { shape: [16, 1, 14, 10], data: random.normals(16 * 14 * 10) }; // 35 tokens: P = 3 pads
let options: ExecutorOptions;

beforeAll(async () => {
  model = await loadTransformer(tinyModelFiles);
  const stages = await onnxStages(model, 'wasm');
  engine = { ...stages, load: async () => ({ ep: 'wasm', adapter: 'test', config: model.config, loadMs: 0 }), probe: async () => ({ ep: 'wasm', flops: 1e9 }) };
  text = random.normals(16 * model.config.textDim);
  options = { config: model.config, modelUrl: '/models/tiny-wan', rpcTimeoutMs: 10_000 };
});

async function started(P: number, transport: Transport): Promise<InProcessExecutor> {
  const executor = new InProcessExecutor(options, P, engine, transport);
  await executor.initialize();
  return executor;
}

async function rejection(work: Promise<unknown>): Promise<Error> {
  try {
    await work;
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected a rejection, but the call resolved');
}

describe.each<Transport>(['direct', 'rpc'])('Executor over %s calls', (transport) => {
  it('initialize gives each worker its rank of the world and loads the model everywhere', async () => {
    const executor = await started(3, transport);
    expect(executor.world).toBe(3);
    expect(executor.workers.map((w) => [w.id, w.userAgent, w.ep])).toEqual([
      ['rank-0', 'in-process rank 0', 'wasm'],
      ['rank-1', 'in-process rank 1', 'wasm'],
      ['rank-2', 'in-process rank 2', 'wasm'],
    ]);
    expect(executor.received).toEqual(Array(3).fill(['initWorker', 'describe', 'loadModel']));
    expect(executor.runtimes.map((r) => r.state)).toEqual(['ready', 'ready', 'ready']);
  });

  it('collectiveRpc returns every rank’s reply in rank order, not arrival order', async () => {
    const executor = await started(3, transport);
    executor.fault = (rank) => ({ delayMs: [60, 30, 0][rank] }); // rank 2 answers first, rank 0 last
    const pings = (await executor.collectiveRpc('ping')) as { rank: number; state: string }[];
    expect(pings.map((p) => [p.rank, p.state])).toEqual([[0, 'ready'], [1, 'ready'], [2, 'ready']]);
    const infos = (await executor.collectiveRpc('describe')) as { userAgent: string }[];
    expect(infos.map((i) => i.userAgent)).toEqual(['in-process rank 0', 'in-process rank 1', 'in-process rank 2']);
  });

  it('collectiveRpc with argsFor gives each rank its own arguments', async () => {
    const executor = new InProcessExecutor(options, 3, engine, transport);
    await executor.placeOnly();
    const peers = ['a', 'b', 'c'];
    const replies = await executor.collectiveRpc('initWorker', { argsFor: (rank) => ({ rank, world: 3, peers, session: 's' }) });
    expect(replies).toEqual([{ rank: 0, world: 3 }, { rank: 1, world: 3 }, { rank: 2, world: 3 }]);
  });

  it('uniqueReplyRank k returns only rank k’s reply (every rank still runs the method)', async () => {
    const executor = await started(3, transport);
    const only = (await executor.collectiveRpc('ping', { uniqueReplyRank: 2 })) as { rank: number };
    expect(only.rank).toBe(2);
    expect(executor.received.map((m) => m.at(-1))).toEqual(['ping', 'ping', 'ping']);
    expect(((await executor.collectiveRpc('describe', { uniqueReplyRank: 0 })) as { userAgent: string }).userAgent).toBe('in-process rank 0');
  });

  it('an invalid uniqueReplyRank is an error naming it and the world size, raised before any rank runs the method', async () => {
    const executor = await started(3, transport);
    for (const bad of [3, -1, 1.5]) {
      const error = await rejection(executor.collectiveRpc('shutdown', { uniqueReplyRank: bad }));
      expect(error.message).toBe(`uniqueReplyRank ${bad} is not a rank of this 3-rank executor`);
    }
    expect(executor.received.flat()).not.toContain('shutdown');
    expect(executor.runtimes.map((r) => r.state)).toEqual(['ready', 'ready', 'ready']);
  });

  it('a rank that never answers rejects with a TimeoutError naming the method and only that rank, after about the timeout', async () => {
    const executor = await started(3, transport);
    executor.fault = (rank) => (rank === 1 ? { silent: true } : null);
    const t0 = performance.now();
    const error = await rejection(executor.collectiveRpc('ping', { timeoutMs: 200 }));
    const elapsed = performance.now() - t0;
    expect(error).toBeInstanceOf(TimeoutError);
    expect(error.message).toBe('ping timed out after 200 ms waiting for rank 1');
    expect((error as TimeoutError).method).toBe('ping');
    expect((error as TimeoutError).silentRanks).toEqual([1]);
    expect(elapsed).toBeGreaterThanOrEqual(190);
    expect(elapsed).toBeLessThan(2_000);
  });

  it('several silent ranks are all named, and the ranks that answered are not', async () => {
    const executor = await started(4, transport);
    executor.fault = (rank) => (rank === 0 || rank === 2 ? { silent: true } : null);
    const t0 = performance.now();
    const error = await rejection(executor.checkHealth(200));
    expect(performance.now() - t0).toBeLessThan(2_000);
    expect(error).toBeInstanceOf(TimeoutError);
    expect((error as TimeoutError).silentRanks).toEqual([0, 2]);
    expect(error.message).toBe('ping timed out after 200 ms waiting for ranks 0, 2');
  });

  it('a worker-side exception rejects with a WorkerError carrying the rank and the remote message', async () => {
    const executor = await started(3, transport);
    executor.fault = (rank, method) => (rank === 2 && method === 'describe' ? { throws: 'out of GPU memory' } : null);
    const error = await rejection(executor.collectiveRpc('describe'));
    expect(error).toBeInstanceOf(WorkerError);
    expect(error).toMatchObject({ rank: 2, method: 'describe', remoteMessage: 'out of GPU memory' });
    expect(error.message).toBe('rank 2 failed in describe: out of GPU memory');
  });

  it('loadModel, prepareJob and executeModel before initWorker fail with a clear error from every rank', async () => {
    const executor = new InProcessExecutor(options, 2, engine, transport);
    await executor.placeOnly();
    for (const method of ['loadModel', 'prepareJob', 'executeModel']) {
      const error = await rejection(executor.collectiveRpc(method, { args: { modelUrl: '/models/tiny-wan' } }));
      expect(error).toBeInstanceOf(WorkerError);
      expect((error as WorkerError).rank).toBe(0);
      expect((error as WorkerError).remoteMessage).toBe(`worker method ${method} called before initWorker: the coordinator must call initWorker first`);
    }
    for (const runtime of executor.runtimes) {
      await expect(runtime.dispatch('executeModel', {})).rejects.toThrow(/before initWorker/);
      expect(runtime.state).toBe('idle');
    }
  });

  it('an unknown method is refused with the whitelist of worker methods', async () => {
    const executor = await started(2, transport);
    const error = await rejection(executor.collectiveRpc('eval', { args: { code: 'process.exit()' } }));
    expect(error).toBeInstanceOf(WorkerError);
    expect((error as WorkerError).remoteMessage).toBe(
      'unknown worker method "eval"; a worker runs only: describe, probe, initWorker, loadModel, prepareJob, probeMesh, executeModel, ping, shutdown',
    );
    expect(WORKER_METHODS).toHaveLength(9);
  });

  it('executeModel over P = 1 and P = 3 gives the same output, and each rank sends 4·ceil(S/P)·D·(P−1)/P·4 bytes per block', async () => {
    const request = { job: 7, step: 0, pass: 0, timestep: 500, latent };
    const outputs: Tensor[] = [];
    for (const P of [1, 3]) {
      const executor = await started(P, transport);
      await executor.prepareJob(7, [text], latent.shape);
      const { output, ranks } = await executor.executeModel(request);
      expect(output.shape).toEqual(latent.shape);
      outputs.push(output);
      const S = tokenGrid(model.config, latent.shape).count;
      expect(S).toBe(35);
      const perRank = 4 * Math.ceil(S / P) * model.config.dim * ((P - 1) / P) * 4 * model.config.numLayers;
      expect(perRank).toBe(4 * exchangeFloatsPerBlock(planUlysses(model.config, S, P), model.config.dim) * model.config.numLayers);
      expect(ranks.map((r) => [r.rank, r.worker, r.bytesSent])).toEqual(Array.from({ length: P }, (_, r) => [r, `rank-${r}`, perRank]));
      if (P === 3) expect(perRank).toBe(73_728); // 4 · 12 · 288 · 2/3 · 4 B · 2 blocks
      await executor.shutdown({ graceMs: 1_000 });
    }
    expect(maxAbsDiff(outputs[1].data, outputs[0].data)).toBeLessThanOrEqual(1e-4);
    expect(maxAbsDiff(outputs[0].data, referenceForward(model, latent, 500, text).data)).toBeLessThanOrEqual(1e-4);
  });

  it('shutdown asks every rank to stop; a rank that does not ack is reported silent and the transport still closes after the grace period; acking ranks refuse further job work', async () => {
    const executor = await started(3, transport);
    executor.fault = (rank, method) => (rank === 1 && method === 'shutdown' ? { silent: true } : null);
    const graceMs = 1_000;
    const t0 = performance.now();
    const result = await executor.shutdown({ graceMs });
    const elapsed = performance.now() - t0;
    expect(result).toEqual({ acked: [0, 2], silent: [1] });
    expect(executor.received.map((m) => m.at(-1))).toEqual(['shutdown', 'shutdown', 'shutdown']);
    expect(executor.closeTransportCalls).toBe(1);
    expect(elapsed).toBeGreaterThanOrEqual(graceMs - 20);
    expect(elapsed).toBeLessThan(graceMs + 1_000);
    // an acking worker is released: it refuses job work until the next executor's initWorker
    for (const rank of [0, 2]) {
      const runtime = executor.runtimes[rank];
      expect(runtime.state).toBe('idle');
      for (const method of ['loadModel', 'prepareJob', 'executeModel']) {
        await expect(runtime.dispatch(method, {})).rejects.toThrow(`worker method ${method} called before initWorker`);
      }
    }
    expect(executor.runtimes[1].state).toBe('ready'); // the silent rank never ran shutdown
  });

  it('shutdown returns as soon as every rank acks, and a second shutdown does nothing', async () => {
    const executor = await started(2, transport);
    const t0 = performance.now();
    expect(await executor.shutdown({ graceMs: 5_000 })).toEqual({ acked: [0, 1], silent: [] });
    expect(performance.now() - t0).toBeLessThan(1_000);
    expect(await executor.shutdown({ graceMs: 5_000 })).toEqual({ acked: [], silent: [] });
    expect(executor.closeTransportCalls).toBe(1);
    expect(executor.received.flat().filter((m) => m === 'shutdown')).toHaveLength(2);
  });
});

describe('executor backends', () => {
  it('getExecutorClass maps "local" and "swarm" to their classes', () => {
    expect(BACKENDS).toEqual(['local', 'swarm']);
    expect(getExecutorClass('local')).toBe(LocalExecutor);
    expect(getExecutorClass('swarm')).toBe(SwarmExecutor);
  });

  it('any other backend name is an error naming the valid backends', () => {
    for (const name of ['ray', 'Local', '', 'mp']) {
      expect(() => getExecutorClass(name)).toThrow(`unknown executor backend ${JSON.stringify(name)}; valid backends: local, swarm`);
    }
  });

  it('the swarm backend without a Swarm says where to get one', () => {
    expect(() => createExecutor('swarm', options)).toThrow('the swarm backend needs a Swarm: pass one from openSwarm()');
  });
});
