// A step cache's forwards as the coordinator keeps them (core/step-cache.ts schedules them, the ranks keep the
// residuals): which forward's residual each pass's ranks keep, the kept forwards a job carries across its placements
// (StepCacheMemory), the last of them run again on ranks placed since, and each forward as it ran, for the report.
import { defined } from '../core/defined.ts';
import { cacheSchedule, type CacheMode } from '../core/step-cache.ts';
import type { ForwardContext, ForwardRequest } from './forward/strategy.ts';

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

/** How a forward its schedule asked for runs on this placement's ranks (StepCacheForwards.asRun). */
export interface CacheRun {
  /** the schedule's, except a reuse the ranks hold no residual for, which is computed and kept */
  cache: CacheMode | undefined;
  recomputed: boolean;
  replayedFrom: number | null;
  /** a reuse is checked by recomputing the forward it reuses first, which needs that one exact */
  checkable: boolean;
}

/** A step cache's forwards on one placement's ranks. */
export class StepCacheForwards {
  /**
   * per pass, the forward whose residual its ranks keep for the prepared job, which a step cache's reuse needs (and a
   * check of a reuse computes again), and whether it attended to stale keys and values (then no check can)
   */
  private readonly keptFrom = new Map<number, { request: ForwardRequest; stale: boolean }>();
  /** per pass, the step whose kept forward rebuildResiduals ran again for this step's reuse */
  private readonly replayedFor = new Map<number, number>();
  /** a step cache's forwards run and not yet taken (take) */
  private forwards: CacheForward[] = [];

  constructor(private readonly context: Pick<ForwardContext, 'placement'>) {}

  /** Each pass's forward of this step, as the placement's step cache schedules it; undefined without one. */
  modes(at: Omit<ForwardRequest, 'pass'>, passes: 1 | 2): CacheMode[] | undefined {
    const placed = this.context.placement.cache;
    if (!placed) return undefined;
    const steps = defined(at.steps, "the job's steps, which a step cache's schedule is made for");
    return cacheSchedule(placed.curve, placed.settings, steps, passes)[at.step];
  }

  /**
   * A reuse needs the residual its pass's ranks kept; where this placement's kept none (it was placed since), the
   * pass's last kept forward runs again on them first, which gives them the residual the job's ranks had. One pass
   * after the other, before this step's forwards: a rank refuses an exchange of a step older than one it has begun.
   */
  async rebuildResiduals(
    step: number,
    modes: CacheMode[],
    memory: StepCacheMemory | undefined,
    forward: (replay: ForwardRequest) => Promise<unknown>,
  ): Promise<void> {
    for (const [pass, mode] of modes.entries()) {
      const replay = mode === 'reuse' && !this.keptFrom.has(pass) ? memory?.lastKept(pass, step) : undefined;
      if (!replay) continue;
      await forward(replay);
      this.replayedFor.set(pass, replay.step);
    }
  }

  /** How `request` runs on these ranks. */
  asRun(request: ForwardRequest): CacheRun {
    const { pass } = request;
    const replayedFrom = this.replayedFor.get(pass) ?? null;
    this.replayedFor.delete(pass);
    // a reuse on ranks that kept no residual and could not be given it again (rebuildResiduals) is computed
    const kept = this.keptFrom.get(pass);
    const recomputed = request.cache === 'reuse' && !kept;
    const cache = recomputed ? 'keep' : request.cache;
    return { cache, recomputed, replayedFrom, checkable: cache !== 'reuse' || kept?.stale === false };
  }

  /** The ranks of `request.pass` keep the residual of `request`, which attended to `stale` keys and values or not. */
  kept(request: ForwardRequest, stale: boolean): void {
    this.keptFrom.set(request.pass, { request, stale });
  }

  /** The forward whose residual the pass's ranks reuse: a check of the reuse computes it first. */
  reusedForward(pass: number): ForwardRequest {
    return defined(this.keptFrom.get(pass), 'the forward reused').request;
  }

  /** `request` ran as `run` asked; a kept forward is remembered in `memory`, for ranks placed later. */
  ran(request: ForwardRequest, run: CacheRun, magnitudeRatio: number | null, memory?: StepCacheMemory): void {
    const { cache, recomputed, replayedFrom } = run;
    const { step, pass } = request;
    if (cache === 'keep') memory?.kept({ ...request, cache });
    if (cache) this.forwards.push({ step, pass, reused: cache === 'reuse', replayedFrom, recomputed, magnitudeRatio });
  }

  /** A prepared job's ranks keep no residuals. */
  jobPrepared(): void {
    this.keptFrom.clear();
  }

  /** The forwards run since the last call: the report's. */
  take(): CacheForward[] {
    return this.forwards.splice(0);
  }
}
