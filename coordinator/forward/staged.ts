// A forward's way through its group's pipeline stages (one, unless the placement pools memory): the first stage
// computes from the patches, each next one from the hidden state the stage before handed on, rank r to rank r through
// the coordinator, which judges it before the next stage gets it; and the turns that keep a stage on one forward at a
// time. The stages' runs are what the verifier checks, stage by stage.
import { hiddenStateError, type HiddenState } from '../../core/model/blocks.ts';
import type { ExecuteArgs, ExecuteResult } from '../../core/worker-api.ts';
import { WorkerError } from '../worker-errors.ts';
import { NO_PATCHES, type ForwardContext, type ForwardRequest } from './strategy.ts';

/** One pipeline stage's part of a forward (the whole forward where there is one stage), for a spot check. */
export interface StageRun {
  stage: number;
  /** its ranks in plan order */
  ranks: number[];
  /** the hidden states the stage before handed each of them; null where it started from the patches */
  input: HiddenState[] | null;
  results: ExecuteResult[];
}

/** What a stage's rank is given for a forward, besides the request. */
export type StageInput = Pick<ExecuteArgs, 'patches' | 'hidden' | 'stale' | 'cache' | 'patch'>;

export class PipelineStages {
  /**
   * pipeline stages: each stage's last forward (per CFG group), which the next pass's waits for, so that a stage runs
   * one pass at a time, whole, and hands it on while it computes the next (its engine would otherwise interleave them)
   */
  private readonly turns: Promise<unknown>[] = [];

  constructor(private readonly context: ForwardContext) {}

  /**
   * The group's pipeline stages in turn, each rank's share of the tokens its `patches` (of the group's plan, whose
   * `rows` they are) and every stage's ranks told `how` the forward runs: each stage's run, the first to the last.
   */
  async run(
    request: ForwardRequest,
    group: number,
    rows: number[],
    patches: Float32Array[],
    how: Pick<ExecuteArgs, 'stale' | 'cache'>,
  ): Promise<StageRun[]> {
    const { layout } = this.context;
    let handed: HiddenState[] | null = null;
    const runs: StageRun[] = [];
    for (let stage = 0; stage < layout.stages; stage++) {
      const from = handed;
      const ranks = layout.stageRanks(group, stage);
      const results = await this.turn(request, group, stage, (rank) => ({
        patches: from ? NO_PATCHES : patches[layout.localRank(rank)],
        ...(from && { hidden: from[layout.localRank(rank)] }),
        ...how,
      }));
      if (stage < layout.stages - 1) handed = this.handedOn(results, ranks, rows, request.pass);
      runs.push({ stage, ranks, input: from, results });
    }
    return runs;
  }

  /**
   * One stage's executeModel of a forward, in the stage's turn: a stage's ranks take the forwards given them one after
   * another, in the order they were given (a guided step's other pass, PipeFusion's next patch, wait their turn); its
   * turn is its group's (with CFG parallel each group's mesh holds the stage).
   */
  turn(
    request: ForwardRequest,
    group: number,
    stage: number,
    input: (rank: number) => StageInput,
  ): Promise<ExecuteResult[]> {
    const { layout } = this.context;
    const ranks = layout.stageRanks(group, stage);
    const show = (rank: number, doing: string) =>
      this.context.showActivity(rank, `${this.context.shareOf(rank)}: ${doing}`);
    const patch = input(ranks[0]).patch;
    const doing =
      `step ${request.step + 1}${request.pass ? ' (unconditional)' : ''}` +
      (patch && patch.count > 1 ? `, patch ${patch.index + 1} of ${patch.count}` : '');
    const turn = group * layout.stages + stage;
    const staged = layout.stages > 1;
    const call = ((staged && this.turns[turn]) || Promise.resolve()).then(() => {
      for (const rank of ranks) show(rank, doing);
      return this.context
        .collectiveRpc('executeModel', {
          ranks,
          args: (rank) => ({
            job: request.job,
            step: request.step,
            pass: request.pass,
            timestep: request.timestep,
            latentShape: request.latent.shape,
            ...input(rank),
          }),
        })
        .finally(() => {
          for (const rank of ranks) show(rank, 'waiting');
        });
    });
    if (staged) this.turns[turn] = call.catch(() => {});
    return call;
  }

  /**
   * The hidden states a pipeline stage before the last handed on, each judged before the next stage
   * gets it: one of the rank's share of the tokens, every value finite; else the rank broke the contract.
   */
  handedOn(results: ExecuteResult[], ranks: number[], rows: number[], pass: number): HiddenState[] {
    const { config } = this.context;
    return results.map((r, i) => {
      const { hidden } = r;
      const malformed = hidden && hiddenStateError(config, hidden, rows[i], this.context.textRowsOf(pass));
      const wrong = !hidden
        ? 'handed no hidden state on to the next pipeline stage'
        : r.rows.length
          ? 'returned rows, but its pipeline stage hands a hidden state on'
          : malformed && `handed on a malformed hidden state: ${malformed}`;
      if (wrong || !hidden) throw new WorkerError(ranks[i], 'executeModel', wrong || '', null, true);
      return hidden;
    });
  }
}
