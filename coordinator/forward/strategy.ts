// One DiT forward of a pass, as the executor asks it of a forward strategy: Ulysses or displaced attention over the
// group's tokens (sequence-parallel.ts, through its pipeline stages in staged.ts), or PipeFusion's patches
// (pipefusion.ts). The executor picks one strategy from its placement, once, as a rank picks how it attends
// (rank/runtime.ts). Here: what a forward is asked and gives back, the narrow view of the executor a strategy runs on
// (ForwardContext, so that the compiler keeps the two in step), and what every strategy checks of a rank's reply.
import type { WanConfig } from '../../core/model/config.ts';
import { attendsStale, type ParallelMode, type RankLayout } from '../../core/parallel.ts';
import type { CacheMode } from '../../core/step-cache.ts';
import type { Timestep } from '../../core/model/timesteps.ts';
import type { Tensor } from '../../core/tensor.ts';
import type {
  ArgsOf,
  ExecuteResult,
  HandOffStats,
  LoadedModel,
  ReplyOf,
  WorkerInfo,
  WorkerMethod,
} from '../../core/worker-api.ts';
import type { ResolvedPlacement } from '../placement.ts';
import { WorkerError } from '../worker-errors.ts';

export interface ForwardRequest {
  job: number;
  step: number;
  /** the job's steps, where known: its final steps are checked at a higher rate (spot-check.ts) */
  steps?: number;
  pass: number;
  /** one for all tokens, or one per token in sequence order (core/model/timesteps.ts) */
  timestep: Timestep;
  latent: Tensor; // [C, T, H, W]
  /** a step cache's forward, as its schedule has it (core/step-cache.ts); none without a step cache */
  cache?: CacheMode;
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
  /** a later pipeline stage's rank: the hand-offs the stage before gave it directly (a step's passes summed) */
  handOff?: HandOffStats;
}

/** What one rank said about itself and the model it loaded (its EP, and why), with its peer id. */
export type RankWorker = WorkerInfo & LoadedModel & { id: string };

/**
 * The executor as its forward strategies and its verifier see it. Read live: the workers arrive with initialize, a
 * prepared job brings its text rows and shares, a later job placed the same way its own placement (Placer.place).
 */
export interface ForwardContext {
  readonly config: WanConfig;
  readonly placement: ResolvedPlacement;
  readonly layout: RankLayout;
  /** number of ranks once initialized */
  readonly world: number;
  /** in rank order */
  readonly workers: readonly RankWorker[];
  /** Executor.collectiveRpc on the ranks named: their replies in that order */
  collectiveRpc<M extends WorkerMethod>(
    method: M,
    options: { args: ArgsOf<M> | ((rank: number) => ArgsOf<M>); ranks: number[] },
  ): Promise<ReplyOf<M>[]>;
  /** What a rank is doing, for the dashboard's swarm view. */
  showActivity(rank: number, doing: string): void;
  /** The rank's share of the prepared job, as the swarm view shows it ("rank 0 of 3 (5 heads, 410 tokens)"). */
  shareOf(rank: number): string;
  /** Rows of the prepared job's text embeddings of the pass: a hidden state's context has as many. */
  textRowsOf(pass: number): number;
}

export interface ForwardOutput {
  output: Tensor; // [C, T, H, W]
  ranks: RankReport[];
  /** the ranks' residual against the one they kept before (a step cache's keep), where they measured it */
  magnitudeRatio: number | null;
}

/** How the executor runs one DiT forward of a pass on the ranks of its group. */
export interface ForwardStrategy {
  /** One forward as `request.cache` asks, spot-checked where `checked` (and the strategy can check). */
  run(request: ForwardRequest, checked: boolean): Promise<ForwardOutput>;
  /** A job was prepared: its ranks hold no keys and values of an earlier forward. */
  jobPrepared(): void;
}

/** what a later pipeline stage is given for patches: it starts from the stage before's hidden state */
export const NO_PATCHES = new Float32Array(0);

/** The values of one token's row of a forward's output: pt·ph·pw·C. */
export const rowWidthOf = (config: WanConfig): number =>
  config.outChannels * config.patchSize.reduce((a, b) => a * b, 1);

/** One rank's work over two forwards (a step's passes, PipeFusion's patches): times and bytes summed, peaks' max. */
export const summedReports = (a: RankReport, b: RankReport): RankReport => ({
  ...a,
  computeMs: a.computeMs + b.computeMs,
  commMs: a.commMs + b.commMs,
  overlapMs: a.overlapMs + b.overlapMs,
  bytesSent: a.bytesSent + b.bytesSent,
  peakMemoryBytes: maxOrNull(a.peakMemoryBytes, b.peakMemoryBytes),
  ...((a.handOff || b.handOff) && {
    handOff: {
      bytes: (a.handOff?.bytes ?? 0) + (b.handOff?.bytes ?? 0),
      ms: (a.handOff?.ms ?? 0) + (b.handOff?.ms ?? 0),
    },
  }),
});

export function rankReport(context: ForwardContext, rank: number, r: ExecuteResult): RankReport {
  return {
    rank,
    worker: context.workers[rank]?.id ?? '',
    computeMs: r.computeMs,
    commMs: r.commMs,
    overlapMs: r.overlapMs,
    bytesSent: r.bytesSent,
    peakMemoryBytes: r.peakMemoryBytes,
    ...(r.handOff && { handOff: r.handOff }),
  };
}

/** Each rank's output rows: the size its share of the tokens gives, all finite; else it broke the contract. */
export function checkRows(config: WanConfig, results: ExecuteResult[], ranks: number[], rows: number[]): void {
  const rowWidth = rowWidthOf(config);
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

/** Per pass, the last step its group ran on this placement: whose keys and values the ranks hold. */
export class HeldKeysValues {
  private readonly lastStepOf = new Map<number, number>();

  constructor(
    private readonly context: ForwardContext,
    private readonly mode: ParallelMode | 'pipefusion',
  ) {}

  /**
   * Whether this forward attends to stale keys and values (displaced mode or PipeFusion past its warm-up, the ranks
   * holding the step before's).
   */
  stale(request: ForwardRequest): boolean {
    return attendsStale(this.mode, this.context.placement.warmupSteps, request.step, this.lastStepOf.get(request.pass));
  }

  /** The pass's group ran this step: its ranks hold its keys and values now. */
  ran(request: ForwardRequest): void {
    this.lastStepOf.set(request.pass, request.step);
  }

  /** A prepared job's ranks hold none. */
  clear(): void {
    this.lastStepOf.clear();
  }
}
