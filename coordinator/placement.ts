// The one place that decides what runs where: the Ulysses degree and the CFG grouping of each job
// (what was asked, or the cost model's choice for 'auto'), which workers become which ranks,
// whether the placement of the last job still fits, the mesh probe of a new placement, and the
// re-placement after a lost rank. Executors only carry out a RankLayout; the pipeline only asks.
import {
  candidatePlans,
  fitMeshProbe,
  planSwarm,
  planWorld,
  predictStep,
  unevenPlan,
  type Hardware,
  type LinkSpeed,
  type Plan,
  type StepPrediction,
  type Workload,
} from '../core/cost-model.ts';
import { latentShape, usesGuidance, type JobParams } from '../core/job.ts';
import type { WanConfig } from '../core/model/config.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { bytesPerElement, type DType } from '../core/net/protocol.ts';
import { checkDegree, defaultDegree, RankLayout, staleKeysValuesBytes, type ParallelMode } from '../core/parallel.ts';
import { formatBytes, type ExecutionProvider, type MeshProbe } from '../core/worker-api.ts';
import { createExecutor, type Backend } from './backends.ts';
import { loadTimeoutMs, type Executor, type LostRank } from './executor.ts';
import type { WorkerMeasurement } from './measure.ts';
import type { Swarm, SwarmWorker } from './swarm.ts';
import type { LinkEmulation } from '../core/net/paced-channel.ts';

/** What a job asks of placement; what it leaves unset, the pipeline's defaults fill. */
export interface PlacementRequest {
  /** Ulysses degree (of each group with CFG parallel); 'auto': the cost model's choice, or the largest the live workers allow */
  ulyssesDegree: number | 'auto';
  /** both passes of a guided step at once on two groups: always (true), never (false), or as the cost model chooses (unset) */
  cfgParallel?: boolean;
  ep: ExecutionProvider | 'auto';
  /** how activations go between ranks; 'auto': the least exact one only where the cost model predicts it enough faster (TRANSPORTS) */
  dtype: DType | 'auto';
  /**
   * how a group's ranks share the heads (and tokens): 'even'; in proportion to each worker's
   * rehearsed speed ('speed', for a degree asked for); or (unset, and 'speed' with 'auto')
   * whichever the cost model predicts faster
   */
  shares?: 'even' | 'speed';
  /** share of forward passes another rank recomputes to check the group's (coordinator/spot-check.ts); its default unless set, 0 for none */
  spotCheckRate?: number;
  /** the ranks' links to each other paced as this slower link (benchmarks and tests: core/net/paced-channel.ts) */
  emulateLink?: LinkEmulation;
  /**
   * how a group's ranks share self-attention: Ulysses (exact), displaced (keys and values one step
   * stale, the exchange off the critical path), or 'auto': displaced only where the cost model
   * predicts it enough faster (EXCHANGES). Ulysses unless set.
   */
  parallel?: ParallelMode | 'auto';
  /** displaced mode's exact steps first (DEFAULT_WARMUP_STEPS unless set) */
  warmupSteps?: number;
  /** Ulysses: the head groups a block's exchange goes in (core/parallel.ts headGroup); unset: the cost model's choice, 1 until the workers are measured */
  headGroups?: number;
}

/** What a placement is made for besides its layout: a job asking for other of these is placed anew. */
type PlacedFor = Pick<PlacementRequest, 'ep' | 'spotCheckRate' | 'emulateLink' | 'warmupSteps'> &
  Exchange & { headGroups: number };
const placedForOf = ({
  ep,
  dtype,
  parallel,
  headGroups,
  warmupSteps,
  spotCheckRate,
  emulateLink,
}: PlacedFor): PlacedFor => ({ ep, dtype, parallel, headGroups, warmupSteps, spotCheckRate, emulateLink });

/** How the degree of an 'auto' job was chosen, and what the cost model expected of it. */
export interface PlannedDegree {
  /** Ulysses degree (of each group with CFG parallel) */
  degree: number;
  cfgParallel: boolean;
  /** the job asked for this degree (predicted all the same), rather than the cost model choosing it */
  asked: boolean;
  by: string;
  /** the rank-to-rank link planned with: a mesh probe of an earlier placement, or the coordinator's links as a stand-in */
  link: LinkSpeed & { from: 'mesh probe' | 'coordinator links' };
  predictedStepMs: number;
  oneWorkerStepMs: number;
  /** each rank's share of the heads where the workers' speeds differ enough to share unevenly (issue 18), else null: even */
  heads: number[] | null;
  /** why fewer workers are used than are live, or null */
  leftOut: string | null;
  /** how activations go between ranks: as asked, or with 'auto' the cost model's choice */
  dtype: DType;
  /** how the ranks share self-attention: as asked, or with 'auto' the cost model's choice */
  parallel: ParallelMode;
  /** Ulysses: the head groups a block's exchange goes in, as asked or the cost model's choice (1: no overlap) */
  headGroups: number;
}

/**
 * The transports 'auto' weighs, most exact first, with how far each moved the bench model's latent
 * from float32's (bench slow-link: 2 steps at P = 2 and 4).
 */
export const TRANSPORTS: { dtype: DType; name: string; deviation: string }[] = [
  { dtype: 'f32', name: 'float32', deviation: 'exact' },
  { dtype: 'f16', name: 'float16', deviation: 'about 1e-4 from exact' },
  { dtype: 'i8', name: 'int8', deviation: 'about 3e-3 from exact' },
  { dtype: 'i4', name: 'int4', deviation: 'displaced deltas only' },
];

/** How a group's ranks exchange: the parallel mode and the transport of its activations. */
export interface Exchange {
  parallel: ParallelMode;
  dtype: DType;
}

/**
 * Every exchange 'auto' weighs, most exact first: Ulysses under each transport, then displaced
 * under each and int4 (stale keys move the latent more than any transport does: bench slow-link). A less
 * exact one is taken only where it is predicted at least LESS_EXACT_GAIN faster than the more
 * exact ones.
 */
export const EXCHANGES: Exchange[] = (['ulysses', 'displaced'] as const).flatMap((parallel) =>
  TRANSPORTS.filter(({ dtype }) => dtype !== 'i4' || parallel === 'displaced').map(({ dtype }) => ({
    parallel,
    dtype,
  })),
);
const LESS_EXACT_GAIN = 1.1;

/** An exchange's name ('float32', 'displaced int8'), and with what it costs in fidelity. */
const nameOf = ({ parallel, dtype }: Exchange): string =>
  `${parallel === 'displaced' ? 'displaced ' : ''}${TRANSPORTS.find((t) => t.dtype === dtype)!.name}`;
/** what displaced mode costs in fidelity, as bench slow-link and eval-demo measured it (issue 20) */
const DISPLACED_DEVIATION =
  "keys and values one step stale past the warm-up: 1 to 2.5% of the latent from exact in bench slow-link, the demo's held-out accuracy within 2.5 points";
const describeExchange = (e: Exchange): string =>
  e.parallel === 'displaced'
    ? `${nameOf(e)} (${DISPLACED_DEVIATION})`
    : `${nameOf(e)} transport (${TRANSPORTS.find((t) => t.dtype === e.dtype)!.deviation})`;

/**
 * Why displaced mode does not fit these workers, or null where it does: each rank holds every
 * rank's keys and values of each pass and block (staleKeysValuesBytes), which must take at most
 * half the least memory a worker reports (DEFAULT_WORKER_GIB where a browser does not say).
 */
function displacedMisfit(work: Workload, degree: number, workers: SwarmWorker[]): string | null {
  const bytes = staleKeysValuesBytes(work, degree);
  const gib = Math.min(...workers.slice(0, degree).map((w) => w.info.memoryGiB ?? DEFAULT_WORKER_GIB));
  return bytes > (gib * 2 ** 30) / 2
    ? `displaced mode would hold ${formatBytes(bytes)} of keys and values on each rank, more than half of the ${gib} GiB its workers have: use Ulysses, or a shorter or smaller video`
    : null;
}
const DEFAULT_WORKER_GIB = 4;

/** The exchange a job gets given what each would take a step (seconds): as asked, or where it leaves a choice ('auto'), the choice and why. */
function chooseExchange(
  request: Pick<PlacementRequest, 'dtype' | 'parallel'>,
  stepS: (exchange: Exchange) => number,
  misfit: string | null,
): Exchange & { why: string } {
  if (request.parallel === 'displaced' && misfit) throw new Error(misfit);
  const asked = (e: Exchange) =>
    (request.dtype === 'auto' || e.dtype === request.dtype) &&
    ((request.parallel ?? 'ulysses') === 'auto' || e.parallel === (request.parallel ?? 'ulysses')) &&
    !(misfit && e.parallel === 'displaced');
  const options = EXCHANGES.filter(asked);
  if (options.length === 1) return { ...options[0], why: '' };
  let best = options[0];
  for (const e of options.slice(1)) if (stepS(e) * LESS_EXACT_GAIN <= stepS(best)) best = e;
  const exact = options[0];
  const why =
    best === exact
      ? `; ${nameOf(exact)}${exact.parallel === 'displaced' ? '' : ' transport'}: no other predicted ${LESS_EXACT_GAIN}× faster`
      : `; ${describeExchange(best)}: predicted ${(stepS(best) * 1000).toFixed(0)} ms a step, ${nameOf(exact)} ${(stepS(exact) * 1000).toFixed(0)} ms`;
  return { ...best, why };
}

/** What head groups a plan's exchange goes in, in words for its `by` (nothing for one group the job left to the cost model). */
const overlapWhy = (headGroups: number, request: Pick<PlacementRequest, 'headGroups'>): string =>
  headGroups > 1
    ? `; q, k, v in ${headGroups} head groups, so attention overlaps the exchange${request.headGroups ? ' (asked for)' : ''}`
    : request.headGroups
      ? '; q, k, v in one head group (asked for)'
      : '';

/** A job's parallel mode and warm-up, as asked: an error that says what is valid. */
function checkExchangeRequest({ parallel, warmupSteps, dtype, headGroups }: PlacementRequest): void {
  // int4 would lose too much of Ulysses' q, k, v; displaced sends only keys' and values' change a step
  if (dtype === 'i4' && parallel !== 'displaced' && parallel !== 'auto')
    throw new Error(
      `dtype 'i4' carries displaced mode's deltas of keys and values only: ask for parallel 'displaced' too (or 'f32', 'f16', 'i8' for Ulysses)`,
    );
  if (parallel !== undefined && !['ulysses', 'displaced', 'auto'].includes(parallel))
    throw new Error(`parallel must be 'ulysses', 'displaced' or 'auto', got ${JSON.stringify(parallel)}`);
  if (warmupSteps !== undefined && !(Number.isInteger(warmupSteps) && warmupSteps >= 0))
    throw new Error(
      `warmupSteps is a whole number ≥ 0 of exact steps before displaced ones, got ${JSON.stringify(warmupSteps)}`,
    );
  if (headGroups !== undefined && !(Number.isInteger(headGroups) && headGroups >= 1))
    throw new Error(
      `headGroups is a whole number ≥ 1 of head groups a block's exchange goes in (1: all heads at once), got ${JSON.stringify(headGroups)}`,
    );
}

/** Where a job runs, and why. */
export interface Placement {
  executor: Executor;
  plan: PlannedDegree | null;
  /** why the job does not run CFG parallel although it was asked for (null when it does, or was not asked) */
  cfgFallback: string | null;
}

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

export interface PlacerOptions {
  config: WanConfig;
  /** the model folder as the workers fetch it */
  modelUrl: string;
  backend: Backend;
  swarm?: Swarm;
  /** rows of every text embedding: the cost model's cross-attention length */
  textTokens: number;
  placementTimeoutMs?: number;
  rpcTimeoutMs?: number;
}

/** rounds of engine checks before a placement: each lets go the workers whose engines hang */
const MAX_ENGINE_CHECK_ROUNDS = 3;

export class Placer {
  private executor: Executor | null = null;
  /** what the current executor was placed for */
  private placedFor: ({ layout: RankLayout } & PlacedFor) | null = null;
  /** the placement lost a rank: the next job places afresh instead of failing on the gone rank */
  // Stryker disable next-line BooleanLiteral: placeOn sets it before anything reads it
  private lostARank = false;
  // Stryker disable next-line BooleanLiteral: placeOn sets it before anything reads it
  private probed = false;
  /** the rank-to-rank link the last mesh probe measured (its slowest rank), for the cost model's next plans */
  private meshLink: LinkSpeed | null = null;
  private prepared: { job: number; texts: Float32Array[]; shape: number[] } | null = null;
  /** re-placements since the prepared job started */
  private replans = 0;
  /** seconds of one forward by degree, rehearsed on a group of workers for a job's shape (groupKey) */
  private readonly rehearsals = new Map<string, Map<number, number[]>>();
  /** seconds of a step of a plan as the jobs that ran it measured, the last weighing half (stepKey) */
  private readonly measuredSteps = new Map<string, number>();

  constructor(private readonly options: PlacerOptions) {
    if (options.backend === 'swarm' && !options.swarm)
      throw new Error('the swarm backend needs a Swarm: pass one from openSwarm()');
  }

  /** The executor of the current placement, if any. */
  get current(): Executor | null {
    return this.executor;
  }

  /** Places a job: keeps the current placement if it still fits what the job needs, else places anew. */
  async place(params: JobParams, request: PlacementRequest): Promise<Placement> {
    checkExchangeRequest(request);
    const guided = usesGuidance(params);
    const cfgFallback =
      request.cfgParallel && !guided
        ? 'no CFG parallel: guidance 1 means one forward pass per step, so there is no second pass for a second group'
        : null;
    const { layout, plan } = await this.layoutFor(params, request, guided);
    // 'auto' without a plan (workers not yet measured): exact
    const parallel =
      plan?.parallel ?? (request.parallel === 'displaced' || request.dtype === 'i4' ? 'displaced' : 'ulysses');
    const placing: PlacedFor = {
      ...request,
      dtype: plan?.dtype ?? (request.dtype === 'auto' ? 'f32' : request.dtype),
      parallel,
      // displaced ranks exchange once a block: head groups are Ulysses' alone
      headGroups: parallel === 'displaced' ? 1 : (plan?.headGroups ?? request.headGroups ?? 1),
    };
    // placedFor is set exactly while there is an executor
    const fits =
      !this.lostARank &&
      this.placedFor !== null &&
      this.placedFor.layout.sameAs(layout) &&
      JSON.stringify(placedForOf(this.placedFor)) === JSON.stringify(placedForOf(placing));
    if (!fits) await this.placeOn(layout, placing);
    return {
      executor: this.executor!,
      plan: plan && cfgFallback ? { ...plan, by: `${plan.by}; ${cfgFallback}` } : plan,
      cfgFallback,
    };
  }

  /**
   * Gives the ranks the job; on a placement of several ranks not yet probed, times an all-to-all on
   * its mesh first: the link the cost model plans the next jobs with. A failed probe costs nothing
   * (a lost rank shows again in the first step, which re-places).
   */
  async prepare(job: number, texts: Float32Array[], shape: number[]): Promise<MeshProbeReport> {
    const executor = this.need();
    this.prepared = { job, texts, shape };
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
      this.meshLink = link;
      return { ranks, link };
    } catch (e) {
      return { error: (e as Error).message };
    }
  }

  /**
   * A lost rank costs one step, not the job: let the survivors go, place again on the live workers
   * (the largest valid degree they allow, never more ranks than before, without CFG parallel) and
   * prepare the job there. Null when the failure was not a lost rank, so trying again would not
   * help; an error when the job has used up its MAX_REPLANS or no worker is left to place on.
   */
  async replace(error: Error, step: number): Promise<FailureRecord | null> {
    const detectedAt = Date.now();
    const before = this.need();
    const lost = await before.lostRanks(error);
    if (!lost.length || !this.prepared || !this.placedFor) return null;
    if (this.replans >= MAX_REPLANS) throw new ReplacementsExhausted(lost, error);
    this.replans++;
    const started = performance.now();
    const placedFor = placedForOf(this.placedFor);
    let degree = 1;
    try {
      // Stryker disable next-line ConditionalExpression: only a swarm loses ranks (Executor.lostRanks is empty for the local backend, which returns before this)
      if (this.options.swarm)
        degree = defaultDegree(
          this.options.config.numHeads,
          Math.min((await this.liveWorkers(1)).length, before.world),
        );
      await this.placeOn(new RankLayout(degree), placedFor);
    } catch (e) {
      const what = lost.map((l) => `rank ${l.rank} (worker ${l.worker}: ${l.cause}, ${l.evidence})`).join(', ');
      throw new Error(
        `lost ${what} in step ${step + 1}, and the job could not be placed again: ${(e as Error).message}`,
        { cause: error },
      );
    }
    const { job, texts, shape } = this.prepared;
    await this.need().prepareJob(job, texts, shape);
    return {
      step,
      error: error.message,
      lost,
      detectedAt,
      degreeBefore: before.world,
      degreeAfter: this.need().world,
      replanMs: performance.now() - started,
    };
  }

  /**
   * The median step of a job that ran on the current placement from its start to its end: the
   * cost model's prediction of that plan for the next jobs of the shape on these workers, averaged
   * with the jobs' before it (each older one weighing half as much): one job's median step moved
   * ±20% from the next one's on this busy 2-core machine.
   */
  measuredStep(params: JobParams, medianStepMs: number): void {
    if (!this.executor || !this.placedFor || this.options.backend !== 'swarm' || !(medianStepMs > 0)) return;
    const { layout, ep, dtype, parallel } = this.placedFor;
    const plan = {
      ulyssesDegree: layout.ulyssesDegree,
      cfgParallel: layout.cfgParallel,
      heads: layout.heads?.[0],
      mode: parallel,
    };
    const key = this.stepKey(
      ep,
      latentShape(params, this.options.config.inChannels),
      this.executor.workers,
      plan,
      bytesPerElement(dtype),
    );
    const before = this.measuredSteps.get(key);
    this.measuredSteps.set(key, before === undefined ? medianStepMs / 1000 : (before + medianStepMs / 1000) / 2);
  }

  async shutdown(options?: { graceMs?: number }): Promise<void> {
    const executor = this.executor;
    this.executor = null;
    this.placedFor = null;
    await executor?.shutdown(options);
  }

  /** The job's layout: what was asked, the planner's choice for 'auto' on a swarm, or the largest valid degree until workers are measured. */
  private async layoutFor(
    params: JobParams,
    request: PlacementRequest,
    guided: boolean,
  ): Promise<{ layout: RankLayout; plan: PlannedDegree | null }> {
    const { config, backend } = this.options;
    const cfgGroups = request.cfgParallel && guided ? 2 : 1;
    if (backend === 'local') {
      if (request.cfgParallel)
        throw new Error(`cfgParallel needs two groups of worker pages: use the swarm backend, not local`);
      if (request.ulyssesDegree !== 'auto' && request.ulyssesDegree !== 1)
        throw new Error(
          `the local backend runs one rank in this tab, not ${request.ulyssesDegree}: use the swarm backend for more`,
        );
      return { layout: new RankLayout(1), plan: null };
    }
    if (request.ulyssesDegree !== 'auto') {
      checkDegree(config.numHeads, request.ulyssesDegree);
      const plan = await this.predictAsked(params, new RankLayout(request.ulyssesDegree, cfgGroups), request);
      return { layout: new RankLayout(request.ulyssesDegree, cfgGroups, plan?.heads ? [plan.heads] : null), plan };
    }
    // CFG parallel asked for: wait for its two groups' first workers, as a fixed degree waits for its workers
    const workers = await this.liveWorkers(request.cfgParallel ? 2 : 1);
    await this.options.swarm!.measuredNow();
    const { degree, cfgParallel, plan } = await this.planFor(params, workers, request.cfgParallel && guided, request);
    return { layout: new RankLayout(degree, cfgParallel ? 2 : 1, plan?.heads ? [plan.heads] : null), plan };
  }

  /**
   * 'auto' on a swarm: the plan the cost model predicts fastest for this job, from the workers'
   * rehearsed forwards and measured links (never a plan predicted slower than one worker): an even
   * degree, or where the workers' speeds differ, the heads shared in proportion to them on the
   * workers of an even degree or on all of them. Until every live worker has been measured, the
   * largest even degree, and no plan to show.
   */
  private async planFor(
    params: JobParams,
    workers: SwarmWorker[],
    cfgParallel: boolean | undefined,
    request: PlacementRequest,
  ): Promise<{ degree: number; cfgParallel: boolean; plan: PlannedDegree | null }> {
    const { config } = this.options;
    const work = this.workloadOf(params);
    const candidates = candidatePlans(work, workers.length).filter(
      (p) => cfgParallel === undefined || p.cfgParallel === cfgParallel,
    );
    // every worker at once is worth rehearsing too: with uneven shares a degree need not be even
    const all: Plan = { ulyssesDegree: Math.min(workers.length, config.numHeads), cfgParallel: false };
    const rehearsed =
      cfgParallel || candidates.some((p) => planWorld(p) === all.ulyssesDegree && !p.cfgParallel)
        ? candidates
        : [...candidates, all];
    const hw = await this.hardwareOf(workers, request, params, [
      { ulyssesDegree: 1, cfgParallel: false },
      ...rehearsed,
    ]);
    if (!hw)
      return {
        degree: defaultDegree(config.numHeads, cfgParallel ? Math.floor(workers.length / 2) : workers.length),
        cfgParallel: !!cfgParallel,
        plan: null,
      };
    const uneven =
      cfgParallel || request.shares === 'even'
        ? []
        : rehearsed.filter((p) => !p.cfgParallel).flatMap((p) => unevenPlan(work, hw, p.ulyssesDegree) ?? []);
    // the fastest plan under each exchange the job allows, then the exchange
    const bestUnder = (exchange: Exchange) => {
      const choice = planSwarm(
        work,
        { ...hw, bytesPerElement: bytesPerElement(exchange.dtype) },
        [...candidates, ...uneven].map((p) => ({ ...p, mode: exchange.parallel, headGroups: request.headGroups })),
      );
      // one worker is always ranked; asked for CFG parallel, the fastest CFG-parallel plan
      return {
        choice,
        best: cfgParallel ? (choice.ranked.find((p) => p.plan.cfgParallel) ?? choice.best) : choice.best,
      };
    };
    const transport = chooseExchange(
      request,
      (exchange) => bestUnder(exchange).best.stepS,
      displacedMisfit(work, Math.max(...candidates.map((p) => p.ulyssesDegree)), workers),
    );
    const { choice, best } = bestUnder(transport);
    const more = choice.ranked.find((p) => p.world > best.world);
    const leftOut =
      best.world < workers.length && more
        ? `${workers.length - best.world} of ${workers.length} workers left out: with ${more.world} the cost model predicts ${(more.stepS * 1000).toFixed(0)} ms a step, not ${(best.stepS * 1000).toFixed(0)}`
        : null;
    const plan: PlannedDegree = {
      degree: best.plan.ulyssesDegree,
      cfgParallel: best.plan.cfgParallel,
      asked: false,
      by: `cost model (${predictedFrom(best, hw.forwardsFrom)}; rank links from ${hw.link.from}${transport.why}${overlapWhy(best.headGroups, request)})`,
      link: hw.link,
      predictedStepMs: best.stepS * 1000,
      oneWorkerStepMs: choice.baseline.stepS * 1000,
      heads: best.plan.heads ?? null,
      leftOut,
      dtype: transport.dtype,
      parallel: transport.parallel,
      headGroups: best.headGroups,
    };
    return { degree: plan.degree, cfgParallel: plan.cfgParallel, plan };
  }

  /**
   * A degree the job asked for, predicted like the planner's choices so that every report carries
   * predicted next to measured: once the live workers are enough for it and all measured. Its
   * ranks share the heads by speed where the job asks that, or (shares unset) where the cost model
   * predicts it faster.
   */
  private async predictAsked(
    params: JobParams,
    layout: RankLayout,
    request: PlacementRequest,
  ): Promise<PlannedDegree | null> {
    const swarm = this.options.swarm;
    if (!swarm || swarm.workers().length < layout.world) return null;
    await swarm.measuredNow();
    const even: Plan = {
      ulyssesDegree: layout.ulyssesDegree,
      cfgParallel: layout.cfgParallel,
      headGroups: request.headGroups,
    };
    const oneWorker: Plan = { ulyssesDegree: 1, cfgParallel: false };
    const hw = await this.hardwareOf(swarm.workers(), request, params, [oneWorker, even]);
    if (!hw) return null;
    const work = this.workloadOf(params);
    const uneven = layout.cfgParallel || request.shares === 'even' ? null : unevenPlan(work, hw, layout.ulyssesDegree);
    const stepUnder = ({ dtype, parallel }: Exchange) => {
      const hwD = { ...hw, bytesPerElement: bytesPerElement(dtype) };
      const [evenStep, unevenStep] = [
        predictStep(work, { ...even, mode: parallel }, hwD),
        uneven && predictStep(work, { ...uneven, mode: parallel, headGroups: request.headGroups }, hwD),
      ];
      return unevenStep && (request.shares === 'speed' || unevenStep.stepS < evenStep.stepS) ? unevenStep : evenStep;
    };
    const transport = chooseExchange(
      request,
      (exchange) => stepUnder(exchange).stepS,
      displacedMisfit(work, layout.ulyssesDegree, swarm.workers()),
    );
    const chosen = stepUnder(transport);
    return {
      degree: layout.ulyssesDegree,
      cfgParallel: layout.cfgParallel,
      asked: true,
      by: `asked for (predicted from ${predictedFrom(chosen, hw.forwardsFrom)}; rank links from ${hw.link.from}${transport.why}${overlapWhy(chosen.headGroups, request)})`,
      link: hw.link,
      predictedStepMs: chosen.stepS * 1000,
      oneWorkerStepMs: predictStep(work, oneWorker, hw).stepS * 1000,
      heads: chosen.plan.heads ?? null,
      leftOut: null,
      dtype: transport.dtype,
      parallel: transport.parallel,
      headGroups: chosen.headGroups,
    };
  }

  private workloadOf(params: JobParams): Workload {
    const { config, textTokens } = this.options;
    return {
      model: config,
      tokens: tokenGrid(config, latentShape(params, config.inChannels)).count,
      textTokens,
      passes: usesGuidance(params) ? 2 : 1,
    };
  }

  /** The rank-to-rank link to plan with: a mesh probe of an earlier placement, or the coordinator's links as a stand-in. */
  private linkOf(workers: SwarmWorker[]): PlannedDegree['link'] {
    if (this.meshLink) return { ...this.meshLink, from: 'mesh probe' };
    const measured = workers.map((w) => w.measurement);
    return {
      bandwidth: Math.min(...measured.map((m) => m?.bandwidth ?? Infinity)),
      latency: Math.max(...measured.map((m) => m?.rttMs ?? 0)) / 2000,
      from: 'coordinator links',
    };
  }

  /**
   * What the cost model is given for these workers, or null while any of them is unmeasured: their
   * probed rates and links, and each plan's forwards rehearsed (the rates stand in where rehearsing
   * failed, and `forwardsFrom` says which).
   */
  private async hardwareOf(
    workers: SwarmWorker[],
    request: PlacementRequest,
    params: JobParams,
    plans: Plan[],
  ): Promise<(Hardware & { link: PlannedDegree['link']; forwardsFrom: string }) | null> {
    const measured = workers.map((w) => w.measurement);
    if (measured.some((m) => !m)) return null;
    let rehearsed: ((degree: number, world: number) => number[] | undefined) | undefined;
    let forwardsFrom = 'forwards rehearsed on these workers';
    try {
      rehearsed = await this.rehearse(workers, request, params, plans);
    } catch (e) {
      forwardsFrom = `probe rates, as rehearsing failed: ${(e as Error).message}`;
    }
    // the EP each worker will run on: the job's, or with 'auto' the one it measured fastest (as it will choose)
    const epNameOf = (m: WorkerMeasurement) => (request.ep === 'auto' ? m.auto.ep : request.ep);
    const epOf = (m: WorkerMeasurement) => m.compute[epNameOf(m)] ?? m.compute.wasm;
    // what the jobs these workers ran are kept under, but for the plan (stepKey)
    const [shape, members] = [latentShape(params, this.options.config.inChannels), membersOf(workers)];
    return {
      workerFlops: measured.map((m) => epOf(m!)?.flops ?? 0),
      workerSoftmaxRates: measured.map((m) => epOf(m!)?.softmaxRate ?? Infinity),
      workerStageS: measured.map((m) => (epOf(m!)?.stageMs ?? 0) / 1000),
      // WASM computes on the CPU the tabs of one browser share; WebGPU on a GPU
      workerCpus: workers.map((w, i) => (epNameOf(measured[i]!) === 'wasm' ? w.info.browser : undefined)),
      // even plans: the slowest of the workers; uneven ones the cost model makes from each worker's (unevenPlan)
      rehearsedForwardS:
        rehearsed && ((plan) => (plan.heads ? undefined : slowest(rehearsed(plan.ulyssesDegree, planWorld(plan))))),
      rehearsedRankForwardS: rehearsed && ((degree) => rehearsed(degree, degree)),
      measuredStepS: (plan, bytes) => this.measuredSteps.get(this.stepKey(request.ep, shape, members, plan, bytes)),
      link: this.linkOf(workers),
      // the transport asked for; 'auto' weighs each (chooseTransport), from float32
      bytesPerElement: bytesPerElement(request.dtype === 'auto' ? 'f32' : request.dtype),
      forwardsFrom,
    };
  }

  /**
   * Each plan's forward rehearsed on the workers it would run on (placeOn's: the first to have
   * joined), all of them at once as in the job, since tabs of one machine slow each other: seconds
   * of each of the `world` workers at `degree` with even shares. Kept for the next jobs of the same
   * shape on the same workers and threads.
   */
  private async rehearse(
    workers: SwarmWorker[],
    request: PlacementRequest,
    params: JobParams,
    plans: Plan[],
  ): Promise<(degree: number, world: number) => number[] | undefined> {
    const { config, modelUrl, textTokens, rpcTimeoutMs } = this.options;
    const shape = latentShape(params, config.inChannels);
    const keyOf = (world: number) => this.groupKey(request.ep, shape, membersOf(workers.slice(0, world)));
    for (const world of new Set(plans.map(planWorld))) {
      const key = keyOf(world);
      const degrees = [...new Set(plans.filter((p) => planWorld(p) === world).map((p) => p.ulyssesDegree))].filter(
        (d) => !this.rehearsals.get(key)?.has(d),
      );
      if (!degrees.length) continue;
      const group = workers.slice(0, world);
      group.forEach((w) =>
        this.options.swarm!.setActivity(w, `rehearsing the job's forward (degree ${degrees.join(', ')})`),
      );
      try {
        const replies = await Promise.all(
          group.map((w) =>
            w.api.rehearse(
              { modelUrl, ep: request.ep, latentShape: shape, textTokens, degrees },
              loadTimeoutMs(rpcTimeoutMs),
            ),
          ),
        );
        const byDegree = this.rehearsals.get(key) ?? new Map<number, number[]>();
        degrees.forEach((d, i) =>
          byDegree.set(
            d,
            replies.map((r) => r.forwardMs[i] / 1000),
          ),
        );
        this.rehearsals.set(key, byDegree);
      } finally {
        group.forEach((w) => this.options.swarm!.setActivity(w, 'idle'));
      }
    }
    return (degree, world) => this.rehearsals.get(keyOf(world))?.get(degree);
  }

  /** A job's shape on a group of workers at their threads (placeOn's: the first to have joined), on an EP. */
  private groupKey(ep: PlacementRequest['ep'], shape: number[], members: { id: string; threads: number }[]): string {
    return [this.options.modelUrl, ep, shape.join('×'), ...members.map((w) => `${w.id}:${w.threads}`)].join(' ');
  }

  /** A plan as it runs on its group (Hardware.measuredStepS): one rank has no exchange, one group of one no transport. */
  private stepKey(
    ep: PlacementRequest['ep'],
    shape: number[],
    members: { id: string; threads: number }[],
    plan: Plan,
    bytes: number,
  ): string {
    const run = [
      `${plan.ulyssesDegree}${plan.cfgParallel ? ' ×2' : ''}`,
      plan.heads?.join('/') ?? 'even',
      plan.ulyssesDegree > 1 ? (plan.mode ?? 'ulysses') : '',
      planWorld(plan) > 1 ? bytes : 0,
    ];
    return `${this.groupKey(ep, shape, members.slice(0, planWorld(plan)))} | ${run.join(' ')}`;
  }

  /** Replaces the current executor by one on `layout` (the first workers to have joined); a failed placement leaves none. */
  private async placeOn(layout: RankLayout, request: PlacedFor): Promise<void> {
    await this.shutdown({ graceMs: 1_000 });
    const { config, modelUrl, backend, swarm, rpcTimeoutMs } = this.options;
    const workers = backend === 'swarm' ? (await this.liveWorkers(layout.world)).slice(0, layout.world) : [];
    const executor = createExecutor(
      backend,
      { config, modelUrl, layout, ...placedForOf(request), rpcTimeoutMs },
      swarm,
      workers,
    );
    executor.onFailure(() => {
      // Stryker disable next-line ConditionalExpression: a replaced executor is shut down first, and a shut-down executor reports no failures
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
    this.executor = executor;
    this.placedFor = { layout, ...placedForOf(request) };
  }

  /** The live workers, each engine answering, once at least `count` have joined; an error saying how many joined after the placement timeout. */
  async liveWorkers(count: number): Promise<SwarmWorker[]> {
    const swarm = this.options.swarm!;
    // workers whose engines hang are let go and the rest counted again (a hung one is refused as it
    // dials again); a few rounds at most, so pages that pass the check at join and fail it here
    // cannot hold a placement for ever
    for (let round = 1; ; round++) {
      await swarm.waitForWorkers(count, this.options.placementTimeoutMs ?? 30_000);
      if (!(await swarm.letGoHungEngines()) || round === MAX_ENGINE_CHECK_ROUNDS) return swarm.workers();
    }
  }

  private need(): Executor {
    if (!this.executor) throw new Error('no placement: call place() first');
    return this.executor;
  }
}

const slowest = (seconds: number[] | undefined): number | undefined => (seconds ? Math.max(...seconds) : undefined);

const membersOf = (workers: SwarmWorker[]) => workers.map((w) => ({ id: w.id, threads: w.info.threads }));

/** Where a prediction came from: the jobs that ran the plan where any did (Hardware.measuredStepS), else the forwards. */
const predictedFrom = (p: StepPrediction, forwardsFrom: string): string =>
  p.measured
    ? `its steps as the last jobs of this shape on these workers measured them; the other plans from ${forwardsFrom}`
    : forwardsFrom;
