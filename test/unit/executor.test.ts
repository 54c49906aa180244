import { beforeAll, describe, expect, it } from 'vitest';
import { BACKENDS, createExecutor, getExecutorClass } from '../../coordinator/backends.ts';
import { SpotCheckFailed, TimeoutError, WorkerError } from '../../coordinator/executor.ts';
import { LocalExecutor } from '../../coordinator/local-executor.ts';
import { SwarmExecutor } from '../../coordinator/swarm-executor.ts';
import { COORDINATOR, type Message } from '../../core/net/protocol.ts';
import { remote, serve } from '../../core/net/rpc.ts';
import { referenceForward, type WanModel } from '../../core/model/reference.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { exchangeFloatsPerBlock, planUlysses, RankLayout } from '../../core/parallel.ts';
import { SeededRandom } from '../../core/random.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import {
  PeerLost,
  WORKER_CONTRACT,
  WORKER_METHODS,
  type ExecuteResult,
  type WorkerApi,
} from '../../core/worker-api.ts';
import type { EngineApi } from '../../rank/engine.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { WorkerRuntime } from '../../rank/runtime.ts';
import { channelPair, machineNamed, validJobArgs } from './fixtures.ts';
import {
  EXACT_SETTINGS,
  InProcessExecutor,
  type InProcessOptions,
  onTinyModel,
  placementFor,
  type Transport,
} from './in-process-executor.ts';

// The executor's lifecycle against P real WorkerRuntimes in this process (in-process-executor.ts),
// over both ways the backends reach a rank.
let model: WanModel;
let engine: EngineApi;
const random = new SeededRandom(5);
let text: Float32Array;
const latent: Tensor = { shape: [16, 1, 14, 10], data: random.normals(16 * 14 * 10) }; // 35 tokens: 12/12/11 at P = 3
let options: InProcessOptions;

describe('the executor against real WorkerRuntimes in this process', () => {
  // a describe, not the file's top: Stryker counts a failed file-level hook as no failed test (its tests are skipped)
  beforeAll(async () => {
    const tiny = await onTinyModel();
    ({ model, engine } = tiny);
    text = random.normals(16 * model.config.textDim);
    // no spot checks (their forwards are chosen at random) unless a test asks for them
    options = { ...tiny.options, spotCheckRate: 0 };
  });

  const onRanks = (P: number, transport: Transport) =>
    new InProcessExecutor({ ...options, layout: new RankLayout(P) }, engine, transport);

  async function started(P: number, transport: Transport): Promise<InProcessExecutor> {
    const executor = onRanks(P, transport);
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

  /** `value` as a `type`, or a failure naming what it was instead. */
  function instance<T>(value: unknown, type: new (...args: never[]) => T): T {
    if (value instanceof type) return value;
    throw new Error(`expected a ${type.name}, got ${String(value)}`);
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
      const pings = await executor.collectiveRpc('ping');
      expect(pings.map((p) => [p.rank, p.state])).toEqual([
        [0, 'ready'],
        [1, 'ready'],
        [2, 'ready'],
      ]);
      const infos = await executor.collectiveRpc('describe');
      expect(infos.map((i) => i.userAgent)).toEqual(['in-process rank 0', 'in-process rank 1', 'in-process rank 2']);
    });

    it('collectiveRpc with per-rank args gives each rank its own arguments', async () => {
      const executor = onRanks(3, transport);
      await executor.placeOnly();
      const peers = ['a', 'b', 'c'];
      const replies = await executor.collectiveRpc('initWorker', {
        args: (rank) => ({ ...EXACT_SETTINGS, rank, world: 3, peers, session: 's' }),
      });
      expect(replies).toEqual([
        { rank: 0, world: 3 },
        { rank: 1, world: 3 },
        { rank: 2, world: 3 },
      ]);
    });

    it('uniqueReplyRank k returns only rank k’s reply (every rank still runs the method)', async () => {
      const executor = await started(3, transport);
      const only = await executor.collectiveRpc('ping', { uniqueReplyRank: 2 });
      expect(only.rank).toBe(2);
      expect(executor.received.map((m) => m.at(-1))).toEqual(['ping', 'ping', 'ping']);
      expect((await executor.collectiveRpc('describe', { uniqueReplyRank: 0 })).userAgent).toBe('in-process rank 0');
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
      expect(instance(error, TimeoutError).method).toBe('ping');
      expect(instance(error, TimeoutError).silentRanks).toEqual([1]);
      // waited for the 200 ms asked, not the executor's 10 s default (upper bound wide for a loaded machine)
      expect(elapsed).toBeGreaterThanOrEqual(190);
      expect(elapsed).toBeLessThan(5_000);
    });

    it('several silent ranks are all named, and the ranks that answered are not', async () => {
      const executor = await started(4, transport);
      executor.fault = (rank) => (rank === 0 || rank === 2 ? { silent: true } : null);
      const t0 = performance.now();
      const error = await rejection(executor.checkHealth(200));
      const elapsed = performance.now() - t0;
      expect(elapsed).toBeGreaterThanOrEqual(190);
      expect(elapsed).toBeLessThan(5_000); // the 200 ms asked, not the executor's 10 s default
      expect(error).toBeInstanceOf(TimeoutError);
      expect(instance(error, TimeoutError).silentRanks).toEqual([0, 2]);
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
      const executor = onRanks(2, transport);
      await executor.placeOnly();
      for (const method of ['loadModel', 'prepareJob', 'executeModel'] as const) {
        const error = await rejection(executor.collectiveRpc(method, { args: validJobArgs[method] }));
        expect(error).toBeInstanceOf(WorkerError);
        expect(instance(error, WorkerError).rank).toBe(0);
        expect(instance(error, WorkerError).remoteMessage).toBe(
          `worker method ${method} called before initWorker: the coordinator must call initWorker first`,
        );
      }
      for (const runtime of executor.runtimes) {
        await expect(runtime.executeModel(validJobArgs.executeModel)).rejects.toThrow(/before initWorker/);
        expect(runtime.state).toBe('idle');
      }
    });

    it('arguments that break the contract are refused before the method runs, naming the field', async () => {
      const executor = await started(2, transport);
      const error = await rejection(
        executor.collectiveRpc('loadModel', { args: { modelUrl: 42, ep: 'cuda' } as never }),
      );
      expect(error).toBeInstanceOf(WorkerError);
      expect(instance(error, WorkerError).remoteMessage).toBe(
        'loadModel arguments.modelUrl: expected a string of at most 4096 characters, got number 42',
      );
      expect(executor.runtimes.map((r) => r.state)).toEqual(['ready', 'ready']);
    });

    it('executeModel over P = 1 and P = 3 gives the same output, and each rank sends the bytes its share gives it (about 4·(S/P)·D·(P−1)/P·4 per block)', async () => {
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
        const plan = planUlysses(model.config, S, P);
        const perRank = (r: number) => 4 * exchangeFloatsPerBlock(plan, r) * model.config.numLayers;
        expect(ranks.map((r) => [r.rank, r.worker, r.bytesSent])).toEqual(
          Array.from({ length: P }, (_, r) => [r, `rank-${r}`, perRank(r)]),
        );
        // tokens 12/12/11, 4 heads each of 24: (3·12·8 + 4·23)·24 floats · 4 B · 2 blocks for the first two
        if (P === 3) expect(ranks.map((r) => r.bytesSent)).toEqual([72_960, 72_960, 69_120]);
        await executor.shutdown({ graceMs: 1_000 });
      }
      expect(maxAbsDiff(outputs[1].data, outputs[0].data)).toBeLessThanOrEqual(1e-4);
      expect(maxAbsDiff(outputs[0].data, referenceForward(model, latent, 500, text).data)).toBeLessThanOrEqual(1e-4);
    });

    it("NaN rows of the right length are refused where they arrive, as a breach by the rank that sent them (the coordinator's own evidence): nothing reaches the latent", async () => {
      const poisoned: EngineApi = {
        ...engine,
        head: async (x, temb, levels) => (await engine.head(x, temb, levels)).fill(NaN, 0, 1),
      };
      const executor = new InProcessExecutor({ ...options, layout: new RankLayout(2) }, poisoned, transport);
      await executor.initialize();
      await executor.prepareJob(7, [text], latent.shape);
      const error = await rejection(executor.executeModel({ job: 7, step: 0, pass: 0, timestep: 500, latent }));
      expect(error).toBeInstanceOf(WorkerError);
      expect(error).toMatchObject({
        rank: 0,
        method: 'executeModel',
        remoteMessage: 'returned NaN or infinite values',
        breach: true,
      });
      await executor.shutdown({ graceMs: 1_000 });
    });

    it('a layout of uneven head shares (6/4/2: ranks of unequal speed) tells each rank its share, scatters the tokens by it (18/12/5) and gives the P = 1 output (issue 18)', async () => {
      const request = { job: 7, step: 0, pass: 0, timestep: 500, latent };
      const single = await started(1, transport);
      await single.prepareJob(7, [text], latent.shape);
      const expected = (await single.executeModel(request)).output;
      await single.shutdown({ graceMs: 1_000 });
      const executor = new InProcessExecutor(
        { ...options, layout: new RankLayout(3, 1, [[6, 4, 2]]) },
        engine,
        transport,
      );
      await executor.initialize();
      await executor.prepareJob(7, [text], latent.shape);
      const { output, ranks } = await executor.executeModel(request);
      expect(maxAbsDiff(output.data, expected.data)).toBeLessThanOrEqual(1e-4);
      const plan = planUlysses(model.config, 35, [6, 4, 2]);
      expect(plan.rows).toEqual([18, 12, 5]);
      expect(ranks.map((r) => r.bytesSent)).toEqual(
        [0, 1, 2].map((r) => 4 * exchangeFloatsPerBlock(plan, r) * model.config.numLayers),
      );
      await executor.shutdown({ graceMs: 1_000 });
    });

    it('spot checks: another rank recomputes the pass alone; honest ranks agree, and a rank returning slightly altered rows (right size, finite) is convicted as a breach (issue 18)', async () => {
      const request = { job: 7, step: 0, pass: 0, timestep: 500, latent };
      const honest = new InProcessExecutor(
        { ...options, layout: new RankLayout(3), spotCheckRate: 1 },
        engine,
        transport,
      );
      await honest.initialize();
      await honest.prepareJob(7, [text], latent.shape);
      await honest.executeModel(request);
      const [check] = honest.takeSpotChecks();
      expect(check).toMatchObject({ step: 0, pass: 0, third: null, verdict: 'agreed' });
      expect(check.difference).toBeLessThan(1e-5);
      expect(honest.received[check.checker]).toContain('recompute');
      await honest.shutdown({ graceMs: 1_000 });

      const cheating = new InProcessExecutor(
        { ...options, layout: new RankLayout(3), spotCheckRate: 1 },
        engine,
        transport,
      );
      cheating.fault = (rank, method) =>
        rank === 1 && method === 'executeModel'
          ? { alters: (r: ExecuteResult) => ({ ...r, rows: r.rows.map((v, i) => (i === 5 ? v + 0.01 : v)) }) }
          : null;
      await cheating.initialize();
      await cheating.prepareJob(7, [text], latent.shape);
      const error = await rejection(cheating.executeModel(request));
      expect(error).toBeInstanceOf(WorkerError);
      expect(error).toMatchObject({ rank: 1, method: 'spot check', breach: true, blame: null });
      expect(instance(error, WorkerError).remoteMessage).toMatch(
        /^step 1: its rows of the pass differ from a recomputation by .* \(ranks \d and \d recomputed it alike\)$/,
      );
      const [caught] = cheating.takeSpotChecks();
      expect(caught.verdict).toMatchObject({ convicted: [1] });
      expect(caught.third).not.toBeNull();
      await cheating.shutdown({ graceMs: 1_000 });
    });

    it('a lying checker between two ranks, with no third to ask, convicts nobody on its word: a dispute, not a breach (issue 33, #2)', async () => {
      const request = { job: 7, step: 0, pass: 0, timestep: 500, latent };
      const executor = new InProcessExecutor(
        { ...options, layout: new RankLayout(2), spotCheckRate: 1 },
        engine,
        transport,
      );
      // each rank computes its own rows honestly and, asked to recompute, moves a value of the other's
      // (rank 0's rows come first): whichever is picked to check lies about the other
      executor.fault = (rank, method) =>
        method === 'recompute'
          ? {
              alters: (r: ExecuteResult) => ({
                ...r,
                rows: r.rows.map((v, i) => (i === (rank === 1 ? 5 : r.rows.length - 1) ? v + 0.01 : v)),
              }),
            }
          : null;
      await executor.initialize();
      await executor.prepareJob(7, [text], latent.shape);
      const error = await rejection(executor.executeModel(request));
      const [check] = executor.takeSpotChecks();
      const checker = check.checker;
      const other = 1 - checker;
      expect(check).toMatchObject({ third: null, verdict: { convicted: [other, checker] } });
      const failed = instance(error, SpotCheckFailed);
      expect(failed).toMatchObject({
        rank: other,
        breach: false,
        disputed: true,
        blame: { rank: checker, cause: 'misbehaved' },
      });
      await executor.shutdown({ graceMs: 1_000 });
    });

    it('executeModel with a patches array of the wrong length is refused by every rank, naming the length its share needs, before any compute', async () => {
      const executor = await started(3, transport);
      await executor.prepareJob(7, [text], latent.shape);
      // the whole latent's 35 token rows of 16·1·2·2 values, where the ranks' shares are 12, 12 and 11 rows
      const whole = new Float32Array(35 * 64);
      const error = await rejection(
        executor.collectiveRpc('executeModel', {
          args: { job: 7, step: 0, pass: 0, timestep: 500, latentShape: latent.shape, patches: whole },
        }),
      );
      expect(error).toBeInstanceOf(WorkerError);
      const { rank, remoteMessage } = instance(error, WorkerError);
      expect(remoteMessage).toBe(
        `executeModel expected ${[12, 12, 11][rank]}×64 patch values for rank ${rank}, got 2240`,
      );
      for (const [r, runtime] of executor.runtimes.entries()) {
        const share = [12, 12, 11][r];
        await expect(
          runtime.executeModel({
            job: 7,
            step: 0,
            pass: 0,
            timestep: 500,
            latentShape: latent.shape,
            patches: new Float32Array(share * 64 - 1),
          }),
        ).rejects.toThrow(`executeModel expected ${share}×64 patch values for rank ${r}, got ${share * 64 - 1}`);
        expect(runtime.state).toBe('ready');
      }
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
      expect(elapsed).toBeLessThan(graceMs + 8_000); // the grace period, not the executor's 10 s RPC timeout
      // an acking worker is released: it refuses job work until the next executor's initWorker
      for (const rank of [0, 2]) {
        const runtime = executor.runtimes[rank];
        expect(runtime.state).toBe('idle');
        for (const method of ['loadModel', 'prepareJob', 'executeModel'] as const) {
          await expect(
            (runtime[method] as (a: unknown) => Promise<unknown>).call(runtime, validJobArgs[method]),
          ).rejects.toThrow(`worker method ${method} called before initWorker`);
        }
      }
      expect(executor.runtimes[1].state).toBe('ready'); // the silent rank never ran shutdown
    });

    it('shutdown returns as soon as every rank acks, and a second shutdown does nothing', async () => {
      const executor = await started(2, transport);
      const t0 = performance.now();
      expect(await executor.shutdown({ graceMs: 30_000 })).toEqual({ acked: [0, 1], silent: [] });
      expect(performance.now() - t0).toBeLessThan(10_000); // far below the 30 s grace period
      expect(await executor.shutdown({ graceMs: 5_000 })).toEqual({ acked: [], silent: [] });
      expect(executor.closeTransportCalls).toBe(1);
      expect(executor.received.flat().filter((m) => m === 'shutdown')).toHaveLength(2);
    });
  });

  describe('the worker contract on the wire', () => {
    /** A raw request as any peer could send it, and the reply body that comes back. */
    async function rawRequest(
      impl: WorkerApi,
      method: string,
      args: unknown,
    ): Promise<{ ok: boolean; error?: string; result?: unknown }> {
      const [coordinatorSide, workerSide] = channelPair();
      serve(workerSide, 0, WORKER_CONTRACT, impl);
      const reply = new Promise<Message>((resolve) => coordinatorSide.onMessage(resolve));
      await coordinatorSide.send({
        kind: 'rpc',
        from: COORDINATOR,
        body: { type: 'request', id: 1, method, args },
        tensors: [],
      });
      return ((await reply) as Extract<Message, { kind: 'rpc' }>).body as { ok: boolean; error?: string };
    }

    it('an unknown method, an inherited property among them, is refused with the list of worker methods', async () => {
      const runtime = new WorkerRuntime(engine, {
        connectMesh: () => Promise.resolve(memoryExchanges(1)[0]),
        describe: () =>
          Promise.resolve({
            ep: 'wasm',
            adapter: 't',
            softwareAdapter: false,
            threads: 1,
            memoryGiB: null,
            userAgent: 'u',
            cores: 1,
            machine: machineNamed('u'),
          }),
      });
      expect(WORKER_METHODS).toEqual([
        'describe',
        'probeCompute',
        'probeLink',
        'initWorker',
        'loadModel',
        'rehearse',
        'preload',
        'encodeText',
        'decodeTile',
        'encodeImage',
        'prepareJob',
        'probeMesh',
        'executeModel',
        'recompute',
        'exchangeEvidence',
        'handOffEvidence',
        'recomputeExchanges',
        'ping',
        'pingEngine',
        'shutdown',
      ]);
      for (const method of ['eval', 'constructor', '__proto__', 'toString', 'judgeTensor']) {
        expect(await rawRequest(runtime, method, {})).toEqual({
          type: 'reply',
          id: 1,
          ok: false,
          error: `unknown method "${method}"; this side answers only: ${WORKER_METHODS.join(', ')}`,
        });
      }
      expect(runtime.state).toBe('idle');
    });

    it('a reply that breaks the contract is rejected where it arrives, naming the worker and the field', async () => {
      const [coordinatorSide, workerSide] = channelPair();
      const liar = {
        describe: () =>
          Promise.resolve({
            ep: 'cuda',
            adapter: 'x',
            softwareAdapter: false,
            threads: 1,
            memoryGiB: null,
            userAgent: 'u',
            cores: 1,
            machine: machineNamed('u'),
          }),
        ping: () => Promise.resolve({ state: 'ready', rank: 0 }),
      };
      serve(workerSide, 0, WORKER_CONTRACT, liar as unknown as WorkerApi);
      const api = remote(coordinatorSide, COORDINATOR, WORKER_CONTRACT, 'worker w7');
      await expect(api.describe({})).rejects.toThrow(
        'worker w7 answered describe with a malformed reply: reply.ep: expected one of "webgpu", "wasm", got "cuda"',
      );
      await expect(api.ping({})).rejects.toThrow(
        'worker w7 answered ping with a malformed reply: reply.totals: expected an object with steps',
      );
    });

    it('blame travels as data: the rank a worker blames is renumbered from its group to the global rank, and text alone blames nobody', async () => {
      for (const transport of ['direct', 'rpc'] as const) {
        const executor = new InProcessExecutor({ ...options, layout: new RankLayout(2, 2) }, engine, transport);
        await executor.initialize();
        executor.fault = (rank, method) =>
          rank === 3 && method === 'ping' ? { throws: 'rank 0 is gone rank 1: x rank 2: y' } : null;
        const textOnly = await rejection(executor.collectiveRpc('ping'));
        expect(textOnly).toMatchObject({ rank: 3, blame: null });
        const accusing = executor.runtimes[3];
        accusing.ping = () =>
          Promise.reject(new PeerLost({ rank: 0, cause: 'disconnected', evidence: 'connection to w2 closed' }));
        executor.fault = () => null;
        const error = instance(await rejection(executor.collectiveRpc('ping')), WorkerError);
        expect(error).toBeInstanceOf(WorkerError);
        // rank 0 of the second group (ranks 2, 3) is global rank 2
        expect(error.blame).toEqual({ rank: 2, cause: 'disconnected', evidence: 'connection to w2 closed' });
        expect(error.message).toBe('rank 3 failed in ping: rank 0 is gone: connection to w2 closed');
      }
    });

    it('a PeerLost says in words whether the peer went away or misbehaved, and is named so', () => {
      const gone = new PeerLost({ rank: 1, cause: 'silent', evidence: 'no tensor in 60 s' });
      const liar = new PeerLost({ rank: 2, cause: 'misbehaved', evidence: 'sent 12 bytes where the plan says 48' });
      expect([gone.name, gone.message]).toEqual(['PeerLost', 'rank 1 is gone: no tensor in 60 s']);
      expect([liar.name, liar.message]).toEqual([
        'PeerLost',
        'rank 2 misbehaved: sent 12 bytes where the plan says 48',
      ]);
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
        expect(() => getExecutorClass(name)).toThrow(
          `unknown executor backend ${JSON.stringify(name)}; valid backends: local, swarm`,
        );
      }
    });

    it('the swarm backend without a Swarm says where to get one', () => {
      expect(() => createExecutor('swarm', placementFor(options))).toThrow(
        'the swarm backend needs a Swarm: pass one from openSwarm()',
      );
    });
  });
});
