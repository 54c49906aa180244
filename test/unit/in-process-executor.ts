import { Executor, type ExecutorOptions } from '../../coordinator/executor.ts';
import { wan21Latent } from '../../core/model/family.ts';
import { Measurements } from '../../coordinator/measurements.ts';
import type { PlacementRequest } from '../../coordinator/placement.ts';
import { planPlacement } from '../../coordinator/planner.ts';
import { DEFAULT_JOB, jobParams } from '../../core/job.ts';
import { wanConfigOfSize, type WanConfig } from '../../core/model/config.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { RankLayout } from '../../core/parallel.ts';
import type { RankSettings } from '../../core/rank-settings.ts';
import type { Link } from '../../core/net/link.ts';
import { COORDINATOR } from '../../core/net/protocol.ts';
import { inProcess, remote, serve, type Remote } from '../../core/net/rpc.ts';
import {
  WORKER_CONTRACT,
  WORKER_METHODS,
  type ExecuteArgs,
  type ExecuteResult,
  type InitArgs,
  type WorkerApi,
  type WorkerInfo,
} from '../../core/worker-api.ts';
import type { EngineApi } from '../../rank/engine.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import type { KeepsEvidence } from '../../rank/exchange/ledger.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import { WorkerRuntime, type StagePartners } from '../../rank/runtime.ts';
import type { Exchange, PointToPoint } from '../../rank/ulysses.ts';
import {
  channelPair,
  describeInProcess,
  machineNamed,
  memoryStageLinks,
  stubEngine,
  tinyModelFiles,
} from './fixtures.ts';

// An executor over P real WorkerRuntimes in this process: the all-to-all over memory, the calls
// either in-process through the contract (as the local backend makes them) or through Links,
// remote() and serve() over an in-memory channel (as the swarm backend does), with a fault of the
// test's choosing in front of any method.
export type Transport = 'direct' | 'rpc';
/** What a rank does instead of answering normally: nothing, an error, a late answer, or an altered one. */
export type Fault =
  | { silent: true }
  | { throws: string }
  | { delayMs: number }
  // a cheat is an altered result: executeModel's or recompute's rows (recompute's reply is read as its rows alone)
  | { alters: (reply: ExecuteResult) => unknown };

/** An executor's ranks as a test writes them: the layout, and what a job asks of the rest. */
export type InProcessOptions = {
  config: WanConfig;
  modelUrl: string;
  layout: RankLayout;
  rpcTimeoutMs?: number;
} & Omit<PlacementRequest, 'ulyssesDegree' | 'cfgParallel'>;

/** The bundled tiny model, an engine on its ONNX stages (WASM), options for one rank: an in-process test's start. */
export async function onTinyModel(): Promise<{ model: WanModel; engine: EngineApi; options: InProcessOptions }> {
  const model = await loadTransformer(tinyModelFiles);
  const engine = stubEngine(await onnxStages(model, 'wasm'), model.config);
  const options = {
    config: model.config,
    modelUrl: '/models/tiny-wan',
    rpcTimeoutMs: 10_000,
    layout: new RankLayout(1),
  };
  return { model, engine, options };
}

/** The planner's placement of `layout` on stand-in workers not yet measured, as a job asking `request` gets it. */
export function placementFor({
  config,
  modelUrl,
  layout,
  rpcTimeoutMs,
  ...request
}: InProcessOptions): ExecutorOptions {
  const workers = Array.from({ length: layout.world }, (_, rank) => ({
    id: `rank-${rank}`,
    info: {
      ep: 'wasm' as const,
      adapter: 'test',
      softwareAdapter: false,
      threads: 1,
      memoryGiB: null,
      userAgent: '',
      cores: 1,
      machine: machineNamed(`rank ${rank}`),
    },
    measurement: null,
  }));
  const placement = planPlacement(
    { config, latent: wan21Latent(config.inChannels), modelUrl, backend: 'swarm', textTokens: 16, rpcTimeoutMs },
    {
      params: jobParams(DEFAULT_JOB),
      request: { ...request, ulyssesDegree: layout.ulyssesDegree, cfgParallel: layout.cfgParallel },
      workers,
      measurements: new Measurements(),
    },
  );
  // uneven head shares come from the cost model's measurements; a test gives them in its layout
  return { config, placement: { ...placement, layout } };
}

export class InProcessExecutor extends Executor {
  readonly runtimes: WorkerRuntime[] = [];
  /** the methods each rank was asked to run, in arrival order */
  readonly received: string[][] = [];
  /** each executeModel as it started and ended on its rank: its pass, and its PipeFusion patch where it had one */
  readonly forwards: { rank: number; pass: number; patch?: number; event: 'start' | 'end' }[] = [];
  closeTransportCalls = 0;
  /** what a rank does instead of answering `method` (called with `args`): nothing unless a test says */
  fault: (rank: number, method: string, args: unknown) => Fault | null = () => null;
  /** the exchange a rank computes over, as a test may rewrite it: what it sends its peers, signed as any */
  exchangeOf: (rank: number, exchange: Exchange & KeepsEvidence) => Exchange & KeepsEvidence = (_, exchange) =>
    exchange;
  /** what a rank hands on to the next pipeline stage, tensor by tensor, as a test may rewrite it (signed as any) */
  handsOn: (rank: number, part: Float32Array) => Float32Array = (_, part) => part;
  /** what a rank says it is (a tab on WASM unless a test says: a worker process, a WebGPU tab) */
  describeOf: (rank: number) => () => Promise<WorkerInfo> = (rank) => describeInProcess(`in-process rank ${rank}`);
  private remotes: Remote<WorkerApi>[] = [];
  private links: Link[] = [];

  constructor(
    options: InProcessOptions,
    private readonly engine: EngineApi,
    private readonly transport: Transport,
  ) {
    super(placementFor(options));
  }

  /** Places the ranks without initWorker, loadModel or anything else. */
  async placeOnly(): Promise<void> {
    await this.place();
    (this as unknown as { placed: boolean }).placed = true;
  }

  protected place(): Promise<string[]> {
    const ranks = this.layout.world;
    // the ranks of one mesh (a CFG group's, a pipeline stage's) share an all-to-all: one per initWorker session
    const meshes = new Map<string, (Exchange & KeepsEvidence)[]>();
    const meshOf = (init: InitArgs) => {
      const mesh = meshes.get(init.session) ?? memoryExchanges(init.world, this.placement.settings.dtype);
      meshes.set(init.session, mesh);
      return mesh;
    };
    // a pipeline stage's hand-off links in memory; what a rank hands on goes through the test's hook as it sends it,
    // signed as the rank signs anything
    const stageLinks = memoryStageLinks();
    const lying = (rank: number, partners: StagePartners): StagePartners => {
      const end = partners.after;
      if (!end) return partners;
      const after: PointToPoint & Partial<KeepsEvidence> = {
        rank: end.rank,
        dtype: end.dtype,
        get bytesSent() {
          return end.bytesSent;
        },
        send: (tag, to, part) => end.send(tag, to, this.handsOn(rank, part)),
        receive: (tag, from, judge) => end.receive(tag, from, judge),
        keepEvidence: (ledger) => end.keepEvidence?.(ledger),
      };
      return { ...partners, after };
    };
    for (let rank = 0; rank < ranks; rank++) {
      const runtime = new WorkerRuntime(this.engine, {
        connectMesh: (init) => Promise.resolve(this.exchangeOf(rank, meshOf(init)[init.rank])),
        connectStages: async (init) => lying(rank, await stageLinks(init)),
        describe: this.describeOf(rank),
      });
      this.runtimes.push(runtime);
      this.received.push([]);
      // the runtime as the worker serves it, with this test's faults in front of every method
      const faulty = Object.fromEntries(
        WORKER_METHODS.map((method) => [
          method,
          async (args: unknown) => {
            this.received[rank].push(method);
            const fault = this.fault(rank, method, args);
            if (fault && 'silent' in fault) return new Promise(() => {});
            if (fault && 'throws' in fault) throw new Error(fault.throws);
            const pass = method === 'executeModel' ? (args as ExecuteArgs).pass : null;
            const patch = method === 'executeModel' ? (args as ExecuteArgs).patch?.index : undefined;
            const forward = { rank, pass, ...(patch !== undefined && { patch }) };
            if (pass !== null) this.forwards.push({ ...forward, pass, event: 'start' });
            if (fault && 'delayMs' in fault) await new Promise((r) => setTimeout(r, fault.delayMs));
            const reply = await (runtime[method] as (a: unknown) => Promise<unknown>).call(runtime, args);
            if (pass !== null) this.forwards.push({ ...forward, pass, event: 'end' });
            if (!fault || !('alters' in fault)) return reply;
            if (method !== 'executeModel' && method !== 'recompute')
              throw new Error(`a test alters executeModel's or recompute's reply (their rows), not ${method}'s`);
            return fault.alters(reply as ExecuteResult);
          },
        ]),
      ) as unknown as WorkerApi;
      if (this.transport === 'direct') {
        this.remotes.push(inProcess(faulty, WORKER_CONTRACT, `rank ${rank}`));
      } else {
        const [coordinatorSide, workerSide] = channelPair();
        serve(workerSide, rank, WORKER_CONTRACT, faulty);
        this.links.push(coordinatorSide, workerSide);
        this.remotes.push(remote(coordinatorSide, COORDINATOR, WORKER_CONTRACT, `rank ${rank}`));
      }
    }
    return Promise.resolve(Array.from({ length: ranks }, (_, r) => `rank-${r}`));
  }

  protected remoteOf(rank: number) {
    return this.remotes[rank];
  }

  protected closeTransport(): void {
    this.closeTransportCalls++;
    for (const link of this.links) link.close('the executor shut down');
  }
}

/** What the planner tells the ranks of a job that asks nothing of it: exact float32 Ulysses. */
export const EXACT_SETTINGS: RankSettings = planPlacement(
  {
    config: wanConfigOfSize({ headDim: 24, textDim: 32, ffnDim: 64, numLayers: 1 }, 'a stand-in'),
    latent: wan21Latent(16),
    modelUrl: '',
    backend: 'local',
    textTokens: 1,
  },
  { params: jobParams(DEFAULT_JOB), request: {}, workers: [], measurements: new Measurements() },
).settings;
