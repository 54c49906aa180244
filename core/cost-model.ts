// Predicted time of one denoising step of a swarm plan, from FLOPs and bytes: each rank computes
// its share of every forward at its measured throughput, and between the attention sub-blocks
// sends its all-to-all bytes over the measured link. The planner ranks plans by this prediction.

import type { WanConfig } from './model/config.ts';
import type { ComputeProbe, ExecutionProvider, MeshProbe, NativeDevice, WeightType } from './worker-api.ts';
import {
  checkDegree,
  displacedFloatsPerBlock,
  evenDegrees,
  evenHeads,
  exchangeFloatsPerBlock,
  MAX_HEAD_GROUPS,
  planUlysses,
  proportionalShares,
  type ParallelMode,
} from './parallel.ts';

/** The sizes a forward's cost depends on (a WanConfig has them all). */
export type ModelShape = Pick<
  WanConfig,
  | 'numHeads'
  | 'headDim'
  | 'dim'
  | 'ffnDim'
  | 'numLayers'
  | 'inChannels'
  | 'outChannels'
  | 'patchSize'
  | 'textDim'
  | 'freqDim'
>;

export interface Workload {
  model: ModelShape;
  /** S: video tokens of one forward */
  tokens: number;
  /** L: text tokens the cross-attention reads */
  textTokens: number;
  /** forward passes per step: 2 with classifier-free guidance, 1 without */
  passes: 1 | 2;
}

export interface Plan {
  ulyssesDegree: number;
  /** conditional and unconditional passes on two groups of `ulyssesDegree` workers each */
  cfgParallel: boolean;
  /**
   * each rank's share of the heads, for workers of unequal speed (rank i on the i-th worker of
   * the Hardware, as placed); even shares without it
   */
  heads?: number[];
  /** how a group's ranks share self-attention; Ulysses without it */
  mode?: ParallelMode;
  /**
   * Ulysses: the head groups a block's exchange goes in (core/parallel.ts headGroup); without it
   * the prediction takes the fastest, and says which (StepPrediction.plan)
   */
  headGroups?: number;
}

/** Workers a plan occupies: its degree, twice over with CFG parallel. */
export const planWorld = (plan: Plan): number => (plan.cfgParallel ? 2 : 1) * plan.ulyssesDegree;

export interface LinkSpeed {
  /** bytes/s one rank can send */
  bandwidth: number;
  /** seconds, one way */
  latency: number;
}

export interface Hardware {
  /** measured FLOP/s of each worker that could take part; a plan uses the fastest ones */
  workerFlops: number[];
  /**
   * measured attention scores/s (bias add + softmax) of each worker, parallel to workerFlops: the
   * memory-bound work FLOPs miss. Omitted: not charged.
   */
  workerSoftmaxRates?: number[];
  /**
   * seconds one stage call costs each worker whatever its size, parallel to workerFlops: what
   * dominates a step at few tokens, where FLOPs are next to nothing. Omitted: not charged.
   */
  workerStageS?: number[];
  /**
   * seconds of one rank's forward under a plan, as rehearsed on the workers it would run on (the
   * slowest of them), all at once as in the job: where given, it replaces the estimate from the
   * rates above, which misses small shapes, the page↔engine hop and tabs of one machine slowing
   * each other (rank/rehearsal.ts).
   */
  rehearsedForwardS?: (plan: Plan) => number | undefined;
  /**
   * seconds of each of the first `degree` workers' forward at that degree with even shares, as
   * rehearsed all at once: what an uneven plan's shares and prediction come from (unevenPlan)
   */
  rehearsedRankForwardS?: (degree: number) => number[] | undefined;
  /**
   * seconds of a step of this plan (at this transport's bytes per value) as jobs of the same shape
   * measured it on these workers (Placer.measuredStep), whatever head groups they ran: where given,
   * that is the prediction, since no rehearsal is closer to what a job takes than a job, and a plan
   * predicted too fast is not chosen again on that prediction.
   */
  measuredStepS?: (plan: Plan, bytesPerElement: number) => number | undefined;
  /**
   * the CPU each worker computes on, where known, parallel to workerFlops: WASM tabs of one
   * browser share their machine's cores, and their exchanges go through its loopback, whose work
   * (the data channels' encryption and framing) is CPU time on those same cores, so no compute
   * hides it. Unknown (undefined, or WebGPU: the GPU computes while the CPU sends): a CPU of its own.
   */
  workerCpus?: (string | undefined)[];
  /**
   * the cores each worker computes on, where it computes on a CPU, parallel to workerFlops: workers of one machine
   * whose threads together exceed its cores share them (coreShares). Undefined (a GPU, or not said): its own.
   */
  workerCores?: readonly (CoreClaim | undefined)[];
  /** the link between workers i and j (indices into workerFlops), or one link for every pair */
  link: LinkSpeed | ((i: number, j: number) => LinkSpeed);
  /** activations on the wire, bytes a value: 4 for fp32 transport, 2 for fp16, about 1 for int8 (payloadBytes) */
  bytesPerElement: number;
  /** all-to-alls per transformer block; Ulysses has 2 (q/k/v out, attention output back) */
  exchangesPerBlock?: number;
  /**
   * The coordinator's link to the workers: every forward it sends the patches [S, C·pt·ph·pw] out
   * and gathers the rows [S, pt·ph·pw·C] back, as fp32, through its one uplink whatever P is.
   * Defaults to `link`; null when the coordinator and the worker share a tab (the local backend).
   */
  coordinatorLink?: LinkSpeed | null;
}

/** What a worker computing on a CPU says of it: the machine (WorkerInfo.machine), its cores and the threads it uses. */
export interface CoreClaim {
  machine: string;
  cores: number;
  threads: number;
}

/**
 * The part of its probed rate each of `workers` (indices into workerFlops) computes at while they all compute at once:
 * 1, or where the threads of those on one machine add up to more than its cores, its cores / those threads. Each was
 * probed on its threads with no other probe of its machine running (Swarm takes them one machine at a time), and a
 * machine with more runnable threads than cores gives each thread an even slice of them, so each worker computes at
 * that fraction of its probe (one on more threads than cores already in its probe, at what its probe had of them).
 * A worker's own `cores` is taken, so that one claiming another's machine slows only the plans it is in. The tabs of
 * one browser split its cores among them (worker/cores.ts): their threads add up to no more than its cores, and they
 * keep their probes' rates. Rehearsed and measured forwards are timed all at once, so they already hold this sharing
 * and are not scaled again.
 */
export function coreShares(
  hw: { workerCores?: readonly (CoreClaim | undefined)[] },
  workers: readonly number[],
): number[] {
  const claims = workers.map((i) => hw.workerCores?.[i]);
  const threadsOn = new Map<string, number>();
  for (const c of claims) if (c) threadsOn.set(c.machine, (threadsOn.get(c.machine) ?? 0) + c.threads);
  return claims.map((c) => {
    if (!c) return 1;
    const threads = threadsOn.get(c.machine) ?? c.threads;
    // the cores its threads get beside the others', of those they had in its probe (all its threads, at most the cores)
    return Math.min(1, (c.threads * Math.min(1, c.cores / threads)) / Math.min(c.threads, c.cores));
  });
}

/**
 * The workers (indices into workerFlops) in the order plans take them, a plan of P taking the first P: each next one
 * the worker that keeps the slowest of those taken fastest once machines' shared cores are counted (coreShares), ties
 * to the faster, then the first. Without shared cores that is the fastest first; with them a second worker of a busy
 * machine comes after a slower one of a machine of its own, where the first would be halved beside it.
 */
export function workerOrder(hw: Pick<Hardware, 'workerFlops' | 'workerCores'>): number[] {
  // fastest first (a stable sort: ties in their order), which is where each next one is looked for
  const left = hw.workerFlops.map((_, i) => i).sort((a, b) => hw.workerFlops[b] - hw.workerFlops[a]);
  const machines = hw.workerCores?.flatMap((c) => (c ? [c.machine] : [])) ?? [];
  if (new Set(machines).size === machines.length) return left; // no machine has two: no cores shared
  const order: number[] = [];
  const slowestWith = (i: number) => {
    const taken = [...order, i];
    const shares = coreShares(hw, taken);
    return Math.min(...taken.map((w, k) => hw.workerFlops[w] * shares[k]));
  };
  while (left.length) {
    let best = 0;
    let bestSlowest = slowestWith(left[0]);
    for (let k = 1; k < left.length; k++) {
      const slowest = slowestWith(left[k]);
      if (slowest > bestSlowest) [best, bestSlowest] = [k, slowest];
    }
    order.push(...left.splice(best, 1));
  }
  return order;
}

/** FLOPs of one rank's share of one forward pass (multiply-add = 2 FLOPs). */
export interface ForwardFlops {
  embed: number;
  /** per block, by part */
  block: {
    selfProjections: number;
    attention: number;
    crossProjections: number;
    crossAttention: number;
    ffn: number;
    total: number;
  };
  head: number;
  total: number;
  /** attention score elements the rank softmaxes, self (its heads × S × S) and cross, all blocks */
  scores: number;
  /** of which self-attention's */
  selfScores: number;
}

export interface StepPrediction {
  plan: Plan;
  /** the head groups predicted: the plan's, or without them the fastest (1 but for Ulysses over several ranks) */
  headGroups: number;
  /** workers the plan occupies: degree, ×2 with CFG parallel */
  world: number;
  flopsPerRank: number; // per step
  bytesPerRank: number; // per step
  computeS: number;
  /** all-to-all time not hidden behind compute */
  commS: number;
  /** patches out to the workers and rows back to the coordinator */
  ioS: number;
  /** computeS + commS + ioS, or the step the jobs that ran this plan measured (Hardware.measuredStepS) */
  stepS: number;
  /** stepS is the jobs' measured step, not the estimate */
  measured: boolean;
}

/**
 * FLOPs of one rank's forward: under Ulysses degree P with even shares (rank 0, the busiest: it has
 * the most heads and tokens), or rank `rank` of the given head shares.
 */
export function forwardFlops(
  model: ModelShape,
  tokens: number,
  textTokens: number,
  shares: number | number[],
  rank = 0,
): ForwardFlops {
  const { dim: D, ffnDim, numLayers, inChannels, outChannels, patchSize, textDim, freqDim } = model;
  const patch = patchSize.reduce((a, b) => a * b, 1);
  const plan = planUlysses(model, tokens, shares);
  const Sl = plan.rows[rank];
  const heads = plan.heads[rank];
  const L = textTokens;
  const selfProjections = 4 * 2 * Sl * D * D; // q, k, v, out on the local tokens
  const attention = (2 * 2 * tokens * tokens * D * heads) / model.numHeads; // QKᵀ and AV, its heads over all tokens
  const crossProjections = 2 * 2 * Sl * D * D + 2 * 2 * L * D * D; // q, out on local tokens; k, v on the text
  const crossAttention = 2 * 2 * Sl * L * D;
  const ffn = 2 * 2 * Sl * D * ffnDim;
  const blockTotal = selfProjections + attention + crossProjections + crossAttention + ffn;
  const embed = 2 * Sl * inChannels * patch * D + 2 * (freqDim * D + D * D + D * 6 * D) + 2 * L * (textDim * D + D * D);
  const head = 2 * Sl * D * outChannels * patch;
  const selfScores = numLayers * heads * tokens * tokens;
  const scores = selfScores + numLayers * model.numHeads * Sl * L;
  return {
    embed,
    block: { selfProjections, attention, crossProjections, crossAttention, ffn, total: blockTotal },
    head,
    total: embed + numLayers * blockTotal + head,
    scores,
    selfScores,
  };
}

/**
 * Engine calls of one rank's forward (rank/ulysses.ts): embed, then per block pre-attention,
 * attention (once per head group) and post-attention, then the head.
 */
export const stageCallsPerForward = (model: Pick<ModelShape, 'numLayers'>, headGroups = 1): number =>
  (2 + headGroups) * model.numLayers + 2;

/**
 * Bytes the busiest rank sends in one forward: Ulysses about 4·(S/P)·D·(P−1)/P elements per block
 * with even shares, displaced 2·(S/P)·D·(P−1).
 */
export function forwardBytes(
  model: ModelShape,
  tokens: number,
  shares: number | number[],
  bytesPerElement: number,
  mode: ParallelMode = 'ulysses',
): number {
  const plan = planUlysses(model, tokens, shares);
  const perBlock = mode === 'displaced' ? displacedFloatsPerBlock : exchangeFloatsPerBlock;
  const busiest = Math.max(...plan.heads.map((_, rank) => perBlock(plan, rank)));
  return busiest * bytesPerElement * model.numLayers;
}

const patchVolume = (m: ModelShape): number => m.patchSize.reduce((a, b) => a * b, 1);

/** The slowest link among a set of workers (fastest bandwidth is not what an all-to-all waits for). */
function slowestLink(hw: Hardware, workers: number[]): LinkSpeed {
  if (typeof hw.link !== 'function') return hw.link;
  let bandwidth = Infinity;
  let latency = 0;
  for (const i of workers)
    for (const j of workers) {
      if (i === j) continue;
      const l = hw.link(i, j);
      bandwidth = Math.min(bandwidth, l.bandwidth);
      latency = Math.max(latency, l.latency);
    }
  return { bandwidth, latency };
}

/**
 * The plan's per-step time: on the fastest `world` workers of `hw` with even shares, or on its
 * first `world` workers in order (rank i on worker i, as placed) with the plan's head shares.
 * Ulysses over several ranks: in the plan's head groups, or without them the fastest.
 */
export function predictStep(work: Workload, plan: Plan, hw: Hardware): StepPrediction {
  checkDegree(work.model.numHeads, plan.ulyssesDegree);
  // displaced ranks exchange once a block, and one rank not at all: one group
  if (plan.mode === 'displaced' || plan.ulyssesDegree < 2) return predictGrouped(work, plan, 1, hw);
  // as in planUlysses, at most as many groups as the rank with the fewest heads has
  const fewestHeads = Math.min(...(plan.heads ?? evenHeads(work.model.numHeads, plan.ulyssesDegree)));
  if (plan.headGroups !== undefined) return predictGrouped(work, plan, Math.min(plan.headGroups, fewestHeads), hw);
  const most = Math.min(MAX_HEAD_GROUPS, fewestHeads);
  const each = Array.from({ length: most }, (_, g) => predictGrouped(work, plan, g + 1, hw));
  // ties to fewer groups: fewer calls and messages for the same time
  return each.reduce((best, p) => (p.stepS < best.stepS ? p : best));
}

function predictGrouped(work: Workload, plan: Plan, headGroups: number, hw: Hardware): StepPrediction {
  const P = plan.ulyssesDegree;
  if (plan.cfgParallel && work.passes !== 2)
    throw new Error('cfgParallel needs two passes per step (guidance ≠ 1); this workload has one');
  if (plan.heads && (plan.cfgParallel || plan.heads.length !== P))
    throw new Error(`head shares ${plan.heads.join('/')} are for one group of ${P} ranks`);
  const world = planWorld(plan);
  if (world > hw.workerFlops.length) throw new Error(`plan needs ${world} workers, ${hw.workerFlops.length} measured`);
  const shares = plan.heads ?? P;
  const workers = plan.heads ? plan.heads.map((_, i) => i) : workerOrder(hw).slice(0, world);
  // each at its share of the cores it shares with the others chosen: all compute at once
  const cpuShares = coreShares(hw, workers);
  const share = new Map(workers.map((i, k) => [i, cpuShares[k]]));
  const chosen = workers.map((i, k) => ({ f: hw.workerFlops[i] * cpuShares[k], i }));
  const softmaxRateOf = (i: number) => (hw.workerSoftmaxRates?.[i] ?? Infinity) * (share.get(i) ?? 1);
  const stageSOf = hw.workerStageS;
  // a stage call's fixed cost is CPU time too, and takes as much longer on a shared core
  const stageS = stageSOf ? Math.max(...chosen.map((c) => stageSOf[c.i] / (share.get(c.i) ?? 1))) : 0;
  const link =
    world > 1
      ? slowestLink(
          hw,
          chosen.map((c) => c.i),
        )
      : { bandwidth: Infinity, latency: 0 };
  // a rank's forward at rates (flop/s, softmax/s); the slowest rank's is the step's: with even
  // shares the busiest share at the slowest rates, else each rank's share at its own worker's
  const forwardAt = (f: ForwardFlops, flops: number, softmaxRate: number) =>
    f.total / flops + f.scores / softmaxRate + stageCallsPerForward(work.model, headGroups) * stageS;
  const forward = forwardFlops(work.model, work.tokens, work.textTokens, shares);
  const slowest = {
    flops: Math.min(...chosen.map((c) => c.f)),
    softmaxRate: Math.min(...chosen.map((c) => softmaxRateOf(c.i))),
  };
  const estimatedForwardS = plan.heads
    ? Math.max(
        ...chosen.map((c, rank) =>
          forwardAt(forwardFlops(work.model, work.tokens, work.textTokens, shares, rank), c.f, softmaxRateOf(c.i)),
        ),
      )
    : forwardAt(forward, slowest.flops, slowest.softmaxRate);

  const passesPerGroup = plan.cfgParallel ? 1 : work.passes;
  // one rank alone sends nothing and waits for no one: both terms are 0 at P = 1
  const displaced = plan.mode === 'displaced';
  const bytes = forwardBytes(work.model, work.tokens, shares, hw.bytesPerElement, plan.mode);
  const exchanges = (displaced ? 1 : (hw.exchangesPerBlock ?? 2) * headGroups) * work.model.numLayers;
  const wireS = bytes / link.bandwidth + exchanges * (P - 1) * link.latency;
  // CFG parallel: one group's output rows [S, pt·ph·pw·C] go to the other once per step
  const outWidth = work.model.outChannels * patchVolume(work.model);
  const cfgBytes = plan.cfgParallel ? work.tokens * outWidth * hw.bytesPerElement : 0;
  const cfgComm = plan.cfgParallel ? cfgBytes / link.bandwidth + link.latency : 0;

  // displaced ranks do Ulysses' work (their tokens over all heads, not all tokens over their
  // heads); a forward is rehearsed in one head group, and each group past it is a call more a block
  const rehearsedS = hw.rehearsedForwardS?.(plan) ?? (plan.heads ? unevenRehearsedS(work, plan.heads, hw) : undefined);
  const forwardS =
    rehearsedS === undefined ? estimatedForwardS : rehearsedS + (headGroups - 1) * work.model.numLayers * stageS;
  const computeS = passesPerGroup * forwardS;
  // the self-attention of the forward (its share of the estimate at the slowest rates): head groups
  // hide all of it but the last group's behind the exchange, as far as the exchange is long
  const selfAttentionS =
    (work.model.numLayers * forward.block.attention) / slowest.flops + forward.selfScores / slowest.softmaxRate;
  const attentionShare =
    selfAttentionS > 0 ? selfAttentionS / forwardAt(forward, slowest.flops, slowest.softmaxRate) : 0;
  const groupsHide = forwardS * attentionShare * (1 - 1 / headGroups);
  // displaced (past its warm-up): a forward's gather has the next forward of its pass to arrive in;
  // two passes on one group run at once, so one's all-to-alls wait behind the other's compute
  // (coordinator/executor.ts velocity); only what takes longer waits. Ranks on one CPU hide
  // nothing: their exchange is work on the cores they compute on (workerCpus).
  const cpus = chosen.map((c) => hw.workerCpus?.[c.i]);
  const oneCpu = cpus.length > 1 && cpus[0] !== undefined && cpus.every((cpu) => cpu === cpus[0]);
  const hiddenBehind = oneCpu ? 0 : displaced || (passesPerGroup > 1 && P > 1) ? forwardS : groupsHide;
  const commPerForward = Math.max(0, wireS - hiddenBehind);
  const commS = passesPerGroup * commPerForward + cfgComm;
  const coordinator =
    hw.coordinatorLink === undefined
      ? typeof hw.link === 'function'
        ? slowestLink(
            hw,
            chosen.map((c) => c.i),
          )
        : hw.link
      : hw.coordinatorLink;
  const ioBytes =
    work.passes * work.tokens * (work.model.inChannels + work.model.outChannels) * patchVolume(work.model) * 4;
  const ioS = coordinator ? ioBytes / coordinator.bandwidth + 2 * work.passes * coordinator.latency : 0;
  const measuredS = hw.measuredStepS?.(plan, hw.bytesPerElement);
  return {
    plan,
    headGroups,
    world,
    flopsPerRank: passesPerGroup * forward.total,
    bytesPerRank: passesPerGroup * bytes + cfgBytes,
    computeS,
    commS,
    ioS,
    stepS: measuredS ?? computeS + commS + ioS,
    measured: measuredS !== undefined,
  };
}

/**
 * The plans worth predicting on workers of equal speed: each even degree (evenDegrees), with and without CFG parallel.
 */
export function candidatePlans(work: Workload, workers: number): Plan[] {
  const plans: Plan[] = [];
  for (const d of evenDegrees(work.model.numHeads, workers)) {
    plans.push({ ulyssesDegree: d, cfgParallel: false });
    if (work.passes === 2 && 2 * d <= workers) plans.push({ ulyssesDegree: d, cfgParallel: true });
  }
  return plans;
}

/**
 * Uneven shares' forward from the even one each worker rehearsed at that degree: a rank's work
 * (its tokens outside attention, its heads inside) grows with its share of the heads, so worker i
 * takes its even time × its heads / the even share's.
 */
function unevenRehearsedS(work: Workload, heads: number[], hw: Hardware): number | undefined {
  const even = hw.rehearsedRankForwardS?.(heads.length);
  if (!even || even.length < heads.length) return undefined;
  const evenShare = Math.ceil(work.model.numHeads / heads.length);
  return Math.max(...heads.map((h, i) => (even[i] * h) / evenShare));
}

/**
 * The plan of `degree` ranks on the first `degree` workers with the heads in proportion to each
 * one's speed (its rehearsed forward, else its FLOP rate), or null where that is the even split.
 */
export function unevenPlan(work: Workload, hw: Hardware, degree: number): Plan | null {
  if (degree < 2 || degree > hw.workerFlops.length) return null;
  const rehearsed = hw.rehearsedRankForwardS?.(degree);
  const speeds =
    rehearsed && rehearsed.length >= degree
      ? rehearsed.slice(0, degree).map((s) => 1 / s)
      : coreShares(
          hw,
          hw.workerFlops.slice(0, degree).map((_, i) => i),
        ).map((share, i) => hw.workerFlops[i] * share);
  if (!speeds.every((s) => Number.isFinite(s) && s > 0)) return null;
  const heads = proportionalShares(work.model.numHeads, speeds);
  const even = evenHeads(work.model.numHeads, degree);
  return heads.every((h, i) => h === even[i]) ? null : { ulyssesDegree: degree, cfgParallel: false, heads };
}

export interface SwarmPlanChoice {
  best: StepPrediction;
  /** one worker, no parallelism: what every plan must beat */
  baseline: StepPrediction;
  /** all candidates, fastest first */
  ranked: StepPrediction[];
}

/**
 * The fastest plan among the candidates (all plans the workers allow by default). One worker is
 * always a candidate, so the choice is never predicted slower than it; ties go to fewer workers.
 */
export function planSwarm(
  work: Workload,
  hw: Hardware,
  candidates: Plan[] = candidatePlans(work, hw.workerFlops.length),
): SwarmPlanChoice {
  const baseline = predictStep(work, { ulyssesDegree: 1, cfgParallel: false }, hw);
  const others = candidates.filter((p) => p.ulyssesDegree !== 1 || p.cfgParallel).map((p) => predictStep(work, p, hw));
  const ranked = [baseline, ...others].sort((a, b) => a.stepS - b.stepS || a.world - b.world);
  return { best: ranked[0], baseline, ranked };
}

/**
 * A link's latency and bandwidth from timed transfers of different sizes (a least-squares fit of
 * t = latency + bytes / bandwidth): what a short probe on a data channel measures.
 */
export function fitLink(samples: { bytes: number; seconds: number }[]): LinkSpeed {
  if (samples.length < 2 || new Set(samples.map((s) => s.bytes)).size < 2) {
    throw new Error(`fitLink needs timed transfers of at least two sizes, got ${samples.length} sample(s)`);
  }
  const n = samples.length;
  const mx = samples.reduce((a, s) => a + s.bytes, 0) / n;
  const my = samples.reduce((a, s) => a + s.seconds, 0) / n;
  const sxy = samples.reduce((a, s) => a + (s.bytes - mx) * s.seconds, 0); // = Σ(b − x̄)(t − ȳ), as Σ(b − x̄) = 0
  const sxx = samples.reduce((a, s) => a + (s.bytes - mx) ** 2, 0);
  const perByte = sxy / sxx;
  if (!(perByte > 0)) throw new Error('fitLink: larger transfers were not slower; probe with larger messages');
  return { bandwidth: 1 / perByte, latency: Math.max(0, my - perByte * mx) };
}

/**
 * The link a rank sees in its exchanges: the bytes it sends per second while all links are busy, and the fixed cost of
 * one exchange.
 */
export function fitMeshProbe(probe: MeshProbe): LinkSpeed {
  return fitLink([
    { bytes: probe.smallBytes, seconds: probe.smallMs / 1000 },
    { bytes: probe.bytesSent, seconds: Math.max(probe.largeMs, probe.smallMs + 0.5) / 1000 },
  ]);
}

const EP_NAME: Record<ExecutionProvider, string> = { wasm: 'WASM', webgpu: 'WebGPU' };

/** what a worker's 'wasm' EP is, in words: WebAssembly in a tab, a process's native device where it has one */
export const cpuName = (nativeDevice?: NativeDevice): string =>
  nativeDevice ? NATIVE_DEVICE_NAME[nativeDevice] : EP_NAME.wasm;
const NATIVE_DEVICE_NAME: Record<NativeDevice, string> = { cpu: 'CPU', cuda: 'CUDA', webgpu: 'WebGPU (Dawn)' };
const gflops = (probe: Pick<ComputeProbe, 'flops'>): string => `${+(probe.flops / 1e9).toPrecision(3)}`;

/**
 * The EP a worker computes fastest on, by its measured matrix-multiply rate (a forward pass is
 * mostly matrix multiplies), and why, in words: "WASM: 21.3 GFLOP/s vs WebGPU 0.2". The worker
 * chooses by it when a job leaves the EP to 'auto', and the planner predicts with the same choice.
 * A software WebGPU adapter computes on the same CPU as WASM, far slower: it is never chosen, so a
 * worker need not wait for its probe.
 */
export function fastestEp(
  compute: Partial<Record<ExecutionProvider, Pick<ComputeProbe, 'flops'>>>,
  softwareAdapter = false,
  nativeDevice?: NativeDevice,
): { ep: ExecutionProvider; why: string } {
  const name = (ep: ExecutionProvider) => (ep === 'wasm' ? cpuName(nativeDevice) : EP_NAME[ep]);
  if (softwareAdapter) {
    // the same words whether or not its probe has finished: the worker does not wait for it, the coordinator does
    const wasm = compute.wasm ? `WASM: ${gflops(compute.wasm)} GFLOP/s` : 'WASM: nothing measured yet';
    return { ep: 'wasm', why: `${wasm} (WebGPU: a software adapter)` };
  }
  const measured = (Object.keys(compute) as ExecutionProvider[])
    .flatMap((ep) => {
      const probe = compute[ep];
      return probe ? [{ ep, flops: probe.flops }] : [];
    })
    .sort((a, b) => b.flops - a.flops);
  if (!measured.length) return { ep: 'wasm', why: `${name('wasm')}: nothing measured yet` };
  const [best, ...slower] = measured;
  // Stryker disable next-line StringLiteral: there are two EPs, so at most one is slower and the separator never shows
  const others = slower.map((m) => `${name(m.ep)} ${gflops(m)}`).join(', ');
  // a process has no browser WebGPU: its device was chosen among its own (worker/node/native-devices.ts)
  const note = others ? ` vs ${others}` : best.ep === 'wasm' && !nativeDevice ? ' (no WebGPU adapter)' : '';
  return { ep: best.ep, why: `${name(best.ep)}: ${gflops(best)} GFLOP/s${note}` };
}

// --- pooled memory: pipeline stages -------------------------------------------------------------

/** A part's weights: its linear layers' matrices (elements, output rows), and the rest (biases, norms, tables). */
export interface PartWeights {
  matrices: number;
  matrixRows: number;
  rest: number;
}

/** The weights of the transformer's parts: one block, the embedders (first stage) and the head (last stage). */
export function modelWeights(model: ModelShape): { block: PartWeights; embedders: PartWeights; head: PartWeights } {
  const { dim: D, ffnDim, inChannels, outChannels, textDim, freqDim } = model;
  const patch = patchVolume(model);
  /** linear layers [inDim → outDim], each with its bias, and `rest` more weights */
  const part = (linears: [number, number][], rest = 0): PartWeights => ({
    matrices: linears.reduce((n, [inDim, outDim]) => n + inDim * outDim, 0),
    matrixRows: linears.reduce((n, [, outDim]) => n + outDim, 0),
    rest: linears.reduce((n, [, outDim]) => n + outDim, rest),
  });
  // self and cross attention's q, k, v, out with their two RMSNorms each; the cross-attention norm; FFN; table
  const block = part([...Array<[number, number]>(8).fill([D, D]), [D, ffnDim], [ffnDim, D]], 4 * D + 2 * D + 6 * D);
  const embedders = part([
    [inChannels * patch, D],
    [freqDim, D],
    [D, D],
    [D, 6 * D],
    [textDim, D],
    [D, D],
  ]);
  const head = part([[D, outChannels * patch]], 2 * D);
  return { block, embedders, head };
}

/** Parameters of the transformer's parts: one block, the embedders (first stage) and the head (last stage). */
export function modelParams(model: ModelShape): { block: number; embedders: number; head: number } {
  const { block, embedders, head } = modelWeights(model);
  const count = (p: PartWeights) => p.matrices + p.rest;
  return { block: count(block), embedders: count(embedders), head: count(head) };
}

/**
 * Bytes of a part's weights held as `weightType`: int8 keeps a byte per matrix weight and a float32 scale per matrix
 * row, the rest as float32 (stage-graphs.ts's FedGraph stores them so).
 */
export function storedWeightBytes(p: PartWeights, weightType: WeightType): number {
  if (weightType === 'int8') return p.matrices + 4 * p.matrixRows + 4 * p.rest;
  return (p.matrices + p.rest) * (weightType === 'float16' ? 2 : 4);
}

export interface StagedPlan {
  /** contiguous pipeline stages of about numLayers/stages blocks each, every one a group of ulyssesDegree ranks */
  stages: number;
  ulyssesDegree: number;
  /** the two guided passes on two pipelines of stages */
  cfgParallel: boolean;
  /**
   * 'exact': each pass through the stages in turn, a step's passes pipelined behind each other;
   * 'pipefusion': each pass's tokens in `patches` patches flowing through the stages, each attending
   * to the keys and values of the step before for patches not yet computed (xDiT's PipeFusion)
   */
  mode: 'exact' | 'pipefusion';
  patches?: number;
  /**
   * the blocks of the stage that sets the pace (the most for its workers' speed, where stages are cut by speed); the
   * even cut's ceil(numLayers / stages) unless given
   */
  paceBlocks?: number;
}

export interface StagedPrediction {
  plan: StagedPlan;
  /** workers: stages × degree, ×2 with CFG parallel */
  world: number;
  /** one stage group's forward of its blocks, Ulysses exchange included */
  stageForwardS: number;
  /**
   * how a step's passes cross the stages: 'batched' both at once stage after stage (a stage's two
   * passes hide each other's exchange), 'pipelined' one behind the other (the first stage starts the
   * second pass while the second stage runs the first); the faster of the two
   */
  schedule: 'batched' | 'pipelined';
  /** one rank's hidden state handed to the next stage, once */
  boundaryS: number;
  stepS: number;
  /** bytes every rank sends to the next stage in a step (the hidden state of its tokens, and the conditioning) */
  boundaryBytesPerRank: number;
  /** Ulysses bytes a rank sends within its stage in a step */
  exchangeBytesPerRank: number;
  /** weights the busiest rank holds (the first stage's: its blocks and the embedders) */
  weightBytesPerRank: number;
  /** keys and values of the step before a rank keeps for its blocks and heads (PipeFusion; 0 in exact mode) */
  staleKeysValuesBytesPerRank: number;
}

/**
 * A step of a staged plan (pooled memory) on workers of equal speed, from the Ulysses prediction of
 * one stage's blocks: a forward crosses the stages in turn, handing each next stage its hidden
 * state; exact mode pipelines a step's passes (the first stage starts the second pass while the
 * second stage runs the first), PipeFusion its patches, so that all stages compute at once but for
 * the pipeline's fill. Ranks hold their weights as `weightType` (half precision unless given).
 */
export function predictStagedStep(
  work: Workload,
  plan: StagedPlan,
  hw: Hardware,
  weightType: WeightType = 'float16',
): StagedPrediction {
  const { stages: S, ulyssesDegree: P } = plan;
  const L = work.model.numLayers;
  if (!(Number.isInteger(S) && S >= 1 && S <= L)) throw new Error(`${S} stages of ${L} blocks`);
  const M = plan.mode === 'pipefusion' ? (plan.patches ?? 2 * S) : 1;
  const blocks = plan.paceBlocks ?? Math.ceil(L / S);
  if (!(Number.isInteger(blocks) && blocks >= 1 && blocks <= L)) throw new Error(`a stage of ${blocks} of ${L} blocks`);
  const m = plan.cfgParallel ? 1 : work.passes;
  const stageOf = (passes: 1 | 2) =>
    predictStep(
      { ...work, model: { ...work.model, numLayers: blocks }, passes },
      { ulyssesDegree: P, cfgParallel: false },
      { ...hw, coordinatorLink: null },
    );
  const stage = stageOf(1);
  const t = stage.computeS + stage.commS;
  const both = m === 2 ? stageOf(2) : stage;
  const link = typeof hw.link === 'function' ? hw.link(0, 1) : hw.link;
  const { dim: D } = work.model;
  // the busiest rank's tokens: an uneven split of the heads gives its first ranks more than ⌈S/P⌉
  const rows = Math.max(...planUlysses(work.model, work.tokens, P).rows);
  // the residual stream of a rank's tokens, and the conditioning (temb, tproj, context) in float32
  const boundaryBytes = rows * D * hw.bytesPerElement + (work.textTokens + 7) * D * 4;
  const b = boundaryBytes / link.bandwidth + link.latency;
  // each PipeFusion patch is a forward's calls to the stage again, each paying its fixed cost (the probe's stageS)
  const callS = M > 1 ? stageCallsPerForward({ numLayers: blocks }) * Math.max(0, ...(hw.workerStageS ?? [])) : 0;
  const patchS = Math.max(0, t - callS) / M + callS;
  // pipelined, the pipeline's fill: S − 1 stage slots (and hand-overs) before the last stage starts,
  // a patch's with PipeFusion; batched, every stage in turn
  const pipelined = m * M * patchS + (S - 1) * (patchS + b / M);
  const batched = plan.mode === 'exact' ? S * (both.computeS + both.commS) + (S - 1) * b : Infinity;
  const schedule = batched <= pipelined ? 'batched' : 'pipelined';
  const weights = modelWeights(work.model);
  const stored = (part: PartWeights) => storedWeightBytes(part, weightType);
  const staleKeysValues = plan.mode === 'pipefusion' ? (m * 2 * work.tokens * D * blocks * hw.bytesPerElement) / P : 0;
  return {
    plan,
    world: S * P * (plan.cfgParallel ? 2 : 1),
    stageForwardS: t,
    schedule,
    boundaryS: b,
    stepS: Math.min(batched, pipelined),
    boundaryBytesPerRank: S > 1 ? m * boundaryBytes : 0,
    exchangeBytesPerRank: schedule === 'batched' ? both.bytesPerRank : m * stage.bytesPerRank,
    weightBytesPerRank: blocks * stored(weights.block) + stored(weights.embedders),
    staleKeysValuesBytesPerRank: staleKeysValues,
  };
}
