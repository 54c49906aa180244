import { placementFor } from './in-process-executor.ts';
import { beforeAll, describe, expect, it } from 'vitest';
import { Executor, type ExecutorOptions } from '../../coordinator/executor.ts';
import { inProcess, type Remote } from '../../core/net/rpc.ts';
import { exchangeFloatsPerBlock, planUlysses, RankLayout } from '../../core/parallel.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { SeededRandom } from '../../core/random.ts';
import { initialNoise } from '../../core/sampler.ts';
import { eulerStep, flowMatchSchedule } from '../../core/schedulers/flow-match-euler-discrete-scheduler.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import type { EngineApi } from '../../rank/engine.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import type { Exchange } from '../../rank/ulysses.ts';
import {
  WORKER_CONTRACT,
  type ArgsOf,
  type InitArgs,
  type ReplyOf,
  type WorkerApi,
  type WorkerMethod,
} from '../../core/worker-api.ts';
import { WorkerRuntime } from '../../rank/runtime.ts';
import { stubEngine, tinyModelFiles, describeInProcess } from './fixtures.ts';

/**
 * CFG parallel: the conditional pass on ranks [0, P), the unconditional one on ranks [P, 2P), each
 * group its own Ulysses mesh, both passes of a step at once. The ranks are WorkerRuntimes in this
 * process; a mesh is the in-memory all-to-all of the ranks that share an initWorker session.
 */
class InProcessExecutor extends Executor {
  /** [rank, 'start' | 'end'] of every executeModel, in the order they happened */
  readonly timeline: [number, 'start' | 'end'][] = [];
  private remotes: Remote<WorkerApi>[] = [];

  constructor(
    options: ExecutorOptions,
    private readonly ranks: number,
    private readonly engine: EngineApi,
  ) {
    super(options);
  }

  protected place(): Promise<string[]> {
    const meshes = new Map<string, Exchange[]>();
    const meshOf = (init: InitArgs) => {
      let mesh = meshes.get(init.session);
      if (!mesh) {
        mesh = memoryExchanges(init.world);
        meshes.set(init.session, mesh);
      }
      return mesh;
    };
    this.remotes = Array.from({ length: this.ranks }, (_, rank) => {
      const runtime = new WorkerRuntime(this.engine, {
        connectMesh: (init) => Promise.resolve(meshOf(init)[init.rank]),
        describe: describeInProcess(`in-process rank ${rank}`),
      });
      return inProcess<WorkerApi>(runtime, WORKER_CONTRACT, `rank ${rank}`);
    });
    return Promise.resolve(this.remotes.map((_, r) => `rank-${r}`));
  }

  protected remoteOf(rank: number) {
    return this.remotes[rank];
  }

  protected override async callRank<M extends WorkerMethod>(
    rank: number,
    method: M,
    args: ArgsOf<M>,
    timeoutMs: number,
  ): Promise<ReplyOf<M>> {
    if (method === 'executeModel') this.timeline.push([rank, 'start']);
    const reply = await super.callRank(rank, method, args, timeoutMs);
    if (method === 'executeModel') this.timeline.push([rank, 'end']);
    return reply;
  }

  protected closeTransport(): void {}
}

let model: WanModel;
let engine: EngineApi;
const random = new SeededRandom(11);
let texts: Float32Array[];
const shape = [16, 1, 14, 10]; // 35 tokens: P = 2 pads one
const GUIDANCE = 5;
const STEPS = 3;

beforeAll(async () => {
  model = await loadTransformer(tinyModelFiles);
  const stages = await onnxStages(model, 'wasm');
  engine = stubEngine(stages, model.config);
  texts = [random.normals(16 * model.config.textDim), random.normals(16 * model.config.textDim)];
});

/** The sampler of the pipeline, on `executor`: the final latent and each step's rank reports. */
async function sample(ulyssesDegree: number, cfgParallel: boolean) {
  const layout = new RankLayout(ulyssesDegree, cfgParallel ? 2 : 1);
  const executor = new InProcessExecutor(
    placementFor({ config: model.config, modelUrl: '/models/tiny-wan', rpcTimeoutMs: 30_000, layout }),
    layout.world,
    engine,
  );
  await executor.initialize();
  await executor.prepareJob(1, texts, shape);
  const schedule = flowMatchSchedule(STEPS, 3);
  let latent: Tensor = initialNoise(shape, 7);
  const reports = [];
  for (let step = 0; step < STEPS; step++) {
    const { velocity, ranks } = await executor.velocity(
      { job: 1, step, timestep: schedule.timesteps[step], latent },
      GUIDANCE,
    );
    latent = { shape, data: eulerStep(latent.data, velocity, schedule.sigmas[step], schedule.sigmas[step + 1]) };
    reports.push(ranks);
  }
  await executor.shutdown({ graceMs: 1_000 });
  return { latent: latent.data, reports, executor };
}

describe('CFG parallel over in-process ranks', () => {
  let single: Awaited<ReturnType<typeof sample>>;
  beforeAll(async () => {
    single = await sample(1, false);
  });

  for (const P of [1, 2]) {
    it(`two groups of P = ${P} give the 1-worker latent within 1e-4, each rank running one pass per step, both passes at once`, async () => {
      const run = await sample(P, true);
      const diff = maxAbsDiff(run.latent, single.latent);
      console.log(`CFG parallel 2×${P}: max-abs vs 1 worker ${diff.toExponential(2)} over ${STEPS} steps`);
      expect(diff).toBeLessThanOrEqual(1e-4);
      expect(run.executor.world).toBe(2 * P);
      expect(run.executor.layout.ulyssesDegree).toBe(P);
      for (const ranks of run.reports)
        expect(ranks.map((r) => [r.rank, r.worker])).toEqual(Array.from({ length: 2 * P }, (_, r) => [r, `rank-${r}`]));
      // one executeModel per rank per step, and the unconditional group starts before the conditional one ends
      const starts = run.executor.timeline.filter(([, what]) => what === 'start').map(([rank]) => rank);
      expect(starts.sort((a, b) => a - b)).toEqual(
        Array.from({ length: 2 * P }, (_, r) => Array<number>(STEPS).fill(r)).flat(),
      );
      const firstEnd = run.executor.timeline.findIndex(([, what]) => what === 'end');
      expect(
        run.executor.timeline
          .slice(0, firstEnd)
          .map(([rank]) => rank)
          .sort((a, b) => a - b),
      ).toEqual(Array.from({ length: 2 * P }, (_, r) => r));
    });
  }

  it('a rank of a CFG-parallel group sends the bytes of one Ulysses pass per step, half of plain Ulysses at the same degree', async () => {
    const cfg = await sample(2, true);
    const plain = await sample(2, false);
    const plan = planUlysses(model.config, 35, 2); // tokens 18/17
    const perPass = [0, 1].map((r) => 4 * exchangeFloatsPerBlock(plan, r) * model.config.numLayers);
    for (const ranks of cfg.reports) expect(ranks.map((r) => r.bytesSent)).toEqual([...perPass, ...perPass]);
    for (const ranks of plain.reports) expect(ranks.map((r) => r.bytesSent)).toEqual(perPass.map((b) => 2 * b));
    expect(maxAbsDiff(cfg.latent, plain.latent)).toBeLessThanOrEqual(1e-4);
  });
});
