// The executor interface, vLLM-style: the base class owns the lifecycle — init and load on every
// rank, collective RPC with timeouts, one DiT forward split across ranks, graceful shutdown — and a
// backend only says how to reach its ranks. What runs where, and how, is decided before an executor
// exists: the planner's ResolvedPlacement (placement.ts), which it carries out and reads as it is.
// How a forward runs is its forward strategy's (forward/), picked once from the placement; checking
// it, the verifier's (verifier.ts); a step cache's forwards, step-cache-forwards.ts.
import { passesPerStep } from '../core/job.ts';
import type { WanConfig } from '../core/model/config.ts';
import type { Transport } from '../core/net/channel.ts';
import { ContractError } from '../core/net/check.ts';
import { NO_RPC_TIMEOUT, RemoteError, RpcTimeout, type Remote } from '../core/net/rpc.ts';
import { CallWatch, watchIntervalMs } from './call-watch.ts';
import type { RankLayout } from '../core/parallel.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { initArgsOf, loadArgsOf, type ResolvedPlacement } from './placement.ts';
import type { SpotCheck } from './spot-check.ts';
import { newSigningKeys, type SigningKeys } from '../core/net/signing.ts';
import { Emitter } from '../core/events.ts';
import { guide } from '../core/sampler.ts';
import type { Tensor } from '../core/tensor.ts';
import {
  callWorker,
  checkRankLost,
  type ArgsOf,
  type MeshProbe,
  type RankLost,
  type ReplyOf,
  type WorkerApi,
  type WorkerMethod,
} from '../core/worker-api.ts';
import { PipeFusionForward } from './forward/pipefusion.ts';
import { SequenceParallelForward } from './forward/sequence-parallel.ts';
import {
  summedReports,
  type ForwardContext,
  type ForwardRequest,
  type ForwardStrategy,
  type RankReport,
  type RankWorker,
} from './forward/strategy.ts';
import { StepCacheForwards, type CacheForward, type StepCacheMemory } from './step-cache-forwards.ts';
import { Verifier } from './verifier.ts';
import { TimeoutError, WorkerError } from './worker-errors.ts';

// the executor's callers import these from here, where they were defined before the strategies moved out
export { maxOrNull, type ForwardRequest, type RankReport } from './forward/strategy.ts';
export { StepCacheMemory, type CacheForward } from './step-cache-forwards.ts';
export { SpotCheckFailed } from './verifier.ts';
export { TimeoutError, WorkerError } from './worker-errors.ts';

export interface ExecutorOptions {
  config: WanConfig;
  /** where and how the job runs: the planner's decisions, which the executor carries out */
  placement: ResolvedPlacement;
}

export interface RpcOptions<M extends WorkerMethod> {
  /** the arguments, the same for every rank or each rank's own */
  args?: ArgsOf<M> | ((rank: number) => ArgsOf<M>);
  timeoutMs?: number;
  /** return only this rank's reply */
  uniqueReplyRank?: number;
  /** call only these ranks (replies in this order); all ranks by default */
  ranks?: number[];
}

/** One link of the running ranks: the coordinator's to a rank, or one between two ranks (`from` > `to`). */
export interface LinkReport {
  from: 'coordinator' | number;
  to: number;
  /** a data channel, or through the server's relay; 'unknown' until the rank has said */
  transport: Transport | 'unknown';
}

export type FailureListener = (error: Error) => void;

/** A rank the executor let go: why (as data), and how long it had been silent. */
export interface LostRank extends RankLost {
  worker: string;
  silentMs: number;
}

export abstract class Executor {
  /** what each rank said about itself and the model it loaded (its EP, and why), in rank order */
  workers: RankWorker[] = [];
  private readonly failures = new Emitter<Error>();
  private placed = false;
  private closed = false;
  /** each rank's share of the prepared job, as the swarm view shows it ("rank 0 of 3 (5 heads, 410 tokens)") */
  private readonly jobShares: string[] = [];
  /** each rank's key pair, by global rank (initialize) */
  private signingKeys: SigningKeys[] = [];
  /** rows of the prepared job's text embeddings, per pass: a hidden state's context has as many */
  private textRows: number[] = [];
  private readonly stepCache: StepCacheForwards;
  private readonly verifier: Verifier;
  /** how a forward runs on the ranks: chosen once, from the placement */
  private readonly forward: ForwardStrategy;

  /** the planner's decisions; a later job placed the same way brings its own prediction (Placer.place) */
  placement: ResolvedPlacement;
  protected readonly config: WanConfig;

  constructor({ config, placement }: ExecutorOptions) {
    this.config = config;
    this.placement = placement;
    const context = this.forwardContext();
    this.stepCache = new StepCacheForwards(context);
    this.verifier = new Verifier(context, this.stepCache, (rank) => this.signingKeys[rank].publicKey);
    this.forward = placement.pipeFusion
      ? new PipeFusionForward(context, placement.pipeFusion.patches)
      : new SequenceParallelForward(context, this.verifier, this.stepCache);
  }

  /**
   * What the forward strategies and the verifier see of this executor. Getters, so that they read what initialize,
   * prepareJob and the placer set since.
   */
  private forwardContext(): ForwardContext {
    const live = {
      placement: () => this.placement,
      world: () => this.world,
      workers: () => this.workers,
    };
    return {
      config: this.config,
      get placement() {
        return live.placement();
      },
      get layout() {
        return live.placement().layout;
      },
      get world() {
        return live.world();
      },
      get workers() {
        return live.workers();
      },
      collectiveRpc: (method, options) => this.collectiveRpc(method, options),
      showActivity: (rank, doing) => this.showActivity(rank, doing),
      shareOf: (rank) => this.jobShares[rank] ?? `rank ${rank}`,
      textRowsOf: (pass) => this.textRows[pass] ?? 0,
    };
  }

  /** The spot checks made since the last call: the report's. */
  takeSpotChecks(): SpotCheck[] {
    return this.verifier.take();
  }

  /** The step cache's forwards run since the last call: the report's. */
  takeCacheForwards(): CacheForward[] {
    return this.stepCache.take();
  }

  /** Reserves the ranks; returns their peer ids in rank order. */
  protected abstract place(): Promise<string[]>;
  /** How to reach rank r. */
  protected abstract remoteOf(rank: number): Remote<WorkerApi> | undefined;
  /** Closes the connections to the ranks (after the graceful part of shutdown). */
  protected abstract closeTransport(): void;
  /** What a rank is doing, for the dashboard's swarm view: shown where the backend has one. */
  protected showActivity(_rank: number, _doing: string): void {}

  get layout(): RankLayout {
    return this.placement.layout;
  }

  /** number of ranks once initialized */
  get world(): number {
    return this.placed ? this.layout.world : 0;
  }

  get rpcTimeoutMs(): number {
    return this.placement.timeouts.rpcMs;
  }

  async initialize(): Promise<void> {
    const peers = await this.place();
    if (peers.length !== this.layout.world)
      throw new Error(`the layout needs ${this.layout.world} ranks but ${peers.length} were placed`);
    this.placed = true;
    const session = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
    // each rank signs what it sends its mesh with a key made here (core/net/signing.ts), for a spot check's evidence
    this.signingKeys = Array.from({ length: this.layout.world }, newSigningKeys);
    await this.collectiveRpc('initWorker', {
      args: (rank) => initArgsOf(this.placement, rank, peers, session, this.signingKeys),
    });
    const infos = await this.collectiveRpc('describe');
    const loaded = await this.collectiveRpc('loadModel', {
      // 'auto': each worker takes the EP it measured fastest, by the rule the planner predicted it with (fastestEp);
      // a staged placement's ranks load their stage's blocks alone
      args: (rank) => loadArgsOf(this.placement, rank),
      timeoutMs: this.placement.timeouts.loadMs,
    });
    this.workers = infos.map((info, rank) => ({ ...info, ...loaded[rank], id: peers[rank] }));
  }

  /** Runs a worker method on every rank (or `ranks`): all replies in rank order, or only `uniqueReplyRank`'s. */
  collectiveRpc<M extends WorkerMethod>(
    method: M,
    options: RpcOptions<M> & { uniqueReplyRank: number },
  ): Promise<ReplyOf<M>>;
  collectiveRpc<M extends WorkerMethod>(method: M, options?: RpcOptions<M>): Promise<ReplyOf<M>[]>;
  async collectiveRpc<M extends WorkerMethod>(
    method: M,
    options: RpcOptions<M> = {},
  ): Promise<ReplyOf<M> | ReplyOf<M>[]> {
    if (this.world === 0) throw new Error(`${method} needs ranks: call initialize() first`);
    const only = options.uniqueReplyRank;
    // checked before any rank runs the method, so a bad call has no side effects on the workers
    if (only !== undefined && !(Number.isInteger(only) && only >= 0 && only < this.world)) {
      throw new Error(`uniqueReplyRank ${only} is not a rank of this ${this.world}-rank executor`);
    }
    const limitMs = options.timeoutMs ?? this.rpcTimeoutMs;
    const ranks = options.ranks ?? Array.from({ length: this.world }, (_, r) => r);
    const argsFor = (rank: number) =>
      typeof options.args === 'function' ? options.args(rank) : ((options.args ?? {}) as ArgsOf<M>);
    // Fails fast on the first rank that errs (a lost rank must not leave the others' calls hanging),
    // and on the ranks whose engines stopped moving (call-watch.ts), all named in one TimeoutError;
    // a rank whose engine moves is waited for however long its call takes.
    const replies = await new Promise<ReplyOf<M>[]>((resolve, reject) => {
      const results: ReplyOf<M>[] = [];
      const waiting = new Set(ranks);
      const watch = new CallWatch(limitMs, ranks, (rank) => this.progressOf(rank));
      const timer = setInterval(() => {
        const hung = watch.check(waiting);
        if (!hung.length) return;
        clearInterval(timer);
        reject(new TimeoutError(method, hung, watch.limitMs));
      }, watchIntervalMs(limitMs));
      ranks.forEach((rank, i) => {
        this.callRank(rank, method, argsFor(rank), NO_RPC_TIMEOUT).then(
          (value) => {
            results[i] = value;
            waiting.delete(rank);
            if (waiting.size) return;
            clearInterval(timer);
            resolve(results);
          },
          (reason: unknown) => {
            clearInterval(timer);
            reject(
              reason instanceof RpcTimeout
                ? new TimeoutError(method, [rank], limitMs)
                : this.workerError(rank, method, reason),
            );
          },
        );
      });
    });
    return only === undefined ? replies : replies[only];
  }

  /** How far `rank`'s engine has got (EngineProgress.done), where the backend hears it; null: nothing says. */
  protected progressOf(_rank: number): number | null {
    return null;
  }

  /** Calls one rank's method; rejects with RpcTimeout or the remote error. */
  protected callRank<M extends WorkerMethod>(
    rank: number,
    method: M,
    args: ArgsOf<M>,
    timeoutMs: number,
  ): Promise<ReplyOf<M>> {
    const worker = this.remoteOf(rank);
    if (!worker) return Promise.reject(new Error(`no rank ${rank}: this executor has ${this.world} ranks`));
    return callWorker(worker, method, args, timeoutMs);
  }

  /**
   * A failed call as data: the rank, its text, and whom it blames (a rank of its mesh, or its hand-off partner in the
   * stage before or after, renumbered to global).
   */
  private workerError(rank: number, method: string, reason: unknown): WorkerError {
    const message = reason instanceof Error ? reason.message : String(reason);
    if (reason instanceof ContractError) return new WorkerError(rank, method, message, null, true);
    let blame: RankLost | null = null;
    if (reason instanceof RemoteError && reason.detail !== undefined) {
      try {
        const { stage, ...said } = checkRankLost(reason.detail, 'blame');
        // a partner is named by the blaming rank's own place in its mesh: it can name no other rank of that stage
        const partner = stage && said.rank === this.layout.localRank(rank) && this.layout.stagePartner(rank, stage);
        if (stage) blame = typeof partner === 'number' ? { ...said, rank: partner } : null;
        else if (said.rank < this.layout.ulyssesDegree)
          blame = { ...said, rank: this.layout.meshRanks(rank)[said.rank] };
      } catch {
        // blame that breaks the contract is dropped; the error's text still says what happened
      }
    }
    return new WorkerError(rank, method, message, blame);
  }

  /** Gives every rank the job's text embeddings (conditional, then unconditional) and latent shape. */
  async prepareJob(job: number, texts: Float32Array[], latentShape: number[]): Promise<void> {
    const tokens = tokenGrid(this.config, latentShape).count;
    for (let rank = 0; rank < this.world; rank++) {
      const stage = this.placement.stages?.[this.layout.stageOf(rank)];
      const held = stage ? `: blocks ${stage.blocks[0]}–${stage.blocks[1] - 1}` : '';
      this.jobShares[rank] = `${this.layout.describe(rank, { numHeads: this.config.numHeads, tokens })}${held}`;
      this.showActivity(rank, this.jobShares[rank]);
    }
    await this.collectiveRpc('prepareJob', {
      args: { job, texts, latentShape, exchangeTimeoutMs: this.placement.timeouts.exchangeMs },
    });
    this.textRows = texts.map((t) => t.length / this.config.textDim);
    this.forward.jobPrepared(); // a prepared job's ranks hold no keys and values
    this.stepCache.jobPrepared(); // nor residuals
    // a worker takes up a new share of its machine's cores as it prepares a job: report the threads it has now
    const infos = await this.collectiveRpc('describe');
    this.workers.forEach((w, rank) => (w.threads = infos[rank].threads));
  }

  /**
   * Times an all-to-all on the ranks' meshes for the prepared job (rank/mesh-probe.ts): the link the cost model plans
   * with.
   */
  probeMesh(job: number): Promise<MeshProbe[]> {
    return this.collectiveRpc('probeMesh', { args: { job } });
  }

  /**
   * One DiT forward pass on the ranks of the pass's group (the placement's forward strategy), as the job's step cache
   * schedules it (a reuse the ranks hold no residual for is computed), spot-checked now and then where it runs the
   * blocks; a kept forward is remembered in `memory`, for ranks placed later to be given its residual again.
   */
  async executeModel(
    request: ForwardRequest,
    memory?: StepCacheMemory,
  ): Promise<{ output: Tensor; ranks: RankReport[] }> {
    const run = this.stepCache.asRun(request);
    const checked = run.checkable && this.world > 1 && this.verifier.due(request);
    const { output, ranks, magnitudeRatio } = await this.forward.run({ ...request, cache: run.cache }, checked);
    this.stepCache.ran(request, run, magnitudeRatio, memory);
    return { output, ranks };
  }

  /**
   * One denoising step's velocity: the conditional pass, and with guidance the unconditional one —
   * at the same time on their two groups with CFG parallel, where `guide` is the step's one exchange;
   * on one group of several ranks at the same time too, so that while one pass waits for its
   * all-to-all the ranks compute the other's (their engines take the two passes' stages in turn).
   */
  async velocity(
    at: Omit<ForwardRequest, 'pass'>,
    guidance: number,
    memory?: StepCacheMemory,
  ): Promise<{ velocity: Float32Array; ranks: RankReport[] }> {
    const passes = passesPerStep({ guidance });
    const modes = this.stepCache.modes(at, passes);
    if (modes)
      await this.stepCache.rebuildResiduals(at.step, modes, memory, (replay) => this.forward.run(replay, false));
    if (passes === 1) {
      const cond = await this.executeModel({ ...at, pass: 0, cache: modes?.[0] }, memory);
      return { velocity: cond.output.data, ranks: cond.ranks };
    }
    if (this.layout.cfgParallel) {
      const [cond, uncond] = await Promise.all([
        this.executeModel({ ...at, pass: 0, cache: modes?.[0] }, memory),
        this.executeModel({ ...at, pass: 1, cache: modes?.[1] }, memory),
      ]);
      return {
        velocity: guide(cond.output.data, uncond.output.data, guidance),
        ranks: [...cond.ranks, ...uncond.ranks],
      };
    }
    // pipeline stages take the passes in turn, so the second pass's first stage runs while the first's second does
    const [cond, uncond] =
      this.layout.ulyssesDegree > 1 || this.layout.stages > 1
        ? await Promise.all([
            this.executeModel({ ...at, pass: 0, cache: modes?.[0] }, memory),
            this.executeModel({ ...at, pass: 1, cache: modes?.[1] }, memory),
          ])
        : [
            await this.executeModel({ ...at, pass: 0, cache: modes?.[0] }, memory),
            await this.executeModel({ ...at, pass: 1, cache: modes?.[1] }, memory),
          ];
    const ranks = cond.ranks.map((r, i) => summedReports(r, uncond.ranks[i]));
    return { velocity: guide(cond.output.data, uncond.output.data, guidance), ranks };
  }

  /** Which links of the ranks are direct and which are relayed; ranks in one page (local) have none. */
  linkReport(): LinkReport[] {
    return [];
  }

  /**
   * After a failed call: which ranks are lost (gone, frozen or misbehaving) and were let go.
   * An empty list means the failure was not a lost rank, so retrying would not help.
   */
  lostRanks(_error: Error): Promise<LostRank[]> {
    return Promise.resolve([]);
  }

  /** Pings every rank; rejects naming the silent ones. */
  async checkHealth(timeoutMs = 5_000): Promise<void> {
    await this.collectiveRpc('ping', { timeoutMs });
  }

  onFailure(listener: FailureListener): () => void {
    return this.failures.on(listener);
  }

  protected reportFailure(error: Error): void {
    this.failures.emit(error);
  }

  /** Asks every rank to stop, waits up to graceMs for their acks, then closes the connections. */
  async shutdown({ graceMs = 5_000 } = {}): Promise<{ acked: number[]; silent: number[] }> {
    if (this.closed) return { acked: [], silent: [] };
    this.closed = true;
    const ranks = Array.from({ length: this.world }, (_, r) => r);
    const acks = await Promise.allSettled(ranks.map((r) => this.callRank(r, 'shutdown', {}, graceMs)));
    this.closeTransport();
    return {
      acked: ranks.filter((r) => acks[r].status === 'fulfilled'),
      silent: ranks.filter((r) => acks[r].status === 'rejected'),
    };
  }
}
