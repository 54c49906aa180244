// The sequence-parallel forward: the group's tokens scattered over its ranks, which attend across them by Ulysses'
// all-to-all or, in displaced mode, to the keys and values of the step before (rank/displaced.ts), through the
// group's pipeline stages (staged.ts; one, unless the placement pools memory). The one strategy that runs a step
// cache's forwards and that the verifier checks.
import { gatherLatent, planUlysses, scatterLatent, tokenStart } from '../../core/parallel.ts';
import { timestepRows } from '../../core/model/timesteps.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { defined } from '../../core/defined.ts';
import type { StepCacheForwards } from '../step-cache-forwards.ts';
import type { Verifier } from '../verifier.ts';
import { PipelineStages } from './staged.ts';
import {
  checkRows,
  HeldKeysValues,
  rankReport,
  type ForwardContext,
  type ForwardOutput,
  type ForwardRequest,
  type ForwardStrategy,
} from './strategy.ts';

export class SequenceParallelForward implements ForwardStrategy {
  /** displaced mode: per pass, the last step its group ran on this placement (whose keys and values the ranks hold) */
  private readonly held: HeldKeysValues;
  private readonly stages: PipelineStages;

  constructor(
    private readonly context: ForwardContext,
    private readonly verifier: Verifier,
    private readonly stepCache: StepCacheForwards,
  ) {
    this.held = new HeldKeysValues(context, context.placement.settings.parallel);
    this.stages = new PipelineStages(context);
  }

  jobPrepared(): void {
    this.held.clear();
  }

  /**
   * One forward as `request.cache` asks (the blocks run, or a residual reused), spot-checked where `checked`: scatter
   * the tokens, run the group's pipeline stages in turn (one, unless the placement pools memory: the first from the
   * patches, each next from the hidden state the stage before handed on, rank r to rank r), check each rank's rows
   * are the size the plan gives it, gather them in token order.
   */
  async run(request: ForwardRequest, checked: boolean): Promise<ForwardOutput> {
    const { config, layout } = this.context;
    const group = layout.groupForPass(request.pass);
    const plan = planUlysses(config, tokenGrid(config, request.latent.shape).count, layout.headsOf(group));
    const shares = scatterLatent(config, plan, request.latent).map((patches, rank) => ({
      patches,
      timestep: timestepRows(request.timestep, tokenStart(plan, rank), plan.rows[rank]),
    }));
    const { cache } = request;
    const reused = cache === 'reuse';
    // displaced mode's warm-up steps and the first after a placement are exact: stale only where the
    // ranks hold the step before's; a checked forward goes as any other (its checker recomputes it stale).
    // A reused forward exchanges no keys or values
    const stale = !reused && this.held.stale(request);
    if (!reused) this.held.ran(request);
    const stageRuns = await this.stages.run(request, group, shares, {
      ...(stale && { stale }),
      ...(cache && { cache }),
    });
    const reports = stageRuns.flatMap((run) => run.results.map((r, i) => rankReport(this.context, run.ranks[i], r)));
    const { ranks, results } = defined(stageRuns.at(-1), 'a pipeline stage');
    checkRows(config, results, ranks, plan.rows);
    const attendedStale = stale && ranks.length > 1; // a group of one rank attends to nothing stale
    // well-formed, finite and plausible, and still wrong: now and then another rank recomputes the pass, stage by
    // stage where it went through stages (a stage's holders alone can), the first stage found wrong convicting
    if (checked) await this.verifier.check(request, plan, stageRuns, attendedStale);
    if (cache === 'keep') this.stepCache.kept(request, attendedStale);
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
}
