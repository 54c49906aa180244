// A worker as the coordinator sees it: the WorkerApi (core/worker-api.ts) and nothing else. The same
// runtime serves the `local` backend (called in the dashboard's page) and the `swarm` backend (served
// over a data channel by the worker page); only the mesh differs. Arguments reach it already checked
// against the contract; what the contract cannot know (rank < world, the model's widths, the order of
// calls) is judged here, and each refusal says what was expected.
import { defined } from '../core/defined.ts';
import type { LoraRef } from '../core/model/lora.ts';
import {
  allBlocks,
  hiddenStateError,
  hiddenStateFloats,
  holdsEmbedders,
  type BlockRange,
  type HiddenState,
} from '../core/model/blocks.ts';
import type { WanConfig } from '../core/model/config.ts';
import { describeLoad, describeWeights, type WeightType } from '../core/worker-api.ts';
import { cpuName, fastestEp } from '../core/cost-model.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { timestepError, timestepLevelCount } from '../core/model/timesteps.ts';
import { WAN_TEXT_TOKENS } from '../core/model/wan-pipeline.ts';
import { partFloats, planUlysses, tokenStart, type UlyssesPlan } from '../core/parallel.ts';
import { payloadBytes, type TensorTag } from '../core/net/protocol.ts';
import type {
  ComputeProbe,
  DecodeTileArgs,
  EncodeImageArgs,
  EncodeTextArgs,
  ExecuteArgs,
  ExecuteResult,
  ExecutionProvider,
  ForwardKey,
  InitArgs,
  HandOffKey,
  KeptForward,
  LoadArgs,
  LoadStatus,
  PatchOf,
  PrepareArgs,
  RankStats,
  RecomputeArgs,
  Recomputed,
  RecomputeExchangesArgs,
  RehearseArgs,
  WorkerApi,
  WorkerInfo,
  WorkerState,
  WorkerTotals,
} from '../core/worker-api.ts';
import type { EngineApi, EngineInfo } from './engine.ts';
import { probeMesh, PROBE_FLOATS } from './mesh-probe.ts';
import { rehearseForwards, warmsFully, warmUpEngine } from './rehearsal.ts';
import {
  exchangePhase,
  ExchangePhase,
  forwardStage,
  noStats,
  placeOnly,
  type BlockAttention,
  type Exchange,
  type StageOutput,
  type ForwardInput,
  type PointToPoint,
} from './ulysses.ts';
import { displacedAttention, heldStaleAttention, KeysValuesHistory } from './displaced.ts';
import { PatchKeysValues, pipeFusionAttention } from './pipefusion.ts';
import { concat } from '../core/tensor.ts';
import { memoryExchanges } from './exchange/memory.ts';
import { ExchangeLedger, type KeepsEvidence } from './exchange/ledger.ts';
import { MAX_AHEAD } from './exchange/mesh.ts';
import {
  handOffChunks,
  handOffDType,
  handOn,
  MAX_PATCH_HAND_OFFS,
  partnerBlamed,
  ReceivedHandOffs,
  RECEIVER,
  SENDER,
  takeHandOff,
  type HandOffOf,
  type MeshKind,
} from './hand-off.ts';

export interface RuntimeHooks {
  /** Builds this rank's side of the all-to-all for a job's ranks. */
  /** the mesh's exchange; one that keeps evidence is given this rank's ledger (exchange/ledger.ts) */
  connectMesh(init: InitArgs): Promise<Exchange & Partial<KeepsEvidence>>;
  /**
   * Links this rank to its hand-off partners in the pipeline stages before and after (init.stageLinks): each a mesh of
   * two over which the hidden state crosses one way (hand-off.ts); a runtime without it cannot be a staged job's rank.
   */
  connectStages?(init: InitArgs): Promise<StagePartners>;
  /** what this worker is; its `threads` are those it computes on from its next job */
  describe(): Promise<WorkerInfo>;
  /**
   * Called before a probe, a model load or a job's preparation, when no job is computing: where
   * the page takes up a new share of its machine's cores (a new engine on those threads).
   */
  betweenJobs?(): Promise<void>;
  /** the most memory the page was measured to hold so far, null where it cannot be measured */
  peakMemoryBytes?(): number | null;
  /**
   * Where this page reads a model folder (or adapter file) its coordinator names: its own server's copy of what that
   * server serves, whichever name the coordinator's page knows it by. Throws, saying why, for what it may not read: a
   * page fetches what its coordinator names, so it reads only where its own server says (worker/model-origin.ts).
   */
  modelSource?(modelUrl: string): string;
  onState?(state: WorkerState, detail: string): void;
  onShutdown?(): void;
}

/** A whole forward's rows: the model's every block ran on this rank, so the output head did too. */
function rowsOf(output: StageOutput): Float32Array {
  if (!('rows' in output)) throw new Error('a whole forward ends at the output head');
  return output.rows;
}

/** `exchange` as one forward uses it: its own payload bytes counted apart from any other forward's on the same mesh. */
function countingSends(exchange: Exchange): Exchange {
  let bytesSent = 0;
  return {
    rank: exchange.rank,
    world: exchange.world,
    dtype: exchange.dtype,
    get bytesSent() {
      return bytesSent;
    },
    allToAll: (tag, parts, judge) => {
      bytesSent += parts.reduce(
        (n, part, to) => n + (to === exchange.rank ? 0 : payloadBytes(part.length, exchange.dtype)),
        0,
      );
      return exchange.allToAll(tag, parts, judge);
    },
  };
}

/** A rank's hand-off links, as connectStages makes them: each a point-to-point exchange that may keep evidence. */
export interface StagePartners {
  before?: PointToPoint & Partial<KeepsEvidence>;
  after?: PointToPoint & Partial<KeepsEvidence>;
}

export class WorkerRuntime implements WorkerApi {
  state: WorkerState = 'idle';
  private detail = '';
  private init: InitArgs | null = null;
  private exchange: Exchange | null = null;
  /** receipts of what this rank's peers sent it in its recent forwards, signed (exchange/ledger.ts) */
  private ledger: ExchangeLedger | null = null;
  /** a pipeline stage's links to its partners in the stages before and after (hand-off.ts) */
  private partners: StagePartners = {};
  /** receipts of the hand-offs this rank received, signed by their sender, with what they carried */
  private readonly handOffs = new ReceivedHandOffs();
  private model: EngineInfo | null = null;
  private modelUrl: string | null = null;
  /** the pipeline stage's blocks the loaded model holds, as loadModel was asked (all where absent) */
  private blocks: BlockRange | undefined = undefined;
  /** the adapters merged into the loaded model, as loadModel was asked */
  private loras: readonly LoraRef[] = [];
  /** how the loaded model's blocks' weights are held, as loadModel was asked (the EP's way where absent) */
  private weightType: WeightType | undefined = undefined;
  private texts: Float32Array[] = [];
  private plan: UlyssesPlan | null = null;
  private job = -1;
  /** displaced mode: the keys and values gathered in the prepared job's last step, per pass and block */
  private readonly keysValues = new KeysValuesHistory();
  /** PipeFusion's keys and values of every token, this rank's blocks (pipefusion.ts) */
  private readonly patchKeysValues = new PatchKeysValues();
  /** a step cache's residual [Sl, D] of each pass's last kept forward of the prepared job */
  private readonly residuals = new Map<number, Float32Array>();
  /** forwards under way: a guided step's two passes run at once */
  private forwardsRunning = 0;
  /**
   * What each EP measured on the threads it had (the coordinator's probes fill it; loadModel measures
   * what is missing). Kept as promises: a load that needs a probe the coordinator's is still taking
   * waits for that one instead of taking a second (on a software WebGPU adapter, seconds).
   */
  private probes: { threads: number; measured: Partial<Record<ExecutionProvider, Promise<ComputeProbe>>> } = {
    threads: 0,
    measured: {},
  };
  /** the EP and threads of the engine a rehearsal last warmed up (rank/rehearsal.ts) */
  private warmEngine: string | null = null;
  /**
   * The preload under way: a placement that comes meanwhile waits for it rather than loading and warming up beside
   * it (two warm-ups sharing the engine's turns take as long as both, and the second finds the engine warm anyway)
   */
  private preloading: Promise<unknown> = Promise.resolve();
  private epWhy = '';
  /** how far the model load under way is (for the pulse), null when none is */
  loadStatus: LoadStatus | null = null;
  /**
   * The loads under way (a preload may start while a rehearsal loads) and the state the first of them found: the last
   * to end puts it back, so that whichever ends first, the page is not left saying it loads.
   */
  private loads = { running: 0, before: { state: 'idle' as WorkerState, detail: '' } };
  readonly totals: WorkerTotals = {
    steps: 0,
    bytesSent: 0,
    computeMs: 0,
    bytesDownloaded: 0,
    bytesKept: 0,
    deviceTensorsLeft: 0,
  };

  constructor(
    private readonly engine: EngineApi,
    private readonly hooks: RuntimeHooks,
  ) {}

  /** the EP the loaded model runs on, once loaded */
  get ep(): ExecutionProvider | null {
    return this.model?.ep ?? null;
  }

  describe() {
    return this.hooks.describe();
  }

  async probeCompute({ ep }: { ep: ExecutionProvider }) {
    await this.hooks.betweenJobs?.();
    return this.probe(await this.measuredNow(), ep);
  }

  /** A new probe of `ep`, kept for loads to come unless it fails (then the next one tries again). */
  private probe(
    measured: Partial<Record<ExecutionProvider, Promise<ComputeProbe>>>,
    ep: ExecutionProvider,
  ): Promise<ComputeProbe> {
    const probe = this.engine.probe(ep);
    measured[ep] = probe;
    probe.catch(() => {
      if (measured[ep] === probe) measured[ep] = undefined;
    });
    return probe;
  }

  /** The probes taken on this worker's current threads (a new share of the cores makes the old ones stale). */
  private async measuredNow() {
    const { threads } = await this.hooks.describe();
    if (this.probes.threads !== threads) this.probes = { threads, measured: {} };
    return this.probes.measured;
  }

  probeLink({ payload }: { payload: Float32Array }) {
    return Promise.resolve({ bytes: payload.byteLength });
  }

  ping() {
    return Promise.resolve({ state: this.state, rank: this.init?.rank ?? null, totals: { ...this.totals } });
  }

  async pingEngine() {
    const started = performance.now();
    await this.engine.alive();
    return { waitedMs: performance.now() - started };
  }

  shutdown() {
    // a browser worker outlives its executor: release the job's ranks and wait for the next initWorker
    this.init = null;
    this.exchange = null;
    this.ledger = null;
    this.partners = {};
    this.handOffs.clear();
    this.texts = [];
    this.plan = null;
    this.forgetKeysValues();
    this.residuals.clear();
    this.setState('idle', 'released by the coordinator');
    queueMicrotask(() => this.hooks.onShutdown?.());
    return Promise.resolve('bye' as const);
  }

  async initWorker(init: InitArgs) {
    const { rank, world, peers } = init;
    if (rank >= world) throw new Error(`initWorker needs 0 ≤ rank < world, got rank ${rank} of ${world}`);
    if (peers.length !== world) throw new Error(`initWorker needs ${world} peer ids, got ${peers.length}`);
    if (init.heads && init.heads.length !== world)
      throw new Error(`initWorker needs a head share for each of ${world} ranks, got ${init.heads.length}`);
    this.init = init;
    this.forgetKeysValues();
    const exchange = await this.hooks.connectMesh(init);
    this.ledger = new ExchangeLedger(rank, init.signing);
    exchange.keepEvidence?.(this.ledger);
    this.exchange = exchange;
    this.partners = await this.connectStages(init);
    this.setState('initialized', `rank ${rank} of ${world}`);
    return { rank, world };
  }

  /** This rank's hand-off links, where its placement is staged: each signs what it sends and keeps receipts. */
  private async connectStages(init: InitArgs): Promise<StagePartners> {
    this.handOffs.clear();
    const { before, after } = init.stageLinks ?? {};
    if (!before && !after) return {};
    if (!this.hooks.connectStages)
      throw new Error('this worker cannot link to the ranks of other pipeline stages: run the job unstaged here');
    const partners = await this.hooks.connectStages(init);
    if (before) partners.before?.keepEvidence?.(this.handOffs.ledger(new ExchangeLedger(RECEIVER, before.signing)));
    if (after) partners.after?.keepEvidence?.(new ExchangeLedger(SENDER, after.signing));
    if (!partners.before !== !before || !partners.after !== !after)
      throw new Error('connectStages linked other stages than initWorker named');
    return partners;
  }

  async loadModel(args: LoadArgs) {
    this.needInit('loadModel');
    this.sourceOf(args.modelUrl);
    await this.preloading;
    this.setState('loading', `loading ${args.modelUrl}`);
    const { info, why } = await this.load(args);
    this.model = info;
    this.modelUrl = args.modelUrl;
    this.blocks = args.blocks;
    this.loras = args.loras ?? [];
    this.weightType = args.weightType;
    this.epWhy = why;
    this.setState(
      'ready',
      `model loaded on ${info.ep} in ${info.loadMs.toFixed(0)} ms (${why}); ${describeWeights(info.weights)}`,
    );
    // the config and the bounds stay here; the rest is the reply
    const { config, bounds, ...loaded } = info;
    return { ...loaded, why };
  }

  /** The model on the EP asked for, or with 'auto' the fastest one; the engine keeps the last one it loaded. */
  private async load({
    modelUrl,
    ep,
    blocks,
    loras,
    weightType,
  }: LoadArgs): Promise<{ info: EngineInfo; why: string }> {
    // an adapter is fetched as the model is: from where this page lets models come, and nowhere else
    for (const url of [modelUrl, ...(loras ?? []).map((lora) => lora.url)]) this.sourceOf(url);
    await this.hooks.betweenJobs?.();
    const choice =
      ep === 'auto'
        ? await this.fastestEp()
        : { ep, why: `${ep === 'wasm' ? await this.cpuName() : 'WebGPU'}: asked for by the job` };
    if (this.loads.running++ === 0) this.loads.before = { state: this.state, detail: this.detail };
    const progress = this.showLoad('loading', `loading ${modelUrl}`);
    try {
      // none and an empty list are the same adapters: the engine, which keeps its last model by what was asked, too
      const held = { blocks, loras: loras ?? [], weightType };
      return { info: await this.loadEngine(modelUrl, choice.ep, progress, held), why: choice.why };
    } finally {
      const { before } = this.loads;
      if (--this.loads.running === 0) {
        this.loadStatus = null;
        if (this.state === 'loading' && before.state !== 'loading') this.setState(before.state, before.detail);
      }
    }
  }

  /**
   * A load's progress as the page (and through the pulse's `load`, the dashboard) shows it, a per cent at a time:
   * a real model's weights are GBs. The caller clears `loadStatus` when the load ends.
   */
  private showLoad(state: WorkerState, what: string): (status: LoadStatus) => void {
    let shown = -1;
    return (status) => {
      this.loadStatus = status;
      const percent = Math.floor((100 * status.bytes) / status.totalBytes);
      if (percent === shown) return;
      shown = percent;
      this.setState(state, `${what}: ${describeLoad(status)}`);
    };
  }

  preload(args: { modelUrl: string }) {
    if (this.state === 'computing')
      return Promise.reject(new Error('preload while a job is computing on this worker: between jobs'));
    const preload = this.preloading.then(() => this.loadAndWarmUp(args));
    this.preloading = preload.catch(() => {});
    return preload;
  }

  private async loadAndWarmUp({ modelUrl }: { modelUrl: string }) {
    // the engine keeps the last model it loaded: a placement asking the same one finds it there
    const { info } = await this.load({ modelUrl, ep: 'auto' });
    // the first job's rehearsal would warm a cold engine up: done now, while no job waits for it
    const engine = await this.engineName(info);
    if (this.coldEngine(engine, 'for the first job')) {
      await warmUpEngine(info.config, this.engine, WAN_TEXT_TOKENS);
      this.warmEngine = engine;
    }
    // the page says the model is in, and whence: its person (and a benchmark) sees the load ended
    this.setState(
      this.state,
      `model preloaded on ${info.ep} in ${info.loadMs.toFixed(0)} ms; ${describeWeights(info.weights)}`,
    );
    return { ep: info.ep, loadMs: info.loadMs };
  }

  async rehearse({ modelUrl, ep, latentShape, textTokens, degrees, forwards, loras = [], weightType }: RehearseArgs) {
    if (this.state === 'computing')
      throw new Error('rehearse while a job is computing on this worker: rehearse between jobs');
    await this.preloading; // settles on a failed preload too: the placement's own load says why
    const { info } = await this.load({ modelUrl, ep, loras, weightType });
    const engine = await this.engineName(info);
    const before = { state: this.state, detail: this.detail };
    const cold = this.coldEngine(engine, "before timing the job's forwards");
    try {
      const warmUpFor = cold ? { forwards } : null;
      const forwardMs = await rehearseForwards(info.config, this.engine, latentShape, textTokens, degrees, warmUpFor);
      // warmed up for a short job only, it is warmed up again for the next job's rehearsal
      if (!cold || warmsFully(forwards)) this.warmEngine = engine;
      return { forwardMs };
    } finally {
      // the engine holds one model: the one this rank's placement loaded (its stage's blocks, its adapters) comes back
      const differs =
        this.modelUrl !== modelUrl ||
        this.model?.ep !== info.ep ||
        this.blocks ||
        this.weightType !== weightType ||
        JSON.stringify(this.loras) !== JSON.stringify(loras);
      if (this.model && this.modelUrl && differs) {
        const held = { blocks: this.blocks, loras: this.loras, weightType: this.weightType };
        await this.loadEngine(this.modelUrl, this.model.ep, undefined, held);
      }
      if (cold) this.setState(before.state, before.detail);
    }
  }

  /**
   * The engine computing `info`'s model: a new one (a new share of the cores starts one) is cold until it has
   * computed a while.
   */
  private async engineName(info: EngineInfo): Promise<string> {
    const { threads } = await this.hooks.describe();
    return `${info.ep} on ${threads} thread${threads === 1 ? '' : 's'}`;
  }

  /** Whether `engine` is still cold (rank/rehearsal.ts), said on the page where it is: it warms up `when`. */
  private coldEngine(engine: string, when: string): boolean {
    if (this.warmEngine === engine) return false;
    this.setState(this.state, `warming up its engine (${engine}) ${when}`);
    return true;
  }

  /** why the loaded model runs on its EP, once loaded */
  get epReason(): string {
    return this.epWhy;
  }

  /** what this worker's 'wasm' EP is, in words: WASM in a tab, a process's native device */
  private async cpuName(): Promise<string> {
    return cpuName((await this.hooks.describe()).nativeDevice);
  }

  /** 'auto': the EP this worker measured fastest; WebGPU is measured only where there is a hardware adapter. */
  private async fastestEp() {
    const measured = await this.measuredNow();
    const { ep, softwareAdapter, nativeDevice } = await this.hooks.describe();
    const wasm = measured.wasm ?? this.probe(measured, 'wasm');
    const webgpu =
      ep === 'webgpu' && !softwareAdapter ? (measured.webgpu ?? this.probe(measured, 'webgpu')) : undefined;
    return fastestEp({ wasm: await wasm, webgpu: await webgpu }, softwareAdapter, nativeDevice);
  }

  encodeText(args: EncodeTextArgs) {
    const detail = `encoding a prompt: text encoder layers ${args.from + 1}–${args.to}`;
    return this.betweenJobs('encodeText', detail, args, (ep) =>
      // umT5-XXL's layers are 0.77 GB each: their reading is a load, shown as one
      this.engine.encodeText(
        { ...args, modelUrl: this.sourceOf(args.modelUrl), ep },
        this.showLoad('computing', `${detail}, reading their weights`),
      ),
    );
  }

  decodeTile(args: DecodeTileArgs) {
    const frames = args.shape[1];
    const detail = `decoding the video: tile ${args.tile}, latent frames ${args.from + 1}–${args.from + frames}`;
    return this.betweenJobs('decodeTile', detail, args, (ep) =>
      this.engine.decodeTile(
        { ...args, modelUrl: this.sourceOf(args.modelUrl), ep },
        this.showLoad('computing', `${detail}, reading the decoder's weights`),
      ),
    );
  }

  encodeImage(args: EncodeImageArgs) {
    const [, , height, width] = args.shape;
    const detail = `encoding the job's image (${width}×${height})`;
    return this.betweenJobs('encodeImage', detail, args, (ep) =>
      this.engine.encodeImage(
        { ...args, modelUrl: this.sourceOf(args.modelUrl), ep },
        this.showLoad('computing', `${detail}, reading the encoder's weights`),
      ),
    );
  }

  /** where this page reads `url` (a model folder or adapter its coordinator named); throws where it may not */
  private sourceOf(url: string): string {
    return this.hooks.modelSource?.(url) ?? url;
  }

  /** The engine loads what the coordinator named, read where this page reads it; the names stay the coordinator's. */
  private loadEngine(...[modelUrl, ep, progress, held = {}]: Parameters<EngineApi['load']>) {
    const loras = held.loras?.map((lora) => ({ ...lora, url: this.sourceOf(lora.url) }));
    return this.engine.load(this.sourceOf(modelUrl), ep, progress, { ...held, loras });
  }

  /** Work a coordinator asks for between jobs (the text encoder, the VAE), on the EP it names or the fastest. */
  private async betweenJobs<T>(
    method: string,
    detail: string,
    { modelUrl, ep: asked }: { modelUrl: string; ep: ExecutionProvider | 'auto' },
    work: (ep: ExecutionProvider) => Promise<T>,
  ): Promise<T> {
    if (this.state === 'computing') throw new Error(`${method} while this worker is computing: call it between jobs`);
    this.sourceOf(modelUrl);
    // taken at once, before any await: a second call arriving meanwhile is refused, not interleaved
    const before = { state: this.state, detail: this.detail };
    this.setState('computing', detail);
    try {
      await this.hooks.betweenJobs?.();
      return await work(asked === 'auto' ? (await this.fastestEp()).ep : asked);
    } finally {
      this.loadStatus = null;
      this.setState(before.state, before.detail);
    }
  }

  async prepareJob({ job, texts, latentShape, exchangeTimeoutMs }: PrepareArgs) {
    const exchange = this.needInit('prepareJob');
    const cfg = this.needModel();
    if (!texts.every((t) => t.length > 0 && t.length % cfg.textDim === 0)) {
      throw new Error(
        `prepareJob needs one or two text embeddings of width ${cfg.textDim}, ` +
          `got ${texts.map((t) => t.length).join(' and ')} values`,
      );
    }
    if (latentShape[0] !== cfg.inChannels)
      throw new Error(
        `prepareJob needs a latent shape [${cfg.inChannels}, T, H, W], got ${JSON.stringify(latentShape)}`,
      );
    await this.hooks.betweenJobs?.();
    const { heads, headGroups, parallel } = defined(this.init, "initWorker's settings");
    this.plan = planUlysses(cfg, tokenGrid(cfg, latentShape).count, heads ?? exchange.world, headGroups);
    this.job = job;
    this.texts = texts;
    this.forgetKeysValues();
    this.residuals.clear();
    if (exchangeTimeoutMs !== undefined) exchange.waitAtMost?.(exchangeTimeoutMs);
    // a guided step's two passes run at once, each a phase or two ahead (a phase: one tensor per
    // head group); displaced ranks meet once a forward, not once a block: a peer may send all its
    // blocks' keys and values ahead
    const perPass = parallel === 'displaced' ? cfg.numLayers + 1 : MAX_AHEAD * this.plan.headGroups;
    exchange.allowAhead?.(texts.length * perPass);
    for (const link of [this.partners.before, this.partners.after]) {
      if (exchangeTimeoutMs !== undefined) link?.waitAtMost?.(exchangeTimeoutMs);
      // the stage before may hand on both passes' hidden states before this rank asks: a PipeFusion patch's each
      link?.allowAhead?.(texts.length * this.handOffTensors(cfg, texts[0].length / cfg.textDim));
    }
    return { job };
  }

  async probeMesh({ job }: { job: number }) {
    const exchange = this.needInit('probeMesh');
    if (job !== this.job || !this.plan) throw new Error(`probeMesh for job ${job} but job ${this.job} was prepared`);
    return probeMesh(exchange, this.job);
  }

  /**
   * Judges a tensor a peer rank is about to send, from its header alone, before any byte of it is
   * buffered: it must belong to the prepared job and have exactly the size the plan gives its
   * phase. Returns why it is refused, or null.
   */
  judgeTensor(from: number, tag: TensorTag, totalBytes: number, link: MeshKind = 'mesh'): string | null {
    const plan = this.plan;
    const cfg = this.model?.config;
    if (!plan || !cfg || !this.exchange) return 'no job is prepared on this rank';
    if (tag.job !== this.job) return `tensor for job ${tag.job}, but job ${this.job} is running`;
    if (tag.pass >= this.texts.length) return `tensor for pass ${tag.pass}, but the job has ${this.texts.length}`;
    if (tag.block >= cfg.numLayers) return `tensor for block ${tag.block} of ${cfg.numLayers}`;
    if (tag.step >= 1000) return `tensor for step ${tag.step}`;
    const phase = exchangePhase(tag.phase);
    if (link !== 'mesh') return this.judgeHandOff(cfg, link, from, tag, totalBytes);
    if (phase === ExchangePhase.HandOff) return 'a hand-off on the mesh of its own stage';
    if (!(from >= 0 && from < plan.degree)) return `tensor from rank ${from} of a mesh of ${plan.degree}`;
    // a mesh probe's tensors name block 0 whatever the stage
    const held = this.heldBlocks(cfg);
    if (phase !== ExchangePhase.Probe && (tag.block < held.from || tag.block >= held.to))
      return `tensor for block ${tag.block}, but this rank holds blocks ${held.from}–${held.to - 1}`;
    const groups = phase === ExchangePhase.QKV || phase === ExchangePhase.Output ? plan.headGroups : 1;
    if (tag.group >= groups) return `tensor for head group ${tag.group} of ${groups}`;
    const me = this.exchange.rank;
    const floats = phase === undefined ? undefined : this.expectedFloats(plan, phase, tag, from, me);
    if (floats === undefined)
      return `unknown exchange phase ${tag.phase}${phase === ExchangePhase.Probe ? ` step ${tag.step}` : ''}`;
    const bytes = payloadBytes(floats, this.exchange.dtype);
    if (totalBytes !== bytes) return `phase ${tag.phase} tensor of ${totalBytes} bytes; the plan says ${bytes}`;
    return null;
  }

  /**
   * A tensor on a hand-off link: only from the stage before, only of a hand-off to this stage's first block, no larger
   * than a tensor of the largest hand-off this rank may be given (its exact size is judged as it is taken).
   */
  private judgeHandOff(cfg: WanConfig, link: 'before' | 'after', from: number, tag: TensorTag, bytes: number) {
    if (link === 'after') return "the next stage's rank sends nothing back on its hand-off link";
    if (from !== SENDER) return `tensor from rank ${from} of a hand-off link`;
    if (exchangePhase(tag.phase) !== ExchangePhase.HandOff) return `phase ${tag.phase} tensor on a hand-off link`;
    const first = this.heldBlocks(cfg).from;
    if (tag.block !== first) return `hand-off to block ${tag.block}, but this rank's stage starts at block ${first}`;
    const plan = defined(this.plan, 'a prepared job');
    const floats = hiddenStateFloats(
      cfg.dim,
      Math.max(...plan.rows),
      defined(this.texts[0], 'a text').length / cfg.textDim,
    );
    const most = payloadBytes(handOffChunks(floats)[0], handOffDType(defined(this.init, 'initWorker').dtype));
    return bytes > 0 && bytes <= most
      ? null
      : `hand-off tensor of ${bytes} bytes; at most ${most} fit this rank's share`;
  }

  /** The floats of a peer's tensor for this phase in this rank's parallel mode; undefined for a phase it has not. */
  private expectedFloats(
    plan: UlyssesPlan,
    phase: ExchangePhase,
    tag: TensorTag,
    from: number,
    me: number,
  ): number | undefined {
    if (phase === ExchangePhase.Probe) return PROBE_FLOATS[tag.step];
    if (this.init?.parallel === 'displaced')
      return phase === ExchangePhase.KeysValues ? partFloats(plan, 'kv', from, me) : undefined;
    return phase === ExchangePhase.QKV
      ? partFloats(plan, 'qkv', from, me, tag.group)
      : phase === ExchangePhase.Output
        ? partFloats(plan, 'output', from, me, tag.group)
        : undefined;
  }

  /**
   * A forward of the prepared job's pass on this worker alone (every token, all heads), through the blocks it holds:
   * the coordinator checks its group's rows against it now and then (coordinator/spot-check.ts); a pipeline stage's
   * rank recomputes its stage, from all the patches or the stage before's hidden state of every token, as the stage
   * ran it. A reused or stale forward needs the whole model.
   */
  async recompute(args: RecomputeArgs): Promise<Recomputed> {
    const pass = args.stale || args.cache ? this.wholePass('recompute', args) : this.preparedPass('recompute', args);
    this.checkStageInput('recompute', pass, args, pass.plan.tokens, 'every token');
    if (args.kept && args.kept.patches.length !== args.patches.length)
      throw new Error(
        `recompute expected all ${pass.plan.tokens}×${pass.patchWidth} patch values of the prepared job, ` +
          `got ${args.kept.patches.length} for the kept forward`,
      );
    if ((args.cache === 'reuse') !== (args.kept !== undefined))
      throw new Error('recompute of a reused forward, and of that alone, is given the kept forward it reuses');
    if (args.stale && args.cache) throw new Error('a stale recompute is of a forward the step cache did not touch');
    const stats = noStats();
    if (args.stale) return { rows: await this.recomputeStale(pass, args, stats), computeMs: stats.computeMs };
    if (args.kept)
      return { rows: await this.recomputeReuse(pass, { ...args, kept: args.kept }, stats), computeMs: stats.computeMs };
    const output = await this.forward(pass, wholePlan(pass), memoryExchanges(1)[0], args, stats);
    return 'rows' in output
      ? { rows: output.rows, computeMs: stats.computeMs }
      : { rows: new Float32Array(0), hidden: output.hidden, computeMs: stats.computeMs };
  }

  exchangeEvidence(forward: ForwardKey) {
    return Promise.resolve({ receipts: this.ledger?.receipts(forward) ?? [] });
  }

  /**
   * A group's forward as its ranks ran it, each of them here over an in-memory exchange of this rank's dtype: what
   * each would receive, digested (exchange/ledger.ts). Bit for bit what honest ranks on this EP received.
   */
  async recomputeExchanges(args: RecomputeExchangesArgs) {
    const pass = this.wholePass('recomputeExchanges', args);
    if (args.patches.length !== pass.plan.tokens * pass.patchWidth)
      throw new Error(`recomputeExchanges expected all ${pass.plan.tokens}×${pass.patchWidth} patch values`);
    if (args.stale || args.cache)
      throw new Error("recomputeExchanges is of a forward run exact and whole, not a step cache's or a stale one");
    const plan = planUlysses(pass.cfg, pass.plan.tokens, args.heads, args.headGroups);
    const exchanges = memoryExchanges(plan.degree, this.needInit('recomputeExchanges').dtype);
    const ledgers = exchanges.map((exchange) => {
      const ledger = new ExchangeLedger(exchange.rank);
      exchange.keepEvidence(ledger);
      return ledger;
    });
    const stats = noStats();
    await Promise.all(
      exchanges.map((exchange, rank) => {
        const start = tokenStart(plan, rank) * pass.patchWidth;
        const patches = args.patches.subarray(start, start + plan.rows[rank] * pass.patchWidth);
        return this.forward(pass, plan, exchange, { ...args, patches }, stats);
      }),
    );
    return { received: ledgers.map((ledger) => ledger.receipts(args)) };
  }

  /** The prepared pass, where this rank holds the whole model to compute it from its patches alone. */
  private wholePass(method: string, args: ExecuteArgs) {
    const pass = this.preparedPass(method, args);
    const held = this.heldBlocks(pass.cfg);
    if (held.from !== 0 || held.to !== pass.cfg.numLayers)
      throw new Error(
        `${method} runs the whole model, but this rank holds blocks ${held.from}–${held.to - 1} of ` +
          `${pass.cfg.numLayers} (a pipeline stage)`,
      );
    if (args.hidden) throw new Error(`${method} starts from all the patches of the pass, not a hidden state`);
    return pass;
  }

  /**
   * A step cache's reused forward, every token: the kept forward it reuses computed first, for its residual (this
   * rank kept only its share's, if any), then this forward's embedding plus that residual through the head.
   */
  private async recomputeReuse(
    pass: ReturnType<WorkerRuntime['preparedPass']>,
    args: RecomputeArgs & { kept: KeptForward },
    stats: RankStats,
  ): Promise<Float32Array> {
    const { kept, ...reused } = args;
    let residual: Float32Array | undefined;
    const keep = (r: Float32Array) => void (residual = r);
    const source = { ...reused, ...kept, residual: { keep } };
    await this.forward(pass, wholePlan(pass), memoryExchanges(1)[0], source, stats);
    const reuse = defined(residual, "the kept forward's residual");
    return rowsOf(
      await this.forward(pass, wholePlan(pass), memoryExchanges(1)[0], { ...reused, residual: { reuse } }, stats),
    );
  }

  /**
   * A displaced group's stale forward, as each of its ranks ran it: every rank's tokens in turn, over its own keys and
   * values of this step and the others' of the step before, which this rank of the group holds (displaced.ts).
   */
  private async recomputeStale(
    pass: ReturnType<WorkerRuntime['preparedPass']>,
    args: ExecuteArgs,
    stats: RankStats,
  ): Promise<Float32Array> {
    const { cfg, plan, patchWidth } = pass;
    if (this.init?.parallel !== 'displaced' || plan.degree < 2)
      throw new Error('a stale recompute is for a rank of a displaced group of several ranks, and this is none');
    const rows: Float32Array[] = [];
    for (let rank = 0; rank < plan.degree; rank++) {
      const start = tokenStart(plan, rank);
      // the rank's place in the group (its tokens' positions); the attention sends nothing
      const asRank = placeOnly(rank, plan.degree, 'a stale recompute');
      const attend = heldStaleAttention(cfg, plan, this.engine, this.keysValues, args, rank);
      const patches = args.patches.subarray(start * patchWidth, (start + plan.rows[rank]) * patchWidth);
      rows.push(rowsOf(await this.forward(pass, plan, asRank, { ...args, patches }, stats, attend)));
    }
    return concat(rows); // [S, width] in token order
  }

  async executeModel(args: ExecuteArgs): Promise<ExecuteResult> {
    const exchange = this.needInit('executeModel');
    const prepared = this.preparedPass('executeModel', args);
    const { patch } = args;
    // PipeFusion: the patch's tokens are this forward's, as if it were that rank of a plan of `count`
    const pass = patch ? { ...prepared, plan: this.patchPlan(prepared, patch, exchange, args) } : prepared;
    const me = patch?.index ?? exchange.rank;
    const whose = patch ? `patch ${patch.index} of ${patch.count}` : `rank ${me}`;
    const handOf = { tag: { job: args.job, step: args.step, pass: args.pass }, ...(patch && { patch: patch.index }) };
    const received = await this.receiveHandOff(args, pass, handOf, pass.plan.rows[me]);
    if (received) args = { ...args, hidden: received.hidden };
    this.checkStageInput('executeModel', pass, args, pass.plan.rows[me], whose);
    this.setState('computing', `job ${args.job} step ${args.step} pass ${args.pass}`);
    this.forwardsRunning++;
    const stats = noStats();
    // a guided step's two passes share the mesh at once: each counts what it sends itself
    const counting = patch ? placeOnly(me, patch.count, 'a PipeFusion patch') : countingSends(exchange);
    const displaced = this.init?.parallel === 'displaced' && pass.plan.degree > 1;
    const at = { step: args.step, pass: args.pass };
    const attend = patch
      ? pipeFusionAttention(pass.cfg, pass.plan, this.engine, this.patchKeysValues, { ...at, patch: me })
      : displaced
        ? displacedAttention(pass.cfg, pass.plan, this.engine, counting, this.keysValues, {
            ...at,
            stale: args.stale ?? false,
          })
        : undefined;
    let output: StageOutput;
    let residualRatio: ExecuteResult['residualRatio'];
    const residual = args.cache && {
      ...(args.cache === 'reuse'
        ? { reuse: this.keptResidual(args.pass, pass.plan.rows[me] * pass.cfg.dim) }
        : {
            keep: (r: Float32Array) => {
              const before = this.residuals.get(args.pass);
              if (before?.length === r.length) residualRatio = magnitudeRatio(r, before, pass.cfg.dim);
              this.residuals.set(args.pass, r);
            },
          }),
    };
    try {
      output = await this.forward(pass, pass.plan, counting, { ...args, residual }, stats, attend);
    } finally {
      this.forwardsRunning--;
    }
    const { bytesSent } = counting;
    this.totals.steps++;
    this.totals.bytesSent += bytesSent;
    this.totals.computeMs += stats.computeMs;
    this.totals.bytesDownloaded += stats.bytesDownloaded;
    this.totals.bytesKept += stats.bytesKept;
    this.totals.deviceTensorsLeft = stats.deviceTensorsLeft;
    if (this.forwardsRunning === 0) this.setState('ready', `finished step ${args.step}`);
    const peakMemoryBytes = this.hooks.peakMemoryBytes?.() ?? null;
    const measured = residualRatio && { residualRatio };
    const handOff = received && { handOff: { bytes: received.bytes, ms: received.ms } };
    if ('rows' in output) return { rows: output.rows, ...stats, bytesSent, peakMemoryBytes, ...measured, ...handOff };
    const after = this.partners.after;
    if (!after) throw new Error("this rank's stage hands a hidden state on, but initWorker linked it to no next stage");
    const handedOn = await partnerBlamed('after', exchange.rank, () =>
      Promise.resolve(handOn(after, { ...handOf, block: this.heldBlocks(pass.cfg).to }, output.hidden)),
    );
    return { rows: new Float32Array(0), ...stats, bytesSent: bytesSent + handedOn, peakMemoryBytes, ...handOff };
  }

  /**
   * A later stage's input, where the stage before hands it on directly: taken from the link and judged (hand-off.ts),
   * a hidden state the coordinator sent instead refused. Undefined where this rank starts from what `args` carry.
   */
  private async receiveHandOff(
    args: ExecuteArgs,
    pass: ReturnType<WorkerRuntime['preparedPass']>,
    of: Omit<HandOffOf, 'block'>,
    rows: number,
  ): Promise<{ hidden: HiddenState; bytes: number; ms: number } | undefined> {
    const before = this.partners.before;
    if (!before) return undefined;
    if (args.hidden)
      throw new Error('executeModel was given a hidden state, but the stage before hands it on directly');
    const { cfg, text } = pass;
    const shape = { dim: cfg.dim, rows, textRows: text.length / cfg.textDim };
    const handOf = { ...of, block: this.heldBlocks(cfg).from };
    const taken = await partnerBlamed('before', this.exchange?.rank ?? 0, () => takeHandOff(before, handOf, shape));
    this.handOffs.keep(handOf, taken.hidden);
    return taken;
  }

  /** The tensors of the largest hand-off this rank may be sent ahead: its whole share, in PipeFusion a patch each. */
  private handOffTensors(cfg: WanConfig, textRows: number): number {
    const rows = Math.max(...defined(this.plan, 'a prepared job').rows);
    return handOffChunks(hiddenStateFloats(cfg.dim, rows, textRows)).length + MAX_PATCH_HAND_OFFS;
  }

  /**
   * What the stage before handed this rank for one forward (a PipeFusion patch's), with the receipts its sender signed:
   * a spot check's evidence of a stage's input and of the stage before's output. Throws where it is no longer kept.
   */
  handOffEvidence({ patch, ...forward }: HandOffKey) {
    return Promise.resolve(this.handOffs.evidence(forward, patch));
  }

  /** The residual this rank kept for `pass`, of its share's `floats`; the coordinator asks 'keep' before 'reuse'. */
  private keptResidual(pass: number, floats: number): Float32Array {
    const kept = this.residuals.get(pass);
    if (!kept)
      throw new Error(
        `a step cache's reuse of pass ${pass}, but this rank kept no residual of it for the prepared job: ` +
          "the coordinator asks 'keep' on a forward first",
      );
    if (kept.length !== floats)
      throw new Error(
        `the residual kept for pass ${pass} is ${kept.length} values, but this rank's share is ${floats}`,
      );
    return kept;
  }

  /** The loaded model's blocks: a pipeline stage's, or all of them. */
  private heldBlocks(cfg: WanConfig): BlockRange {
    return this.blocks ?? allBlocks(cfg);
  }

  /**
   * A forward starts from patches on the rank that holds the embedders (every rank of an unstaged job), else from the
   * stage before's hidden state of its `rows` tokens (`whose`: the rank's, or every token), each part of it judged
   * before anything is computed from it.
   */
  /** Every key and value held from forwards before (displaced mode's, PipeFusion's): a new job or mesh has none. */
  private forgetKeysValues(): void {
    this.keysValues.clear();
    this.patchKeysValues.clear();
  }

  /** The plan of PipeFusion's patches, whose rank `patch.index` a forward computes: for a stage of one rank alone. */
  private patchPlan(
    pass: ReturnType<WorkerRuntime['preparedPass']>,
    patch: PatchOf,
    exchange: Exchange,
    args: ExecuteArgs,
  ): UlyssesPlan {
    if (exchange.world !== 1)
      throw new Error(
        `PipeFusion's patches are for a pipeline stage of one rank; this rank's mesh has ${exchange.world}`,
      );
    if (args.cache || args.stale)
      throw new Error('a PipeFusion patch is computed whole: no step cache, no displaced mode');
    if (!(patch.index < patch.count))
      throw new Error(`patch ${patch.index} of ${patch.count}: patches are numbered from 0`);
    return planUlysses(pass.cfg, pass.plan.tokens, patch.count);
  }

  private checkStageInput(
    method: string,
    pass: ReturnType<WorkerRuntime['preparedPass']>,
    args: ExecuteArgs,
    rows: number,
    whose: string,
  ): void {
    const { cfg, patchWidth, text } = pass;
    const held = this.heldBlocks(cfg);
    const stage = `this rank holds blocks ${held.from}–${held.to - 1} of ${cfg.numLayers}`;
    const wrongTimestep = timestepError(args.timestep, rows);
    if (wrongTimestep) throw new Error(`${method}'s timestep for ${whose} is malformed: ${wrongTimestep}`);
    if (holdsEmbedders(held)) {
      if (args.hidden) throw new Error(`${method} was given a hidden state, but ${stage} and starts from the patches`);
      if (args.patches.length !== rows * patchWidth)
        throw new Error(
          `${method} expected ${rows}×${patchWidth} patch values for ${whose}, got ${args.patches.length}`,
        );
      return;
    }
    if (!args.hidden)
      throw new Error(`${method} needs the stage before's hidden state: ${stage}, a later pipeline stage`);
    if (args.patches.length)
      throw new Error(`${method} was given patches beside the hidden state, but ${stage}: patches are for the first`);
    if (timestepLevelCount(args.timestep, rows) > 1)
      throw new Error(
        `${method} was given a timestep per token, but ${stage}: a hidden state carries one time embedding`,
      );
    const wrong = hiddenStateError(cfg, args.hidden, rows, text.length / cfg.textDim);
    if (wrong) throw new Error(`${method}'s hidden state for ${whose} is malformed: ${wrong}`);
  }

  /** What a forward of the prepared job needs from `args`, checked against what was prepared. */
  private preparedPass(method: string, args: ExecuteArgs) {
    const cfg = this.needModel();
    const plan = this.plan;
    if (args.job !== this.job || !plan)
      throw new Error(`${method} for job ${args.job} but job ${this.job} was prepared`);
    const text = this.texts.at(args.pass);
    if (!text)
      throw new Error(`no text embedding for pass ${args.pass}: the job was prepared with ${this.texts.length}`);
    const grid = tokenGrid(cfg, args.latentShape);
    if (grid.count !== plan.tokens)
      throw new Error(`${method} with ${grid.count} tokens but the job was prepared for ${plan.tokens}`);
    return { cfg, plan, text, grid, patchWidth: cfg.inChannels * cfg.patchSize.reduce((x, y) => x * y, 1) };
  }

  private forward(
    pass: ReturnType<WorkerRuntime['preparedPass']>,
    plan: UlyssesPlan,
    exchange: Exchange,
    args: ExecuteArgs & Partial<Pick<ForwardInput, 'residual'>>,
    stats: RankStats,
    attend?: BlockAttention,
  ): Promise<StageOutput> {
    const { cfg, text, grid } = pass;
    return forwardStage(
      cfg,
      plan,
      this.engine,
      exchange,
      {
        ...(args.hidden ? { hidden: args.hidden } : { patches: args.patches }),
        timestep: args.timestep,
        text,
        grid,
        tag: { job: args.job, step: args.step, pass: args.pass },
        bounds: this.model?.bounds,
        residual: args.residual,
      },
      this.heldBlocks(cfg),
      stats,
      attend,
    );
  }

  private setState(state: WorkerState, detail: string): void {
    this.state = state;
    this.detail = detail;
    this.hooks.onState?.(state, detail);
  }

  private needInit(method: string): Exchange {
    if (!this.init || !this.exchange)
      throw new Error(`worker method ${method} called before initWorker: the coordinator must call initWorker first`);
    return this.exchange;
  }

  private needModel(): WanConfig {
    if (!this.model) throw new Error('no model loaded: the coordinator must call loadModel after initWorker');
    return this.model.config;
  }
}

/** The prepared job's whole sequence on this rank alone: a recomputation's plan. */
function wholePlan(pass: { cfg: WanConfig; plan: UlyssesPlan }): UlyssesPlan {
  return planUlysses(pass.cfg, pass.plan.tokens, 1);
}

/** MagCache's magnitude ratio of two residuals [S, width], summed over the tokens: Σ |now_s| / |before_s|. */
function magnitudeRatio(now: Float32Array, before: Float32Array, width: number): { sum: number; tokens: number } {
  const tokens = now.length / width;
  let sum = 0;
  for (let s = 0; s < tokens; s++) {
    let a = 0;
    let b = 0;
    for (let i = s * width; i < (s + 1) * width; i++) {
      a += now[i] * now[i];
      b += before[i] * before[i];
    }
    sum += b > 0 ? Math.sqrt(a / b) : 1;
  }
  return { sum, tokens };
}
