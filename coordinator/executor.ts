// The executor interface, vLLM-style: the base class owns the lifecycle — init and load on every
// rank, collective RPC with timeouts, one DiT forward split across ranks, graceful shutdown — and a
// backend only says how to reach its ranks. What runs where, and how, is decided before an executor
// exists: the planner's ResolvedPlacement (placement.ts), which it carries out and reads as it is.
import { passesPerStep } from '../core/job.ts';
import type { WanConfig } from '../core/model/config.ts';
import type { Transport } from '../core/net/channel.ts';
import { ContractError } from '../core/net/check.ts';
import { NO_RPC_TIMEOUT, RemoteError, RpcTimeout, type Remote } from '../core/net/rpc.ts';
import { CallWatch, watchIntervalMs } from './call-watch.ts';
import {
  gatherLatent,
  planUlysses,
  scatterLatent,
  attendsStale,
  type RankLayout,
  type UlyssesPlan,
} from '../core/parallel.ts';
import { patchify, tokenGrid } from '../core/model/tokens.ts';
import { hiddenStateError, type HiddenState } from '../core/model/blocks.ts';
import { initArgsOf, loadArgsOf, type ResolvedPlacement } from './placement.ts';
import {
  checkedHiddenStates,
  checkedRows,
  judgeOutputs,
  pickChecker,
  spotCheckDraw,
  type CheckedOutputs,
  type SpotCheck,
} from './spot-check.ts';
import { judgeExchanges, sameDigests, trueDigests } from './exchange-evidence.ts';
import { newSigningKeys, type SigningKeys } from '../core/net/signing.ts';
import { defined } from '../core/defined.ts';
import { Emitter } from '../core/events.ts';
import { guide } from '../core/sampler.ts';
import { concat, type Tensor } from '../core/tensor.ts';
import { cacheSchedule, type CacheMode } from '../core/step-cache.ts';
import {
  callWorker,
  checkRankLost,
  type ArgsOf,
  type ExecuteArgs,
  type ExecuteResult,
  type LoadedModel,
  type MeshProbe,
  type RankLost,
  type RecomputeArgs,
  type ReplyOf,
  type WorkerApi,
  type WorkerInfo,
  type WorkerMethod,
} from '../core/worker-api.ts';

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

/** The larger of two measurements, either of which may be missing. */
export const maxOrNull = (a: number | null, b: number | null): number | null =>
  a === null ? b : b === null ? a : Math.max(a, b);

export interface RankReport {
  rank: number;
  worker: string;
  computeMs: number;
  commMs: number;
  /** time computing while an exchange of the rank's was on the wire (RankStats) */
  overlapMs: number;
  bytesSent: number;
  /** the most memory the rank's page held so far (null: its browser cannot measure it) */
  peakMemoryBytes: number | null;
}

/** One link of the running ranks: the coordinator's to a rank, or one between two ranks (`from` > `to`). */
export interface LinkReport {
  from: 'coordinator' | number;
  to: number;
  /** a data channel, or through the server's relay; 'unknown' until the rank has said */
  transport: Transport | 'unknown';
}

export interface ForwardRequest {
  job: number;
  step: number;
  /** the job's steps, where known: its final steps are checked at a higher rate (spot-check.ts) */
  steps?: number;
  pass: number;
  timestep: number;
  latent: Tensor; // [C, T, H, W]
  /** a step cache's forward, as its schedule has it (core/step-cache.ts); none without a step cache */
  cache?: CacheMode;
}

/** A forward of a job with a step cache, as it ran. */
export interface CacheForward {
  step: number;
  pass: number;
  reused: boolean;
  /** the step whose kept forward ran again first, on ranks placed since it (their residual was the lost ranks') */
  replayedFrom: number | null;
  /** scheduled to reuse, computed: no kept forward to run again (a job resumed from its checkpoint) */
  recomputed: boolean;
  /** its residual's magnitude against the one kept before it (MagCache's ratio), where both were computed */
  magnitudeRatio: number | null;
}

/** Some ranks' engines made no progress on a call within its limit (call-watch.ts). */
export class TimeoutError extends Error {
  override name = 'TimeoutError';
  constructor(
    readonly method: string,
    readonly silentRanks: number[],
    /** the limit they were judged by, stretched where every rank was late together */
    readonly timeoutMs: number,
  ) {
    super(
      `${method} timed out after ${timeoutMs} ms waiting for ` +
        `rank${silentRanks.length > 1 ? 's' : ''} ${silentRanks.join(', ')}`,
    );
  }
}

/**
 * A rank's method failed. `remoteMessage` is the rank's own error text (or, with `breach`, what was
 * wrong with its reply); `blame` is whom the rank holds responsible, in global ranks: its word, not
 * a verdict.
 */
export class WorkerError extends Error {
  override name = 'WorkerError';
  constructor(
    readonly rank: number,
    readonly method: string,
    readonly remoteMessage: string,
    readonly blame: RankLost | null = null,
    /** the rank broke the contract: the coordinator saw it itself */
    readonly breach = false,
  ) {
    super(`rank ${rank} failed in ${method}: ${remoteMessage}`);
  }
}

/**
 * A spot check found wrong rows (spot-check.ts). Convicted on the coordinator's own evidence (a
 * breach), or, `disputed`, a disagreement between the rank and `blame` (its checker) that no third
 * judgement decided: one of the two lied, and the record of accusations (accusations.ts) says which.
 */
export class SpotCheckFailed extends WorkerError {
  override name = 'SpotCheckFailed';
  constructor(
    rank: number,
    why: string,
    blame: RankLost | null,
    readonly disputed = false,
  ) {
    super(rank, 'spot check', why, blame, !disputed);
  }
}

export type FailureListener = (error: Error) => void;

/** What a failed spot check's receipts showed (Executor.exchangeLie): the rank they convict, if any, and why. */
interface ExchangeFinding {
  rank: number | null;
  said: string;
}

/** what a later pipeline stage is given for patches: it starts from the stage before's hidden state */
const NO_PATCHES = new Float32Array(0);

/** One pipeline stage's part of a forward (the whole forward where there is one stage), for a spot check. */
interface StageRun {
  stage: number;
  /** its ranks in plan order */
  ranks: number[];
  /** the hidden states the stage before handed each of them; null where it started from the patches */
  input: HiddenState[] | null;
  results: ExecuteResult[];
}

/** The values of one token's row of a forward's output: pt·ph·pw·C. */
const rowWidthOf = (config: WanConfig): number => config.outChannels * config.patchSize.reduce((a, b) => a * b, 1);

/** One rank's work over two forwards (a step's passes, PipeFusion's patches): times and bytes summed, peaks' max. */
const summedReports = (a: RankReport, b: RankReport): RankReport => ({
  ...a,
  computeMs: a.computeMs + b.computeMs,
  commMs: a.commMs + b.commMs,
  overlapMs: a.overlapMs + b.overlapMs,
  bytesSent: a.bytesSent + b.bytesSent,
  peakMemoryBytes: maxOrNull(a.peakMemoryBytes, b.peakMemoryBytes),
});

/** The hidden states a stage's ranks were handed, as one of every token: x in token order, the rest as rank 0's. */
function wholeHiddenState(parts: HiddenState[]): HiddenState {
  return { ...parts[0], x: concat(parts.map((p) => p.x)) };
}

/** A rank the executor let go: why (as data), and how long it had been silent. */
export interface LostRank extends RankLost {
  worker: string;
  silentMs: number;
}

/**
 * What a job's step cache keeps across its placements: each pass's last kept forward (its latent is a reference to
 * the sampler's), to run again on ranks placed since; and as it was when the current placement began, for the steps
 * a spot check's conviction runs again.
 */
export class StepCacheMemory {
  private latest = new Map<number, ForwardRequest>();
  private atPlacement = new Map<number, ForwardRequest>();

  kept(request: ForwardRequest): void {
    this.latest.set(request.pass, request);
  }

  /** The pass's last kept forward before `step`, if any. */
  lastKept(pass: number, step: number): ForwardRequest | undefined {
    const kept = this.latest.get(pass);
    return kept && kept.step < step ? kept : undefined;
  }

  /** A placement starts here. */
  placed(): void {
    this.atPlacement = new Map(this.latest);
  }

  /** The steps since the current placement began run again. */
  rerun(): void {
    this.latest = new Map(this.atPlacement);
  }
}

export abstract class Executor {
  /** what each rank said about itself and the model it loaded (its EP, and why), in rank order */
  workers: (WorkerInfo & LoadedModel & { id: string })[] = [];
  private readonly failures = new Emitter<Error>();
  private placed = false;
  private closed = false;
  /** displaced mode: per pass, the last step its group ran on this placement (whose keys and values the ranks hold) */
  private readonly lastStepOf = new Map<number, number>();
  private readonly spotCheckDue: (forward: { step: number; steps?: number }) => boolean;
  /** each rank's share of the prepared job, as the swarm view shows it ("rank 0 of 3 (5 heads, 410 tokens)") */
  private readonly jobShares: string[] = [];
  /** each rank's key pair, by global rank (initialize) */
  private signingKeys: SigningKeys[] = [];
  /** spot checks made and not yet taken (takeSpotChecks) */
  private spotChecks: SpotCheck[] = [];
  /** a step cache's forwards run and not yet taken (takeCacheForwards) */
  private cacheForwards: CacheForward[] = [];
  /**
   * per pass, the forward whose residual its ranks keep for the prepared job, which a step cache's reuse needs (and a
   * check of a reuse computes again), and whether it attended to stale keys and values (then no check can)
   */
  private readonly keptFrom = new Map<number, { request: ForwardRequest; stale: boolean }>();
  /** per pass, the step whose kept forward rebuildResiduals ran again for this step's reuse */
  private readonly replayedFor = new Map<number, number>();
  /** rows of the prepared job's text embeddings, per pass: a hidden state's context has as many */
  private textRows: number[] = [];
  /**
   * pipeline stages: each stage's last forward (per CFG group), which the next pass's waits for, so that a stage runs
   * one pass at a time, whole, and hands it on while it computes the next (its engine would otherwise interleave them)
   */
  private readonly stageTurns: Promise<unknown>[] = [];

  /** the planner's decisions; a later job placed the same way brings its own prediction (Placer.place) */
  placement: ResolvedPlacement;
  protected readonly config: WanConfig;

  constructor({ config, placement }: ExecutorOptions) {
    this.config = config;
    this.placement = placement;
    this.spotCheckDue = spotCheckDraw(placement.spotChecks.rate);
  }

  /** The spot checks made since the last call: the report's. */
  takeSpotChecks(): SpotCheck[] {
    return this.spotChecks.splice(0);
  }

  /** The step cache's forwards run since the last call: the report's. */
  takeCacheForwards(): CacheForward[] {
    return this.cacheForwards.splice(0);
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

  /** A failed call as data: the rank, its text, and whom it blames (a rank of its group, renumbered to global). */
  private workerError(rank: number, method: string, reason: unknown): WorkerError {
    const message = reason instanceof Error ? reason.message : String(reason);
    if (reason instanceof ContractError) return new WorkerError(rank, method, message, null, true);
    let blame: RankLost | null = null;
    if (reason instanceof RemoteError && reason.detail !== undefined) {
      try {
        const said = checkRankLost(reason.detail, 'blame');
        if (said.rank < this.layout.ulyssesDegree) blame = { ...said, rank: this.layout.meshRanks(rank)[said.rank] };
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
    this.lastStepOf.clear(); // a prepared job's ranks hold no keys and values
    this.keptFrom.clear(); // nor residuals
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
   * One DiT forward pass on the ranks of the pass's group (`forward`), as the job's step cache schedules it (a reuse
   * the ranks hold no residual for is computed), spot-checked now and then where it runs the blocks; a kept forward
   * is remembered in `memory`, for ranks placed later to be given its residual again.
   */
  async executeModel(
    request: ForwardRequest,
    memory?: StepCacheMemory,
  ): Promise<{ output: Tensor; ranks: RankReport[] }> {
    const { pass, step } = request;
    const replayedFrom = this.replayedFor.get(pass) ?? null;
    this.replayedFor.delete(pass);
    // a reuse on ranks that kept no residual and could not be given it again (rebuildResiduals) is computed
    const kept = this.keptFrom.get(pass);
    const recomputed = request.cache === 'reuse' && !kept;
    const cache = recomputed ? 'keep' : request.cache;
    // a reuse is checked by recomputing the forward it reuses first, which needs that one exact
    const checkable = cache !== 'reuse' || kept?.stale === false;
    const checked = checkable && this.world > 1 && this.spotCheckDue(request);
    const { pipeFusion } = this.placement;
    const { output, ranks, magnitudeRatio } = pipeFusion
      ? await this.pipeFusionForward(request, pipeFusion.patches)
      : await this.forward({ ...request, cache }, checked);
    if (cache === 'keep') memory?.kept({ ...request, cache });
    if (cache) {
      this.cacheForwards.push({ step, pass, reused: cache === 'reuse', replayedFrom, recomputed, magnitudeRatio });
    }
    return { output, ranks };
  }

  /**
   * One forward as `request.cache` asks (the blocks run, or a residual reused), spot-checked where `checked`: scatter
   * the tokens, run the group's pipeline stages in turn (one, unless the placement pools memory: the first from the
   * patches, each next from the hidden state the stage before handed on, rank r to rank r), check each rank's rows
   * are the size the plan gives it, gather them in token order.
   */
  private async forward(
    request: ForwardRequest,
    checked: boolean,
  ): Promise<{ output: Tensor; ranks: RankReport[]; magnitudeRatio: number | null }> {
    const { config } = this;
    const layout = this.layout;
    const group = layout.groupForPass(request.pass);
    const plan = planUlysses(config, tokenGrid(config, request.latent.shape).count, layout.headsOf(group));
    const patches = scatterLatent(config, plan, request.latent);
    const { cache } = request;
    const reused = cache === 'reuse';
    // displaced mode's warm-up steps and the first after a placement are exact: stale only where the
    // ranks hold the step before's; a checked forward goes as any other (its checker recomputes it stale).
    // A reused forward exchanges no keys or values
    const stale = !reused && this.stale(request);
    if (!reused) this.lastStepOf.set(request.pass, request.step);
    let handed: HiddenState[] | null = null;
    let ranks: number[] = [];
    let results: ExecuteResult[] = [];
    const reports: RankReport[] = [];
    const stageRuns: StageRun[] = [];
    for (let stage = 0; stage < layout.stages; stage++) {
      const from = handed;
      ranks = layout.stageRanks(group, stage);
      results = await this.stageTurn(request, group, stage, (rank) => ({
        patches: from ? NO_PATCHES : patches[layout.localRank(rank)],
        ...(from && { hidden: from[layout.localRank(rank)] }),
        ...(stale && { stale }),
        ...(cache && { cache }),
      }));
      reports.push(...results.map((r, i) => this.rankReport(ranks[i], r)));
      if (stage < layout.stages - 1) handed = this.handedOn(results, ranks, plan.rows, request.pass);
      stageRuns.push({ stage, ranks, input: from, results });
    }
    this.checkRows(results, ranks, plan.rows);
    const attendedStale = stale && ranks.length > 1; // a group of one rank attends to nothing stale
    // well-formed, finite and plausible, and still wrong: now and then another rank recomputes the pass, stage by
    // stage where it went through stages (a stage's holders alone can), the first stage found wrong convicting
    if (checked) for (const run of stageRuns) await this.spotCheck(request, plan, run, attendedStale);
    if (cache === 'keep') this.keptFrom.set(request.pass, { request, stale: attendedStale });
    const measured = results.map((r) => r.residualRatio);
    const magnitudeRatio = measured.every((m) => m !== undefined)
      ? measured.reduce((n, m) => n + m.sum, 0) / measured.reduce((n, m) => n + m.tokens, 0)
      : null;
    return {
      magnitudeRatio,
      output: gatherLatent(
        config,
        plan,
        results.map((r) => r.rows),
        request.latent.shape,
      ),
      ranks: reports,
    };
  }

  /**
   * PipeFusion (placement.pipeFusion): the tokens cut into patches that follow each other through the stages, so that
   * every stage computes at once, each on another patch, its blocks attending to the patches before of this step and
   * those after of the step before (rank/pipefusion.ts). The warm-up steps, and the first after a placement, go as
   * one patch: exact, filling the stages' keys and values. Nothing is spot-checked (the planner's rate is 0).
   */
  private async pipeFusionForward(
    request: ForwardRequest,
    patches: number,
  ): Promise<{ output: Tensor; ranks: RankReport[]; magnitudeRatio: null }> {
    const { config, layout } = this;
    const group = layout.groupForPass(request.pass);
    const count = this.stale(request) ? patches : 1;
    this.lastStepOf.set(request.pass, request.step);
    const plan = planUlysses(config, tokenGrid(config, request.latent.shape).count, count);
    const flows = scatterLatent(config, plan, request.latent).map(async (input, index) => {
      const patch = { index, count };
      let handed: HiddenState | null = null;
      const runs: { rank: number; result: ExecuteResult }[] = [];
      for (let stage = 0; stage < layout.stages; stage++) {
        const from = handed;
        const [rank] = layout.stageRanks(group, stage);
        const [result] = await this.stageTurn(request, group, stage, () => ({
          patches: from ? NO_PATCHES : input,
          ...(from && { hidden: from }),
          patch,
        }));
        runs.push({ rank, result });
        if (stage < layout.stages - 1) [handed] = this.handedOn([result], [rank], [plan.rows[index]], request.pass);
      }
      return runs;
    });
    const patchRuns = await Promise.all(flows);
    const last = patchRuns.map((runs) => defined(runs.at(-1), 'a stage'));
    this.checkRows(
      last.map((r) => r.result),
      last.map((r) => r.rank),
      plan.rows,
    );
    // a rank's report is its patches' summed
    const reports = new Map<number, RankReport>();
    for (const { rank, result } of patchRuns.flat()) {
      const r = this.rankReport(rank, result);
      const before = reports.get(rank);
      reports.set(rank, before ? summedReports(before, r) : r);
    }
    return {
      output: gatherLatent(
        config,
        plan,
        last.map((r) => r.result.rows),
        request.latent.shape,
      ),
      ranks: [...reports.values()],
      magnitudeRatio: null,
    };
  }

  /**
   * One stage's executeModel of a forward, in the stage's turn: a stage's ranks take the forwards given them one after
   * another, in the order they were given (a guided step's other pass, PipeFusion's next patch, wait their turn); its
   * turn is its group's (with CFG parallel each group's mesh holds the stage).
   */
  private stageTurn(
    request: ForwardRequest,
    group: number,
    stage: number,
    input: (rank: number) => Pick<ExecuteArgs, 'patches' | 'hidden' | 'stale' | 'cache' | 'patch'>,
  ): Promise<ExecuteResult[]> {
    const { layout } = this;
    const ranks = layout.stageRanks(group, stage);
    const shareOf = (rank: number) => this.jobShares[rank] ?? `rank ${rank}`;
    const patch = input(ranks[0]).patch;
    const doing =
      `step ${request.step + 1}${request.pass ? ' (unconditional)' : ''}` +
      (patch && patch.count > 1 ? `, patch ${patch.index + 1} of ${patch.count}` : '');
    const turn = group * layout.stages + stage;
    const staged = layout.stages > 1;
    const call = ((staged && this.stageTurns[turn]) || Promise.resolve()).then(() => {
      for (const rank of ranks) this.showActivity(rank, `${shareOf(rank)}: ${doing}`);
      return this.collectiveRpc('executeModel', {
        ranks,
        args: (rank) => ({
          job: request.job,
          step: request.step,
          pass: request.pass,
          timestep: request.timestep,
          latentShape: request.latent.shape,
          ...input(rank),
        }),
      }).finally(() => {
        for (const rank of ranks) this.showActivity(rank, `${shareOf(rank)}: waiting`);
      });
    });
    if (staged) this.stageTurns[turn] = call.catch(() => {});
    return call;
  }

  /** Each rank's output rows: the size its share of the tokens gives, all finite; else it broke the contract. */
  private checkRows(results: ExecuteResult[], ranks: number[], rows: number[]): void {
    const rowWidth = rowWidthOf(this.config);
    results.forEach((r: ExecuteResult, i) => {
      if (r.rows.length !== rows[i] * rowWidth) {
        throw new WorkerError(
          ranks[i],
          'executeModel',
          `returned ${r.rows.length} values; its share is ${rows[i]}×${rowWidth}`,
          null,
          true,
        );
      }
      // well-formed garbage would go into the latent, the checkpoint and the video (as black)
      if (!r.rows.every(Number.isFinite))
        throw new WorkerError(ranks[i], 'executeModel', 'returned NaN or infinite values', null, true);
    });
  }

  private rankReport(rank: number, r: ExecuteResult): RankReport {
    return {
      rank,
      worker: this.workers[rank]?.id ?? '',
      computeMs: r.computeMs,
      commMs: r.commMs,
      overlapMs: r.overlapMs,
      bytesSent: r.bytesSent,
      peakMemoryBytes: r.peakMemoryBytes,
    };
  }

  /**
   * The hidden states a pipeline stage before the last handed on, each judged before the next stage
   * gets it: one of the rank's share of the tokens, every value finite; else the rank broke the contract.
   */
  private handedOn(results: ExecuteResult[], ranks: number[], rows: number[], pass: number): HiddenState[] {
    return results.map((r, i) => {
      const { hidden } = r;
      const malformed = hidden && hiddenStateError(this.config, hidden, rows[i], this.textRows[pass] ?? 0);
      const wrong = !hidden
        ? 'handed no hidden state on to the next pipeline stage'
        : r.rows.length
          ? 'returned rows, but its pipeline stage hands a hidden state on'
          : malformed && `handed on a malformed hidden state: ${malformed}`;
      if (wrong || !hidden) throw new WorkerError(ranks[i], 'executeModel', wrong || '', null, true);
      return hidden;
    });
  }

  /**
   * Whether this forward attends to stale keys and values (displaced mode past its warm-up, the ranks holding the step
   * before's).
   */
  private stale(request: ForwardRequest): boolean {
    const { settings, warmupSteps, pipeFusion } = this.placement;
    const mode = pipeFusion ? 'pipefusion' : settings.parallel;
    return attendsStale(mode, warmupSteps, request.step, this.lastStepOf.get(request.pass));
  }

  /**
   * Has another rank recompute the pass alone and judges the group's rows by it (spot-check.ts); with pipeline
   * stages, one stage's part of it, from the stage's input, by a rank holding the stage (of any CFG group), judged
   * by the hidden states the stage handed on or its rows. A rank convicted is thrown as a breach (with its co-accused
   * as blame), so the placer lets it go and the step runs again without it. A `stale` forward is recomputed as its
   * group ran it, by a rank of the group: only those hold the step before's keys and values.
   */
  private async spotCheck(request: ForwardRequest, plan: UlyssesPlan, run: StageRun, stale: boolean): Promise<void> {
    const started = performance.now();
    const { config, layout } = this;
    const { ranks, input } = run;
    // a reuse's checker computes the forward it reuses first, for the residual (executeModel checks only exact ones)
    const kept = request.cache === 'reuse' && defined(this.keptFrom.get(request.pass), 'the forward reused').request;
    const args: RecomputeArgs = {
      job: request.job,
      step: request.step,
      pass: request.pass,
      timestep: request.timestep,
      latentShape: request.latent.shape,
      patches: input ? NO_PATCHES : patchify(config, request.latent).data,
      ...(input && { hidden: wholeHiddenState(input) }),
      ...(stale && { stale }),
      ...(kept && {
        cache: 'reuse',
        kept: { step: kept.step, timestep: kept.timestep, patches: patchify(config, kept.latent).data },
      }),
    };
    const holders = stale ? ranks : layout.stageHolders(run.stage);
    const others = Array.from({ length: this.world }, (_, r) => r).filter((r) => !holders.includes(r));
    const rowWidth = rowWidthOf(config);
    const {
      checker,
      third,
      judged: found,
    } = run.stage === layout.stages - 1
      ? await this.judgeRecomputed(
          args,
          ranks,
          others,
          checkedRows(
            plan,
            run.results.map((r) => r.rows),
            rowWidth,
          ),
        )
      : await this.judgeRecomputed(
          args,
          ranks,
          others,
          checkedHiddenStates(
            plan,
            run.results.map((r) => defined(r.hidden, 'a hidden state handed on')),
            { dim: config.dim, textRows: this.textRows[request.pass] ?? 0, stage: run.stage },
          ),
        );
    let judged = found;
    // rows wrong from a tensor one rank sent the others are wrong on every rank: its receipts name who sent it
    let receipts: ExchangeFinding | undefined;
    if (judged.verdict !== 'agreed') {
      receipts = await this.exchangeLie(args, plan, ranks, checker, third).catch((e: unknown) => {
        // a rank whose receipts or recomputation broke the contract lied in them; anything else: the rows decide
        if (!(e instanceof WorkerError && e.breach)) return { rank: null, said: `not asked to the end: ${String(e)}` };
        return { rank: e.rank, said: `its evidence of the checked forward broke the contract: ${e.remoteMessage}` };
      });
      if (receipts.rank !== null) judged = { ...judged, verdict: { convicted: [receipts.rank], why: receipts.said } };
    }
    this.spotChecks.push({
      step: request.step,
      pass: request.pass,
      ...(layout.stages > 1 && { stage: run.stage }),
      checker,
      third,
      ...judged,
      ...(receipts && { receipts: receipts.said }),
      ms: performance.now() - started,
    });
    if (judged.verdict === 'agreed') return;
    // two convicted: no judgement said which of the two lied (a checker may lie about the rank it checks)
    const [convicted, alsoConvicted] = judged.verdict.convicted as [number, number?];
    const blame: RankLost | null =
      alsoConvicted === undefined
        ? null
        : {
            rank: alsoConvicted,
            cause: 'misbehaved',
            evidence: `a spot check of step ${request.step + 1}: ${judged.verdict.why}`,
          };
    throw new SpotCheckFailed(
      convicted,
      `step ${request.step + 1}${request.pass ? ' (unconditional)' : ''}: ${judged.verdict.why}`,
      blame,
      alsoConvicted !== undefined,
    );
  }

  /**
   * The group's `outputs` judged by a recomputation of a rank drawn from those not `out` and, where they disagree, a
   * third's (judgeOutputs); a recomputation that is not one of every token is a breach of its rank.
   */
  private async judgeRecomputed<T>(
    args: RecomputeArgs,
    ranks: number[],
    out: number[],
    outputs: CheckedOutputs<T>,
  ): Promise<{ checker: number; third: number | null; judged: Pick<SpotCheck, 'difference' | 'verdict'> }> {
    const recompute = async (rank: number) => {
      // judged as every call is: a checker whose engine moves is waited for, however slow
      const [reply] = await this.collectiveRpc('recompute', { args, ranks: [rank] });
      const taken = outputs.take(reply);
      if ('wrong' in taken) throw new WorkerError(rank, 'recompute', taken.wrong, null, true);
      return { rank, output: taken.output };
    };
    const checker = await recompute(defined(pickChecker(this.world, out), 'a rank to recompute'));
    const { tolerance } = this.placement.spotChecks;
    const judged = judgeOutputs(ranks, outputs, checker, null, tolerance);
    if (judged.verdict === 'agreed') return { checker: checker.rank, third: null, judged };
    // a rank independent of both the checker and the suspect decides
    const third = pickChecker(this.world, [checker.rank, judged.verdict.convicted[0], ...out]);
    if (third === null) return { checker: checker.rank, third, judged };
    return {
      checker: checker.rank,
      third,
      judged: judgeOutputs(ranks, outputs, checker, await recompute(third), tolerance),
    };
  }

  /**
   * The rank whose signed tensors made its Ulysses group's rows wrong, where the receipts of its exchanges name one
   * (exchange-evidence.ts) against a recomputation of them that two ranks make alike: the checker and the third
   * first, then ranks drawn from the CSPRNG. Only for an exact forward of a group of tabs on WASM, recomputed by
   * tabs on WASM: the receipts are digests, and only ranks that compute bit for bit alike send the same bytes.
   * WebGPU's kernels do not, nor a worker process's (native kernels, or Node's build of onnxruntime-web's WASM): an
   * honest process's tensors would differ from a tab's recomputation and name it.
   */
  private async exchangeLie(
    args: RecomputeArgs,
    plan: UlyssesPlan,
    ranks: number[],
    checker: number,
    third: number | null,
  ): Promise<ExchangeFinding> {
    const wasm = (rank: number) => {
      const worker = this.workers.at(rank);
      return worker?.ep === 'wasm' && (worker.kind ?? 'tab') === 'tab';
    };
    // displaced mode exchanges keys and values its recomputation does not: its receipts would prove nothing
    const not = (why: string) => ({ rank: null, said: `not asked: ${why}` });
    if (this.placement.settings.parallel !== 'ulysses') return not('displaced mode');
    if (this.layout.stages > 1) return not('pipeline stages');
    if (args.stale || args.cache) return not("a step cache's forward");
    if (!ranks.every(wasm)) return not('ranks not all tabs on WASM');
    const forward = { job: args.job, step: args.step, pass: args.pass };
    const evidence = await this.collectiveRpc('exchangeEvidence', { args: forward, ranks });
    const judges = [checker, ...(third === null ? [] : [third])];
    for (let next = pickChecker(this.world, judges); next !== null; next = pickChecker(this.world, judges))
      judges.push(next);
    const tables: Map<string, string>[] = [];
    let truth: Map<string, string> | undefined;
    for (const rank of judges.filter(wasm)) {
      const [{ received }] = await this.collectiveRpc('recomputeExchanges', {
        args: { ...args, heads: plan.heads, headGroups: plan.headGroups },
        ranks: [rank],
      });
      const table = trueDigests(received);
      truth = tables.find((t) => sameDigests(t, table));
      if (truth) break;
      tables.push(table);
    }
    if (!truth) return { rank: null, said: `no two of ${tables.length} recomputations of the exchanges agreed` };
    const publicKeys = ranks.map((r) => this.signingKeys[r].publicKey);
    const verdict = judgeExchanges(
      forward,
      truth,
      evidence.map((e) => e.receipts),
      publicKeys,
    );
    if (!verdict) return { rank: null, said: 'every receipt was as recomputed: the rows decide' };
    const sender = verdict.senders.at(0);
    if (sender !== undefined)
      return {
        rank: ranks[sender],
        said:
          `it sent its peers ${verdict.where} other than its group's recomputed exchanges give, signed ` +
          '(their receipts prove it), and every rank computed its rows from them',
      };
    return { rank: ranks[verdict.forgers[0]], said: 'it kept a receipt of a tensor its sender never signed' };
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
    const modes = this.cacheModes(at, passes);
    if (modes) await this.rebuildResiduals(at.step, modes, memory);
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

  /**
   * A reuse needs the residual its pass's ranks kept; where this placement's kept none (it was placed since), the
   * pass's last kept forward runs again on them first, which gives them the residual the job's ranks had. One pass
   * after the other, before this step's forwards: a rank refuses an exchange of a step older than one it has begun.
   */
  private async rebuildResiduals(step: number, modes: CacheMode[], memory: StepCacheMemory | undefined) {
    for (const [pass, mode] of modes.entries()) {
      const replay = mode === 'reuse' && !this.keptFrom.has(pass) ? memory?.lastKept(pass, step) : undefined;
      if (!replay) continue;
      await this.forward(replay, false);
      this.replayedFor.set(pass, replay.step);
    }
  }

  /** Each pass's forward of this step, as the placement's step cache schedules it; undefined without one. */
  private cacheModes(at: Omit<ForwardRequest, 'pass'>, passes: 1 | 2): CacheMode[] | undefined {
    const placed = this.placement.cache;
    if (!placed) return undefined;
    const steps = defined(at.steps, "the job's steps, which a step cache's schedule is made for");
    return cacheSchedule(placed.curve, placed.settings, steps, passes)[at.step];
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
