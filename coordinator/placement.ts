// A job's placement from the request to the ranks. What a job asks (PlacementRequest, every field
// optional) goes to the planner (planner.ts), which decides every knob once and returns a
// ResolvedPlacement; the executor, the ranks (initArgsOf), the report and the dashboard read it and
// fill in nothing. A new knob is a field here or in RankSettings, a decision in the planner and a
// use where it matters.
import type { LoraRef } from '../core/model/lora.ts';
import type { LinkSpeed } from '../core/cost-model.ts';
import type { LinkEmulation } from '../core/net/paced-channel.ts';
import type { DType } from '../core/net/protocol.ts';
import type { SigningKeys } from '../core/net/signing.ts';
import type { ParallelMode, RankLayout } from '../core/parallel.ts';
import type { RankSettings } from '../core/rank-settings.ts';
import type { ExecutionProvider, HandOffMesh, InitArgs, LoadArgs, WeightType } from '../core/worker-api.ts';
import type { MagnitudeCurve, StepCacheRequest, StepCacheSettings } from '../core/step-cache.ts';
import type { PipelineStage } from './stage-plan.ts';

/**
 * What a job does when a re-placement would leave it on one worker that is not trusted (the
 * dashboard's own browser's, or marked trusted: Swarm.isTrusted), with no other rank to check it:
 * 'stop' with a reason (the default: one liar alone would decide the video), or 'continue' on it.
 */
export const UNTRUSTED_ALONE = ['stop', 'continue'] as const;
export type UntrustedAlone = (typeof UNTRUSTED_ALONE)[number];

/** Where the ranks run: one in this tab, or on the swarm's worker pages (backends.ts makes their executors). */
export const BACKENDS = ['local', 'swarm'] as const;
export type Backend = (typeof BACKENDS)[number];

/**
 * What a job asks of placement; what it leaves unset, the planner decides. A rank setting is asked
 * for by its own name (RankSettings), so a new one needs no field here.
 */
export interface PlacementRequest extends Partial<Omit<RankSettings, 'dtype' | 'parallel' | 'emulateLink'>> {
  /** Ulysses degree (of each group with CFG parallel); 'auto' (the default): the cost model's choice */
  ulyssesDegree?: number | 'auto';
  /** both passes of a guided step at once on two groups: always (true), never (false), or as the cost model chooses */
  cfgParallel?: boolean;
  /** where the workers compute; 'auto' (the default): the EP each measured fastest */
  ep?: ExecutionProvider | 'auto';
  /** how activations go between ranks (TRANSPORTS): float32 unless set; 'auto': a less exact one where it pays */
  dtype?: DType | 'auto';
  /**
   * how a group's ranks share the heads (and tokens): 'even'; in proportion to each worker's
   * rehearsed speed ('speed', for a degree asked for); or (unset, and 'speed' with 'auto')
   * whichever the cost model predicts faster. Pipeline stages: 'even' cuts the blocks evenly within
   * each worker's memory, by no measured speed; else by speed.
   */
  shares?: 'even' | 'speed';
  /** share of forward passes another rank recomputes to check the group's (spot-check.ts); 0 for none */
  spotCheckRate?: number;
  /** when a lost rank leaves the job on one untrusted worker (UNTRUSTED_ALONE); 'stop' unless set */
  untrustedAlone?: UntrustedAlone;
  /** the ranks' links to each other paced as this slower link (benchmarks and tests: core/net/paced-channel.ts) */
  emulateLink?: LinkEmulation;
  /**
   * how a group's ranks share self-attention: Ulysses (exact, the default), displaced (keys and
   * values one step stale, the exchange off the critical path), or 'auto': displaced where it pays
   */
  parallel?: ParallelMode | 'auto';
  /** displaced mode's exact steps first */
  warmupSteps?: number;
  /**
   * pooled memory: the transformer's blocks cut into this many pipeline stages, each held by its own
   * worker, which loads only its stage's weights (stage-plan.ts); 1 (the default): every worker holds all
   */
  stages?: number;
  /**
   * PipeFusion (with stages, each of one worker a CFG group): each forward's tokens cut into this many patches that
   * follow each other through the stages, so that all stages compute at once, each attending to the patches after its
   * own as of the step before (the first warmupSteps steps exact); 'auto': exact staged mode, for now (PipeFusion was
   * measured slower than it: README); unset: exact staged mode, stage after stage
   */
  pipeFusionPatches?: number | 'auto';
  /** LoRA adapters every rank merges into its weights as it loads (core/model/lora.ts); none unless set */
  loras?: LoraRef[];
  /**
   * how every rank holds the blocks' weights (LoadArgs): 'float16' halves them, so a pipeline stage holds twice the
   * blocks, at ~2e-4 of the output's scale from float32; unset: float16 on WebGPU with shader-f16, float32 elsewhere
   */
  weightType?: WeightType;
  /**
   * the step cache (core/step-cache.ts): 'off' unless set; 'calibrate' computes every forward and measures the
   * magnitude ratios a curve is made of (npm run calibrate-cache)
   */
  cache?: StepCacheRequest | 'calibrate';
}

/** A job's step cache as placed: its settings, and the curve its schedule is read from (null: a calibration run). */
export interface PlacedStepCache {
  settings: StepCacheSettings;
  curve: MagnitudeCurve | null;
}

/** What the cost model expected of a placement, and why it was chosen. */
export interface PlacementPrediction {
  /** the job asked for this degree (predicted all the same), rather than the cost model choosing it */
  asked: boolean;
  by: string;
  /** the rank-to-rank link planned with: a mesh probe of an earlier placement, or the coordinator's links */
  link: LinkSpeed & { from: 'mesh probe' | 'coordinator links' };
  predictedStepMs: number;
  oneWorkerStepMs: number;
  /** why fewer workers are used than are live, or null */
  leftOut: string | null;
  /** which of its workers look like one machine and share its cores, and the words for it (sharedCoresNote), or null */
  sharedCores: SharedCores | null;
}

/** Workers of a placement that look like one machine and share its cores (planner.ts sharedCoresNote). */
export interface SharedCores {
  workers: string[];
  /** in words: which, how many cores, and what part of its speed alone each computes at */
  note: string;
}

/** How long the coordinator waits for its ranks. */
export interface Timeouts {
  /** a call to a rank: a forward, a spot check's recomputation */
  rpcMs: number;
  /** a call that may load the model: GBs, minutes on a slow link */
  loadMs: number;
  /** a rank waiting for a peer's tensors names it silent within this, before the coordinator's patience runs out */
  exchangeMs: number;
}

/** Every decision about where and how a job runs, made once by the planner. */
export interface ResolvedPlacement {
  backend: Backend;
  /** the model folder as the workers fetch it */
  modelUrl: string;
  /** the adapters merged into every rank's weights, their files as the workers fetch them */
  loras: LoraRef[];
  /** how every rank holds the blocks' weights; null: as its EP does (LoadArgs) */
  weightType: WeightType | null;
  /** how many ranks, in which CFG groups, each group's shares of the heads */
  layout: RankLayout;
  /**
   * the workers in rank order ([] for the local backend's one rank in this tab), each with the EP the
   * planner predicted it on: the one asked, or for 'auto' the one it measured fastest (cost-model.ts
   * fastestEp, the rule the worker applies itself as it loads; 'auto' where it is not yet measured)
   */
  workers: { id: string; ep: ExecutionProvider | 'auto' }[];
  /** the EP the job asked for ('auto': each worker's fastest) */
  ep: ExecutionProvider | 'auto';
  /** what every rank is told besides its place in the mesh */
  settings: RankSettings;
  /** displaced mode's, or PipeFusion's, exact steps first */
  warmupSteps: number;
  /** forwards checked by another rank's recomputation, and how far its rows may differ (spot-check.ts) */
  spotChecks: { rate: number; tolerance: number };
  /** a re-placement onto one untrusted worker alone stops the job, or continues (UNTRUSTED_ALONE) */
  untrustedAlone: UntrustedAlone;
  timeouts: Timeouts;
  /** the cost model's prediction and its reasons; null where nothing was measured to predict from */
  prediction: PlacementPrediction | null;
  /** why the job does not run CFG parallel although it was asked for (null when it does, or was not asked) */
  cfgFallback: string | null;
  /** which forwards skip the blocks and reuse a residual (null: none) */
  cache: PlacedStepCache | null;
  /**
   * pooled memory: the pipeline stages in order, each's blocks and workers (layout.stages of them); null where every
   * rank holds the whole model
   */
  stages: PipelineStage[] | null;
  /** PipeFusion: how many patches a forward past the warm-up is cut into (null: exact, the tokens whole) */
  pipeFusion: { patches: number } | null;
}

/** What rank `rank` of a placement is told at initWorker: its place in its group's mesh and the settings. */
export function initArgsOf(
  placement: ResolvedPlacement,
  rank: number,
  peers: string[],
  session: string,
  keys: SigningKeys[],
): InitArgs {
  const { layout } = placement;
  // a rank's own secret key alone, and its mesh's public keys: no rank can sign for another
  const signing = layout.ulyssesDegree > 1 && {
    signing: { secretKey: keys[rank].secretKey, publicKeys: layout.meshRanks(rank).map((r) => keys[r].publicKey) },
  };
  // a hand-off is signed by its sender, whatever the stage's degree: its receiver and a spot check hold it to that
  const pairSigning = (pair: HandOffMesh, sender: number, receiver: number): HandOffMesh => ({
    ...pair,
    signing: { secretKey: keys[rank].secretKey, publicKeys: [keys[sender].publicKey, keys[receiver].publicKey] },
  });
  const links = layout.stageLinksOf(rank, peers, session);
  const before = layout.stagePartner(rank, 'before');
  const after = layout.stagePartner(rank, 'after');
  const stageLinks = links && {
    stageLinks: {
      ...(links.before && before !== null && { before: pairSigning(links.before, before, rank) }),
      ...(links.after && after !== null && { after: pairSigning(links.after, rank, after) }),
    },
  };
  return { ...layout.meshOf(rank, peers, session), ...placement.settings, ...signing, ...stageLinks };
}

/** What rank `rank` of a placement loads: the model on the EP asked, and its stage's blocks where the job is staged. */
export function loadArgsOf(placement: ResolvedPlacement, rank: number): LoadArgs {
  const stage = placement.stages?.[placement.layout.stageOf(rank)];
  return {
    modelUrl: placement.modelUrl,
    ep: placement.ep,
    ...(stage && { blocks: { from: stage.blocks[0], to: stage.blocks[1] } }),
    ...(placement.loras.length && { loras: placement.loras }),
    ...(placement.weightType && { weightType: placement.weightType }),
  };
}

/** The same ranks doing the same work the same way: a job placed so can keep the ranks of `other`. */
export function samePlacement(a: ResolvedPlacement, b: ResolvedPlacement): boolean {
  const decisions = ({ prediction, cfgFallback, ...rest }: ResolvedPlacement) => JSON.stringify(rest);
  return decisions(a) === decisions(b);
}
