import { describe, expect, it } from 'vitest';
import {
  cutStages,
  placeStages,
  stagedModel,
  wholeModelBytes,
  type PipelineStage,
  type StageGroup,
  type StagedModel,
  type StageWorker,
} from '../../coordinator/stage-plan.ts';
import { expectedWeightShapes, wanConfigOfSize } from '../../core/model/config.ts';
import { sizeOf } from '../../core/tensor.ts';
import { MAX_MESSAGE_FLOATS } from '../../core/worker-api.ts';

const GB = 1e9;
/** Wan2.1-T2V-14B in bfloat16: 40 blocks of 351 M parameters, 233 M in the embedders and 82 k in the head. */
const WAN_14B_BF16: StagedModel = {
  numLayers: 40,
  blockBytes: 702.5e6,
  firstBytes: 466e6,
  lastBytes: 0.17e6,
  blockReserveBytes: 0,
};

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
    const two: StagedModel = { numLayers: 2, blockBytes: 1e6, firstBytes: 1e6, lastBytes: 1e5, blockReserveBytes: 0 };
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

  it("the output head counts against the last stage's memory, and no other's", () => {
    // a head of two blocks' bytes: the last worker, however fast, holds two blocks beside it, the first the rest
    const headed: StagedModel = {
      numLayers: 5,
      blockBytes: GB,
      firstBytes: 0,
      lastBytes: 2 * GB,
      blockReserveBytes: 0,
    };
    const stages = stagesOf(cutStages(headed, [group('first', 4, 1, 0), group('last', 4, 10, 0)]));
    expect(stages.map((s) => s.blocks)).toEqual([
      [0, 3],
      [3, 5],
    ]);
    expect(stages.map((s) => s.heldBytes)).toEqual([3 * GB, 4 * GB]);
  });

  it("what a rank keeps per block it holds (PipeFusion's keys and values) counts against its memory beside the weights, not in what it holds; refused, the missing bytes count it too", () => {
    const kept: StagedModel = { numLayers: 4, blockBytes: GB, firstBytes: 0, lastBytes: 0, blockReserveBytes: GB };
    // 6 GB each: three blocks of weights alone, but each block needs 2 GB with its keys and values
    const stages = stagesOf(cutStages(kept, [group('a', 6, 1, 0), group('b', 6, 1, 0)]));
    expect(sizes(stages)).toEqual([2, 2]);
    expect(stages.map((s) => s.heldBytes)).toEqual([2 * GB, 2 * GB]);
    expect(cutStages({ ...kept, blockReserveBytes: 0 }, [group('a', 3, 1, 0), group('b', 3, 1, 0)])).not.toHaveProperty(
      'refused',
    );
    expect(cutStages(kept, [group('a', 3, 1, 0), group('b', 3, 1, 0)])).toEqual({
      refused:
        "the model needs 8.00 GB of weights and PipeFusion's keys and values and these 2 stage group(s) can hold " +
        '4.00 GB: it needs 4.00 GB more, one more worker with 4.00 GB for the model',
    });
  });

  it('a swarm that holds the model exactly is placed, every worker full', () => {
    const exact: StagedModel = { numLayers: 4, blockBytes: GB, firstBytes: GB, lastBytes: GB, blockReserveBytes: 0 };
    const stages = stagesOf(cutStages(exact, [group('a', 3, 1, 0), group('b', 3, 1, 0)]));
    expect(sizes(stages)).toEqual([2, 2]);
    expect(stages.map((s) => s.heldBytes)).toEqual([3 * GB, 3 * GB]);
  });

  it('more groups than blocks: the fastest hold a block each, the rest take no part, and no block is past the model', () => {
    const two: StagedModel = { numLayers: 2, blockBytes: GB, firstBytes: 0, lastBytes: 0, blockReserveBytes: 0 };
    const stages = stagesOf(
      cutStages(two, [group('a', 10, 2, 0), group('slowest', 10, 1, 0), group('fastest', 10, 3, 0)]),
    );
    expect(stages.map((s) => [s.workers[0], s.blocks])).toEqual([
      ['a', [0, 1]],
      ['fastest', [1, 2]],
    ]);
  });

  it("a refusal counts the whole model, what the groups' free memory can hold of it, and the reserve a new worker needs", () => {
    const model: StagedModel = {
      numLayers: 4,
      blockBytes: GB,
      firstBytes: 0.5 * GB,
      lastBytes: 0.25 * GB,
      blockReserveBytes: 0,
    };
    // the first holds one block beside the embedders; the second's memory is less than its reserve: it holds nothing
    const plan = cutStages(model, [group('a', 2, 1, 0.5), group('b', 0.5, 1, 1)]);
    expect(plan).toEqual({
      refused:
        'the model needs 4.75 GB of weights and these 2 stage group(s) can hold 1.50 GB: it needs 3.00 GB more, ' +
        'one more worker with 4.00 GB for the model',
    });
    // memory in pieces smaller than a block holds no block: what can be held is the model less the blocks missing
    const fragmented = cutStages(model, [group('a', 2.4, 1, 0), group('b', 2.2, 1, 0)]);
    expect(fragmented).toEqual({
      refused:
        'the model needs 4.75 GB of weights and these 2 stage group(s) can hold 2.75 GB: it needs 2.00 GB more, ' +
        'one more worker with 2.00 GB for the model',
    });
  });
});

describe("a model's bytes as stages hold them", () => {
  const cfg = wanConfigOfSize({ headDim: 32, textDim: 32, ffnDim: 64, numLayers: 4 }, 'four blocks');

  it("are the checkpoint's tensors in float32: a block's, the embedders' with the first stage, the head's with the last", () => {
    const bytes = { block: 0, first: 0, last: 0 };
    for (const [name, shape] of expectedWeightShapes(cfg)) {
      const n = 4 * sizeOf(shape);
      if (name.startsWith('blocks.0.')) bytes.block += n;
      else if (name.startsWith('patch_embedding.') || name.startsWith('condition_embedder.')) bytes.first += n;
      else if (!name.startsWith('blocks.')) bytes.last += n; // proj_out and the head's scale_shift_table
    }
    const model = stagedModel(cfg);
    expect(model).toEqual({
      numLayers: 4,
      blockBytes: bytes.block,
      firstBytes: bytes.first,
      lastBytes: bytes.last,
      blockReserveBytes: 0,
    });
    const whole = [...expectedWeightShapes(cfg).values()].reduce((n, shape) => n + 4 * sizeOf(shape), 0);
    expect(wholeModelBytes(model)).toBe(whole);
    expect(wholeModelBytes({ ...model, numLayers: 1 })).toBe(bytes.block + bytes.first + bytes.last);
  });
});

describe('placing pipeline stages on workers', () => {
  const cfg = wanConfigOfSize({ headDim: 32, textDim: 32, ffnDim: 64, numLayers: 4 }, 'four blocks');
  const job = { degree: 1, tokens: 64, textTokens: 16 };
  const live = (...flops: (number | null)[]): StageWorker[] =>
    flops.map((f, i) => ({ id: `w${i}`, memoryGiB: null, flops: f }));
  const cut = (stages: PipelineStage[]) => stages.map((s) => [s.workers, s.blocks]);

  it('stages are a whole number from 1 to the blocks; one stage holds every block', () => {
    for (const stages of [0, 1.5, -1])
      expect(() => placeStages(cfg, { ...job, stages }, live(null, null))).toThrow(
        `stages is a whole number ≥ 1 of pipeline stages, got ${stages}`,
      );
    expect(cut(placeStages(cfg, { ...job, stages: 1 }, live(null, null)))).toEqual([[['w0'], [0, 4]]]);
  });

  it("a rank's hidden state of any size is handed on, rank to rank: ten times one message's floats of it", () => {
    // the 14B's width: x [Sl, D], the time embedding and its projection [7, D] and the context [textTokens, D]
    const wide = { ...cfg, numHeads: 40, headDim: 128, dim: 5120 };
    const tokens = 10 * (MAX_MESSAGE_FLOATS / wide.dim) - 7 - job.textTokens;
    expect((tokens + 7 + job.textTokens) * wide.dim).toBe(10 * MAX_MESSAGE_FLOATS);
    expect(placeStages(wide, { ...job, tokens, stages: 2 }, live(null, null))).toHaveLength(2);
  });

  it('an uneven split is sized by its busiest rank: 13 ranks of the 14B width are refused patches ⌈S/13⌉ rows would fit', () => {
    const wan14b = { ...cfg, numHeads: 40, headDim: 128, dim: 5120, numLayers: 40 };
    const textTokens = 512;
    // rank 0 of 13 has 4 of 40 heads: a tenth of the tokens, where ⌈S/13⌉ is less than a twelfth. At 3M tokens its
    // patches (64 floats a token) are 76.8 MB, over one message; the old rule's rows would have fit
    const tokens = 3_000_000;
    expect(Math.ceil(tokens / 13) * 64).toBeLessThanOrEqual(MAX_MESSAGE_FLOATS);
    const staged = (degree: number) => () =>
      placeStages(wan14b, { stages: 2, degree, tokens, textTokens }, live(...Array<null>(2 * degree).fill(null)));
    expect(staged(13)).toThrow("a rank's patches would be 76.8 MB, more than the 62.9 MB one message carries");
    // 10 ranks of 4 heads each: a tenth too, refused alike; 20 of 2 heads: a twentieth, placed
    expect(staged(10)).toThrow("a rank's patches would be 76.8 MB");
    expect(staged(20)()).toHaveLength(2);
    // at 480p × 81 frames (32,760 tokens) every split is placed: the hidden state goes rank to rank, not in a message
    expect(
      placeStages(wan14b, { stages: 2, degree: 13, tokens: 32_760, textTokens }, live(...Array<null>(26).fill(null))),
    ).toHaveLength(2);
  });

  it('too few workers says how many are live, one worker as one', () => {
    expect(() => placeStages(cfg, { ...job, stages: 2 }, live(null))).toThrow(
      '2 pipeline stages of 1 worker need 2 workers but 1 is live: ask for fewer stages, or open more worker pages',
    );
  });

  it('blocks go by speed only where every worker placed was measured; workers left out do not count', () => {
    // the first two measured, a third left out unmeasured: by speed
    expect(cut(placeStages(cfg, { ...job, stages: 2 }, live(3e9, 1e9, null)))).toEqual([
      [['w0'], [0, 3]],
      [['w1'], [3, 4]],
    ]);
    // one of them unmeasured, or measured at nothing: evenly
    for (const flops of [null, 0])
      expect(cut(placeStages(cfg, { ...job, stages: 2 }, live(3e9, flops)))).toEqual([
        [['w0'], [0, 2]],
        [['w1'], [2, 4]],
      ]);
  });

  it("a stage of several workers holds what its smallest member can, at its slowest member's pace", () => {
    const model = stagedModel(cfg);
    const GiB = 2 ** 30;
    // each worker's budget holds one block beside the embedders and the head, or everything
    const small = (model.firstBytes + model.lastBytes + 1.5 * model.blockBytes) / GiB;
    const workers: StageWorker[] = [
      { id: 'a1', memoryGiB: null, modelMemoryGiB: small, flops: 1e9 },
      { id: 'a2', memoryGiB: null, flops: 1e9 },
      { id: 'b1', memoryGiB: null, flops: 1e9 },
      { id: 'b2', memoryGiB: null, flops: 1e9 },
    ];
    expect(cut(placeStages(cfg, { ...job, degree: 2, stages: 2 }, workers))).toEqual([
      [
        ['a1', 'a2'],
        [0, 1],
      ],
      [
        ['b1', 'b2'],
        [1, 4],
      ],
    ]);
    // a fast member in a slow stage speeds it up none: 3 blocks on the stage whose slowest member is 3× the other's
    const paced = [3e9, 9e9, 1e9, 9e9].map((flops, i) => ({ ...workers[i], modelMemoryGiB: undefined, flops }));
    expect(cut(placeStages(cfg, { ...job, degree: 2, stages: 2 }, paced))).toEqual([
      [
        ['a1', 'a2'],
        [0, 3],
      ],
      [
        ['b1', 'b2'],
        [3, 4],
      ],
    ]);
  });
});
