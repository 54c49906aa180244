import { describe, expect, it } from 'vitest';
import { cutStages, type PipelineStage, type StageGroup, type StagedModel } from '../../coordinator/stage-plan.ts';

const GB = 1e9;
/** Wan2.1-T2V-14B in bfloat16: 40 blocks of 351 M parameters, 233 M in the embedders and 82 k in the head. */
const WAN_14B_BF16: StagedModel = { numLayers: 40, blockBytes: 702.5e6, firstBytes: 466e6, lastBytes: 0.17e6 };

const group = (id: string, memoryGB: number, speed = 1, reserveGB = 1): StageGroup => ({
  workers: [id],
  memoryBytes: memoryGB * GB,
  reserveBytes: reserveGB * GB,
  speed,
});

const stagesOf = (plan: ReturnType<typeof cutStages>): PipelineStage[] => {
  if ('refused' in plan) throw new Error(plan.refused);
  return plan.stages;
};
const sizes = (stages: PipelineStage[]) => stages.map((s) => s.blocks[1] - s.blocks[0]);

describe('cutting the blocks into pipeline stages', () => {
  it("the 14B in bfloat16 on four 10 GB workers: contiguous stages of about a quarter each, none past its worker's memory", () => {
    const groups = ['a', 'b', 'c', 'd'].map((id) => group(id, 10));
    const stages = stagesOf(cutStages(WAN_14B_BF16, groups));
    expect(stages.map((s) => s.blocks)).toEqual([
      [0, 10],
      [10, 20],
      [20, 30],
      [30, 40],
    ]);
    expect(stages.map((s) => s.workers)).toEqual([['a'], ['b'], ['c'], ['d']]);
    const whole = 40 * WAN_14B_BF16.blockBytes + WAN_14B_BF16.firstBytes + WAN_14B_BF16.lastBytes;
    expect(stages.reduce((n, s) => n + s.heldBytes, 0)).toBeCloseTo(whole, -3);
    expect(Math.max(...stages.map((s) => s.heldBytes)) / whole).toBeLessThan(0.35);
    // the embedders ride with the first stage
    expect(stages[0].heldBytes).toBeCloseTo(10 * WAN_14B_BF16.blockBytes + WAN_14B_BF16.firstBytes, -3);
  });

  it('blocks go by speed where memory allows: a worker twice as fast holds twice the blocks', () => {
    const stages = stagesOf(cutStages(WAN_14B_BF16, [group('slow', 40, 1), group('fast', 40, 2)]));
    expect(sizes(stages)).toEqual([13, 27]);
  });

  it('every stage asked for holds a block, however slow its worker: two blocks over workers 10× apart make two stages', () => {
    const two: StagedModel = { numLayers: 2, blockBytes: 1e6, firstBytes: 1e6, lastBytes: 1e5 };
    const stages = stagesOf(cutStages(two, [group('fast', 1, 10, 0), group('slow', 1, 1, 0)]));
    expect(stages.map((s) => [s.workers[0], s.blocks])).toEqual([
      ['fast', [0, 1]],
      ['slow', [1, 2]],
    ]);
  });

  it("a worker's memory caps its share, however fast it is; the rest go to those with room", () => {
    // 5 GB less 1 GB of reserve and the embedders holds 5 blocks
    const stages = stagesOf(cutStages(WAN_14B_BF16, [group('small but fast', 5, 10), group('b', 20), group('c', 20)]));
    expect(sizes(stages)).toEqual([5, 18, 17]);
    stages.forEach((s, i) => expect(s.heldBytes).toBeLessThanOrEqual([5, 20, 20][i] * GB - GB));
  });

  it('a worker that can hold no block takes no stage, and the one after it holds the embedders', () => {
    const stages = stagesOf(cutStages(WAN_14B_BF16, [group('tiny', 1.5), group('b', 16), group('c', 16)]));
    expect(stages.map((s) => s.workers)).toEqual([['b'], ['c']]);
    expect(sizes(stages)).toEqual([20, 20]);
    expect(stages[0].heldBytes).toBeCloseTo(20 * WAN_14B_BF16.blockBytes + WAN_14B_BF16.firstBytes, -3);
  });

  it('a swarm that cannot hold the model is refused, saying how much more is needed and what worker would do', () => {
    const plan = cutStages(WAN_14B_BF16, [group('a', 8), group('b', 8)]);
    expect(plan).toEqual({ refused: expect.stringMatching(/^the model needs 28\.57 GB of weights/) as string });
    // 8 GB less 1 GB of reserve holds 9 blocks, beside the embedders too: 18 of 40
    const missing = ((40 - 18) * WAN_14B_BF16.blockBytes) / GB;
    expect((plan as { refused: string }).refused).toContain(`it needs ${missing.toFixed(2)} GB more`);
    expect((plan as { refused: string }).refused).toContain(`one more worker with ${(missing + 1).toFixed(2)} GB`);
    expect(cutStages(WAN_14B_BF16, [])).toEqual({ refused: 'no worker to hold the model' });
  });

  it('a group of several workers (Ulysses within the stage) holds its stage on each member', () => {
    const pair: StageGroup = { workers: ['a1', 'a2'], memoryBytes: 16 * GB, reserveBytes: GB, speed: 2 };
    const stages = stagesOf(cutStages(WAN_14B_BF16, [pair, group('b', 16, 2)]));
    expect(stages[0].workers).toEqual(['a1', 'a2']);
    expect(sizes(stages)).toEqual([20, 20]);
  });
});
