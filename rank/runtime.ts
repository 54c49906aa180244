import type { WanConfig } from '../core/model/config.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { planUlysses, type UlyssesPlan } from '../core/parallel.ts';
import { BYTES_PER_ELEMENT, type DType } from '../core/net/protocol.ts';
import type { EngineApi, EngineInfo } from './engine.ts';
import type { ExecutionProvider } from './onnx-stages.ts';
import { probeMesh, PROBE_FLOATS } from './mesh-probe.ts';
import { ExchangePhase, forwardRank, noStats, type Exchange, type RankStats } from './ulysses.ts';

/**
 * A worker as the coordinator sees it: a fixed set of named methods, and nothing else. The same
 * runtime serves the `local` backend (called directly in the dashboard) and the `swarm` backend
 * (called over a data channel by the worker page); only the mesh differs.
 */
export const WORKER_METHODS = ['describe', 'probe', 'initWorker', 'loadModel', 'prepareJob', 'probeMesh', 'executeModel', 'ping', 'shutdown'] as const;
export type WorkerMethod = (typeof WORKER_METHODS)[number];

export interface WorkerInfo {
  ep: ExecutionProvider;
  adapter: string;
  threads: number;
  memoryGiB: number | null;
  userAgent: string;
}

export interface InitArgs {
  rank: number;
  world: number;
  /** peer ids of all ranks in rank order (the swarm mesh dials them) */
  peers: string[];
  session: string;
  /** how activations travel between ranks; float32 unless the coordinator asks for float16 */
  dtype?: DType;
}

export interface ExecuteArgs {
  job: number;
  step: number;
  pass: number;
  timestep: number;
  latentShape: number[];
  patches: Float32Array; // this rank's [Sl, C·pt·ph·pw]
}

export interface ExecuteResult extends RankStats {
  rows: Float32Array; // this rank's [Sl, pt·ph·pw·C]
  bytesSent: number;
}

export type WorkerState = 'idle' | 'initialized' | 'loading' | 'ready' | 'computing';

export interface RuntimeHooks {
  /** Builds this rank's side of the all-to-all for a job's ranks. */
  connectMesh(init: InitArgs): Promise<Exchange>;
  describe(): Promise<WorkerInfo>;
  onState?(state: WorkerState, detail: string): void;
  onShutdown?(): void;
}

export class WorkerRuntime {
  state: WorkerState = 'idle';
  private init: InitArgs | null = null;
  private exchange: Exchange | null = null;
  private model: EngineInfo | null = null;
  private texts: Float32Array[] = [];
  private plan: UlyssesPlan | null = null;
  private job = -1;
  /** over all forward passes, except deviceTensorsLeft: after the last one */
  readonly totals = { steps: 0, bytesSent: 0, computeMs: 0, bytesDownloaded: 0, bytesKept: 0, deviceTensorsLeft: 0 };

  constructor(
    private readonly engine: EngineApi,
    private readonly hooks: RuntimeHooks,
  ) {}

  /** the EP the loaded model runs on, once loaded */
  get ep(): ExecutionProvider | null {
    return this.model?.ep ?? null;
  }

  /** The only way in: unknown methods and methods called out of order fail with a clear error. */
  async dispatch(method: string, args: unknown): Promise<unknown> {
    if (!(WORKER_METHODS as readonly string[]).includes(method)) {
      throw new Error(`unknown worker method "${method}"; a worker runs only: ${WORKER_METHODS.join(', ')}`);
    }
    const needsInit: WorkerMethod[] = ['loadModel', 'prepareJob', 'probeMesh', 'executeModel'];
    if (needsInit.includes(method as WorkerMethod) && !this.init) {
      throw new Error(`worker method ${method} called before initWorker: the coordinator must call initWorker first`);
    }
    const a = (args ?? {}) as Record<string, unknown>;
    switch (method as WorkerMethod) {
      case 'describe':
        return this.hooks.describe();
      case 'initWorker':
        return this.initWorker(a as unknown as InitArgs);
      case 'loadModel':
        return this.loadModel(String(a.modelUrl), (a.ep ?? 'auto') as ExecutionProvider | 'auto');
      case 'prepareJob':
        return this.prepareJob(Number(a.job), a.texts as Float32Array[], a.latentShape as number[]);
      case 'executeModel':
        return this.executeModel(a as unknown as ExecuteArgs);
      case 'probeMesh':
        if (Number(a.job) !== this.job || !this.plan) throw new Error(`probeMesh for job ${a.job} but job ${this.job} was prepared`);
        return probeMesh(this.exchange!, this.job);
      case 'probe':
        // with a payload it measures the link (only its size comes back), without one the compute
        if (a.payload instanceof Float32Array) return { bytes: a.payload.byteLength };
        if (a.ep !== undefined && a.ep !== 'wasm' && a.ep !== 'webgpu') throw new Error(`probe ep must be wasm or webgpu, got ${JSON.stringify(a.ep)}`);
        return this.engine.probe(a.ep as ExecutionProvider | undefined);
      case 'ping':
        return { state: this.state, rank: this.init?.rank ?? null, totals: this.totals };
      case 'shutdown':
        // a browser worker outlives its executor: release the job's ranks and wait for the next initWorker
        this.init = null;
        this.exchange = null;
        this.texts = [];
        this.plan = null;
        this.setState('idle', 'released by the coordinator');
        queueMicrotask(() => this.hooks.onShutdown?.());
        return 'bye';
    }
  }

  private setState(state: WorkerState, detail: string): void {
    this.state = state;
    this.hooks.onState?.(state, detail);
  }

  private async initWorker(init: InitArgs) {
    const { rank, world, peers } = init;
    if (!Number.isInteger(world) || world < 1 || !Number.isInteger(rank) || rank < 0 || rank >= world) {
      throw new Error(`initWorker needs 0 ≤ rank < world, got rank ${rank} of ${world}`);
    }
    if (!Array.isArray(peers) || peers.length !== world) throw new Error(`initWorker needs ${world} peer ids, got ${peers?.length}`);
    if (init.dtype !== undefined && init.dtype !== 'f32' && init.dtype !== 'f16') throw new Error(`initWorker dtype must be f32 or f16, got ${JSON.stringify(init.dtype)}`);
    this.init = init;
    this.exchange = await this.hooks.connectMesh(init);
    this.setState('initialized', `rank ${rank} of ${world}`);
    return { rank, world };
  }

  private async loadModel(modelUrl: string, ep: ExecutionProvider | 'auto') {
    this.setState('loading', `loading ${modelUrl}`);
    this.model = await this.engine.load(modelUrl, ep);
    this.setState('ready', `model loaded on ${this.model.ep} in ${this.model.loadMs.toFixed(0)} ms`);
    return { ep: this.model.ep, adapter: this.model.adapter, loadMs: this.model.loadMs };
  }

  private prepareJob(job: number, texts: Float32Array[], latentShape: number[]) {
    const cfg = this.needModel();
    if (!Array.isArray(texts) || !texts.length || texts.length > 2 || !texts.every((t) => t instanceof Float32Array && t.length % cfg.textDim === 0)) {
      throw new Error(`prepareJob needs one or two text embeddings of width ${cfg.textDim}`);
    }
    if (!Array.isArray(latentShape) || latentShape.length !== 4 || latentShape[0] !== cfg.inChannels) {
      throw new Error(`prepareJob needs a latent shape [${cfg.inChannels}, T, H, W], got ${JSON.stringify(latentShape)}`);
    }
    this.plan = planUlysses(cfg, tokenGrid(cfg, latentShape).count, this.exchange!.world);
    this.job = job;
    this.texts = texts;
    return { job };
  }

  /**
   * Judges a tensor a peer rank is about to send, from its header alone, before any byte of it is
   * buffered: it must belong to the prepared job and have exactly the size the plan gives its
   * phase. Returns why it is refused, or null.
   */
  judgeTensor(tag: { job: number; step: number; pass: number; block: number; phase: number }, totalBytes: number): string | null {
    const plan = this.plan;
    const cfg = this.model?.config;
    if (!plan || !cfg) return 'no job is prepared on this rank';
    if (tag.job !== this.job) return `tensor for job ${tag.job}, but job ${this.job} is running`;
    if (tag.pass >= this.texts.length) return `tensor for pass ${tag.pass}, but the job has ${this.texts.length}`;
    if (tag.block >= cfg.numLayers) return `tensor for block ${tag.block} of ${cfg.numLayers}`;
    if (tag.step >= 1000) return `tensor for step ${tag.step}`;
    const floats = tag.phase === ExchangePhase.Probe ? PROBE_FLOATS[tag.step] : [3 * plan.localTokens * plan.headWidth, plan.localTokens * plan.headWidth][tag.phase];
    if (floats === undefined) return `unknown exchange phase ${tag.phase}${tag.phase === ExchangePhase.Probe ? ` step ${tag.step}` : ''}`;
    const bytes = floats * BYTES_PER_ELEMENT[this.exchange!.dtype];
    if (totalBytes !== bytes) return `phase ${tag.phase} tensor of ${totalBytes} bytes; the plan says ${bytes}`;
    return null;
  }

  private async executeModel(args: ExecuteArgs): Promise<ExecuteResult> {
    const cfg = this.needModel();
    const exchange = this.exchange!;
    if (args.job !== this.job) throw new Error(`executeModel for job ${args.job} but job ${this.job} was prepared`);
    const text = this.texts[args.pass];
    if (!text) throw new Error(`no text embedding for pass ${args.pass}`);
    const grid = tokenGrid(cfg, args.latentShape);
    const plan = planUlysses(cfg, grid.count, exchange.world);
    if (this.plan && plan.tokens !== this.plan.tokens) throw new Error(`executeModel with ${plan.tokens} tokens but the job was prepared for ${this.plan.tokens}`);
    const patchWidth = cfg.inChannels * cfg.patchSize.reduce((x, y) => x * y, 1);
    if (!(args.patches instanceof Float32Array) || args.patches.length !== plan.localTokens * patchWidth) {
      throw new Error(`executeModel expected ${plan.localTokens}×${patchWidth} patch values for rank ${exchange.rank}, got ${args.patches?.length}`);
    }
    this.setState('computing', `job ${args.job} step ${args.step} pass ${args.pass}`);
    const stats = noStats();
    const sentBefore = exchange.bytesSent;
    const rows = await forwardRank(cfg, plan, this.engine, exchange, {
      patches: args.patches,
      timestep: args.timestep,
      text,
      grid,
      tag: { job: args.job, step: args.step, pass: args.pass },
    }, stats);
    const bytesSent = exchange.bytesSent - sentBefore;
    this.totals.steps++;
    this.totals.bytesSent += bytesSent;
    this.totals.computeMs += stats.computeMs;
    this.totals.bytesDownloaded += stats.bytesDownloaded;
    this.totals.bytesKept += stats.bytesKept;
    this.totals.deviceTensorsLeft = stats.deviceTensorsLeft;
    this.setState('ready', `finished step ${args.step}`);
    return { rows, ...stats, bytesSent };
  }

  private needModel(): WanConfig {
    if (!this.model) throw new Error('no model loaded: the coordinator must call loadModel after initWorker');
    return this.model.config;
  }
}
