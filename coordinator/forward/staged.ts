// A forward's way through its group's pipeline stages (one, unless the placement pools memory): the first stage
// computes from the patches, and each rank of a stage before the last hands its hidden state straight to the rank of
// the next stage that computes the same tokens, over their own link (rank/hand-off.ts), which judges it before use: no
// activation crosses the coordinator, which sends each stage's ranks the request and hears back the last stage's
// rows. The turns keep a stage on one forward at a time. The stages' runs are what the verifier checks, stage by stage.
import type { RankLayout } from '../../core/parallel.ts';
import type { ExecuteArgs, ExecuteResult } from '../../core/worker-api.ts';
import { WorkerError } from '../worker-errors.ts';
import { NO_PATCHES, type ForwardContext, type ForwardRequest, type RankReport } from './strategy.ts';

/** One pipeline stage's part of a forward (the whole forward where there is one stage), for a spot check. */
export interface StageRun {
  stage: number;
  /** its ranks in plan order */
  ranks: number[];
  results: ExecuteResult[];
}

/** What a stage's rank is given for a forward, besides the request: its tokens' timesteps among it. */
export type StageInput = Pick<ExecuteArgs, 'patches' | 'timestep' | 'stale' | 'cache' | 'patch'>;

/** A rank's share of a forward's tokens: its patches and their timesteps. */
export type TokenShare = Pick<ExecuteArgs, 'patches' | 'timestep'>;

/** One boundary's hand-offs in a step: from stage `boundary` to the next, all its ranks' and passes' together. */
export interface HandOffReport {
  boundary: number;
  /** payload bytes the next stage's ranks received */
  bytes: number;
  /** the longest any of them took from the first tensor to the last */
  ms: number;
}

/** A step's hand-offs, boundary by boundary, from what its ranks reported (each rank's: what it was handed). */
export function handOffsOf(layout: RankLayout, ranks: RankReport[]): HandOffReport[] {
  return Array.from({ length: layout.stages - 1 }, (_, boundary) => {
    const received = ranks.filter((r) => layout.stageOf(r.rank) === boundary + 1 && r.handOff);
    return {
      boundary,
      bytes: received.reduce((n, r) => n + (r.handOff?.bytes ?? 0), 0),
      ms: Math.max(0, ...received.map((r) => r.handOff?.ms ?? 0)),
    };
  });
}

export class PipelineStages {
  /**
   * pipeline stages: each stage's last forward (per CFG group), which the next pass's waits for, so that a stage runs
   * one pass at a time, whole, and hands it on while it computes the next (its engine would otherwise interleave them)
   */
  private readonly turns: Promise<unknown>[] = [];

  constructor(private readonly context: ForwardContext) {}

  /**
   * The group's pipeline stages in turn, the first stage's ranks given their `shares` of the tokens' patches, each
   * later one's ranks their hand-off by the stage before (and their tokens' timesteps), every stage's ranks told `how`
   * the forward runs: each stage's run, the first to the last.
   */
  async run(
    request: ForwardRequest,
    group: number,
    shares: TokenShare[],
    how: Pick<ExecuteArgs, 'stale' | 'cache'>,
  ): Promise<StageRun[]> {
    const { layout } = this.context;
    const runs: StageRun[] = [];
    for (let stage = 0; stage < layout.stages; stage++) {
      const ranks = layout.stageRanks(group, stage);
      const results = await this.turn(request, group, stage, (rank) => {
        const share = shares[layout.localRank(rank)];
        return { patches: stage === 0 ? share.patches : NO_PATCHES, timestep: share.timestep, ...how };
      });
      if (stage < layout.stages - 1) handedOn(results, ranks);
      runs.push({ stage, ranks, results });
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
    if (layout.stages > 1 && typeof request.timestep !== 'number' && new Set(request.timestep).size > 1)
      throw new Error(
        'a forward whose tokens take different timesteps runs in one pipeline stage: its hidden state carries one ' +
          'time embedding (place it on workers that hold the whole model)',
      );
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
}

/**
 * A stage before the last hands its hidden state on to the next stage's ranks, not back (the contract has no field
 * for it): a rank that returned rows broke the contract.
 */
export function handedOn(results: ExecuteResult[], ranks: number[]): void {
  results.forEach((r, i) => {
    if (r.rows.length)
      throw new WorkerError(
        ranks[i],
        'executeModel',
        'returned rows, but its stage hands a hidden state on',
        null,
        true,
      );
  });
}
