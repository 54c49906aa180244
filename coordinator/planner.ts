// The one place that decides where and how a job runs: from the request, the job's shape and what
// the swarm's workers measured, a ResolvedPlacement (placement.ts). Pure: it waits for nothing and
// calls no worker; the Placer (placer.ts) gathers what it reads and runs the rehearsals it asks for.
// It decides the Ulysses degree and CFG grouping (what was asked, or the cost model's choice for
// 'auto'), which workers become which ranks (the fastest first, as the cost model predicts on them),
// the heads' shares, the exchange (mode, transport, head groups), warm-up, spot checks and
// timeouts; the text encoder's layers and the VAE's tiles are placed here too.
import { checkLoras, type LoraRef } from '../core/model/lora.ts';
import { defined } from '../core/defined.ts';
import {
  candidatePlans,
  coreShares,
  planSwarm,
  planWorld,
  predictStagedStep,
  predictStep,
  unevenPlan,
  workerOrder,
  type CoreClaim,
  type Hardware,
  type Plan,
  type StepPrediction,
  type Workload,
} from '../core/cost-model.ts';
import { passesPerStep, usesGuidance, type JobParams } from '../core/job.ts';
import { latentShape, type LatentFormat } from '../core/model/family.ts';
import type { WanConfig } from '../core/model/config.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { bytesPerElement, type DType } from '../core/net/protocol.ts';
import {
  checkDegree,
  defaultDegree,
  evenHeads,
  proportionalShares,
  RankLayout,
  staleKeysValuesBytes,
  type ParallelMode,
} from '../core/parallel.ts';
import type { RankSettings } from '../core/rank-settings.ts';
import { resolveStepCache, STEP_CACHE_DEFAULTS, type MagnitudeCurve } from '../core/step-cache.ts';
import { formatBytes, type ExecutionProvider, type WeightType, WEIGHT_TYPES } from '../core/worker-api.ts';
import type { Backend } from './backends.ts';
import type { WorkerMeasurement } from './measure.ts';
import type { Measurements, WorkerGroup } from './measurements.ts';
import { handOffEvidence, oversized, recomputeMessages } from './message-sizes.ts';
import {
  UNTRUSTED_ALONE,
  type PlacedStepCache,
  type PlacementPrediction,
  type PlacementRequest,
  type ResolvedPlacement,
  type SharedCores,
  type Timeouts,
  type UntrustedAlone,
} from './placement.ts';
import { DEFAULT_SPOT_CHECK_RATE, spotCheckTolerance } from './spot-check.ts';
import { placeStages } from './stage-plan.ts';
import type { SwarmWorker } from './swarm.ts';

/** What the planner knows of a live worker. */
export type PlanningWorker = Pick<SwarmWorker, 'id' | 'info' | 'measurement'>;

/** What stays the same for every job of a pipeline: the model and how its ranks are reached. */
export interface PlannerContext {
  config: WanConfig;
  /** the latent its jobs are made in (its family's: core/model/family.ts) */
  latent: LatentFormat;
  /** the model folder as the workers fetch it */
  modelUrl: string;
  backend: Backend;
  /** rows of every text embedding: the cost model's cross-attention length */
  textTokens: number;
  /** how long a call to a rank may take; RPC_TIMEOUT_MS unless set */
  rpcTimeoutMs?: number;
  /** the model's magnitude curve for the step cache: its folder's, or the published one of its shape; null: none */
  stepCacheCurve?: MagnitudeCurve | null;
}

export interface PlanningInput<W extends PlanningWorker = PlanningWorker> {
  params: JobParams;
  request: PlacementRequest;
  /** the live workers, in the order they joined (none for the local backend) */
  workers: readonly W[];
  measurements: Measurements;
  /** why the rehearsals the planner asked for failed, if they did: it predicts from probe rates instead */
  rehearsalError?: string;
  /** after a lost rank: no more ranks than the placement had */
  maxWorld?: number;
  /** ids of the workers the user trusts (Swarm.isTrusted); none unless given */
  trusted?: ReadonlySet<string>;
}

/** Displaced mode's exact steps before stale keys and values: the first steps move the latent most (DistriFusion). */
export const DEFAULT_WARMUP_STEPS = 2;
/**
 * How long a rank's engine may make no progress on a call that loads nothing, at least: a stage's
 * first run compiles its graph, and a busy machine's pages answer late.
 */
export const RPC_TIMEOUT_MS = 120_000;
/** ... and as a multiple of the step the planner predicts for the placement: a slow machine's stages are slow too */
export const STALL_STEP_MULTIPLE = 20;
/** How long a worker may take to load a model: a real model is GBs, minutes on a slow link. */
export const LOAD_TIMEOUT_MS = 30 * 60_000;

/**
 * A rank is let go when its engine makes no progress for the limit, never for being slow
 * (call-watch.ts): the limit is `rpcTimeoutMs` where the job sets it, else STALL_STEP_MULTIPLE
 * predicted steps with RPC_TIMEOUT_MS as the floor.
 */
export function timeoutsOf(rpcTimeoutMs?: number, predictedStepMs: number | null = null): Timeouts {
  const rpcMs = rpcTimeoutMs ?? Math.max(RPC_TIMEOUT_MS, Math.ceil(STALL_STEP_MULTIPLE * (predictedStepMs ?? 0)));
  // a rank names a silent peer within half the coordinator's patience for a forward: before that runs out
  return {
    rpcMs,
    loadMs: Math.max(LOAD_TIMEOUT_MS, rpcMs),
    exchangeMs: Math.round(rpcMs / 2),
  };
}

/**
 * The transports 'auto' weighs, most exact first, with how far each moved the bench model's latent
 * from float32's (bench slow-link). The dashboard's report names them from here too.
 */
export const TRANSPORTS: { dtype: DType; name: string; wire: string; deviation: string }[] = [
  { dtype: 'f32', name: 'float32', wire: 'exact float32', deviation: 'exact' },
  { dtype: 'f16', name: 'float16', wire: 'float16', deviation: 'about 1e-4 from exact' },
  { dtype: 'i8', name: 'int8', wire: 'int8 with a float32 scale per 64 values', deviation: 'about 3e-3 from exact' },
  {
    dtype: 'i4',
    name: 'int4',
    wire: 'int4 with a float32 scale per 64 values',
    deviation: 'displaced deltas only',
  },
];
const transportOf = (dtype: DType) =>
  defined(
    TRANSPORTS.find((t) => t.dtype === dtype),
    // Stryker disable next-line StringLiteral: TRANSPORTS has every DType, so this is never shown
    `transport ${dtype}`,
  );
export const transportName = (dtype: DType): string => transportOf(dtype).name;
/** How a transport puts activations on the wire, in words ("int8 with a float32 scale per 64 values"). */
export const transportWire = (dtype: DType): string => transportOf(dtype).wire;

/** How a group's ranks exchange: the parallel mode and the transport of its activations. */
export interface Exchange {
  parallel: ParallelMode;
  dtype: DType;
}

/**
 * Every exchange 'auto' weighs, most exact first: Ulysses under each transport, then displaced
 * under each and int4 (stale keys move the latent more than any transport does: bench slow-link). A less
 * exact one is taken only where it is predicted at least LESS_EXACT_GAIN faster than the more exact ones.
 */
export const EXCHANGES: Exchange[] = (['ulysses', 'displaced'] as const).flatMap((parallel) =>
  TRANSPORTS.filter(({ dtype }) => dtype !== 'i4' || parallel === 'displaced').map(({ dtype }) => ({
    parallel,
    dtype,
  })),
);
const LESS_EXACT_GAIN = 1.1;

/** An exchange's name ('float32', 'displaced int8 …'). */
const nameOf = ({ parallel, dtype }: Exchange): string =>
  `${parallel === 'displaced' ? 'displaced ' : ''}${transportName(dtype)}`;
/** what displaced mode costs in fidelity, as bench slow-link and eval-demo measured it */
const DISPLACED_DEVIATION =
  'keys and values one step stale past the warm-up: 1 to 2.5% of the latent from exact in bench slow-link, ' +
  "the demo's held-out accuracy within 2.5 points";
const describeExchange = (e: Exchange): string =>
  e.parallel === 'displaced'
    ? `${nameOf(e)} (${DISPLACED_DEVIATION})`
    : `${nameOf(e)} transport (${transportOf(e.dtype).deviation})`;

/** The request with the defaults of what it leaves unset; the cost model's choices stay unset. */
interface Asked {
  loras: LoraRef[];
  weightType: WeightType | undefined;
  ulyssesDegree: number | 'auto';
  cfgParallel: boolean | undefined;
  ep: ExecutionProvider | 'auto';
  dtype: DType | 'auto';
  shares: 'even' | 'speed' | undefined;
  spotCheckRate: number;
  untrustedAlone: UntrustedAlone;
  emulateLink: RankSettings['emulateLink'];
  parallel: ParallelMode | 'auto';
  warmupSteps: number;
  headGroups: number | undefined;
  /** pipeline stages (pooled memory); 1: every rank holds the whole model */
  stages: number;
  /** PipeFusion's patches a forward is cut into ('auto': exact, PipeFusion measured slower); null: exact staged mode */
  pipeFusionPatches: number | 'auto' | null;
}

/** A request checked, with its defaults: an error that says what is valid. */
export function checkRequest(request: PlacementRequest): Asked {
  const { parallel = 'ulysses', warmupSteps = DEFAULT_WARMUP_STEPS, dtype = 'f32', headGroups } = request;
  const { spotCheckRate = DEFAULT_SPOT_CHECK_RATE, untrustedAlone = 'stop' } = request;
  // int4 would lose too much of Ulysses' q, k, v; displaced sends only keys' and values' change a step
  if (dtype === 'i4' && parallel === 'ulysses')
    throw new Error(
      `dtype 'i4' carries displaced mode's deltas of keys and values only: ` +
        `ask for parallel 'displaced' too (or 'f32', 'f16', 'i8' for Ulysses)`,
    );
  if (!['ulysses', 'displaced', 'auto'].includes(parallel))
    throw new Error(`parallel must be 'ulysses', 'displaced' or 'auto', got ${JSON.stringify(parallel)}`);
  if (!(Number.isInteger(warmupSteps) && warmupSteps >= 0))
    throw new Error(
      `warmupSteps is a whole number ≥ 0 of exact steps before displaced ones, got ${JSON.stringify(warmupSteps)}`,
    );
  if (headGroups !== undefined && !(Number.isInteger(headGroups) && headGroups >= 1))
    throw new Error(
      `headGroups is a whole number ≥ 1 of head groups a block's exchange goes in (1: all heads at once), ` +
        `got ${JSON.stringify(headGroups)}`,
    );
  if (!(spotCheckRate >= 0 && spotCheckRate <= 1))
    throw new RangeError(`a spot-check rate is between 0 and 1, got ${spotCheckRate}`);
  if (!UNTRUSTED_ALONE.includes(untrustedAlone))
    throw new Error(`untrustedAlone is ${UNTRUSTED_ALONE.join(' or ')}, got ${JSON.stringify(untrustedAlone)}`);
  const stages = checkStagesRequest(request);
  const { weightType, pipeFusionPatches = null } = request;
  if (
    pipeFusionPatches !== null &&
    pipeFusionPatches !== 'auto' &&
    !(Number.isInteger(pipeFusionPatches) && pipeFusionPatches >= 2)
  )
    throw new Error(
      `pipeFusionPatches is a whole number ≥ 2 of patches a forward flows through the stages in, or 'auto', ` +
        `got ${JSON.stringify(pipeFusionPatches)}`,
    );
  if (pipeFusionPatches !== null && stages < 2)
    throw new Error(
      'pipeFusionPatches cuts each forward into patches that flow through pipeline stages: ask stages ≥ 2',
    );
  if (weightType !== undefined && !WEIGHT_TYPES.includes(weightType))
    throw new Error(
      `weightType is how ranks hold the model's weights: ${WEIGHT_TYPES.join(', ')} ` +
        `(unset: as each EP does), got ${JSON.stringify(weightType)}`,
    );
  return {
    loras: checkLoras(request.loras),
    weightType,
    ulyssesDegree: request.ulyssesDegree ?? 'auto',
    cfgParallel: request.cfgParallel,
    ep: request.ep ?? 'auto',
    dtype,
    shares: request.shares,
    spotCheckRate,
    untrustedAlone,
    emulateLink: request.emulateLink ?? null,
    parallel,
    warmupSteps,
    headGroups,
    stages,
    pipeFusionPatches,
  };
}

/** The pipeline stages asked for. */
function checkStagesRequest(request: PlacementRequest): number {
  const { stages = 1 } = request;
  if (!(Number.isInteger(stages) && stages >= 1))
    throw new Error(`stages is a whole number ≥ 1 of pipeline stages, got ${JSON.stringify(stages)}`);
  return stages;
}

/**
 * Why a staged placement's forwards cannot be spot-checked, or null where they can: a stage is recomputed from the
 * hidden state of every token by another rank holding its blocks (of its Ulysses mesh, or of the other CFG group).
 */
function stagesUncheckable(
  layout: RankLayout,
  exchange: Exchange,
  config: WanConfig,
  work: Pick<Workload, 'tokens' | 'textTokens'>,
  pipeFusion: PlacedPipeFusion,
): string | null {
  if (pipeFusion)
    return "PipeFusion's patches attend to keys and values of the step before that only their stage's worker holds";
  if (layout.ulyssesDegree * layout.cfgGroups < 2)
    return (
      'a stage held by one worker has no other worker holding its blocks to recompute it: ' +
      'ask two workers a stage (ulyssesDegree 2, or cfgParallel)'
    );
  if (exchange.parallel === 'displaced')
    return 'in displaced mode a stage attends to keys and values of the step before that only its own ranks hold';
  // each group's busiest rank's hand-off, as its receiver's evidence, and a stage's recomputation of every token
  const evidence = Array.from({ length: layout.cfgGroups }, (_, g) =>
    handOffEvidence(config, { ...work, heads: layout.headsOf(g) }),
  );
  return [...evidence, ...recomputeMessages(config, work)].map(oversized).find((why) => why !== null) ?? null;
}

/**
 * A staged placement's spot-check rate: as asked where its stages can be checked; where they cannot, 0 unasked, and
 * asked, refused on its first placement, saying why (a re-placement on fewer workers goes on unchecked).
 */
function stagedSpotCheckRate(asked: Asked, input: PlanningInput, why: string | null): number {
  if (!why) return asked.spotCheckRate;
  if (input.request.spotCheckRate && input.maxWorld === undefined)
    throw new Error(`pipeline stages cannot be spot-checked here: ${why}; or ask spotCheckRate 0`);
  return 0;
}

/** The exchange a job gets given what each would take a step (seconds): as asked, or for 'auto' the choice and why. */
function chooseExchange(
  asked: Pick<Asked, 'dtype' | 'parallel'>,
  stepS: (exchange: Exchange) => number,
  misfit: string | null,
): Exchange & { why: string } {
  if (asked.parallel === 'displaced' && misfit) throw new Error(misfit);
  const allowed = (e: Exchange) =>
    (asked.dtype === 'auto' || e.dtype === asked.dtype) &&
    (asked.parallel === 'auto' || e.parallel === asked.parallel) &&
    !(misfit && e.parallel === 'displaced');
  const options = EXCHANGES.filter(allowed);
  const [exact] = options;
  if (options.length === 1) return { ...exact, why: '' };
  let best = exact;
  // Stryker disable next-line MethodExpression: the exact exchange weighed against itself leaves best as it was
  for (const e of options.slice(1)) if (stepS(e) * LESS_EXACT_GAIN <= stepS(best)) best = e;
  const ms = (e: Exchange) => (stepS(e) * 1000).toFixed(0);
  const why =
    best === exact
      ? `; ${nameOf(exact)}${exact.parallel === 'displaced' ? '' : ' transport'}: ` +
        `no other predicted ${LESS_EXACT_GAIN}× faster`
      : `; ${describeExchange(best)}: predicted ${ms(best)} ms a step, ${nameOf(exact)} ${ms(exact)} ms`;
  return { ...best, why };
}

/** The exchange without a prediction ('auto' where nothing is measured: exact). */
const exchangeUnpredicted = (asked: Asked): Exchange => ({
  parallel: asked.parallel === 'displaced' || asked.dtype === 'i4' ? 'displaced' : 'ulysses',
  dtype: asked.dtype === 'auto' ? 'f32' : asked.dtype,
});

/**
 * What head groups a plan's exchange goes in, in words for its `by` (nothing for one group the job left to the cost
 * model).
 */
const overlapWhy = (headGroups: number, asked: Asked): string =>
  headGroups > 1
    ? `; q, k, v in ${headGroups} head groups, so attention overlaps the exchange` +
      (asked.headGroups ? ' (asked for)' : '')
    : asked.headGroups
      ? '; q, k, v in one head group (asked for)'
      : '';

const DEFAULT_WORKER_GIB = 4;

/**
 * Why displaced mode does not fit these workers, or null where it does: each rank holds every
 * rank's keys and values of each pass and block (staleKeysValuesBytes), which must take at most
 * half the least memory a worker reports (DEFAULT_WORKER_GIB where a browser does not say).
 */
function displacedMisfit(work: Workload, degree: number, workers: readonly PlanningWorker[]): string | null {
  const bytes = staleKeysValuesBytes(work, degree);
  const gib = Math.min(...workers.slice(0, degree).map((w) => w.info.memoryGiB ?? DEFAULT_WORKER_GIB));
  return bytes > (gib * 2 ** 30) / 2
    ? `displaced mode would hold ${formatBytes(bytes)} of keys and values on each rank, more than half of the ` +
        `${gib} GiB its workers have: use Ulysses, or a shorter or smaller video`
    : null;
}

/** The EP a worker will run a job on: the job's, or with 'auto' the one it measured fastest (as it will choose). */
const epOf = (ep: Asked['ep'], m: WorkerMeasurement): ExecutionProvider => (ep === 'auto' ? m.auto.ep : ep);
const computeOf = (ep: Asked['ep'], m: WorkerMeasurement) => m.compute[epOf(ep, m)] ?? m.compute.wasm;

/** What rankOrder reads of a worker: its measurement, and what it says of its machine where it says it. */
type OrderedWorker = Pick<PlanningWorker, 'measurement'> & Partial<Pick<PlanningWorker, 'info'>>;

/**
 * The workers in the order ranks are given to them (workerOrder): the fastest first on the EP each will run (ties in
 * join order), a second worker of a machine whose cores it would share after a slower one of its own machine, so that
 * the plans the cost model predicts are placed on the workers it predicted them on; in join order while any is
 * unmeasured.
 */
export function rankOrder<W extends OrderedWorker>(workers: readonly W[], ep: Asked['ep']): W[] {
  const measured = workers.flatMap((w) => (w.measurement ? [w.measurement] : []));
  if (measured.length < workers.length) return [...workers];
  const order = workerOrder({
    workerFlops: measured.map((m) => computeOf(ep, m)?.flops ?? 0),
    workerCores: coreClaims(workers, measured, ep),
  });
  return order.map((i) => workers[i]);
}

/**
 * The cores each worker computes on (core/cost-model.ts coreShares): its machine's where WASM computes on the CPU,
 * none where WebGPU computes on a GPU (and so does a process's 'wasm' EP on CUDA or Dawn's WebGPU). The tabs of one
 * browser are on one machine whatever their hints say, the first tab's: they share one probe of its cores.
 */
function coreClaims(
  workers: readonly OrderedWorker[],
  measured: readonly WorkerMeasurement[],
  ep: Asked['ep'],
): (CoreClaim | undefined)[] {
  const machineOf = new Map<string, string>();
  for (const { info } of workers)
    if (info?.browser && !machineOf.has(info.browser)) machineOf.set(info.browser, info.machine);
  return workers.map(({ info }, i) =>
    info && epOf(ep, measured[i]) === 'wasm' && (info.nativeDevice ?? 'cpu') === 'cpu'
      ? {
          machine: (info.browser && machineOf.get(info.browser)) || info.machine,
          cores: info.cores,
          threads: info.threads,
        }
      : undefined,
  );
}

/** What a job's forwards cost: the model, its tokens, the text's and its passes. */
function workloadOf(ctx: PlannerContext, params: JobParams): Workload {
  const { config, textTokens } = ctx;
  const tokens = tokenGrid(config, latentShape(params, ctx.latent)).count;
  return { model: config, tokens, textTokens, passes: passesPerStep(params) };
}

/** A group of workers running a job's shape: what rehearsals and measured steps are kept under. */
export function groupOf(
  ctx: PlannerContext,
  params: JobParams,
  ep: Asked['ep'],
  members: WorkerGroup['members'],
): WorkerGroup {
  return { modelUrl: ctx.modelUrl, ep, shape: latentShape(params, ctx.latent), members };
}

const membersOf = (workers: readonly PlanningWorker[]): WorkerGroup['members'] =>
  workers.map((w) => ({ id: w.id, browser: w.info.browser, threads: w.info.threads }));

/** The plans a job weighs, and with which workers: what the cost model predicts and the rehearsals time. */
interface Weighed<W extends PlanningWorker = PlanningWorker> {
  asked: Asked;
  guided: boolean;
  work: Workload;
  /** the workers in rank order (rankOrder), at most maxWorld */
  workers: W[];
  /** the layout asked for, or null for 'auto' */
  fixed: RankLayout | null;
  /** the plans to rehearse and predict: the one asked for, or for 'auto' one worker first and the candidates */
  plans: Plan[];
  /** 'auto': the plans it chooses among (candidatePlans, CFG parallel as asked) */
  candidates: Plan[];
  cfgParallel: boolean | undefined;
  cfgFallback: string | null;
}

function weigh<W extends PlanningWorker>(ctx: PlannerContext, input: PlanningInput<W>): Weighed<W> {
  const asked = checkRequest(input.request);
  const guided = usesGuidance(input.params);
  const work = workloadOf(ctx, input.params);
  const workers = rankOrder(input.workers, asked.ep).slice(0, input.maxWorld ?? Infinity);
  let cfgFallback =
    asked.cfgParallel && !guided
      ? 'no CFG parallel: guidance 1 means one forward pass per step, so there is no second pass for a second group'
      : null;
  if (asked.cfgParallel && guided && input.maxWorld !== undefined && workers.length < 2)
    cfgFallback = 'no CFG parallel: one worker is left, and CFG parallel needs two groups';
  const cfgParallel = cfgFallback ? false : asked.cfgParallel;
  const oneWorker: Plan = { ulyssesDegree: 1, cfgParallel: false };
  const degree = asked.ulyssesDegree;
  if (degree !== 'auto') {
    checkDegree(ctx.config.numHeads, degree);
    const groups = cfgParallel ? 2 : 1;
    // an asked degree the live workers no longer allow after a loss: the largest even one that fits
    const fits = input.maxWorld === undefined || degree * groups <= workers.length;
    const fixed = new RankLayout(
      fits ? degree : defaultDegree(ctx.config.numHeads, Math.floor(workers.length / groups)),
      groups,
    );
    const even: Plan = {
      ulyssesDegree: fixed.ulyssesDegree,
      cfgParallel: fixed.cfgParallel,
      headGroups: asked.headGroups,
    };
    // nothing to choose: only the plan asked for is rehearsed (a one-worker rehearsal would only time the baseline the
    // report compares with, at the cost of a second rehearsal before the job; the probe rates predict that)
    return { asked, guided, work, workers, fixed, plans: [even], candidates: [], cfgParallel, cfgFallback };
  }
  const candidates = candidatePlans(work, workers.length).filter(
    (p) => cfgParallel === undefined || p.cfgParallel === cfgParallel,
  );
  // every worker at once is worth rehearsing too: with uneven shares a degree need not be even
  const all: Plan = { ulyssesDegree: Math.min(workers.length, ctx.config.numHeads), cfgParallel: false };
  // Stryker disable next-line MethodExpression,ArrowFunction: hasAll false adds a candidate twice, changing no rank
  const hasAll = candidates.some((p) => planWorld(p) === all.ulyssesDegree && !p.cfgParallel);
  const rehearsed = cfgParallel || hasAll || workers.length === 0 ? candidates : [...candidates, all];
  return {
    asked,
    guided,
    work,
    workers,
    fixed: null,
    plans: [oneWorker, ...rehearsed],
    candidates,
    cfgParallel,
    cfgFallback,
  };
}

/** A rehearsal the planner needs before it can predict: these workers' forward at these degrees, all at once. */
export interface RehearsalNeeded<W extends PlanningWorker> {
  group: WorkerGroup;
  workers: W[];
  degrees: number[];
}

/**
 * The rehearsals a job's plans need that are not yet measured (none until every worker is measured), the largest group
 * first: it warms every cold engine up at once, side by side, where a lone worker's first would warm up one and leave
 * the others to warm up after it, one group at a time.
 */
export function rehearsalsNeeded<W extends PlanningWorker>(
  ctx: PlannerContext,
  input: PlanningInput<W>,
): RehearsalNeeded<W>[] {
  if (ctx.backend !== 'swarm') return [];
  const { asked, workers, plans } = weigh(ctx, input);
  // a rehearsal loads the whole model, which a staged job's workers need not hold
  if (asked.stages > 1) return [];
  if (!workers.length || workers.some((w) => !w.measurement)) return [];
  const needed: RehearsalNeeded<W>[] = [];
  for (const world of [...new Set(plans.map(planWorld))].sort((a, b) => b - a)) {
    if (world > workers.length) continue;
    const group = groupOf(ctx, input.params, asked.ep, membersOf(workers.slice(0, world)));
    const degrees = [...new Set(plans.filter((p) => planWorld(p) === world).map((p) => p.ulyssesDegree))].filter(
      (d) => !input.measurements.rehearsal(group, d),
    );
    if (degrees.length) needed.push({ group, workers: workers.slice(0, world), degrees });
  }
  return needed;
}

/** What the cost model is given for these workers, or null while any of them is unmeasured. */
function hardwareOf(
  ctx: PlannerContext,
  input: PlanningInput,
  weighed: Weighed,
): (Hardware & { link: PlacementPrediction['link']; forwardsFrom: string }) | null {
  const { workers, asked } = weighed;
  const measured = workers.flatMap((w) => (w.measurement ? [w.measurement] : []));
  if (!workers.length || measured.length < workers.length) return null;
  const rehearsed = (degree: number, world: number) =>
    input.measurements.rehearsal(groupOf(ctx, input.params, asked.ep, membersOf(workers.slice(0, world))), degree);
  const anyRehearsed = weighed.plans.some((p) => rehearsed(p.ulyssesDegree, planWorld(p)) !== undefined);
  const forwardsFrom = input.rehearsalError
    ? `probe rates, as rehearsing failed: ${input.rehearsalError}`
    : anyRehearsed
      ? 'forwards rehearsed on these workers'
      : 'probe rates (these workers were not rehearsed together)';
  const cores = coreClaims(workers, measured, asked.ep);
  return {
    workerFlops: measured.map((m) => computeOf(asked.ep, m)?.flops ?? 0),
    workerSoftmaxRates: measured.map((m) => computeOf(asked.ep, m)?.softmaxRate ?? Infinity),
    workerStageS: measured.map((m) => (computeOf(asked.ep, m)?.stageMs ?? 0) / 1000),
    // the workers of one machine compute on its cores and exchange through its loopback
    workerCpus: cores.map((c) => c?.machine),
    workerCores: cores,
    // even plans: the slowest of the workers; uneven ones the cost model makes from each worker's (unevenPlan)
    rehearsedForwardS: (plan) => (plan.heads ? undefined : slowest(rehearsed(plan.ulyssesDegree, planWorld(plan)))),
    rehearsedRankForwardS: (degree) => rehearsed(degree, degree),
    measuredStepS: (plan, bytes) =>
      input.measurements.measuredStep(
        groupOf(ctx, input.params, asked.ep, membersOf(workers.slice(0, planWorld(plan)))),
        runOf(plan, bytes),
      ),
    // an asked degree's workers are known: the link is theirs
    link: linkOf(input.measurements, weighed.fixed ? workers.slice(0, weighed.fixed.world) : workers),
    // the transport asked for; 'auto' weighs each (chooseExchange), from float32
    bytesPerElement: bytesPerElement(asked.dtype === 'auto' ? 'f32' : asked.dtype),
    forwardsFrom,
  };
}

const slowest = (seconds: number[] | undefined): number | undefined => (seconds ? Math.max(...seconds) : undefined);

/** How a plan runs, for its measured steps: one rank has no exchange, one group of one no transport. */
export function runOf(plan: Plan, bytes: number) {
  return {
    ulyssesDegree: plan.ulyssesDegree,
    cfgParallel: plan.cfgParallel,
    heads: plan.heads ?? null,
    mode: plan.ulyssesDegree > 1 ? (plan.mode ?? 'ulysses') : null,
    bytesPerElement: planWorld(plan) > 1 ? bytes : 0,
  };
}

/**
 * The rank-to-rank link to plan with: a mesh probe of an earlier placement, or the coordinator's links as a stand-in.
 */
function linkOf(measurements: Measurements, workers: readonly PlanningWorker[]): PlacementPrediction['link'] {
  if (measurements.meshLink) return { ...measurements.meshLink, from: 'mesh probe' };
  const measured = workers.map((w) => w.measurement);
  return {
    bandwidth: Math.min(...measured.map((m) => m?.bandwidth ?? Infinity)),
    latency: Math.max(...measured.map((m) => m?.rttMs ?? 0)) / 2000,
    from: 'coordinator links',
  };
}

/**
 * Where a prediction came from: the jobs that ran the plan where any did (Hardware.measuredStepS), else the forwards.
 */
const predictedFrom = (p: StepPrediction, forwardsFrom: string): string =>
  p.measured
    ? `its steps as the last jobs of this shape on these workers measured them; the other plans from ${forwardsFrom}`
    : forwardsFrom;

interface Chosen {
  layout: RankLayout;
  exchange: Exchange;
  headGroups: number | undefined;
  prediction: PlacementPrediction | null;
}

/** 'auto' on measured workers: the plan the cost model predicts fastest (never slower than one worker). */
function chooseAuto(ctx: PlannerContext, weighed: Weighed, hw: NonNullable<ReturnType<typeof hardwareOf>>): Chosen {
  const { work, workers, asked, candidates, plans, cfgParallel } = weighed;
  // Stryker disable MethodExpression: a CFG-parallel plan's degree is a plain candidate's too: no uneven plan is new
  const uneven =
    cfgParallel || asked.shares === 'even'
      ? []
      : plans.filter((p) => !p.cfgParallel).flatMap((p) => unevenPlan(work, hw, p.ulyssesDegree) ?? []);
  // Stryker restore MethodExpression
  // the fastest plan under each exchange the job allows, then the exchange
  const bestUnder = (exchange: Exchange) => {
    const choice = planSwarm(
      work,
      { ...hw, bytesPerElement: bytesPerElement(exchange.dtype) },
      [...candidates, ...uneven].map((p) => ({ ...p, mode: exchange.parallel, headGroups: asked.headGroups })),
    );
    // one worker is always ranked; asked for CFG parallel, the fastest CFG-parallel plan
    return { choice, best: cfgParallel ? (choice.ranked.find((p) => p.plan.cfgParallel) ?? choice.best) : choice.best };
  };
  const largest = Math.max(1, ...candidates.map((p) => p.ulyssesDegree));
  const exchange = chooseExchange(asked, (e) => bestUnder(e).best.stepS, displacedMisfit(work, largest, workers));
  const { choice, best } = bestUnder(exchange);
  const more = choice.ranked.find((p) => p.world > best.world);
  const ms = (p: StepPrediction) => (p.stepS * 1000).toFixed(0);
  const sharing = (world: number) => sharedCoresNote(workers.slice(0, world), hw.workerCores?.slice(0, world) ?? []);
  const leftOut =
    // Stryker disable next-line ConditionalExpression: no ranked plan is wider than the live workers: no more then
    best.world < workers.length && more
      ? `${workers.length - best.world} of ${workers.length} workers left out: ` +
        `with ${more.world} the cost model predicts ${ms(more)} ms a step, not ${ms(best)}: ` +
        whyLeftOut(best, more, sharing(best.world) ? null : (sharing(more.world)?.note ?? null))
      : null;
  const by =
    `cost model (${predictedFrom(best, hw.forwardsFrom)}; rank links from ${hw.link.from}` +
    `${exchange.why}${overlapWhy(best.headGroups, asked)})`;
  return {
    layout: new RankLayout(
      best.plan.ulyssesDegree,
      best.plan.cfgParallel ? 2 : 1,
      best.plan.heads ? [best.plan.heads] : null,
    ),
    exchange,
    headGroups: best.headGroups,
    prediction: {
      asked: false,
      by,
      link: hw.link,
      predictedStepMs: best.stepS * 1000,
      oneWorkerStepMs: choice.baseline.stepS * 1000,
      leftOut,
      sharedCores: sharing(best.world),
    },
  };
}

/**
 * Why the wider plan `more` is slower than the one chosen, in words a person can act on (issue 66): the workers it
 * would add share a machine's cores with those chosen (`sharedCores`, its sharedCoresNote), so they compute no sooner
 * together; they compute their shares no sooner than the chosen ones compute theirs (the added ones are too slow to
 * help); or what it saves in compute its exchanges cost again, which a job of more tokens outweighs.
 */
export function whyLeftOut(best: StepPrediction, more: StepPrediction, sharedCores: string | null = null): string {
  if (sharedCores && more.computeS >= best.computeS)
    return (
      `${sharedCores}, so together they compute a step no sooner than fewer of them; they would be used beside each ` +
      'other with cores of their own (one browser of worker tabs on that machine, the others on other machines)'
    );
  if (more.computeS >= best.computeS)
    return (
      'the workers it would add compute their share no sooner than those chosen compute theirs, so each step would ' +
      'wait for them; they are used where they are faster (more of their cores, or WebGPU)'
    );
  return (
    'the compute they would save is less than their exchanges would cost; a job of more tokens (more frames, a ' +
    'larger size) gives each worker more to compute per exchange, and would use them'
  );
}

/**
 * The workers of a plan (in rank order, with their CoreClaims) that look like one machine and share its cores, in
 * words (issue 66), or null where none do: which, how many cores, and what part of its speed alone each computes at
 * beside the others (core/cost-model.ts coreShares).
 */
export function sharedCoresNote(
  workers: readonly { id: string }[],
  claims: readonly (CoreClaim | undefined)[],
): SharedCores | null {
  const indices = workers.map((_, i) => i);
  const shares = coreShares({ workerCores: claims }, indices);
  const machines = new Map<string, number[]>();
  for (const i of indices) {
    const claim = claims[i];
    if (claim && shares[i] < 1) machines.set(claim.machine, [...(machines.get(claim.machine) ?? []), i]);
  }
  if (!machines.size) return null;
  const sharing = [...machines.values()];
  const note = sharing
    .map((one) => {
      const ids = one.map((i) => workers[i].id);
      const names = `${ids.slice(0, -1).join(', ')} and ${ids.at(-1) ?? ''}`;
      const threads = one.reduce((sum, i) => sum + (claims[i]?.threads ?? 0), 0);
      const cores = claims[one[0]]?.cores ?? 1;
      const part = Math.round(100 * Math.max(...one.map((i) => shares[i])));
      return (
        `workers ${names} look like one machine (their pages see the same cores, memory, OS, time zone and adapter) ` +
        `and share its ${cores} core${cores === 1 ? '' : 's'}: with ${threads} threads between them each computes ` +
        `at about ${part}% of its speed alone`
      );
    })
    .join('; ');
  return { workers: sharing.flat().map((i) => workers[i].id), note };
}

/** The worker given the fewest heads where the heads went by speed and it has less than an even share, or null. */
function fewestHeads(workers: readonly { id: string }[], heads: readonly number[]) {
  const total = heads.reduce((a, b) => a + b, 0);
  const fewest = Math.min(...heads);
  const worker = workers.at(heads.indexOf(fewest));
  return worker && fewest * heads.length < total ? { id: worker.id, fewest, total } : null;
}

/**
 * Where the heads went by speed and a worker was given less than an even share: which, and what would give it more
 * (issue 66), or null. Its ranks are the placement's workers in rank order (heads are shared by speed in one group).
 */
export function smallestShare(workers: readonly { id: string }[], heads: readonly number[]): string | null {
  const least = fewestHeads(workers, heads);
  return (
    least &&
    `worker ${least.id} was given ${least.fewest} of the ${least.total} heads: its forward was the slowest when ` +
      'rehearsed; on more of its cores (fewer tabs beside it) or on WebGPU, it would be given more'
  );
}

/** What a placement's notes are made of. */
export type PlacementNotes = Pick<ResolvedPlacement, 'workers' | 'layout' | 'prediction' | 'stages'>;

/**
 * What a placement's notes say of one worker (the dashboard's swarm table, issue 66): why it was left out and what job
 * would use it, that it was given the fewest heads and what would give it more, that it shares its machine's cores;
 * none where they say nothing of it.
 */
export function workerPlanNotes(placement: PlacementNotes, worker: string): string[] {
  const { prediction } = placement;
  if (!placement.workers.some((w) => w.id === worker)) return prediction?.leftOut ? [prediction.leftOut] : [];
  // heads are shared by speed in one group of one stage only
  const heads = placement.stages ? undefined : placement.layout.heads?.[0];
  const least = heads && fewestHeads(placement.workers, heads);
  return [
    least && least.id === worker ? smallestShare(placement.workers, heads) : null,
    prediction?.sharedCores?.workers.includes(worker) ? prediction.sharedCores.note : null,
  ].filter((note): note is string => note !== null);
}

/**
 * A degree the job asked for, predicted like the planner's choices so that every report carries
 * predicted next to measured. Its ranks share the heads by speed where the job asks that, or
 * (shares unset) where the cost model predicts it faster.
 */
function predictAsked(weighed: Weighed, fixed: RankLayout, hw: NonNullable<ReturnType<typeof hardwareOf>>): Chosen {
  const { work, workers, asked } = weighed;
  const even: Plan = {
    ulyssesDegree: fixed.ulyssesDegree,
    cfgParallel: fixed.cfgParallel,
    headGroups: asked.headGroups,
  };
  const oneWorker: Plan = { ulyssesDegree: 1, cfgParallel: false };
  const uneven = fixed.cfgParallel || asked.shares === 'even' ? null : unevenPlan(work, hw, fixed.ulyssesDegree);
  const stepUnder = ({ dtype, parallel }: Exchange) => {
    const hwD = { ...hw, bytesPerElement: bytesPerElement(dtype) };
    const evenStep = predictStep(work, { ...even, mode: parallel }, hwD);
    const unevenStep = uneven && predictStep(work, { ...uneven, mode: parallel, headGroups: asked.headGroups }, hwD);
    return unevenStep && (asked.shares === 'speed' || unevenStep.stepS < evenStep.stepS) ? unevenStep : evenStep;
  };
  const exchange = chooseExchange(
    asked,
    (e) => stepUnder(e).stepS,
    displacedMisfit(work, fixed.ulyssesDegree, workers),
  );
  const chosen = stepUnder(exchange);
  const by =
    `asked for (predicted from ${predictedFrom(chosen, hw.forwardsFrom)}; rank links from ${hw.link.from}` +
    `${exchange.why}${overlapWhy(chosen.headGroups, asked)})`;
  return {
    layout: new RankLayout(fixed.ulyssesDegree, fixed.cfgGroups, chosen.plan.heads ? [chosen.plan.heads] : null),
    exchange,
    headGroups: chosen.headGroups,
    prediction: {
      asked: true,
      by,
      link: hw.link,
      predictedStepMs: chosen.stepS * 1000,
      oneWorkerStepMs: predictStep(work, oneWorker, hw).stepS * 1000,
      leftOut: null,
      sharedCores: sharedCoresNote(workers.slice(0, fixed.world), hw.workerCores?.slice(0, fixed.world) ?? []),
    },
  };
}

/** The local backend: one rank in this tab, nothing to predict. */
function placeLocal(weighed: Weighed): Chosen {
  const { asked } = weighed;
  if (asked.cfgParallel)
    throw new Error(`cfgParallel needs two groups of worker pages: use the swarm backend, not local`);
  if (asked.ulyssesDegree !== 'auto' && asked.ulyssesDegree !== 1)
    throw new Error(
      `the local backend runs one rank in this tab, not ${asked.ulyssesDegree}: use the swarm backend for more`,
    );
  return { layout: new RankLayout(1), exchange: exchangeUnpredicted(asked), headGroups: undefined, prediction: null };
}

/** Before the workers are measured: the degree asked, or the largest even degree they allow, exact and even. */
function placeUnmeasured(ctx: PlannerContext, weighed: Weighed): Chosen {
  const { fixed, workers, cfgParallel, asked } = weighed;
  const groups = cfgParallel ? 2 : 1;
  const layout =
    fixed ?? new RankLayout(defaultDegree(ctx.config.numHeads, Math.floor(workers.length / groups)), groups);
  return { layout, exchange: exchangeUnpredicted(asked), headGroups: undefined, prediction: null };
}

/** Every decision of a job's placement: pure, from the request, the job, the live workers and their measurements. */
export function planPlacement(ctx: PlannerContext, input: PlanningInput): ResolvedPlacement {
  const weighed = weigh(ctx, input);
  const { asked, fixed } = weighed;
  const staged = asked.stages > 1 ? placeStaged(ctx, input, weighed) : null;
  const workers = staged?.workers ?? weighed.workers;
  const hw =
    !staged && ctx.backend === 'swarm' && workers.length >= (fixed?.world ?? 1)
      ? hardwareOf(ctx, input, weighed)
      : null;
  const chosen =
    staged?.chosen ??
    (ctx.backend === 'local'
      ? placeLocal(weighed)
      : hw
        ? fixed
          ? predictAsked(weighed, fixed, hw)
          : chooseAuto(ctx, weighed, hw)
        : placeUnmeasured(ctx, weighed));
  const { layout, exchange } = chosen;
  if (ctx.backend === 'swarm') refuseUntrustedAlone(asked, input, layout.world, workers);
  const pipeFusion = staged?.pipeFusion ?? null;
  // displaced ranks exchange once a block: head groups are Ulysses' alone, at most the fewest heads a rank has
  const fewestHeads = Math.min(...(layout.heads?.flat() ?? evenHeads(ctx.config.numHeads, layout.ulyssesDegree)));
  const headGroups =
    exchange.parallel === 'displaced' ? 1 : Math.min(chosen.headGroups ?? asked.headGroups ?? 1, fewestHeads);
  const cfgFallback = weighed.cfgFallback;
  const prediction = chosen.prediction && {
    ...chosen.prediction,
    by: cfgFallback ? `${chosen.prediction.by}; ${cfgFallback}` : chosen.prediction.by,
  };
  return {
    backend: ctx.backend,
    modelUrl: ctx.modelUrl,
    loras: asked.loras,
    weightType: asked.weightType ?? null,
    layout,
    workers:
      ctx.backend === 'swarm'
        ? workers
            .slice(0, layout.world)
            .map((w) => ({ id: w.id, ep: w.measurement ? epOf(asked.ep, w.measurement) : asked.ep }))
        : [],
    ep: asked.ep,
    settings: { dtype: exchange.dtype, parallel: exchange.parallel, headGroups, emulateLink: asked.emulateLink },
    warmupSteps: asked.warmupSteps,
    spotChecks: {
      rate: staged
        ? stagedSpotCheckRate(asked, input, stagesUncheckable(layout, exchange, ctx.config, weighed.work, pipeFusion))
        : asked.spotCheckRate,
      tolerance: spotCheckTolerance(exchange.dtype),
    },
    untrustedAlone: asked.untrustedAlone,
    timeouts: timeoutsOf(ctx.rpcTimeoutMs, prediction?.predictedStepMs),
    prediction,
    cfgFallback,
    stages: staged?.stages ?? null,
    pipeFusion,
    cache: placedStepCache(ctx, input.request),
  };
}

type PlacedPipeFusion = ResolvedPlacement['pipeFusion'];

/**
 * The PipeFusion a staged placement of `stages` stages of `degree` workers can take, as asked: its stages one worker
 * each, exchanging nothing within them, its patches at most the heads (planUlysses cuts them) and the tokens; for
 * 'auto' twice the stages, where possible. Null where it asked none, or for 'auto' where the placement cannot take it;
 * asked a number, a placement that cannot take it is refused, saying why.
 */
function pipeFusionAsked(
  ctx: PlannerContext,
  asked: Asked,
  { stages, degree, tokens }: { stages: number; degree: number; tokens: number },
): { patches: number } | null {
  const patches = asked.pipeFusionPatches;
  // a re-placement on fewer workers may leave one stage: nothing to pipeline, the job goes on exact
  if (patches === null || stages < 2) return null;
  const most = Math.min(ctx.config.numHeads, tokens);
  const refusal =
    degree !== 1
      ? `PipeFusion's stages are one worker each (two with cfgParallel): ask ulyssesDegree 1, not ${degree}`
      : exchangeUnpredicted(asked).parallel === 'displaced'
        ? "PipeFusion's stages exchange nothing within them: ask parallel 'ulysses', not 'displaced'"
        : patches !== 'auto' && patches > most
          ? `pipeFusionPatches ${patches} is more than this job can be cut into: at most ${most} ` +
            `(the model's ${ctx.config.numHeads} heads, the job's ${tokens} tokens)`
          : null;
  if (refusal && patches !== 'auto') throw new Error(refusal);
  return refusal ? null : { patches: patches === 'auto' ? Math.min(2 * stages, most) : patches };
}

/**
 * The job's step cache: what it asked, read against the model's curve. A step cache skips or keeps all the blocks at
 * once, so it needs ranks holding them all: not pipeline stages yet.
 */
export function placedStepCache(ctx: Pick<PlannerContext, 'stepCacheCurve'>, request: PlacementRequest) {
  const { cache, stages = 1 } = request;
  const placed: PlacedStepCache | null =
    cache === 'calibrate'
      ? { settings: { ...STEP_CACHE_DEFAULTS, threshold: 0 }, curve: null }
      : (() => {
          const curve = ctx.stepCacheCurve ?? null;
          const settings = resolveStepCache(cache, curve);
          return settings && { settings, curve };
        })();
  if (placed && stages > 1)
    throw new Error(
      'the step cache skips all the blocks of a forward at once, so it needs ranks that hold them all: ' +
        'ask cache off with pipeline stages',
    );
  return placed;
}

/**
 * Pooled memory: the blocks cut into pipeline stages over the workers (stage-plan.ts), each stage a
 * group of the Ulysses degree asked (one worker where it is 'auto'), the workers in stage order;
 * after a lost rank, into as many stages as the workers left fill.
 */
function placeStaged(ctx: PlannerContext, input: PlanningInput, weighed: Weighed) {
  const { asked } = weighed;
  if (ctx.backend !== 'swarm') throw new Error('pipeline stages run on worker pages: use the swarm backend for stages');
  const degree = asked.ulyssesDegree === 'auto' ? 1 : asked.ulyssesDegree;
  const live = weighed.workers;
  // CFG parallel: each group's mesh holds every stage; after a loss, one group where two no longer fit
  const cfgGroups = weighed.cfgParallel && (input.maxWorld === undefined || live.length >= 2 * degree) ? 2 : 1;
  const members = degree * cfgGroups;
  const count =
    input.maxWorld === undefined
      ? asked.stages
      : Math.max(1, Math.min(asked.stages, Math.floor(live.length / members)));
  const { tokens, textTokens, passes } = weighed.work;
  // PipeFusion's stages keep every token's keys and values [2, S, D] in float32 per block, for each pass they run
  // 'auto' never fuses (below): only a number of patches asked makes the cut reserve PipeFusion's memory
  const fusing =
    asked.pipeFusionPatches === 'auto' ? null : pipeFusionAsked(ctx, asked, { stages: count, degree, tokens });
  const keysValuesBytesPerBlock = fusing ? (cfgGroups === 2 ? 1 : passes) * 2 * tokens * ctx.config.dim * 4 : 0;
  const stages = placeStages(
    ctx.config,
    { stages: count, degree, tokens, textTokens, weightType: asked.weightType, cfgGroups, keysValuesBytesPerBlock },
    live.map((w) => ({
      id: w.id,
      memoryGiB: w.info.memoryGiB,
      modelMemoryGiB: w.info.modelMemoryGiB,
      // 'even' shares: blocks by memory alone (workers alike, or speeds measured on shared cores)
      flops: w.measurement && asked.shares !== 'even' ? (computeOf(asked.ep, w.measurement)?.flops ?? null) : null,
    })),
  );
  const workerOf = (id: string) =>
    defined(
      live.find((w) => w.id === id),
      // Stryker disable next-line StringLiteral: placeStages places only the live workers' ids it was given
      `worker ${id}`,
    );
  const placed = stages.map((stage) => ({ blocks: stage.blocks, workers: stage.workers.map(workerOf) }));
  // the stages were cut for int8's bytes, which a WebGPU rank does not hold (rank/onnx-stages.ts heldWeightType)
  const onWebGpu = placed
    .flatMap((s) => s.workers)
    .filter((w) => w.measurement && epOf(asked.ep, w.measurement) === 'webgpu');
  if (asked.weightType === 'int8' && onWebGpu.length)
    throw new Error(
      `int8 weights are held on WASM alone, and ${onWebGpu.map((w) => w.id).join(', ')} would compute on WebGPU, ` +
        "holding more than its stage was cut for: ask ep 'wasm', or weightType 'float16'",
    );
  const possible = pipeFusionAsked(ctx, asked, { stages: stages.length, degree, tokens });
  const exact = predictStaged(ctx, input, weighed, placed, cfgGroups, null);
  const fused = possible && predictStaged(ctx, input, weighed, placed, cfgGroups, possible.patches);
  // 'auto' stays exact: PipeFusion was measured slower than exact stages (bench pooled: each patch's calls widen the
  // weights again), where the cost model, which does not count that, predicts it faster
  const pipeFusion = asked.pipeFusionPatches === 'auto' ? null : possible;
  const ms = (p: PlacementPrediction | null) => `${p?.predictedStepMs.toFixed(0)} ms`;
  const why =
    asked.pipeFusionPatches !== 'auto'
      ? ''
      : possible
        ? `; exact: 'auto' takes no PipeFusion, measured slower than exact stages (predicted ${ms(fused)} a step, ` +
          `exact ${ms(exact)})`
        : '; exact: PipeFusion not possible here';
  const prediction = pipeFusion ? fused : exact;
  const chosen: Chosen = {
    layout: new RankLayout(degree, cfgGroups, null, stages.length),
    exchange: exchangeUnpredicted(asked),
    headGroups: undefined,
    prediction: prediction && { ...prediction, by: prediction.by + why },
  };
  // in rank order: group after group, each's stages in turn (RankLayout)
  const ranked = Array.from({ length: cfgGroups }, (_, g) =>
    stages.flatMap((stage) => stage.workers.slice(g * degree, (g + 1) * degree)),
  );
  return {
    stages,
    chosen,
    workers: ranked.flat().map(workerOf),
    pipeFusion,
  };
}

/**
 * A staged step as the cost model predicts it (predictStagedStep: exact mode, a step's passes pipelined through the
 * stages or batched, whichever is quicker; or PipeFusion's patches pipelined), at the pace of the stage slowest for its
 * blocks (stages are cut by speed, so they are near even): the others keep in step with it. From the probes' rates: a
 * rehearsal or a step measured was of the whole model. Null while a placed worker is unmeasured.
 */
function predictStaged<W extends PlanningWorker>(
  ctx: PlannerContext,
  input: PlanningInput<W>,
  weighed: Weighed<W>,
  stages: { blocks: [number, number]; workers: W[] }[],
  cfgGroups: 1 | 2,
  /** PipeFusion's patches; null: exact */
  patches: number | null,
): PlacementPrediction | null {
  const flopsOf = (w: W) => (w.measurement ? (computeOf(weighed.asked.ep, w.measurement)?.flops ?? 0) : 0);
  if (stages.some((stage) => stage.workers.some((w) => !flopsOf(w)))) return null;
  const secondsOf = ({ blocks: [from, to], workers }: (typeof stages)[number]) =>
    (to - from) / Math.min(...workers.map(flopsOf));
  const pace = stages.reduce((slowest, stage) => (secondsOf(stage) > secondsOf(slowest) ? stage : slowest));
  const measured = hardwareOf(ctx, input, { ...weighed, workers: pace.workers, fixed: null, plans: [] });
  if (!measured) return null;
  const hw: Hardware = {
    ...measured,
    rehearsedForwardS: undefined,
    rehearsedRankForwardS: undefined,
    measuredStepS: undefined,
  };
  const degree = pace.workers.length / cfgGroups;
  const step = predictStagedStep(
    weighed.work,
    {
      stages: stages.length,
      ulyssesDegree: degree,
      cfgParallel: cfgGroups === 2,
      ...(patches ? { mode: 'pipefusion', patches } : { mode: 'exact' }),
      paceBlocks: pace.blocks[1] - pace.blocks[0],
    },
    hw,
  );
  const flow = patches ? `PipeFusion's ${patches} patches pipelined` : `a step's passes ${step.schedule}`;
  return {
    asked: true,
    by:
      `the cost model: ${stages.length} pipeline stages of ${degree} worker${degree === 1 ? '' : 's'}, ` +
      `${flow}, at the pace of the stage slowest for its blocks (probe rates)`,
    link: measured.link,
    predictedStepMs: step.stepS * 1000,
    oneWorkerStepMs: predictStep(weighed.work, { ulyssesDegree: 1, cfgParallel: false }, hw).stepS * 1000,
    leftOut: null,
    sharedCores: null,
  };
}

/**
 * Never trust one worker alone: a re-placement (after a lost rank) onto one worker the user does not
 * trust, with no rank left to check it, stops the job with the reason, unless the job asked to continue.
 */
function refuseUntrustedAlone(
  asked: Pick<Asked, 'untrustedAlone'>,
  input: Pick<PlanningInput, 'maxWorld' | 'trusted'>,
  world: number,
  workers: readonly PlanningWorker[],
): void {
  if (input.maxWorld === undefined || world !== 1 || asked.untrustedAlone === 'continue') return;
  const alone = workers.at(0);
  if (!alone || input.trusted?.has(alone.id)) return;
  throw new Error(
    `only worker ${alone.id} is left for this job and it is not trusted: one worker alone, with nobody to check ` +
      'it, would decide the video. The job stops; run it again once more workers have joined, mark a worker ' +
      "trusted on the dashboard, open a worker tab on this machine, or ask untrustedAlone 'continue'",
  );
}

/** How many workers a placement of this request waits for before it is planned. */
export function workersToWaitFor(ctx: PlannerContext, request: PlacementRequest, params: JobParams): number {
  const { ulyssesDegree = 'auto', cfgParallel } = request;
  const groups = cfgParallel && usesGuidance(params) ? 2 : 1;
  const stages = checkStagesRequest(request);
  if (ulyssesDegree === 'auto') return groups * stages;
  checkDegree(ctx.config.numHeads, ulyssesDegree);
  return ulyssesDegree * groups * stages;
}

/**
 * The text encoder's layers on the workers that run them: contiguous runs in rank order, each in
 * proportion to its worker's measured speed (evenly while any is unmeasured), at most one worker a layer.
 */
export function placeTextLayers<W extends OrderedWorker>(
  workers: readonly W[],
  numLayers: number,
): { worker: W; from: number; to: number }[] {
  const hosts = rankOrder(workers, 'auto').slice(0, numLayers);
  if (!hosts.length) return [];
  const speeds = hosts.map((w) => w.measurement?.compute.wasm?.flops);
  const weights = speeds.every((s): s is number => s !== undefined && s > 0) ? speeds : hosts.map(() => 1);
  const counts = proportionalShares(numLayers, weights);
  let from = 0;
  return hosts.map((worker, i) => {
    const run = { worker, from, to: from + counts[i] };
    from = run.to;
    return run;
  });
}

/**
 * The VAE's tiles: every live worker takes them from one queue (they are independent), so the tile
 * size must fit the smallest buffer any of them allows, as far as their loads have said.
 */
export function placeVaeTiles<W extends Pick<PlanningWorker, 'id' | 'info'>>(
  workers: readonly W[],
  measurements: Measurements,
): { hosts: W[]; maxBufferBytes: number } {
  const limits = workers.map((w) => measurements.maxBufferBytes({ id: w.id, browser: w.info.browser }) ?? Infinity);
  return { hosts: [...workers], maxBufferBytes: Math.min(Infinity, ...limits) };
}
