// The denoising loop with recovery: each step's velocity from the placement's executor (one or two
// DiT forwards). A lost rank costs a re-placement (Placer.replace) and the interrupted step, not the
// job. A rank a spot check convicts (SpotCheckFailed) may have returned wrong rows unchecked since
// it was placed, so the steps since then run again from the checkpoint it was placed at; sampling is
// seeded, so the latent is the one an honest swarm makes. A rank slower than its share has the
// shares changed between steps (Placer.rebalance): the same workers, so the checkpoint stays.
import { defined } from '../core/defined.ts';
import type { JobParams } from '../core/job.ts';
import { median } from '../core/median.ts';
import { stepTimestep } from '../core/model/family.ts';
import type { TokenGrid } from '../core/model/tokens.ts';
import { sample, type SamplerCheckpoint, type Solver } from '../core/sampler.ts';
import type { Tensor } from '../core/tensor.ts';
import { handOffsOf, type HandOffReport } from './forward/staged.ts';
import { SpotCheckFailed, StepCacheMemory, type CacheForward, type RankReport } from './executor.ts';
import type { FailureRecord, Placer, RebalanceRecord } from './placer.ts';
import type { SpotCheck } from './spot-check.ts';

export interface StepProgress {
  step: number; // 1-based, completed
  steps: number;
  stepMs: number;
  elapsedMs: number;
  etaMs: number;
  ranks: RankReport[];
}

export interface StepReport {
  step: number;
  ms: number;
  ranks: RankReport[];
  /** each stage boundary's hand-offs in the step, from stage to stage directly (none without pipeline stages) */
  handOffs: HandOffReport[];
}

export interface DenoiseRequest {
  placer: Placer;
  job: number;
  params: JobParams;
  /** the latent's [C, T, H, W] */
  shape: number[];
  /** the model's tokens of that latent */
  grid: TokenGrid;
  /** image to video (Wan2.2 TI2V): the encoded image held as the first latent frame (core/sampler.ts) */
  firstFrame?: Float32Array;
  solver: Solver;
  /** continue from a checkpoint: `step` steps done, `latent` after them */
  resume?: SamplerCheckpoint;
  signal?: AbortSignal;
  onCheckpoint?: (c: SamplerCheckpoint) => void;
  onProgress?: (p: StepProgress) => void;
}

export interface Denoised {
  latent: Tensor;
  steps: StepReport[];
  /** the ranks lost in the steps (the placer records them with those of the other phases: Placer.failures) */
  failures: FailureRecord[];
  /** the steps a slow rank's share shrank at */
  rebalances: RebalanceRecord[];
  spotChecks: SpotCheck[];
  /** a step cache's forwards, each as it last ran (a step run again replaces its record) */
  cacheForwards: CacheForward[];
  /** the median step's ms: what the plan's predictedStepMs is held to (a slow step moves a mean, not a median) */
  medianStepMs: number;
}

/** A step and the checkpoint after it (undefined before the first step of a job that did not resume). */
interface Point {
  step: number;
  checkpoint: SamplerCheckpoint | undefined;
}

/** The sampler is left at a spot check's conviction: the steps since the convicted rank was placed run again. */
class RerunFrom extends Error {
  override name = 'RerunFrom';
  constructor(readonly point: Point) {
    super(`re-running from step ${point.step + 1}`);
  }
}

export async function denoise(r: DenoiseRequest): Promise<Denoised> {
  const { placer, params } = r;
  const first = r.resume?.step ?? 0;
  const steps: StepReport[] = [];
  const failures: FailureRecord[] = [];
  const spotChecks: SpotCheck[] = [];
  const cacheForwards = new Map<string, CacheForward>();
  const cacheMemory = new StepCacheMemory();
  const takeCacheForwards = () => {
    for (const f of executor().takeCacheForwards()) cacheForwards.set(`${f.step}/${f.pass}`, f);
  };
  const loopStart = performance.now();
  const executor = () => defined(placer.current, 'a placement of the job');
  let ranks: RankReport[] = [];
  /** the ranks of the step just done, until the next step has weighed their shares */
  let lastStepRanks: RankReport[] | null = null;
  const rebalances: RebalanceRecord[] = [];
  // where the current placement started (its checkpoint kept alone: a real model's latent is
  // megabytes, one per step) and the last step done
  let placedAt: Point = { step: first, checkpoint: r.resume };
  let from = placedAt;
  for (;;) {
    let lastDone = from;
    lastStepRanks = null;
    steps.splice(0, steps.length, ...steps.filter((s) => s.step < from.step));
    try {
      const latent = await sample({
        shape: r.shape,
        steps: params.steps,
        flowShift: params.flowShift,
        seed: params.seed,
        solver: r.solver,
        resume: from.checkpoint,
        firstFrame: r.firstFrame,
        signal: r.signal,
        async velocity(at) {
          // a rank markedly slower than its share keeps its job with a smaller one (placer.rebalance)
          const judged = lastStepRanks;
          lastStepRanks = null;
          if (judged) {
            const rebalance = await placer.rebalance(at.step, judged);
            if (rebalance) rebalances.push(rebalance);
          }
          for (;;) {
            try {
              const timestep = stepTimestep(r.grid, at.timestep, r.firstFrame !== undefined);
              const result = await executor().velocity(
                { job: r.job, steps: params.steps, ...at, timestep },
                params.guidance,
                cacheMemory,
              );
              ranks = result.ranks;
              return result.velocity;
            } catch (e) {
              spotChecks.push(...executor().takeSpotChecks());
              takeCacheForwards();
              const caught = e instanceof SpotCheckFailed;
              const failure = await placer.replace(e as Error, at.step, caught ? placedAt.step : null);
              if (!failure) throw e;
              failures.push(failure);
              if (caught) throw new RerunFrom(placedAt); // on the new placement
              placedAt = lastDone; // the new placement starts at this step
              cacheMemory.placed();
            }
          }
        },
        onStep({ stepMs, ...checkpoint }) {
          spotChecks.push(...executor().takeSpotChecks());
          takeCacheForwards();
          const { step } = checkpoint;
          lastDone = { step, checkpoint };
          steps.push({ step: step - 1, ms: stepMs, ranks, handOffs: handOffsOf(executor().layout, ranks) });
          lastStepRanks = ranks;
          r.onCheckpoint?.(checkpoint);
          const elapsedMs = performance.now() - loopStart;
          r.onProgress?.({
            step,
            steps: params.steps,
            stepMs,
            elapsedMs,
            etaMs: (elapsedMs / (step - first)) * (params.steps - step),
            ranks,
          });
        },
      });
      const forwards = [...cacheForwards.values()].sort((a, b) => a.step - b.step || a.pass - b.pass);
      const medianStepMs = median(steps.map((s) => s.ms));
      return { latent, steps, failures, rebalances, spotChecks, cacheForwards: forwards, medianStepMs };
    } catch (e) {
      if (!(e instanceof RerunFrom)) throw e;
      from = e.point;
      placedAt = e.point;
      cacheMemory.rerun();
    }
  }
}
