// PipeFusion (placement.pipeFusion): the tokens cut into patches that follow each other through the pipeline stages,
// so that every stage computes at once, each on another patch, its blocks attending to the patches before of this
// step and those after of the step before (rank/pipefusion.ts). Nothing is spot-checked (the planner's rate is 0), and
// no step cache runs with pipeline stages.
import { defined } from '../../core/defined.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { gatherLatent, planUlysses, scatterLatent, tokenStart } from '../../core/parallel.ts';
import { timestepRows } from '../../core/model/timesteps.ts';
import type { ExecuteResult } from '../../core/worker-api.ts';
import { handedOn, PipelineStages } from './staged.ts';
import {
  checkRows,
  HeldKeysValues,
  NO_PATCHES,
  rankReport,
  summedReports,
  type ForwardContext,
  type ForwardOutput,
  type ForwardRequest,
  type ForwardStrategy,
  type RankReport,
} from './strategy.ts';

export class PipeFusionForward implements ForwardStrategy {
  /** per pass, the last step its patches ran on this placement (whose keys and values the stages hold) */
  private readonly held: HeldKeysValues;
  private readonly stages: PipelineStages;

  constructor(
    private readonly context: ForwardContext,
    /** the patches a forward past its warm-up is cut into */
    private readonly patches: number,
  ) {
    this.held = new HeldKeysValues(context, 'pipefusion');
    this.stages = new PipelineStages(context);
  }

  jobPrepared(): void {
    this.held.clear();
  }

  /**
   * The warm-up steps, and the first after a placement, go as one patch: exact, filling the stages' keys and values;
   * the others in `patches` patches.
   */
  async run(request: ForwardRequest, _checked: boolean): Promise<ForwardOutput> {
    const { config, layout } = this.context;
    const group = layout.groupForPass(request.pass);
    const count = this.held.stale(request) ? this.patches : 1;
    this.held.ran(request);
    const plan = planUlysses(config, tokenGrid(config, request.latent.shape).count, count);
    // each patch flows through the stages, each stage's rank handing it straight on to the next's (staged.ts)
    const flows = scatterLatent(config, plan, request.latent).map(async (input, index) => {
      const patch = { index, count };
      const runs: { rank: number; result: ExecuteResult }[] = [];
      for (let stage = 0; stage < layout.stages; stage++) {
        const [rank] = layout.stageRanks(group, stage);
        const [result] = await this.stages.turn(request, group, stage, () => ({
          patches: stage === 0 ? input : NO_PATCHES,
          timestep: timestepRows(request.timestep, tokenStart(plan, index), plan.rows[index]),
          patch,
        }));
        runs.push({ rank, result });
        if (stage < layout.stages - 1) handedOn([result], [rank]);
      }
      return runs;
    });
    const patchRuns = await Promise.all(flows);
    const last = patchRuns.map((runs) => defined(runs.at(-1), 'a stage'));
    checkRows(
      config,
      last.map((r) => r.result),
      last.map((r) => r.rank),
      plan.rows,
    );
    // a rank's report is its patches' summed
    const reports = new Map<number, RankReport>();
    for (const { rank, result } of patchRuns.flat()) {
      const r = rankReport(this.context, rank, result);
      const before = reports.get(rank);
      reports.set(rank, before ? summedReports(before, r) : r);
    }
    return {
      output: gatherLatent(
        config,
        plan,
        last.map((r) => r.result.rows),
        request.latent.shape,
      ),
      ranks: [...reports.values()],
      magnitudeRatio: null,
    };
  }
}
