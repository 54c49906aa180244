import { beforeAll, describe, expect, it } from 'vitest';
import { WorkerError, type ExecutorOptions } from '../../coordinator/executor.ts';
import { Swarm, type SwarmEvent, type SwarmWorker } from '../../coordinator/swarm.ts';
import { SwarmExecutor } from '../../coordinator/swarm-executor.ts';
import { parseWanConfig, type WanConfig } from '../../core/model/config.ts';
import { readJson } from '../../core/model/files.ts';
import { TRANSFORMER_CONFIG } from '../../core/model/transformer.ts';
import { checkDegree, defaultDegree, ParallelConfigError, validDegrees } from '../../core/parallel.ts';
import type { InitArgs } from '../../rank/runtime.ts';
import { tinyModelFiles } from './fixtures.ts';

/**
 * Placement: how many ranks a SwarmExecutor takes from a real Swarm roster, and what it says
 * when it cannot. The Swarm is the real class on a stub PeerJS peer; workers enter and leave
 * its roster the way `admit` and a closing link do, with an RPC stub that answers like a worker.
 */
let config: WanConfig; // the bundled tiny model: 12 heads

beforeAll(async () => {
  config = parseWanConfig(await readJson(tinyModelFiles, TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
});

interface FakeWorker extends SwarmWorker {
  calls: { method: string; args: unknown }[];
}

/** A Swarm on a stub peer, plus the two roster changes PeerJS would cause. */
function testSwarm() {
  const peer = { id: 'ditswarm-c-test', on() {}, destroy() {} };
  const swarm = new (Swarm as unknown as new (peer: unknown, origin: string, token: string) => Swarm)(peer, 'http://localhost:8080', 'token');
  const internals = swarm as unknown as { roster: Map<string, SwarmWorker>; emit(e: SwarmEvent): void };
  let joined = 0;
  const join = (count = 1): FakeWorker[] =>
    Array.from({ length: count }, () => {
      const id = `w${joined}`;
      const calls: FakeWorker['calls'] = [];
      const rpc = {
        async call(method: string, args: unknown) {
          calls.push({ method, args });
          if (method === 'initWorker') return { rank: (args as InitArgs).rank, world: (args as InitArgs).world };
          if (method === 'describe') return worker.info;
          if (method === 'loadModel') return { ep: 'wasm', adapter: 'stub', loadMs: 0 };
          return 'bye';
        },
        failAll() {},
      };
      const worker: FakeWorker = {
        id,
        info: { ep: 'wasm', adapter: 'stub', threads: 1, memoryGiB: null, userAgent: `page ${id}` },
        rpc: rpc as unknown as SwarmWorker['rpc'],
        link: { close() {} } as unknown as SwarmWorker['link'],
        joinedAt: joined++,
        activity: 'idle',
        pulse: null,
        framesDropped: 0,
        transport: 'direct',
        measurement: null,
        calls,
      };
      internals.roster.set(id, worker);
      internals.emit({ type: 'join', worker });
      return worker;
    });
  const leave = (worker: SwarmWorker) => {
    internals.roster.delete(worker.id);
    internals.emit({ type: 'leave', worker, reason: 'test', at: Date.now(), silentMs: 0 });
  };
  return { swarm, join, leave };
}

const executorOn = (swarm: Swarm, extra: Partial<ExecutorOptions> = {}) =>
  new SwarmExecutor({ config, modelUrl: '/models/tiny-wan', placementTimeoutMs: 300, rpcTimeoutMs: 1_000, ...extra }, swarm);

async function rejection(work: Promise<unknown>): Promise<Error> {
  try {
    await work;
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected a rejection, but the call resolved');
}

describe('Ulysses degree rules (core/parallel)', () => {
  it('valid degrees are the divisors of the head count, capped by the workers available', () => {
    expect(config.numHeads).toBe(12);
    expect(validDegrees(12)).toEqual([1, 2, 3, 4, 6, 12]);
    expect(validDegrees(12, 5)).toEqual([1, 2, 3, 4]);
    expect(validDegrees(12, 7)).toEqual([1, 2, 3, 4, 6]);
    expect(validDegrees(40, 8)).toEqual([1, 2, 4, 5, 8]);
    expect(validDegrees(12, 0)).toEqual([]);
  });

  it('the default degree is the largest valid one the live workers allow, at least 1', () => {
    expect([0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13].map((live) => defaultDegree(12, live))).toEqual([1, 1, 2, 3, 4, 4, 6, 6, 6, 12, 12]);
  });

  it('a degree that does not divide the heads is an error listing the valid degrees', () => {
    expect(() => checkDegree(12, 5)).toThrow(ParallelConfigError);
    expect(() => checkDegree(12, 5)).toThrow("ulyssesDegree 5 does not divide the model's 12 heads; valid degrees: 1, 2, 3, 4, 6, 12");
    for (const bad of [0, -2, 2.5, Number.NaN, 24]) expect(() => checkDegree(12, bad), String(bad)).toThrow(/valid degrees: 1, 2, 3, 4, 6, 12$/);
    for (const good of [1, 2, 3, 4, 6, 12]) expect(() => checkDegree(12, good)).not.toThrow();
  });

  it('a degree above the live workers says how many are live and which degrees fit now', () => {
    expect(() => checkDegree(12, 6, 4)).toThrow('ulyssesDegree 6 needs 6 workers but 4 are live; valid degrees now: 1, 2, 3, 4, or open more worker pages');
    expect(() => checkDegree(12, 2, 1)).toThrow('ulyssesDegree 2 needs 2 workers but 1 is live; valid degrees now: 1, or open more worker pages');
    expect(() => checkDegree(12, 1, 0)).toThrow('ulyssesDegree 1 needs 1 worker but 0 are live; open a worker page first');
    expect(() => checkDegree(12, 4, 4)).not.toThrow();
  });
});

describe('SwarmExecutor placement', () => {
  it('too few workers within the timeout: the error says how many joined, how many are needed and where to join', async () => {
    const { swarm, join } = testSwarm();
    join(2);
    const t0 = performance.now();
    const error = await rejection(executorOn(swarm, { ulyssesDegree: 4 }).initialize());
    const elapsed = performance.now() - t0;
    expect(error.message).toMatch(/^2 workers joined within .* but 4 are needed: open http:\/\/localhost:8080\/worker\.html\?swarm=ditswarm-c-test&token=token in 2 more tab/);
    expect(elapsed).toBeGreaterThanOrEqual(280);
    expect(elapsed).toBeLessThan(1_300);
  });

  it('with no workers at all, even "auto" waits for one and then says 1 is needed', async () => {
    const { swarm } = testSwarm();
    const error = await rejection(executorOn(swarm).initialize());
    expect(error.message).toMatch(/^0 workers joined within .* but 1 is needed/);
  });

  it('workers that join during the wait are placed, in the order they joined', async () => {
    const { swarm, join } = testSwarm();
    join(2);
    setTimeout(() => join(3), 50);
    const executor = executorOn(swarm, { ulyssesDegree: 4, placementTimeoutMs: 2_000 });
    await executor.initialize();
    expect(executor.world).toBe(4);
    expect(executor.workers.map((w) => w.id)).toEqual(['w0', 'w1', 'w2', 'w3']);
    expect(swarm.workers().map((w) => w.activity)).toEqual(['rank 0 of 4', 'rank 1 of 4', 'rank 2 of 4', 'rank 3 of 4', 'idle']);
  });

  it('an invalid degree fails at once, listing the valid degrees, without waiting for workers', async () => {
    const { swarm, join } = testSwarm();
    join(12);
    const t0 = performance.now();
    const error = await rejection(executorOn(swarm, { ulyssesDegree: 5, placementTimeoutMs: 10_000 }).initialize());
    expect(error).toBeInstanceOf(ParallelConfigError);
    expect(error.message).toBe("ulyssesDegree 5 does not divide the model's 12 heads; valid degrees: 1, 2, 3, 4, 6, 12");
    expect(performance.now() - t0).toBeLessThan(200);
    expect(swarm.workers().every((w) => w.activity === 'idle')).toBe(true);
  });

  it('"auto" takes the largest valid degree the live workers allow: 4 → 4, 5 → 4, 7 → 6, 13 → 12', async () => {
    for (const [live, degree] of [[1, 1], [4, 4], [5, 4], [7, 6], [13, 12]]) {
      const { swarm, join } = testSwarm();
      join(live);
      const executor = executorOn(swarm, { ulyssesDegree: 'auto' });
      await executor.initialize();
      expect(executor.world, `${live} live`).toBe(degree);
      expect(swarm.workers().filter((w) => w.activity.startsWith('rank ')).length).toBe(degree);
    }
  });

  it('each rank is told its rank, the world and every rank’s peer id, then describes itself and loads the model', async () => {
    const { swarm, join } = testSwarm();
    const workers = join(3);
    await executorOn(swarm, { ulyssesDegree: 3 }).initialize();
    workers.forEach((w, rank) => {
      expect(w.calls.map((c) => c.method)).toEqual(['initWorker', 'describe', 'loadModel']);
      expect(w.calls[0].args).toMatchObject({ rank, world: 3, peers: ['w0', 'w1', 'w2'] });
      expect(w.calls[2].args).toEqual({ modelUrl: '/models/tiny-wan', ep: 'auto' });
    });
  });

  it('a rank leaving the swarm is reported to onFailure; a worker outside the ranks leaving is not', async () => {
    const { swarm, join, leave } = testSwarm();
    const workers = join(3);
    const executor = executorOn(swarm, { ulyssesDegree: 2 });
    await executor.initialize();
    const failures: string[] = [];
    executor.onFailure((e) => failures.push(e.message));
    leave(workers[2]);
    expect(failures).toEqual([]);
    leave(workers[1]);
    expect(failures).toEqual(['rank 1 (worker w1) is lost: test']);
  });

  it('CFG parallel places two groups of P on 2P different workers, each group its own mesh with its own session', async () => {
    const { swarm, join } = testSwarm();
    const workers = join(5);
    const executor = executorOn(swarm, { ulyssesDegree: 2, cfgParallel: true });
    await executor.initialize();
    expect(executor.world).toBe(4);
    expect(executor.groupSize).toBe(2);
    expect([executor.groupRanks(0), executor.groupRanks(1)]).toEqual([[0, 1], [2, 3]]);
    const ids = executor.workers.map((w) => w.id);
    expect(ids).toEqual(['w0', 'w1', 'w2', 'w3']);
    expect(new Set(ids).size).toBe(4); // no worker in both groups
    const inits = workers.slice(0, 4).map((w) => w.calls[0].args as InitArgs);
    expect(inits.map((i) => [i.rank, i.world, i.peers])).toEqual([
      [0, 2, ['w0', 'w1']],
      [1, 2, ['w0', 'w1']],
      [0, 2, ['w2', 'w3']],
      [1, 2, ['w2', 'w3']],
    ]);
    expect(inits[0].session).toBe(inits[1].session);
    expect(inits[2].session).toBe(inits[3].session);
    expect(inits[0].session).not.toBe(inits[2].session);
    expect(workers[4].calls).toEqual([]);
    expect(swarm.workers().map((w) => w.activity)).toEqual([
      'rank 0 of 4 (conditional group)',
      'rank 1 of 4 (conditional group)',
      'rank 2 of 4 (unconditional group)',
      'rank 3 of 4 (unconditional group)',
      'idle',
    ]);
    // the mesh links are those within a group; the groups meet only at the coordinator
    expect(executor.linkReport().filter((l) => l.from !== 'coordinator').map((l) => [l.from, l.to])).toEqual([[1, 0], [3, 2]]);
  });

  it('CFG parallel "auto" takes the largest valid degree half the live workers allow; too few workers is an error saying 2P are needed', async () => {
    for (const [live, degree] of [[2, 1], [5, 2], [7, 3], [9, 4]]) {
      const { swarm, join } = testSwarm();
      join(live);
      const executor = executorOn(swarm, { ulyssesDegree: 'auto', cfgParallel: true });
      await executor.initialize();
      expect([executor.groupSize, executor.world], `${live} live`).toEqual([degree, 2 * degree]);
    }
    const { swarm, join } = testSwarm();
    join(3);
    const error = await rejection(executorOn(swarm, { ulyssesDegree: 2, cfgParallel: true }).initialize());
    expect(error.message).toMatch(/^3 workers joined within .* but 4 are needed/);
  });

  it('a rank that names a lost mesh peer names it in its own group: with CFG parallel that is a rank of the second group', async () => {
    const { swarm, join } = testSwarm();
    join(4);
    const executor = executorOn(swarm, { ulyssesDegree: 2, cfgParallel: true });
    await executor.initialize();
    const lost = await executor.lostRanks(new WorkerError(3, 'executeModel', 'rank 0 is gone'));
    expect(lost.map((l) => [l.rank, l.worker])).toEqual([[2, 'w2']]);
    expect(swarm.workers().map((w) => w.id)).toEqual(['w0', 'w1', 'w3']);
  });

  it('after shutdown the ranks are idle again and their leaving is no longer a failure', async () => {
    const { swarm, join, leave } = testSwarm();
    const workers = join(2);
    const executor = executorOn(swarm, { ulyssesDegree: 2 });
    await executor.initialize();
    const failures: string[] = [];
    executor.onFailure((e) => failures.push(e.message));
    expect(await executor.shutdown({ graceMs: 500 })).toEqual({ acked: [0, 1], silent: [] });
    expect(workers.map((w) => w.calls.at(-1)?.method)).toEqual(['shutdown', 'shutdown']);
    expect(workers.map((w) => w.activity)).toEqual(['idle', 'idle']);
    leave(workers[0]);
    expect(failures).toEqual([]);
  });
});
