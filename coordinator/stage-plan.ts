// Pooled memory: the transformer's blocks cut into contiguous pipeline stages, each held by one
// group of workers (a group may run Ulysses within its stage, so each member holds the whole stage).
// The cut follows exo's memory-weighted partitioning, weighted by speed: a step of a pipeline is as
// slow as its slowest stage, so blocks go where they finish soonest, never past what a group can
// hold; the embedders ride with the first stage and the output head with the last. A swarm that
// cannot hold the model is refused before any weight moves, saying how much is missing.
import { modelWeights, storedWeightBytes, type ModelShape } from '../core/cost-model.ts';
import { formatBytes, type WeightType } from '../core/worker-api.ts';
import { checkMessages, patchesIn, rowsOut } from './message-sizes.ts';

/** What cutting needs to know of a model, in the bytes a rank holds it in. */
export interface StagedModel {
  numLayers: number;
  /** one block's weights */
  blockBytes: number;
  /** what the first stage holds beside its blocks: patch embedding and condition embedder */
  firstBytes: number;
  /** what the last stage holds beside its blocks: the output head */
  lastBytes: number;
  /** what a rank keeps beside each block's weights while it computes: PipeFusion's keys and values, else 0 */
  blockReserveBytes: number;
}

/** The bytes a rank needs for each block it holds: its weights, and what it keeps for it while it computes. */
const perBlockBytes = (model: StagedModel): number => model.blockBytes + model.blockReserveBytes;

/** A group that holds one stage: its members all hold the stage's blocks. */
export interface StageGroup {
  workers: string[];
  /** the least memory a member can give the model */
  memoryBytes: number;
  /** what a member needs beside the weights while it computes (activations, keys and values) */
  reserveBytes: number;
  /** how fast the group runs a block, relative to the others (its measured flop/s, say) */
  speed: number;
}

export interface PipelineStage {
  /** the blocks the stage holds, [from, to) */
  blocks: [number, number];
  workers: string[];
  /** the weight bytes each member holds */
  heldBytes: number;
}

/** Stages in pipeline order (a hidden state passes from each to the next); or why the groups cannot hold the model. */
export type StagePlan = { stages: PipelineStage[] } | { refused: string };

/**
 * Cuts the model's blocks over the groups in the order given (the first holds the embedders, the
 * last the head). Each group with room holds a block (the stages were asked for), then each block
 * goes to the group whose stage would then finish soonest (blocks over speed) among those with room
 * for it, which minimises the slowest stage under the memory caps; a group left with no block (no
 * room for one) is dropped and the cut made again without it.
 */
export function cutStages(model: StagedModel, groups: readonly StageGroup[]): StagePlan {
  if (!groups.length) return { refused: 'no worker to hold the model' };
  const room = (g: StageGroup, i: number, n: number) =>
    Math.max(
      0,
      Math.floor(
        (g.memoryBytes - g.reserveBytes - (i === 0 ? model.firstBytes : 0) - (i === n - 1 ? model.lastBytes : 0)) /
          perBlockBytes(model),
      ),
    );
  const capacity = groups.map((g, i) => room(g, i, groups.length));
  const held = capacity.reduce((a, b) => a + b, 0);
  if (held < model.numLayers) return { refused: missingWords(model, groups, model.numLayers - held) };
  // each stage asked for holds a block before the rest go by speed: a slow worker asked to pool its memory still
  // takes part (where it has room), as the job asked, rather than being dropped by the speed rule alone
  const blocks = capacity.map((c): number => (c > 0 && groups.length <= model.numLayers ? 1 : 0));
  for (let b = blocks.reduce((n, k) => n + k, 0); b < model.numLayers; b++) {
    let best = -1;
    for (let i = 0; i < groups.length; i++) {
      if (blocks[i] >= capacity[i]) continue;
      if (best < 0 || (blocks[i] + 1) / groups[i].speed < (blocks[best] + 1) / groups[best].speed) best = i;
    }
    blocks[best]++;
  }
  const idle = blocks.findIndex((n) => n === 0);
  // a group with nothing to hold takes no part; without it the ends may move, so cut again
  if (idle >= 0) return cutStages(model, [...groups.slice(0, idle), ...groups.slice(idle + 1)]);
  let from = 0;
  return {
    stages: groups.map((g, i) => {
      const blocksHeld = blocks[i];
      const stage: PipelineStage = {
        blocks: [from, from + blocksHeld],
        workers: g.workers,
        heldBytes:
          blocksHeld * model.blockBytes +
          (i === 0 ? model.firstBytes : 0) +
          (i === groups.length - 1 ? model.lastBytes : 0),
      };
      from += blocksHeld;
      return stage;
    }),
  };
}

/** What is missing for `blocksShort` more blocks, in words a user can act on. */
function missingWords(model: StagedModel, groups: readonly StageGroup[], blocksShort: number): string {
  const total = model.numLayers * perBlockBytes(model) + model.firstBytes + model.lastBytes;
  const pooled = groups.reduce((n, g) => n + Math.max(0, g.memoryBytes - g.reserveBytes), 0);
  const missing = blocksShort * perBlockBytes(model);
  // one more worker holds the missing blocks beside what any member needs to compute
  const reserve = Math.max(...groups.map((g) => g.reserveBytes));
  const what = model.blockReserveBytes ? "of weights and PipeFusion's keys and values" : 'of weights';
  return (
    `the model needs ${formatBytes(total)} ${what} and these ${groups.length} stage group(s) can hold ` +
    `${formatBytes(Math.min(pooled, total - missing))}: it needs ${formatBytes(missing)} more, ` +
    `one more worker with ${formatBytes(missing + reserve)} for the model`
  );
}

/** Bytes of the whole transformer as a rank holds it. */
export const wholeModelBytes = (model: StagedModel): number =>
  model.numLayers * model.blockBytes + model.firstBytes + model.lastBytes;

/**
 * The bytes a rank holds a model in as cutStages weighs them: every weight as `weightType` (float32 unless asked: the
 * loader widens every checkpoint, and only a WebGPU adapter with shader-f16 halves them unasked).
 */
export function stagedModel(model: ModelShape, weightType: WeightType = 'float32'): StagedModel {
  const weights = modelWeights(model);
  return {
    numLayers: model.numLayers,
    blockBytes: storedWeightBytes(weights.block, weightType),
    firstBytes: storedWeightBytes(weights.embedders, weightType),
    lastBytes: storedWeightBytes(weights.head, weightType),
    blockReserveBytes: 0,
  };
}

/**
 * The share of the memory a worker reports (WorkerInfo.memoryGiB) that its stage's weights may take: the
 * rest is its browser's, its page's and the forward's activations.
 */
export const STAGE_MEMORY_SHARE = 0.5;

/** A worker as the stage placement sees it: what it reports of its memory, and its measured speed. */
export interface StageWorker {
  id: string;
  memoryGiB: number | null;
  /** what its user lets the model's weights take (the worker page's field) */
  modelMemoryGiB?: number;
  /** its measured flop/s on the EP it will run, null while unmeasured */
  flops: number | null;
}

/**
 * The bytes of weights a worker's stage may hold: what its user set on its page (who knows what else
 * the machine runs, and that browsers report at most 8 GiB), else STAGE_MEMORY_SHARE of what its
 * browser reports, else no bound.
 */
export function memoryBudget(w: Pick<StageWorker, 'memoryGiB' | 'modelMemoryGiB'>): number {
  if (w.modelMemoryGiB !== undefined) return w.modelMemoryGiB * 2 ** 30;
  return w.memoryGiB === null ? Infinity : w.memoryGiB * 2 ** 30 * STAGE_MEMORY_SHARE;
}

/**
 * A staged placement's pipeline: `stages` stages of `degree` workers each (a Ulysses mesh within the
 * stage), the first stages × degree of `workers` in order, cut by cutStages; with `cfgGroups` 2 (CFG
 * parallel), `degree` in each group, a stage's workers group 0's mesh then group 1's. A worker's
 * memory budget is memoryBudget's; a group's is its least member's. Blocks go by measured speed (a group's: its
 * slowest member's, times its members, as even shares run), evenly while any worker is unmeasured.
 * A cut that cannot hold the model is refused, saying what is missing.
 */
export function placeStages(
  model: ModelShape,
  {
    stages,
    degree,
    tokens,
    textTokens,
    weightType,
    cfgGroups = 1,
    keysValuesBytesPerBlock = 0,
  }: {
    stages: number;
    degree: number;
    tokens: number;
    textTokens: number;
    weightType?: WeightType;
    cfgGroups?: 1 | 2;
    /** PipeFusion: every token's keys and values a rank keeps per block it holds (rank/pipefusion.ts) */
    keysValuesBytesPerBlock?: number;
  },
  workers: readonly StageWorker[],
): PipelineStage[] {
  if (!(Number.isInteger(stages) && stages >= 1))
    throw new Error(`stages is a whole number ≥ 1 of pipeline stages, got ${JSON.stringify(stages)}`);
  if (stages > model.numLayers)
    throw new Error(
      `${stages} pipeline stages of a model of ${model.numLayers} blocks: each stage holds at least one block, ` +
        `so at most ${model.numLayers} stages`,
    );
  // a rank's patches come and its rows go in one message each, the busiest rank's, whose share follows its heads; its
  // hidden state goes to the next stage's rank directly, of any size (rank/hand-off.ts)
  const mesh = { tokens, textTokens, heads: degree };
  checkMessages([patchesIn(model, mesh), rowsOut(model, mesh)]);
  // with CFG parallel a stage is held by both groups' meshes: its blocks are cut for all of them
  const members = degree * cfgGroups;
  const needed = stages * members;
  const what = cfgGroups === 2 ? ` in each of 2 CFG groups` : '';
  if (needed > workers.length)
    throw new Error(
      `${stages} pipeline stages of ${degree} worker${degree === 1 ? '' : 's'}${what} need ${needed} workers but ` +
        `${workers.length} ${workers.length === 1 ? 'is' : 'are'} live: ` +
        'ask for fewer stages, or open more worker pages',
    );
  const hosts = workers.slice(0, needed);
  // Stryker disable next-line ConditionalExpression: null > 0 is false, so the null test changes nothing
  const measured = hosts.every((w) => w.flops !== null && w.flops > 0);
  const groups = Array.from({ length: stages }, (_, s) => hosts.slice(s * members, (s + 1) * members));
  const plan = cutStages(
    { ...stagedModel(model, weightType), blockReserveBytes: keysValuesBytesPerBlock },
    groups.map((members) => ({
      workers: members.map((w) => w.id),
      memoryBytes: Math.min(...members.map(memoryBudget)),
      reserveBytes: 0,
      speed: measured ? degree * Math.min(...members.map((w) => w.flops ?? 1)) : 1,
    })),
  );
  if ('refused' in plan) throw new Error(`the job cannot be placed in ${stages} pipeline stages: ${plan.refused}`);
  return plan.stages;
}
