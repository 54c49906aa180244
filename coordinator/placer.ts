// Carries out the planner's placements (planner.ts): waits for the workers a job needs, runs the
// rehearsals the planner asks for, keeps the executor of the current placement while the next job's
// placement is the same, probes a new placement's mesh, and after a lost rank places the job again
// through the planner. It decides nothing itself.
import { defined } from '../core/defined.ts';
import { fitMeshProbe, type LinkSpeed } from '../core/cost-model.ts';
import type { JobParams } from '../core/job.ts';
import { bytesPerElement } from '../core/net/protocol.ts';
import type { MeshProbe } from '../core/worker-api.ts';
import { createExecutor } from './backends.ts';
import type { Executor, LostRank } from './executor.ts';
import { Measurements } from './measurements.ts';
import { samePlacement, type PlacementRequest, type ResolvedPlacement } from './placement.ts';
import {
  checkRequest,
  groupOf,
  placeTextLayers,
  placeVaeTiles,
  planPlacement,
  rehearsalsNeeded,
  runOf,
  timeoutsOf,
  workersToWaitFor,
  type PlannerContext,
  type PlanningInput,
  type RehearsalNeeded,
} from './planner.ts';
import type { Swarm, SwarmWorker } from './swarm.ts';

/** How a lost rank was noticed and what the re-placement cost. */
export interface FailureRecord {
  step: number;
  error: string;
  lost: LostRank[];
  /** when the failure was seen (ms since the epoch) */
  detectedAt: number;
  /** ranks before and after */
  degreeBefore: number;
  degreeAfter: number;
  replanMs: number;
  /**
   * where a rank was caught returning wrong rows (a spot check), the step the job went back to:
   * the first its rows went into (null: only the interrupted step runs again)
   */
  rerunFromStep?: number | null;
}

/** A lost rank costs a re-placement; after this many in one job, the job fails. */
export const MAX_REPLANS = 8;

/** The job lost ranks more often than MAX_REPLANS allows; `cause` is the last failure, as it came. */
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

export interface PlacerOptions extends PlannerContext {
  swarm?: Swarm;
  /** how long a placement waits for the workers it needs */
  placementTimeoutMs?: number;
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
  private readonly measurements = new Measurements();
  private prepared: {
    job: number;
    texts: Float32Array[];
    shape: number[];
    params: JobParams;
    request: PlacementRequest;
  } | null = null;
  /** re-placements since the prepared job started */
  private replans = 0;

  constructor(private readonly options: PlacerOptions) {
    if (options.backend === 'swarm' && !options.swarm)
      throw new Error('the swarm backend needs a Swarm: pass one from openSwarm()');
  }

  /** The executor of the current placement, if any. */
  get current(): Executor | null {
    return this.executor;
  }

  /** Places a job: keeps the current placement if the planner places it the same, else places anew. */
  async place(
    params: JobParams,
    request: PlacementRequest,
  ): Promise<{ executor: Executor; placement: ResolvedPlacement }> {
    this.options.swarm?.accusations.newJob(); // a worker set aside in the last job is placed again
    const placement = await this.planOnLive(params, request);
    const current = this.executor;
    if (!current || this.lostARank || !samePlacement(current.placement, placement)) await this.placeOn(placement);
    const executor = defined(this.executor, 'the placement');
    // the same decisions, with this job's prediction
    executor.placement = placement;
    this.prepared = null;
    return { executor, placement };
  }

  /**
   * The planner's placement on workers still live once it is made: a worker that left while the
   * placement was rehearsed and planned (refused, let go, closed) has it planned again without it.
   */
  private async planOnLive(params: JobParams, request: PlacementRequest, maxWorld?: number) {
    for (let attempt = 1; ; attempt++) {
      const placement = await this.plan(params, request, maxWorld);
      const live = new Set(this.options.swarm?.workers().map((w) => w.id));
      if (!this.options.swarm || placement.workers.every((w) => live.has(w.id)) || attempt === MAX_PLAN_ATTEMPTS)
        return placement;
    }
  }

  /** The planner's placement of a job on the live workers, once the workers it needs have joined and are measured. */
  private async plan(params: JobParams, request: PlacementRequest, maxWorld?: number): Promise<ResolvedPlacement> {
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
    if (this.options.backend !== 'swarm' || !swarm) return planPlacement(this.options, input([]));
    // checked before waiting: an invalid request fails at once
    checkRequest(request);
    const workers = await this.liveWorkers(
      maxWorld === undefined ? workersToWaitFor(this.options, request, params) : 1,
    );
    if (maxWorld === undefined) await swarm.measuredNow();
    let rehearsalError: string | undefined;
    // a re-placement predicts from what was rehearsed before: recovery does not wait for rehearsals
    if (maxWorld === undefined) {
      try {
        for (const needed of rehearsalsNeeded(this.options, input(workers))) await this.rehearse(needed);
      } catch (e) {
        rehearsalError = (e as Error).message;
      }
    }
    return planPlacement(this.options, input(workers, rehearsalError));
  }

  /** A group's forward rehearsed at the degrees asked, all its workers at once as in the job (rank/rehearsal.ts). */
  private async rehearse({ group, workers, degrees }: RehearsalNeeded<SwarmWorker>): Promise<void> {
    const swarm = defined(this.options.swarm, 'the swarm');
    const { modelUrl, textTokens } = this.options;
    workers.forEach((w) => swarm.setActivity(w, `rehearsing the job's forward (degree ${degrees.join(', ')})`));
    try {
      const replies = await Promise.all(
        workers.map((w) =>
          w.api.rehearse(
            { modelUrl, ep: group.ep, latentShape: group.shape, textTokens, degrees },
            timeoutsOf(this.options.rpcTimeoutMs).loadMs,
          ),
        ),
      );
      degrees.forEach((d, i) =>
        this.measurements.setRehearsal(
          group,
          d,
          replies.map((r) => r.forwardMs[i] / 1000),
        ),
      );
    } finally {
      workers.forEach((w) => swarm.setActivity(w, null));
    }
  }

  /**
   * Gives the ranks the job; on a placement of several ranks not yet probed, times an all-to-all on
   * its mesh first: the link the cost model plans the next jobs with. A failed probe costs nothing
   * (a lost rank shows again in the first step, which re-places).
   */
  async prepare(
    job: number,
    texts: Float32Array[],
    shape: number[],
    params: JobParams,
    request: PlacementRequest,
  ): Promise<MeshProbeReport> {
    const executor = defined(this.executor, 'a placement (call place() first)');
    this.prepared = { job, texts, shape, params, request };
    this.replans = 0;
    await executor.prepareJob(job, texts, shape);
    if (executor.layout.ulyssesDegree < 2 || this.probed) return null; // one rank (the local backend's too) has no mesh
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
      return { error: (e as Error).message };
    }
  }

  /**
   * A lost rank costs one step, not the job: let the survivors go, have the planner place the job
   * again on the live workers (never more ranks than before; its CFG groups, shares and mode where
   * they still pay) and prepare it there. Null when the failure was not a lost rank, so trying again
   * would not help; an error when the job has used up its MAX_REPLANS or no worker is left.
   */
  async replace(error: Error, step: number): Promise<FailureRecord | null> {
    const detectedAt = Date.now();
    const before = defined(this.executor, 'a placement (call place() first)');
    const lost = await before.lostRanks(error);
    const prepared = this.prepared;
    if (!lost.length || !prepared) return null;
    if (this.replans >= MAX_REPLANS) throw new ReplacementsExhausted(lost, error);
    this.replans++;
    const started = performance.now();
    try {
      await this.placeOn(await this.planOnLive(prepared.params, prepared.request, before.world));
    } catch (e) {
      const what = lost.map((l) => `rank ${l.rank} (worker ${l.worker}: ${l.cause}, ${l.evidence})`).join(', ');
      const why = (e as Error).message;
      const message = `lost ${what} in step ${step + 1}, and the job could not be placed again: ${why}`;
      // the job failed of the lost rank; why placing it again failed is in the message
      // eslint-disable-next-line preserve-caught-error -- the cause is the loss, not the failed re-placement
      throw new Error(message, { cause: error });
    }
    const after = defined(this.executor, 'the new placement');
    await after.prepareJob(prepared.job, prepared.texts, prepared.shape);
    return {
      step,
      error: error.message,
      lost,
      detectedAt,
      degreeBefore: before.world,
      degreeAfter: after.world,
      replanMs: performance.now() - started,
    };
  }

  /**
   * The median step of a job that ran on the current placement from its start to its end: the
   * planner's prediction of that plan for the next jobs of the shape on these workers.
   */
  measuredStep(params: JobParams, medianStepMs: number): void {
    const executor = this.executor;
    if (!executor || this.options.backend !== 'swarm' || !(medianStepMs > 0)) return;
    const { layout, settings, ep } = executor.placement;
    const plan = {
      ulyssesDegree: layout.ulyssesDegree,
      cfgParallel: layout.cfgParallel,
      heads: layout.heads?.[0],
      mode: settings.parallel,
    };
    const members = executor.workers.map((w) => ({ id: w.id, threads: w.threads }));
    this.measurements.recordStep(
      groupOf(this.options, params, ep, members),
      runOf(plan, bytesPerElement(settings.dtype)),
      medianStepMs / 1000,
    );
  }

  /** The text encoder's layers on the live workers, as the planner shares them (waits for one worker). */
  async textLayers(numLayers: number): Promise<{ host: SwarmWorker; from: number; to: number }[]> {
    return placeTextLayers(await this.liveWorkers(1), numLayers).map(({ worker, from, to }) => ({
      host: worker,
      from,
      to,
    }));
  }

  /** The workers to decode the VAE's tiles on and the buffer they all allow (waits for one worker). */
  async vaeTiles(): Promise<{ hosts: SwarmWorker[]; maxBufferBytes: number }> {
    return placeVaeTiles(await this.liveWorkers(1), this.measurements);
  }

  /**
   * Lets go and bans a worker a check of its text encoder layers or VAE tiles convicted, as a spot check's conviction
   * of a rank is (swarm-executor.ts: lostRanks).
   */
  convict(worker: SwarmWorker, why: string): void {
    this.options.swarm?.evict(worker, why, { ban: true });
  }

  async shutdown(options?: { graceMs?: number }): Promise<void> {
    const executor = this.executor;
    this.executor = null;
    await executor?.shutdown(options);
  }

  /** Replaces the current executor by one on `placement`; a failed placement leaves none. */
  private async placeOn(placement: ResolvedPlacement): Promise<void> {
    await this.shutdown({ graceMs: 1_000 });
    const { config, backend, swarm } = this.options;
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
    try {
      await executor.initialize();
    } catch (e) {
      await executor.shutdown({ graceMs: 500 }).catch(() => {});
      throw e;
    }
    for (const w of executor.workers) this.measurements.setMaxBufferBytes(w.id, w.maxBufferBytes);
    this.executor = executor;
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
