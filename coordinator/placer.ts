// Carries out the planner's placements (planner.ts): waits for the workers a job needs, runs the
// rehearsals the planner asks for, keeps the executor of the current placement while the next job's
// placement is the same, probes a new placement's mesh, and after a lost worker places the job again
// through the planner. It decides nothing itself. A worker lost in any phase (rehearsal, initWorker,
// loadModel, prepareJob, the mesh probe, a step, a text encoder run, a VAE tile) goes through one rule
// (Placer.lose, then Placer.onLive): a re-placement from the job's MAX_REPLANS on the live workers,
// and the job fails only where nothing can be placed, saying who was lost, why, and why.
import type { LoraRef } from '../core/model/lora.ts';
import type { WanConfig } from '../core/model/config.ts';
import { MISSING_PARTS, MissingPart } from '../core/model/wan-pipeline.ts';
import { defined } from '../core/defined.ts';
import { fitMeshProbe, type LinkSpeed } from '../core/cost-model.ts';
import { passesPerStep, type JobParams } from '../core/job.ts';
import { bytesPerElement } from '../core/net/protocol.ts';
import { evenHeads } from '../core/parallel.ts';
import type { MeshProbe, WeightType } from '../core/worker-api.ts';
import { createExecutor } from './backends.ts';
import type { Executor, LostRank, RankReport } from './executor.ts';
import { Measurements } from './measurements.ts';
import { samePlacement, type PlacementRequest, type ResolvedPlacement } from './placement.ts';
import {
  checkRequest,
  groupOf,
  placeTextLayers,
  placeVaeTiles,
  planPlacement,
  placedStepCache,
  rehearsalsNeeded,
  runOf,
  timeoutsOf,
  workersToWaitFor,
  type PlannerContext,
  type PlanningInput,
  type RehearsalNeeded,
} from './planner.ts';
import { judgeShares, shouldRebalance, type SharesJudgement } from './rebalance.ts';
import { stagedModel, wholeModelBytes } from './stage-plan.ts';
import type { Swarm, SwarmWorker } from './swarm.ts';

/** A job's shares changed mid-job because a worker was slower than its share (coordinator/rebalance.ts). */
export interface RebalanceRecord {
  /** the first step (from 0) on the new shares */
  step: number;
  /** each rank's heads before and after */
  headsBefore: number[];
  headsAfter: number[];
  /** each rank's compute ms in the step that decided it */
  computeMs: number[];
  /** the step's compute time before over after, as the measured speeds predicted */
  predictedGain: number;
  replanMs: number;
}

/** Where in a job workers were lost: placing is rehearsals, initWorker, loadModel, prepareJob and the mesh probe. */
export type LossPhase = 'encoding' | 'placing' | 'denoising' | 'decoding';

/** How a lost worker was noticed and what the re-placement cost. */
export interface FailureRecord {
  phase: LossPhase;
  /** the step the job was at: while denoising the interrupted one (from 0), before it the first to run */
  step: number;
  error: string;
  lost: LostRank[];
  /** when the failure was seen (ms since the epoch) */
  detectedAt: number;
  /**
   * ranks before and after; outside the steps (a rehearsal, a text encoder run, a VAE tile) the workers the phase
   * ran on before and those it could go on with after
   */
  degreeBefore: number;
  degreeAfter: number;
  replanMs: number;
  /**
   * where a rank was caught returning wrong rows (a spot check), the step the job went back to:
   * the first its rows went into (null: only the interrupted step runs again)
   */
  rerunFromStep?: number | null;
}

/** A lost worker costs a re-placement; after this many in one job, the job fails. */
export const MAX_REPLANS = 8;

/** The job lost workers more often than MAX_REPLANS allows; `cause` is the last failure, as it came. */
export class ReplacementsExhausted extends Error {
  override name = 'ReplacementsExhausted';
  constructor(
    readonly lost: LostRank[],
    cause: Error,
  ) {
    super(`${cause.message} (gave up after ${MAX_REPLANS} re-placements in this job)`, { cause });
  }
}

export type MeshProbeReport = { ranks: MeshProbe[]; link: LinkSpeed } | { error: string } | null;

export interface PlacerOptions extends Omit<PlannerContext, 'config'> {
  /**
   * the folder's transformer; null where it has none: the placer then serves the text encoder's and the VAE's work
   * on the workers, and refuses to place a job (MissingPart)
   */
  config: WanConfig | null;
  swarm?: Swarm;
  /** how long a placement waits for the workers it needs */
  placementTimeoutMs?: number;
}

/** Where in the job a failure came. */
interface JobPoint {
  phase: LossPhase;
  step: number;
}

/** A failure that lost workers, not yet recovered from. */
interface Loss extends JobPoint {
  error: Error;
  lost: LostRank[];
  detectedAt: number;
  degreeBefore: number;
  rerunFromStep?: number | null;
}

/** plans made before a placement whose workers all stayed live is given up on */
const MAX_PLAN_ATTEMPTS = 3;
/** rounds of engine checks before a placement: each lets go the workers whose engines hang */
const MAX_ENGINE_CHECK_ROUNDS = 3;

export class Placer {
  private executor: Executor | null = null;
  /** the placement lost a rank: the next job places afresh instead of failing on the gone rank */
  // Stryker disable next-line BooleanLiteral: placeOn sets it before anything reads it
  private lostARank = false;
  // Stryker disable next-line BooleanLiteral: placeOn sets it before anything reads it
  private probed = false;
  /** the swarm's (kept across its workers' reloads, and the dashboard's where it keeps them), else this placer's */
  private readonly measurements: Measurements;
  /** the rehearsals run ahead of any job (rehearseAhead): a placement waits for them, then finds them timed */
  private rehearsingAhead: Promise<void> = Promise.resolve();
  private prepared: {
    job: number;
    texts: Float32Array[];
    shape: number[];
    params: JobParams;
    request: PlacementRequest;
  } | null = null;
  /**
   * the job's losses: re-placements spent, those recorded, the one being recovered from (a re-placement on the live
   * workers settles it), and who hears of each
   */
  private job: {
    replans: number;
    step: number;
    failures: FailureRecord[];
    pending: (Loss & { started: number }) | null;
    onFailure?: (f: FailureRecord) => void;
    /** each step's judgement on the current placement of its shares by measured speed (rebalance) */
    judged: SharesJudgement[];
    rebalances: RebalanceRecord[];
  } = { replans: 0, step: 0, failures: [], pending: null, judged: [], rebalances: [] };
  /** why and when each worker left the swarm: the evidence of a worker lost outside an executor */
  private readonly departures = new WeakMap<SwarmWorker, { reason: string; silentMs: number }>();
  private readonly offLeave: (() => void) | undefined;

  /** What the planner is told of the pipeline: the placer's options, with the transformer a placed job needs. */
  private get planning(): PlacerOptions & PlannerContext {
    const { config } = this.options;
    if (!config) throw new MissingPart(MISSING_PARTS.transformer);
    return { ...this.options, config };
  }

  constructor(private readonly options: PlacerOptions) {
    this.measurements = options.swarm?.measurements ?? new Measurements();
    if (options.backend === 'swarm' && !options.swarm)
      throw new Error('the swarm backend needs a Swarm: pass one from openSwarm()');
    this.offLeave = options.swarm?.on((e) => {
      if (e.type === 'leave') this.departures.set(e.worker, { reason: e.reason, silentMs: e.silentMs });
    });
  }

  /** The executor of the current placement, if any. */
  get current(): Executor | null {
    return this.executor;
  }

  /**
   * A new job: MAX_REPLANS re-placements to spend on workers it loses, from `step` (a resumed job's); `onFailure`
   * hears of each loss once the job is placed again after it.
   */
  startJob({ step = 0, onFailure }: { step?: number; onFailure?: (f: FailureRecord) => void } = {}): void {
    this.job = { replans: 0, step, failures: [], pending: null, onFailure, judged: [], rebalances: [] };
  }

  /** The job's changes of shares, in order. */
  get rebalances(): RebalanceRecord[] {
    return [...this.job.rebalances];
  }

  /** The workers the job lost so far, in every phase, as they were seen. */
  get failures(): FailureRecord[] {
    return [...this.job.failures].sort((a, b) => a.detectedAt - b.detectedAt);
  }

  /**
   * Places a job: keeps the current placement if the planner places it the same, else places anew; a worker lost
   * while rehearsing, in initWorker or in loadModel costs a re-placement on the live workers.
   */
  async place(
    params: JobParams,
    request: PlacementRequest,
  ): Promise<{ executor: Executor; placement: ResolvedPlacement }> {
    this.options.swarm?.accusations.newJob(); // a worker set aside in the last job is placed again
    this.prepared = null;
    const at: JobPoint = { phase: 'placing', step: this.job.step };
    const placement = await this.onLive(
      () => this.planOnLive(params, request, at),
      (p) => p.layout.world,
    );
    const current = this.executor;
    if (current && !this.lostARank && samePlacement(current.placement, placement))
      current.placement = placement; // the same decisions, with this job's prediction
    else await this.placeLive(params, request, at, placement);
    const executor = defined(this.executor, 'the placement');
    return { executor, placement: executor.placement };
  }

  /**
   * Gives the ranks the job; on a placement of several ranks not yet probed, times an all-to-all on
   * its mesh first: the link the cost model plans the next jobs with. A rank lost in either costs a
   * re-placement; a probe that failed otherwise costs nothing.
   */
  async prepare(
    job: number,
    texts: Float32Array[],
    shape: number[],
    params: JobParams,
    request: PlacementRequest,
  ): Promise<MeshProbeReport> {
    defined(this.executor, 'a placement (call place() first)');
    this.prepared = { job, texts, shape, params, request };
    const at: JobPoint = { phase: 'placing', step: this.job.step };
    const loss = await this.prepareRanks(at);
    if (loss) {
      this.lose(loss);
      await this.placeLive(params, request, at, null, loss.degreeBefore); // prepares the job there
    }
    for (;;) {
      const executor = defined(this.executor, 'the placement');
      // one rank (the local backend's too) has no mesh
      if (executor.layout.ulyssesDegree < 2 || this.probed) return null;
      this.probed = true;
      try {
        const ranks = await executor.probeMesh(job);
        const fits = ranks.map(fitMeshProbe);
        const link = {
          bandwidth: Math.min(...fits.map((f) => f.bandwidth)),
          latency: Math.max(...fits.map((f) => f.latency)),
        };
        this.measurements.meshLink = link;
        return { ranks, link };
      } catch (e) {
        const lost = await this.lossOf(executor, e as Error, at).catch(() => null);
        if (!lost) return { error: (e as Error).message };
        // the new placement is probed before the job goes on
        this.lose(lost);
        await this.placeLive(params, request, at, null, lost.degreeBefore);
      }
    }
  }

  /**
   * A lost rank costs one step, not the job: let the survivors go, have the planner place the job
   * again on the live workers (never more ranks than before; its CFG groups, shares and mode where
   * they still pay) and prepare it there. Null when the failure was not a lost rank, so trying again
   * would not help; an error when the job has used up its MAX_REPLANS or no worker is left.
   * `rerunFromStep`: where a spot check caught the rank, the step the job goes back to.
   */
  async replace(error: Error, step: number, rerunFromStep: number | null = null): Promise<FailureRecord | null> {
    const detectedAt = Date.now();
    const before = defined(this.executor, 'a placement (call place() first)');
    const lost = await before.lostRanks(error);
    const prepared = this.prepared;
    if (!lost.length || !prepared) return null;
    const loss: Loss = { phase: 'denoising', step, error, lost, detectedAt, degreeBefore: before.world, rerunFromStep };
    this.lose(loss);
    // the loss is recorded first, by the re-placement that settles it
    const recorded = this.job.failures.length;
    await this.placeLive(prepared.params, prepared.request, loss, null, before.world);
    return this.job.failures[recorded];
  }

  /**
   * After a step (`ranks`, its reports), before step `step` (from 0): where a rank computed its share markedly
   * slower than the others, step after step (rebalance.ts), the measured speeds become the group's forwards and the
   * job is placed again on the same workers, its shares by those speeds. The record where it was; null where the
   * shares stay. Only Ulysses exchanges of one group share by speed: a displaced rank's keys and values of the step
   * before are its own heads', CFG groups share alike (the planner's unevenPlan), pipeline stages are cut by blocks.
   */
  async rebalance(step: number, ranks: readonly RankReport[]): Promise<RebalanceRecord | null> {
    const executor = this.executor;
    const prepared = this.prepared;
    if (!executor || !prepared || this.options.backend !== 'swarm') return null;
    const { layout, settings } = executor.placement;
    if (layout.cfgGroups !== 1 || layout.stages !== 1 || layout.ulyssesDegree < 2 || settings.parallel !== 'ulysses')
      return null;
    if (prepared.request.shares === 'even' || ranks.length !== layout.world) return null;
    const even = evenHeads(this.planning.config.numHeads, layout.ulyssesDegree);
    const heads = layout.heads?.[0] ?? even;
    const computeMs = [...ranks].sort((a, b) => a.rank - b.rank).map((r) => r.computeMs);
    const judged = judgeShares(heads, computeMs);
    this.job.judged.push(judged);
    const stepsLeft = prepared.params.steps - step;
    if (!shouldRebalance(this.job.judged, this.job.rebalances.length, stepsLeft)) return null;
    const started = performance.now();
    // each worker's forward at an even share, as the steps measured it: what the planner shares heads by
    const passes = passesPerStep(prepared.params);
    this.measurements.setRehearsal(
      groupOn(this.planning, prepared.params, executor),
      layout.ulyssesDegree,
      computeMs.map((ms, r) => (ms / passes / heads[r]) * (even[r] / 1000)),
    );
    const at: JobPoint = { phase: 'denoising', step };
    // a plan that cannot be made (one untrusted worker alone, say) leaves the job as it is: slow, not stopped
    const planned = await this.planOnLive(
      prepared.params,
      { ...prepared.request, shares: 'speed' },
      at,
      layout.world,
    ).catch(() => null);
    if (!planned || samePlacement(executor.placement, planned)) {
      this.job.judged = [];
      return null;
    }
    await this.placeLive(prepared.params, prepared.request, at, planned, layout.world);
    const after = defined(this.executor, 'the placement').layout;
    const record: RebalanceRecord = {
      step,
      headsBefore: heads,
      headsAfter: after.heads?.[0] ?? evenHeads(this.planning.config.numHeads, after.ulyssesDegree),
      computeMs,
      predictedGain: judged.gain,
      replanMs: performance.now() - started,
    };
    this.job.rebalances.push(record);
    return record;
  }

  /**
   * The one rule of a lost worker, whatever the phase: it costs one of the job's MAX_REPLANS
   * re-placements, and is recorded once the job is placed again on the live workers (onLive). Past
   * MAX_REPLANS the job fails with the last failure.
   */
  private lose(loss: Loss): void {
    const pending = this.job.pending;
    // workers lost together, before the job could be placed again, cost one re-placement
    if (pending) pending.lost.push(...loss.lost.filter((l) => !pending.lost.some((p) => p.worker === l.worker)));
    else if (this.job.replans >= MAX_REPLANS) throw new ReplacementsExhausted(loss.lost, loss.error);
    else {
      this.job.replans++;
      this.job.pending = { ...loss, started: performance.now() };
    }
  }

  /**
   * Places work on the live workers (`place`); after a loss, this is its re-placement: recorded with the degree it
   * placed, or, where nothing could be placed, the job's failure, saying who was lost, why, and why nothing could be.
   */
  private async onLive<T>(place: () => Promise<T>, degreeOf: (placed: T) => number): Promise<T> {
    let placed: T;
    try {
      placed = await place();
    } catch (e) {
      const loss = this.job.pending;
      this.job.pending = null;
      if (!loss || e instanceof ReplacementsExhausted) throw e;
      const what = loss.lost.map((l) => `rank ${l.rank} (worker ${l.worker}: ${l.cause}, ${l.evidence})`).join(', ');
      const where = {
        encoding: 'while encoding the prompt',
        placing: 'while placing the job',
        denoising: `in step ${loss.step + 1}`,
        decoding: 'while decoding the video',
      }[loss.phase];
      const message = `lost ${what} ${where}, and the job could not be placed again: ${(e as Error).message}`;
      // the job failed of the lost worker; why placing it again failed is in the message
      // eslint-disable-next-line preserve-caught-error -- the cause is the loss, not the failed re-placement
      throw new Error(message, { cause: loss.error });
    }
    const loss = this.job.pending;
    if (loss) {
      this.job.pending = null;
      const { started, error, ...seen } = loss;
      const record: FailureRecord = {
        ...seen,
        error: error.message,
        degreeAfter: degreeOf(placed),
        replanMs: performance.now() - started,
      };
      this.job.failures.push(record);
      this.job.onFailure?.(record);
    }
    return placed;
  }

  /**
   * Carries out a placement of the job, the current one's or, after a loss, one the planner makes
   * on the live workers with no more ranks than `maxWorld`: its ranks initialized and loaded and,
   * once prepared, the job prepared on them. A rank lost on the way costs another re-placement.
   */
  private async placeLive(
    params: JobParams,
    request: PlacementRequest,
    at: JobPoint,
    planned: ResolvedPlacement | null,
    maxWorld?: number,
  ): Promise<void> {
    for (let placement = planned; ; placement = null) {
      placement ??= await this.onLive(
        () => this.planOnLive(params, request, at, maxWorld),
        (p) => p.layout.world,
      );
      const loss = (await this.placeOn(placement, at)) ?? (await this.prepareRanks(at));
      if (!loss) return;
      this.lose(loss);
      maxWorld = placement.layout.world;
    }
  }

  /** The prepared job given to the current placement's ranks; where that lost a rank, the loss. */
  private async prepareRanks(at: JobPoint): Promise<Loss | null> {
    const executor = defined(this.executor, 'a placement');
    const prepared = this.prepared;
    if (!prepared) return null;
    try {
      await executor.prepareJob(prepared.job, prepared.texts, prepared.shape);
      return null;
    } catch (e) {
      return this.lossOf(executor, e as Error, at);
    }
  }

  /** A failed call of `executor`'s as a loss, its lost ranks judged by the executor; the error where none was. */
  private async lossOf(executor: Executor, error: Error, at: JobPoint): Promise<Loss> {
    const detectedAt = Date.now();
    const degreeBefore = executor.layout.world;
    const lost = await executor.lostRanks(error);
    if (!lost.length) throw error;
    return { ...at, error, lost, detectedAt, degreeBefore };
  }

  /**
   * The planner's placement on workers still live once it is made: a worker that left while the
   * placement was rehearsed and planned (refused, let go, closed) has it planned again without it.
   */
  private async planOnLive(params: JobParams, request: PlacementRequest, at: JobPoint, maxWorld?: number) {
    for (let attempt = 1; ; attempt++) {
      const placement = await this.plan(params, request, at, maxWorld);
      const live = new Set(this.options.swarm?.workers().map((w) => w.id));
      if (!this.options.swarm || placement.workers.every((w) => live.has(w.id)) || attempt === MAX_PLAN_ATTEMPTS)
        return placement;
    }
  }

  /**
   * What a job would cost on the live workers as they are now, before it is queued (estimate.ts): the step the cost
   * model predicts for the plan the planner would place, or why it predicts none; and the weight bytes a rank of that
   * plan reads where some does not hold the model (each worker's pulse says which model its engine holds).
   */
  forecast(params: JobParams, request: PlacementRequest): { stepMs: number | string; loadBytes: number } {
    const swarm = this.options.swarm;
    if (this.options.backend !== 'swarm' || !swarm)
      return { stepMs: 'a job in this tab (the local backend) is not predicted', loadBytes: 0 };
    try {
      const workers = eligible(swarm);
      if (!workers.length) return { stepMs: 'no worker has joined yet', loadBytes: 0 };
      const waitFor = workersToWaitFor(this.planning, request, params);
      if (waitFor > workers.length)
        return { stepMs: `the job waits for ${waitFor} workers, and ${workers.length} have joined`, loadBytes: 0 };
      const trusted = new Set(workers.filter((w) => swarm.isTrusted(w)).map((w) => w.id));
      const placed = planPlacement(this.planning, {
        params,
        request,
        workers,
        measurements: this.measurements,
        trusted,
      });
      const holds = new Set(workers.filter((w) => w.pulse?.holds === placed.modelUrl).map((w) => w.id));
      const loads =
        placed.stages || placed.loras.length || placed.weightType || placed.workers.some((w) => !holds.has(w.id));
      const bytes = placed.stages?.map((s) => s.heldBytes) ?? [wholeModelBytes(stagedModel(this.planning.config))];
      return {
        stepMs: placed.prediction?.predictedStepMs ?? 'the workers are not measured yet',
        loadBytes: loads ? Math.max(...bytes) : 0,
      };
    } catch (e) {
      return { stepMs: (e as Error).message, loadBytes: 0 };
    }
  }

  /**
   * The planner's placement of a job on the live workers, once the workers it needs have joined and are measured. A
   * worker lost while rehearsing costs a re-placement: it is left out and the plan made on the rest.
   */
  private async plan(
    params: JobParams,
    request: PlacementRequest,
    at: JobPoint,
    maxWorld?: number,
  ): Promise<ResolvedPlacement> {
    const swarm = this.options.swarm;
    const input = (workers: SwarmWorker[], rehearsalError?: string): PlanningInput<SwarmWorker> => ({
      params,
      request,
      workers,
      measurements: this.measurements,
      maxWorld,
      rehearsalError,
      trusted: new Set(workers.filter((w) => swarm?.isTrusted(w)).map((w) => w.id)),
    });
    if (this.options.backend !== 'swarm' || !swarm) return planPlacement(this.planning, input([]));
    // checked before waiting: an invalid request fails at once
    const { loras } = checkRequest(request);
    placedStepCache(this.planning, request);
    const waitFor = workersToWaitFor(this.planning, request, params);
    const workers = await this.liveWorkers(maxWorld === undefined ? waitFor : 1);
    if (maxWorld === undefined) await swarm.measuredNow(request.ep);
    let rehearsalError: string | undefined;
    // a re-placement predicts from what was rehearsed before: recovery does not wait for rehearsals
    if (maxWorld === undefined) {
      await this.rehearsingAhead;
      for (const needed of rehearsalsNeeded(this.planning, input(workers))) {
        const failed = await this.rehearse(needed, params, loras, request.weightType);
        if (!failed) continue;
        const lost = await this.lostWorkers(needed.workers, failed.workers);
        if (!lost.length) {
          rehearsalError = failed.error.message;
          break;
        }
        this.lose({ ...at, error: failed.error, lost, detectedAt: failed.detectedAt, degreeBefore: workers.length });
        // planned afresh on the rest where they are enough for what the job asks, else as a re-placement is
        const enough = swarm.workers().length >= waitFor;
        return this.onLive(
          () => this.plan(params, request, at, enough ? undefined : workers.length),
          (p) => p.layout.world,
        );
      }
    }
    return planPlacement(this.planning, input(workers, rehearsalError));
  }

  /**
   * Rehearses, while no job runs, what a job of `params` would need on the workers measured now (issue 66): the first
   * job placed then finds its forwards timed, as every later one does, instead of timing them while its person waits.
   * A rehearsal that fails here costs nothing: the job's placement rehearses again, and judges the workers then.
   */
  rehearseAhead(params: JobParams, request: PlacementRequest): Promise<void> {
    const swarm = this.options.swarm;
    if (this.options.backend !== 'swarm' || !swarm) return Promise.resolve();
    const run = this.rehearsingAhead.then(async () => {
      const { loras } = checkRequest(request);
      const workers = eligible(swarm);
      if (workers.length < workersToWaitFor(this.planning, request, params)) return;
      const trusted = new Set(workers.filter((w) => swarm.isTrusted(w)).map((w) => w.id));
      const input = { params, request, workers, measurements: this.measurements, trusted };
      for (const needed of rehearsalsNeeded(this.planning, input)) {
        const failed = await this.rehearse(needed, params, loras, request.weightType);
        if (failed) throw failed.error;
      }
    });
    this.rehearsingAhead = run.catch(() => {});
    return run;
  }

  /**
   * A group's forward rehearsed at the degrees asked, all its workers at once as in the job (rank/rehearsal.ts),
   * on the model with the job's adapters and weight type (so that the job finds it loaded); where it failed, the
   * workers whose rehearsal failed and the first error.
   */
  private async rehearse(
    { group, workers, degrees }: RehearsalNeeded<SwarmWorker>,
    params: JobParams,
    loras: LoraRef[],
    weightType: WeightType | undefined,
  ): Promise<{ workers: SwarmWorker[]; error: Error; detectedAt: number } | null> {
    const swarm = defined(this.options.swarm, 'the swarm');
    const { modelUrl, textTokens } = this.options;
    workers.forEach((w) => swarm.setActivity(w, `rehearsing the job's forward (degree ${degrees.join(', ')})`));
    try {
      // a cold engine warms up in its first rehearsal: warmed up first, all of them, no worker's forwards are timed
      // while another's warm-up takes the cores they share (a preload is the same load and warm-up, and is nothing to
      // an engine already warm; a job of another EP or adapters than a preload's warms up in the rehearsal)
      if (
        workers.length > 1 &&
        !loras.length &&
        !weightType &&
        (group.ep === 'auto' || workers.every((w) => w.measurement?.auto.ep === group.ep))
      )
        await Promise.allSettled(
          workers.map((w) => w.api.preload({ modelUrl }, timeoutsOf(this.options.rpcTimeoutMs).loadMs)),
        );
      const replies = await Promise.allSettled(
        workers.map((w) =>
          w.api.rehearse(
            {
              modelUrl,
              ep: group.ep,
              latentShape: group.shape,
              textTokens,
              degrees,
              forwards: params.steps * passesPerStep(params),
              ...(loras.length && { loras }),
              ...(weightType && { weightType }),
            },
            timeoutsOf(this.options.rpcTimeoutMs).loadMs,
          ),
        ),
      );
      const failed = replies.flatMap((r, i) => (r.status === 'rejected' ? [[workers[i], r.reason] as const] : []));
      if (failed.length)
        return { workers: failed.map(([w]) => w), error: failed[0][1] as Error, detectedAt: Date.now() };
      const forwards = replies.map((r) => (r.status === 'fulfilled' ? r.value.forwardMs : []));
      degrees.forEach((d, i) =>
        this.measurements.setRehearsal(
          group,
          d,
          forwards.map((f) => f[i] / 1000),
        ),
      );
      return null;
    } finally {
      workers.forEach((w) => swarm.setActivity(w, null));
    }
  }

  /**
   * Which of `suspects` (workers of `among`, numbered by their place there) are lost, on the
   * coordinator's own evidence as an executor judges its ranks (swarm-executor.ts: lostRanks): they
   * left the swarm, or do not answer a ping within the swarm's silence limit (those are let go).
   */
  private async lostWorkers(among: SwarmWorker[], suspects: SwarmWorker[]): Promise<LostRank[]> {
    const swarm = defined(this.options.swarm, 'the swarm');
    const judged = await Promise.all(
      suspects.map(async (w): Promise<LostRank | null> => {
        const rank = among.indexOf(w);
        const left = this.departures.get(w);
        if (left || !swarm.workers().includes(w)) {
          const { reason, silentMs } = left ?? { reason: 'it left the swarm', silentMs: 0 };
          return { rank, worker: w.id, cause: silentMs > 0 ? 'silent' : 'disconnected', evidence: reason, silentMs };
        }
        const started = Date.now();
        // as an executor confirms a silent rank: within the silence the machine's load allows now
        const pingMs = swarm.silenceLimitMs();
        const answers = await w.api.ping({}, pingMs).then(
          () => true,
          () => false,
        );
        if (answers) return null;
        const evidence = `did not answer a ping within ${(pingMs / 1000).toFixed(1)} s`;
        swarm.evict(w, evidence);
        return { rank, worker: w.id, cause: 'silent', evidence, silentMs: Date.now() - started };
      }),
    );
    return judged.filter((l) => l !== null);
  }

  /**
   * A worker whose text encoder run or VAE tile failed (`among`: the workers the phase ran on): where it is lost, it
   * costs a re-placement as a lost rank does (true); false where it is not, and the failure is not a lost worker's.
   * The text encoder's layers left go to the live workers the next textLayers gives, which records the loss; a lost
   * worker's VAE tiles go back to the queue the others decode from, so the loss is recorded at once.
   */
  async lostOutsideSteps(
    phase: 'encoding' | 'decoding',
    worker: SwarmWorker,
    among: SwarmWorker[],
    error: Error,
  ): Promise<boolean> {
    const detectedAt = Date.now();
    const lost = await this.lostWorkers(among, [worker]);
    if (!lost.length) return false;
    const step = phase === 'decoding' ? (this.prepared?.params.steps ?? this.job.step) : this.job.step;
    this.lose({ phase, step, error, lost, detectedAt, degreeBefore: among.length });
    if (phase === 'decoding')
      await this.onLive(
        () => Promise.resolve(among.length - lost.length),
        (n) => n,
      );
    return true;
  }

  /**
   * The median step of a job that ran on the current placement from its start to its end: the
   * planner's prediction of that plan for the next jobs of the shape on these workers.
   */
  measuredStep(params: JobParams, medianStepMs: number): void {
    const executor = this.executor;
    if (!executor || this.options.backend !== 'swarm' || !(medianStepMs > 0)) return;
    const { layout, settings } = executor.placement;
    // a staged job's step is no plan the planner weighs against the others (it has no prediction)
    if (layout.stages !== 1) return;
    const plan = {
      ulyssesDegree: layout.ulyssesDegree,
      cfgParallel: layout.cfgParallel,
      heads: layout.heads?.[0],
      mode: settings.parallel,
    };
    this.measurements.recordStep(
      groupOn(this.planning, params, executor),
      runOf(plan, bytesPerElement(settings.dtype)),
      medianStepMs / 1000,
    );
  }

  /**
   * The text encoder's layers [from, numLayers) on the live workers, as the planner shares them (waits for one
   * worker): after a lost worker, its re-placement.
   */
  async textLayers(numLayers: number, from = 0): Promise<{ host: SwarmWorker; from: number; to: number }[]> {
    return this.onLive(
      async () =>
        placeTextLayers(await this.liveWorkers(1), numLayers - from).map(({ worker, from: start, to }) => ({
          host: worker,
          from: from + start,
          to: from + to,
        })),
      (runs) => runs.length,
    );
  }

  /**
   * The workers to decode the VAE's tiles on and the buffer they all allow (waits for one worker): after a lost
   * worker, its re-placement.
   */
  async vaeTiles(): Promise<{ hosts: SwarmWorker[]; maxBufferBytes: number }> {
    return this.onLive(
      async () => placeVaeTiles(await this.liveWorkers(1), this.measurements),
      (placed) => placed.hosts.length,
    );
  }

  /**
   * Lets go and bans a worker a check of its text encoder layers or VAE tiles convicted, as a spot check's conviction
   * of a rank is (swarm-executor.ts: lostRanks).
   */
  convict(worker: SwarmWorker, why: string): void {
    this.options.swarm?.evict(worker, why, { ban: true });
  }

  /** Shuts the current placement's executor down; the pipeline's last call (with `close`) also stops watching. */
  async shutdown(options?: { graceMs?: number; close?: boolean }): Promise<void> {
    if (options?.close) this.offLeave?.();
    const executor = this.executor;
    this.executor = null;
    await executor?.shutdown(options);
  }

  /**
   * Replaces the current executor by one on `placement`; a failed placement leaves none. Where a rank was lost in
   * initWorker or loadModel, the loss (its ranks judged by the executor); any other failure is thrown.
   */
  private async placeOn(placement: ResolvedPlacement, at: JobPoint): Promise<Loss | null> {
    await this.shutdown({ graceMs: 1_000 });
    const { config, backend, swarm } = this.planning;
    const byId = new Map(swarm?.workers().map((w) => [w.id, w]));
    const workers = placement.workers.map(({ id }) => byId.get(id));
    if (workers.some((w) => !w)) throw new Error('a worker of the placement left the swarm before it was placed');
    const executor = createExecutor(
      backend,
      { config, placement },
      swarm,
      workers.flatMap((w) => (w ? [w] : [])),
    );
    executor.onFailure(() => {
      // Stryker disable next-line ConditionalExpression: a replaced executor is shut down first, and reports no
      // failures
      if (this.executor === executor) this.lostARank = true;
    });
    this.lostARank = false;
    this.probed = false;
    this.job.judged = [];
    try {
      await executor.initialize();
    } catch (e) {
      try {
        return await this.lossOf(executor, e as Error, at);
      } finally {
        await executor.shutdown({ graceMs: 500 }).catch(() => {});
      }
    }
    for (const w of executor.workers) this.measurements.setMaxBufferBytes(w, w.maxBufferBytes);
    this.executor = executor;
    return null;
  }

  /**
   * The live workers, each engine answering, once at least `count` have joined; an error saying how many joined after
   * the placement timeout.
   */
  async liveWorkers(count: number): Promise<SwarmWorker[]> {
    const swarm = defined(this.options.swarm, 'the swarm');
    // workers whose engines hang are let go and the rest counted again (a hung one is refused as it
    // dials again); a few rounds at most, so pages that pass the check at join and fail it here
    // cannot hold a placement for ever
    for (let round = 1; ; round++) {
      await swarm.waitForWorkers(count, this.options.placementTimeoutMs ?? 30_000);
      if (!(await swarm.letGoHungEngines()) || round === MAX_ENGINE_CHECK_ROUNDS) return eligible(swarm);
    }
  }
}

/**
 * The live workers the job may use: all but those the record of accusations set aside for it
 * (accusations.ts); an error saying so where that leaves none.
 */
function eligible(swarm: Swarm): SwarmWorker[] {
  const live = swarm.workers();
  const workers = live.filter((w) => !swarm.isSetAside(w));
  if (live.length && !workers.length)
    throw new Error(
      `every live worker (${live.map((w) => w.id).join(', ')}) is set aside for this job: they accused ` +
        'each other and nobody else could say who lied; neither is banned, and the next job places them again ' +
        '(add a worker the swarm can judge them by, or mark one trusted)',
    );
  return workers;
}

/** The group of workers `executor`'s placement runs a job's shape on: what its measurements are kept under. */
const groupOn = (ctx: PlannerContext, params: JobParams, executor: Executor) =>
  groupOf(
    ctx,
    params,
    executor.placement.ep,
    executor.workers.map((w) => ({ id: w.id, browser: w.browser, threads: w.threads })),
  );
