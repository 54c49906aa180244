// Exact staged mode (issue 35): a job that asks for `stages` has the planner cut the blocks over
// that many workers (stage-plan.ts), the layout give each stage a mesh of its own, each rank load
// only its stage's blocks, and the executor pass each forward through the stages in turn, the first
// from the patches and each next from the hidden state the one before handed on: the latent of one
// worker holding everything, to the bit. A stage that hands on a malformed hidden state is named.
import { handOffsOf } from '../../coordinator/forward/staged.ts';
import { wan21Latent } from '../../core/model/family.ts';
import { beforeAll, describe, expect, it } from 'vitest';
import { SpotCheckFailed, WorkerError } from '../../coordinator/executor.ts';
import type { WorkerMeasurement } from '../../coordinator/measure.ts';
import { Measurements } from '../../coordinator/measurements.ts';
import { loadArgsOf, type PlacementRequest, type ResolvedPlacement } from '../../coordinator/placement.ts';
import {
  planPlacement,
  rehearsalsNeeded,
  workersToWaitFor,
  type PlannerContext,
  type PlanningWorker,
} from '../../coordinator/planner.ts';
import { memoryBudget, placeStages, stagedModel, STAGE_MEMORY_SHARE } from '../../coordinator/stage-plan.ts';
import { DEFAULT_SPOT_CHECK_RATE } from '../../coordinator/spot-check.ts';
import { defined } from '../../core/defined.ts';
import { DEFAULT_JOB, jobParams } from '../../core/job.ts';
import type { BlockRange } from '../../core/model/blocks.ts';
import { wanConfigOfSize } from '../../core/model/config.ts';
import { RankLayout } from '../../core/parallel.ts';
import { SeededRandom } from '../../core/random.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import type { ExecuteResult, WeightType, WorkerInfo } from '../../core/worker-api.ts';
import type { EngineApi } from '../../rank/engine.ts';
import type { GpuDevice } from '../../rank/gpu-weights.ts';
import { heldWeightType } from '../../rank/onnx-stages.ts';
import { InProcessExecutor, type InProcessOptions, onTinyModel } from './in-process-executor.ts';
import { machineNamed } from './fixtures.ts';

/** a model of four blocks: two stages of two, or four of one */
const FOUR_BLOCKS = wanConfigOfSize({ headDim: 24, textDim: 32, ffnDim: 64, numLayers: 4 }, 'four blocks');
const ctx: PlannerContext = {
  config: FOUR_BLOCKS,
  latent: wan21Latent(FOUR_BLOCKS.inChannels),
  modelUrl: '/m',
  backend: 'swarm',
  textTokens: 16,
};
const guided = jobParams(DEFAULT_JOB);

function worker(id: string, gflops: number | null = null, memoryGiB: number | null = null): PlanningWorker {
  const measurement: WorkerMeasurement | null =
    gflops === null
      ? null
      : {
          threads: 1,
          compute: { wasm: { ep: 'wasm', flops: gflops * 1e9, softmaxRate: gflops * 1e8, stageMs: 1 / gflops } },
          auto: { ep: 'wasm', why: 'WASM only' },
          rttMs: 2,
          bandwidth: 1e9,
        };
  const info: WorkerInfo = {
    ep: 'wasm',
    adapter: 'stub',
    softwareAdapter: false,
    threads: 1,
    memoryGiB,
    userAgent: id,
    cores: 1,
    machine: machineNamed(id),
  };
  return { id, info, measurement };
}
const workers = (n: number) => Array.from({ length: n }, (_, i) => worker(`w${i}`));

const plan = (request: PlacementRequest, live: readonly PlanningWorker[], maxWorld?: number): ResolvedPlacement =>
  planPlacement(ctx, { params: guided, request, workers: live, measurements: new Measurements(), maxWorld });

describe('the stages of a placement', () => {
  it('a rank is a stage of a group, each stage a mesh of its own: its own session, peers and pairs', () => {
    const layout = new RankLayout(2, 1, null, 3);
    expect(layout.world).toBe(6);
    expect([0, 1, 2, 3, 4, 5].map((r) => [layout.stageOf(r), layout.localRank(r), layout.groupOf(r)])).toEqual([
      [0, 0, 0],
      [0, 1, 0],
      [1, 0, 0],
      [1, 1, 0],
      [2, 0, 0],
      [2, 1, 0],
    ]);
    const peers = ['a', 'b', 'c', 'd', 'e', 'f'];
    expect(layout.meshOf(3, peers, 's')).toEqual({ rank: 1, world: 2, peers: ['c', 'd'], session: 's.stage1' });
    expect(layout.meshPairs()).toEqual([
      [1, 0],
      [3, 2],
      [5, 4],
    ]);
    expect(layout.groupRanks(0)).toEqual([0, 1, 2, 3, 4, 5]);
    expect(layout.describe(4)).toBe('rank 4 of 6 (pipeline stage 3 of 3)');
    // one stage: the meshes and sessions as before
    expect(new RankLayout(2).meshOf(1, ['a', 'b'], 's').session).toBe('s');
    expect(new RankLayout(2, 1, null, 2).sameAs(new RankLayout(2))).toBe(false);
    expect(() => new RankLayout(1, 1, null, 0)).toThrow('pipeline stages are a whole number ≥ 1, got 0');
  });

  it('stages: 2 on three unmeasured workers cuts the blocks evenly over the first two, each loading its own', () => {
    const placement = plan({ stages: 2 }, workers(3));
    expect(placement.layout.stages).toBe(2);
    expect(placement.layout.world).toBe(2);
    expect(placement.workers.map((w) => w.id)).toEqual(['w0', 'w1']);
    const model = stagedModel(FOUR_BLOCKS);
    expect(placement.stages).toEqual([
      { blocks: [0, 2], workers: ['w0'], heldBytes: 2 * model.blockBytes + model.firstBytes },
      { blocks: [2, 4], workers: ['w1'], heldBytes: 2 * model.blockBytes + model.lastBytes },
    ]);
    const blocksOf = (rank: number) => loadArgsOf(placement, rank).blocks;
    expect([blocksOf(0), blocksOf(1)]).toEqual([
      { from: 0, to: 2 },
      { from: 2, to: 4 },
    ]);
    // no spot checks and no rehearsal: no worker holds the whole model
    expect(placement.spotChecks.rate).toBe(0);
    expect(
      rehearsalsNeeded(ctx, {
        params: guided,
        request: { stages: 2 },
        workers: workers(3),
        measurements: new Measurements(),
      }),
    ).toEqual([]);
    expect(workersToWaitFor(ctx, { stages: 2 }, guided)).toBe(2);
    // unstaged: no stages, and a worker loads every block
    const whole = plan({}, workers(2));
    expect([whole.stages, whole.layout.stages, loadArgsOf(whole, 1).blocks]).toEqual([null, 1, undefined]);
  });

  it('a staged step is predicted on measured workers, at the pace of the stage slowest for its blocks (issue 35)', () => {
    expect(plan({ stages: 2 }, workers(2)).prediction).toBeNull(); // unmeasured: nothing to predict from
    const even = defined(plan({ stages: 2 }, [worker('a', 10), worker('b', 10)]).prediction, 'a prediction');
    expect(even.by).toMatch(/^the cost model: 2 pipeline stages of 1 worker, a step's passes (pipelined|batched)/);
    // a guided step's two passes pipelined through two stages of half the blocks each: the second stage runs the
    // first pass while the first runs the second, so about three half forwards where one worker runs four
    const ratio = even.predictedStepMs / even.oneWorkerStepMs;
    console.log(`staged step ${even.predictedStepMs.toFixed(3)} ms, one worker ${even.oneWorkerStepMs.toFixed(3)} ms`);
    expect(ratio).toBeGreaterThan(0.6);
    expect(ratio).toBeLessThan(0.95);
    // half the speed, about twice the step
    const slower = defined(plan({ stages: 2 }, [worker('a', 5), worker('b', 5)]).prediction, 'a prediction');
    expect(slower.predictedStepMs / even.predictedStepMs).toBeGreaterThan(1.8);
    expect(slower.predictedStepMs / even.predictedStepMs).toBeLessThan(2.2);
    // stages cut by speed (three blocks on the fast worker, one on the slow) keep in step: the pace of either, not
    // of the slow worker holding half the blocks
    const uneven = defined(plan({ stages: 2 }, [worker('slow', 5), worker('fast', 15)]).prediction, 'a prediction');
    const halfOnSlow = defined(plan({ stages: 2 }, [worker('a', 5), worker('b', 5)]).prediction, 'a prediction');
    expect(uneven.predictedStepMs).toBeLessThan(0.75 * halfOnSlow.predictedStepMs);
  });

  it('measured workers hold blocks by speed, and memory caps what each holds', () => {
    // the fastest first (rankOrder), holding three times the blocks
    const fast = plan({ stages: 2 }, [worker('slow', 1), worker('fast', 3)]);
    expect(fast.stages?.map((s) => [s.blocks, s.workers])).toEqual([
      [[0, 3], ['fast']],
      [[3, 4], ['slow']],
    ]);
    // asked for even shares (workers known alike, or speeds measured on cores they share), by memory alone
    expect(
      plan({ stages: 2, shares: 'even' }, [worker('slow', 1), worker('fast', 3)]).stages?.map((s) => s.blocks),
    ).toEqual([
      [0, 2],
      [2, 4],
    ]);
    // a worker whose memory holds one block beside the embedders holds one, however fast
    const model = stagedModel(FOUR_BLOCKS);
    const oneBlockGiB = (model.firstBytes + 1.5 * model.blockBytes) / STAGE_MEMORY_SHARE / 2 ** 30;
    const capped = plan({ stages: 2 }, [worker('small', 10, oneBlockGiB), worker('big', 1, 1)]);
    expect(capped.stages?.map((s) => s.blocks)).toEqual([
      [0, 1],
      [1, 4],
    ]);
  });

  it("what a worker's user set on its page is its budget, below or above the share of what its browser reports", () => {
    const model = stagedModel(FOUR_BLOCKS);
    const oneBlockGiB = (model.firstBytes + 1.5 * model.blockBytes) / 2 ** 30;
    const declared = (id: string, gflops: number, memoryGiB: number | null, modelMemoryGiB: number) => {
      const w = worker(id, gflops, memoryGiB);
      return { ...w, info: { ...w.info, modelMemoryGiB } };
    };
    // lowered: the fast worker's browser reports 8 GiB, but its user lets the model take one block's worth
    const lowered = plan({ stages: 2 }, [declared('fast', 10, 8, oneBlockGiB), worker('slow', 1, 8)]);
    expect(lowered.stages?.map((s) => [s.blocks, s.workers])).toEqual([
      [[0, 1], ['fast']],
      [[1, 4], ['slow']],
    ]);
    // raised: a browser reports at most 8 GiB, a lab machine's user knows it has more
    const third = model.numLayers * model.blockBytes + model.firstBytes + model.lastBytes;
    const small = third / 2 ** 30 / 3 / STAGE_MEMORY_SHARE; // a third of the model at the default share
    expect(() => plan({ stages: 2 }, [worker('a', 1, small), worker('b', 1, small)])).toThrow('it needs');
    const raised = plan({ stages: 2 }, [declared('a', 1, small, 1), worker('b', 1, small)]);
    expect(raised.stages?.map((s) => s.blocks[1] - s.blocks[0])).toEqual([3, 1]);
    expect(memoryBudget({ memoryGiB: 8 })).toBe(8 * 2 ** 30 * STAGE_MEMORY_SHARE);
    expect(memoryBudget({ memoryGiB: null })).toBe(Infinity);
    expect(memoryBudget({ memoryGiB: 8, modelMemoryGiB: 0.5 })).toBe(2 ** 29);
  });

  it('weightType float16 counts every weight at half its bytes: workers too small for the model in float32 hold it so, each told to load it so', () => {
    const [f32, f16] = [stagedModel(FOUR_BLOCKS), stagedModel(FOUR_BLOCKS, 'float16')];
    // the embedders and the head too: at the 14B's width the embedders are 0.93 GB in float32
    expect([f16.blockBytes, f16.firstBytes, f16.lastBytes].map((b) => 2 * b)).toEqual([
      f32.blockBytes,
      f32.firstBytes,
      f32.lastBytes,
    ]);
    // each worker holds the embedders, the head and 2.2 blocks' worth of float16: 1.1 blocks of float32
    const budgetGiB = (f16.firstBytes + f16.lastBytes + 2.2 * f16.blockBytes) / STAGE_MEMORY_SHARE / 2 ** 30;
    const small = [worker('a', null, budgetGiB), worker('b', null, budgetGiB)];
    expect(() => plan({ stages: 2 }, small)).toThrow(/it needs .* more/);
    const halved = plan({ stages: 2, weightType: 'float16' }, small);
    expect(halved.weightType).toBe('float16');
    expect(halved.stages?.map((s) => [s.blocks, s.heldBytes])).toEqual([
      [[0, 2], f16.firstBytes + 2 * f16.blockBytes],
      [[2, 4], 2 * f16.blockBytes + f16.lastBytes],
    ]);
    expect([0, 1].map((rank) => loadArgsOf(halved, rank).weightType)).toEqual(['float16', 'float16']);
    // unasked, a rank holds them as its EP does, and the placement says nothing of it
    expect(plan({ stages: 2 }, workers(2)).weightType).toBeNull();
    expect(loadArgsOf(plan({ stages: 2 }, workers(2)), 0)).not.toHaveProperty('weightType');
    expect(() => plan({ weightType: 'bfloat16' as never }, workers(2))).toThrow(
      `weightType is how ranks hold the model's weights: float32, float16, int8 (unset: as each EP does), got "bfloat16"`,
    );
  });

  it('weightType int8 counts a byte per matrix weight, a float32 scale per matrix row and the rest in float32; a stage on a worker that would compute on WebGPU, which holds no int8, is refused before any weight moves', () => {
    const int8 = stagedModel(FOUR_BLOCKS, 'int8');
    const { dim: D, ffnDim } = FOUR_BLOCKS;
    // a block: q, k, v, out of both attentions and the FFN's two layers; their biases, the four q/k norms, the
    // cross-attention norm's weight and bias, the six-row table
    const matrices = 8 * D * D + 2 * D * ffnDim;
    const rows = 8 * D + ffnDim + D;
    expect(int8.blockBytes).toBe(matrices + 4 * rows + 4 * (rows + 4 * D + 2 * D + 6 * D));
    const small = (id: string) =>
      worker(id, 1, (int8.firstBytes + 2.2 * int8.blockBytes) / STAGE_MEMORY_SHARE / 2 ** 30);
    expect(() => plan({ stages: 2, weightType: 'float16' }, [small('a'), small('b')])).toThrow(/it needs .* more/);
    const quartered = plan({ stages: 2, weightType: 'int8' }, [small('a'), small('b')]);
    expect(quartered.stages?.map((s) => s.heldBytes)).toEqual([
      int8.firstBytes + 2 * int8.blockBytes,
      2 * int8.blockBytes + int8.lastBytes,
    ]);
    const gpu = small('gpu');
    const measured = defined(gpu.measurement, 'a measured worker');
    const onGpu = { ...gpu, measurement: { ...measured, auto: { ep: 'webgpu' as const, why: 'WebGPU: faster' } } };
    expect(() => plan({ stages: 2, weightType: 'int8' }, [small('a'), onGpu])).toThrow(
      "int8 weights are held on WASM alone, and gpu would compute on WebGPU, holding more than its stage was cut for: ask ep 'wasm', or weightType 'float16'",
    );
    expect(plan({ stages: 2, weightType: 'int8', ep: 'wasm' }, [small('a'), onGpu]).workers.map((w) => w.ep)).toEqual([
      'wasm',
      'wasm',
    ]);
  });

  it('a rank holds the blocks as asked where its device can halve them (WASM, WebGPU with shader-f16), int8 on WASM (WebGPU: as float16 asked); unasked, float16 on such a WebGPU alone', () => {
    const gpu = (f16: boolean) => ({ features: new Set(f16 ? ['shader-f16'] : []) }) as unknown as GpuDevice;
    const held = (asked: WeightType | undefined) =>
      [null, gpu(true), gpu(false)].map((device) => heldWeightType(asked, device));
    expect(held(undefined)).toEqual(['float32', 'float16', 'float32']);
    expect(held('float16')).toEqual(['float16', 'float16', 'float32']);
    expect(held('float32')).toEqual(['float32', 'float32', 'float32']);
    expect(held('int8')).toEqual(['int8', 'float16', 'float32']);
  });

  it('a staged job the workers cannot hold, or that asks what staged placement does not do, is refused saying why', () => {
    const tiny = 1e-4; // GiB: a tenth of a block
    expect(() => plan({ stages: 2 }, [worker('a', null, tiny), worker('b', null, tiny)])).toThrow(
      /^the job cannot be placed in 2 pipeline stages: the model needs .* it needs .* more, one more worker with/,
    );
    expect(() => plan({ stages: 3 }, workers(2))).toThrow(
      '3 pipeline stages of 1 worker need 3 workers but 2 are live: ask for fewer stages, or open more worker pages',
    );
    expect(() => plan({ stages: 2, ulyssesDegree: 2 }, workers(3))).toThrow(
      '2 pipeline stages of 2 workers need 4 workers but 3 are live',
    );
    expect(() => plan({ stages: 5 }, workers(6))).toThrow(
      '5 pipeline stages of a model of 4 blocks: each stage holds at least one block, so at most 4 stages',
    );
    expect(() => plan({ stages: 1.5 }, workers(2))).toThrow('stages is a whole number ≥ 1 of pipeline stages, got 1.5');
    expect(() => plan({ stages: 2, cfgParallel: true }, workers(3))).toThrow(
      '2 pipeline stages of 1 worker in each of 2 CFG groups need 4 workers but 3 are live',
    );
    // a stage is spot-checked by another worker holding its blocks: one worker a stage has none
    expect(() => plan({ stages: 2, spotCheckRate: 0.1 }, workers(4))).toThrow(
      'pipeline stages cannot be spot-checked here: a stage held by one worker has no other worker holding its ' +
        'blocks to recompute it: ask two workers a stage (ulyssesDegree 2, or cfgParallel); or ask spotCheckRate 0',
    );
    expect(() => plan({ stages: 2, ulyssesDegree: 2, parallel: 'displaced', spotCheckRate: 0.1 }, workers(4))).toThrow(
      'in displaced mode a stage attends to keys and values of the step before that only its own ranks hold',
    );
    expect(() =>
      planPlacement(
        { ...ctx, backend: 'local' },
        { params: guided, request: { stages: 2 }, workers: [], measurements: new Measurements() },
      ),
    ).toThrow('pipeline stages run on worker pages: use the swarm backend for stages');
  });

  it('PipeFusion is placed on stages of one worker each, unchecked, its patches at most the heads; asked otherwise, refused saying why', () => {
    const placed = plan({ stages: 2, pipeFusionPatches: 3 }, workers(2));
    expect([placed.pipeFusion, placed.spotChecks.rate, placed.layout.stages]).toEqual([{ patches: 3 }, 0, 2]);
    expect(plan({ stages: 2, pipeFusionPatches: 2, cfgParallel: true }, workers(4)).pipeFusion).toEqual({ patches: 2 });
    expect(plan({ stages: 2 }, workers(2)).pipeFusion).toBeNull();
    // re-placed on one worker, there are no stages left to pipeline: the job goes on exact
    expect(plan({ stages: 2, pipeFusionPatches: 3, untrustedAlone: 'continue' }, workers(1), 1).pipeFusion).toBeNull();
    expect(() => plan({ stages: 2, pipeFusionPatches: 3, spotCheckRate: 0.1 }, workers(4))).toThrow(
      "pipeline stages cannot be spot-checked here: PipeFusion's patches attend to keys and values of the step " +
        "before that only their stage's worker holds; or ask spotCheckRate 0",
    );
    expect(() => plan({ pipeFusionPatches: 3 }, workers(2))).toThrow(
      'pipeFusionPatches cuts each forward into patches that flow through pipeline stages: ask stages ≥ 2',
    );
    expect(() => plan({ stages: 2, pipeFusionPatches: 1 }, workers(2))).toThrow(
      "pipeFusionPatches is a whole number ≥ 2 of patches a forward flows through the stages in, or 'auto', got 1",
    );
    expect(() => plan({ stages: 2, pipeFusionPatches: 2, ulyssesDegree: 2, spotCheckRate: 0 }, workers(4))).toThrow(
      "PipeFusion's stages are one worker each (two with cfgParallel): ask ulyssesDegree 1, not 2",
    );
    expect(() => plan({ stages: 2, pipeFusionPatches: 2, parallel: 'displaced' }, workers(2))).toThrow(
      "PipeFusion's stages exchange nothing within them: ask parallel 'ulysses', not 'displaced'",
    );
    // PipeFusion's stages keep every token's keys and values of each pass, per block: 151 MB a block at 480p, 81 frames
    const long = { ...guided, frames: 81, height: 480, width: 832 };
    const small = [worker('a', null, 0.25), worker('b', null, 0.25)];
    const place = (request: PlacementRequest) =>
      planPlacement(ctx, { params: long, request, workers: small, measurements: new Measurements() });
    expect(place({ stages: 2 }).stages?.map((s) => s.blocks)).toEqual([
      [0, 2],
      [2, 4],
    ]);
    expect(() => place({ stages: 2, pipeFusionPatches: 3 })).toThrow(
      /^the job cannot be placed in 2 pipeline stages: the model needs 618\.\d+ MB of weights and PipeFusion's keys /,
    );
    expect(() => plan({ stages: 2, pipeFusionPatches: 13 }, workers(2))).toThrow(
      `pipeFusionPatches 13 is more than this job can be cut into: at most 12 (the model's 12 heads, the job's `,
    );
  });

  it("'auto' PipeFusion stays exact even where the cost model predicts it faster than exact stages (it was measured slower), and where nothing is measured or it cannot run", () => {
    const measured = [worker('a', 10), worker('b', 10)];
    const exact = defined(plan({ stages: 2 }, measured).prediction, 'a prediction');
    const fused = defined(plan({ stages: 2, pipeFusionPatches: 4 }, measured).prediction, 'a prediction');
    // two passes of half the blocks on each stage, the fill a quarter of one's: about 2.25 half forwards, not 3
    expect(fused.predictedStepMs / exact.predictedStepMs).toBeGreaterThan(0.65);
    expect(fused.predictedStepMs / exact.predictedStepMs).toBeLessThan(1 / 1.1);
    expect(fused.by).toMatch(/^the cost model: 2 pipeline stages of 1 worker, PipeFusion's 4 patches pipelined, /);
    const auto = plan({ stages: 2, pipeFusionPatches: 'auto' }, measured);
    expect(auto.pipeFusion).toBeNull();
    expect(auto.prediction?.predictedStepMs).toBe(exact.predictedStepMs);
    expect(auto.prediction?.by).toMatch(/; exact: 'auto' takes no PipeFusion, measured slower than exact stages /);
    // nothing measured to predict from: exact
    expect(plan({ stages: 2, pipeFusionPatches: 'auto' }, workers(2)).pipeFusion).toBeNull();
    // stages of two Ulysses workers cannot run it: exact, saying so
    const meshes = plan({ stages: 2, ulyssesDegree: 2, pipeFusionPatches: 'auto' }, [
      ...measured,
      worker('c', 10),
      worker('d', 10),
    ]);
    expect(meshes.pipeFusion).toBeNull();
    expect(meshes.prediction?.by).toMatch(/; exact: PipeFusion not possible here$/);
    expect(() => plan({ stages: 2, pipeFusionPatches: 'some' as never }, measured)).toThrow(
      `pipeFusionPatches is a whole number ≥ 2 of patches a forward flows through the stages in, or 'auto', got "some"`,
    );
  });

  it("spot checks go as asked where another worker holds each stage's blocks, and are off unasked where none does", () => {
    expect(plan({ stages: 2 }, workers(2)).spotChecks.rate).toBe(0);
    expect(plan({ stages: 2, ulyssesDegree: 2 }, workers(4)).spotChecks.rate).toBe(DEFAULT_SPOT_CHECK_RATE);
    expect(plan({ stages: 2, cfgParallel: true, spotCheckRate: 0.25 }, workers(4)).spotChecks.rate).toBe(0.25);
    // re-placed where its stages cannot be checked, a job that asked for checks goes on unchecked rather than failing
    expect(plan({ stages: 2, spotCheckRate: 0.25 }, workers(2), 2).spotChecks.rate).toBe(0);
  });

  it('a stage may be a Ulysses mesh of several workers, each holding the whole stage', () => {
    const placement = plan({ stages: 2, ulyssesDegree: 2 }, workers(5));
    expect(placement.layout).toMatchObject({ world: 4, ulyssesDegree: 2, stages: 2 });
    expect(placement.stages?.map((s) => [s.blocks, s.workers])).toEqual([
      [
        [0, 2],
        ['w0', 'w1'],
      ],
      [
        [2, 4],
        ['w2', 'w3'],
      ],
    ]);
    expect([0, 1, 2, 3].map((rank) => loadArgsOf(placement, rank).blocks?.from)).toEqual([0, 0, 2, 2]);
    expect(workersToWaitFor(ctx, { stages: 2, ulyssesDegree: 2 }, guided)).toBe(4);
  });

  it("a rank's hidden state of any size goes to the next stage directly: no message of the coordinator's limits it", () => {
    const live = workers(4).map((w) => ({ id: w.id, memoryGiB: null, flops: null }));
    const job = { tokens: 100_000, textTokens: 512 };
    // 115.8 MB of hidden state a rank, as one stage of one worker hands it on
    expect(placeStages(FOUR_BLOCKS, { stages: 2, degree: 1, ...job }, live)).toHaveLength(2);
    expect(placeStages(FOUR_BLOCKS, { stages: 2, degree: 2, ...job }, live)).toHaveLength(2);
  });

  it('re-placed after a lost rank, a staged job is cut into as many stages as workers are left', () => {
    const placement = plan({ stages: 3 }, workers(2), 3);
    expect(placement.stages?.map((s) => [s.blocks, s.workers])).toEqual([
      [[0, 2], ['w0']],
      [[2, 4], ['w1']],
    ]);
  });
});

/** An executor that keeps what it shows of each rank in the swarm view. */
class ShowingExecutor extends InProcessExecutor {
  readonly shown = new Map<number, string>();
  protected override showActivity(rank: number, doing: string): void {
    this.shown.set(rank, doing);
  }
}

describe('the executor through pipeline stages', () => {
  const random = new SeededRandom(11);
  let engine: EngineApi;
  let options: InProcessOptions;
  let text: Float32Array;
  const latent: Tensor = { shape: [16, 1, 6, 10], data: random.normals(16 * 6 * 10) }; // 15 tokens

  beforeAll(async () => {
    ({ engine, options } = await onTinyModel());
    text = random.normals(5 * options.config.textDim);
  });

  /** An executor on `layout` whose ranks record the blocks each was asked to load. */
  async function started(layout: RankLayout, request: PlacementRequest) {
    const loads: (BlockRange | undefined)[] = [];
    const recording: EngineApi = {
      ...engine,
      load: (url, ep, progress, held) => (loads.push(held?.blocks), engine.load(url, ep, progress, held)),
    };
    const executor = new ShowingExecutor({ ...options, ...request, layout }, recording, 'rpc');
    await executor.initialize();
    await executor.prepareJob(3, [text, text], latent.shape);
    return { executor, loads };
  }

  it('a guided step through two stages gives the latent of one rank holding everything, to the bit, its passes pipelined', async () => {
    const { executor, loads } = await started(new RankLayout(1, 1, null, 2), { stages: 2 });
    expect(executor.placement.stages?.map((s) => s.blocks)).toEqual([
      [0, 1],
      [1, 2],
    ]);
    expect(loads).toEqual([
      { from: 0, to: 1 },
      { from: 1, to: 2 },
    ]);
    const at = { job: 3, step: 0, timestep: 600, latent };
    const staged = await executor.velocity(at, 5);
    const { executor: single } = await started(new RankLayout(1), { spotCheckRate: 0 });
    const whole = await single.velocity(at, 5);
    expect(maxAbsDiff(staged.velocity, whole.velocity)).toBe(0);
    // the swarm view says which blocks each worker holds
    expect(executor.shown.get(1)).toBe('rank 1 of 2 (pipeline stage 2 of 2, 12 heads, 15 tokens): blocks 1–1: waiting');
    // every stage's rank reports its own share of the work
    expect(staged.ranks.map((r) => r.worker)).toEqual(['rank-0', 'rank-1']);
    expect(executor.received.map((calls) => calls.filter((m) => m === 'executeModel').length)).toEqual([2, 2]);
    // the two passes are pipelined: each stage runs one pass whole at a time, and the second stage takes the
    // first pass while the first stage computes the second (each forward taking 50 ms more, as a real one takes time)
    executor.fault = (_rank, method) => (method === 'executeModel' ? { delayMs: 50 } : null);
    executor.forwards.length = 0;
    await executor.velocity({ ...at, step: 1 }, 5);
    const when = (rank: number, pass: number, event: 'start' | 'end') =>
      executor.forwards.findIndex((f) => f.rank === rank && f.pass === pass && f.event === event);
    expect(when(0, 0, 'end')).toBeLessThan(when(0, 1, 'start'));
    expect(when(1, 0, 'end')).toBeLessThan(when(1, 1, 'start'));
    expect(when(0, 1, 'start')).toBeLessThan(when(1, 0, 'end'));
    expect(when(1, 0, 'start')).toBeLessThan(when(0, 1, 'end'));
    await Promise.all([executor.shutdown({ graceMs: 500 }), single.shutdown({ graceMs: 500 })]);
  });

  it('two stages of two Ulysses ranks each give the latent of two ranks holding everything, to the bit', async () => {
    const { executor, loads } = await started(new RankLayout(2, 1, null, 2), { stages: 2, spotCheckRate: 0 });
    expect(loads).toEqual([
      { from: 0, to: 1 },
      { from: 0, to: 1 },
      { from: 1, to: 2 },
      { from: 1, to: 2 },
    ]);
    const at = { job: 3, step: 0, timestep: 600, latent };
    const staged = await executor.velocity(at, 5);
    const { executor: unstaged } = await started(new RankLayout(2), { spotCheckRate: 0 });
    expect(maxAbsDiff(staged.velocity, (await unstaged.velocity(at, 5)).velocity)).toBe(0);
    // each stage's ranks exchanged within their stage, every block of theirs
    expect(staged.ranks.map((r) => r.rank)).toEqual([0, 1, 2, 3]);
    for (const rank of staged.ranks) expect(rank.bytesSent).toBeGreaterThan(0);
    await Promise.all([executor.shutdown({ graceMs: 500 }), unstaged.shutdown({ graceMs: 500 })]);
  });

  it('two stages of two Ulysses ranks of uneven shares (8 and 4 heads) hand each rank its own rows: the latent of two such ranks holding everything, to the bit', async () => {
    const { executor } = await started(new RankLayout(2, 1, [[8, 4]], 2), { stages: 2, spotCheckRate: 0 });
    const at = { job: 3, step: 0, timestep: 600, latent };
    const staged = await executor.velocity(at, 5);
    const { executor: unstaged } = await started(new RankLayout(2, 1, [[8, 4]]), { spotCheckRate: 0 });
    expect(maxAbsDiff(staged.velocity, (await unstaged.velocity(at, 5)).velocity)).toBe(0);
    // each second-stage rank was handed its own share's rows (10 and 5 of 15 tokens), both passes, over its link
    const dim = 288;
    const handed = staged.ranks.filter((r) => r.rank >= 2).map((r) => r.handOff?.bytes);
    expect(handed).toEqual([10, 5].map((rows) => 2 * 4 * (7 + 5 + rows) * dim)); // 5 rows of text
    expect(handOffsOf(executor.layout, staged.ranks)).toEqual([
      { boundary: 0, bytes: 2 * 4 * (7 + 5 + 15) * dim + 2 * 4 * (7 + 5) * dim, ms: expect.any(Number) as number },
    ]);
    await Promise.all([executor.shutdown({ graceMs: 500 }), unstaged.shutdown({ graceMs: 500 })]);
  });

  it("with CFG parallel each group's mesh runs the stages, at once with the other's: the velocity of two groups holding everything, to the bit", async () => {
    const placed = plan({ stages: 2, cfgParallel: true }, workers(5));
    expect(placed.layout).toMatchObject({ world: 4, ulyssesDegree: 1, cfgGroups: 2, stages: 2 });
    // a stage's workers are group 0's then group 1's; the ranks group after group, each's stages in turn
    expect(placed.stages?.map((s) => s.workers)).toEqual([
      ['w0', 'w1'],
      ['w2', 'w3'],
    ]);
    expect(placed.workers.map((w) => w.id)).toEqual(['w0', 'w2', 'w1', 'w3']);
    expect([0, 1, 2, 3].map((rank) => loadArgsOf(placed, rank).blocks?.from)).toEqual([0, 2, 0, 2]);

    const { executor, loads } = await started(new RankLayout(1, 2, null, 2), {
      stages: 2,
      cfgParallel: true,
      spotCheckRate: 0,
    });
    expect(loads.map((b) => b?.from)).toEqual([0, 1, 0, 1]);
    const at = { job: 3, step: 0, timestep: 600, latent };
    const staged = await executor.velocity(at, 5);
    const { executor: unstaged } = await started(new RankLayout(1, 2), { cfgParallel: true, spotCheckRate: 0 });
    expect(maxAbsDiff(staged.velocity, (await unstaged.velocity(at, 5)).velocity)).toBe(0);
    // group 1's first stage (rank 2) takes the unconditional pass while group 0's (rank 0) computes the conditional one
    executor.fault = (_rank, method) => (method === 'executeModel' ? { delayMs: 50 } : null);
    executor.forwards.length = 0;
    await executor.velocity({ ...at, step: 1 }, 5);
    const when = (rank: number, event: 'start' | 'end') =>
      executor.forwards.findIndex((f) => f.rank === rank && f.event === event);
    expect(when(2, 'start')).toBeLessThan(when(0, 'end'));
    expect(executor.forwards.filter((f) => f.event === 'start').map((f) => [f.rank, f.pass])).toEqual(
      expect.arrayContaining([
        [0, 0],
        [1, 0],
        [2, 1],
        [3, 1],
      ]),
    );
    await Promise.all([executor.shutdown({ graceMs: 500 }), unstaged.shutdown({ graceMs: 500 })]);
  });

  it('spot checks cover every stage, each recomputed from its input by a holder of its blocks: the rank whose outputs of its stage are wrong is the one convicted', async () => {
    // CFG parallel over stages of two Ulysses ranks: a stage's blocks are held by 4 ranks, its 2 and the other group's
    const layout = new RankLayout(2, 2, null, 2);
    const { executor } = await started(layout, { stages: 2, cfgParallel: true, spotCheckRate: 1 });
    expect(executor.placement.spotChecks.rate).toBe(1);
    expect([0, 1].map((stage) => layout.stageHolders(stage))).toEqual([
      [0, 1, 4, 5],
      [2, 3, 6, 7],
    ]);
    const at = { job: 3, step: 0, timestep: 600, latent };
    const checked = await executor.velocity(at, 5);
    const { executor: unstaged } = await started(new RankLayout(2, 2), { cfgParallel: true, spotCheckRate: 0 });
    expect(maxAbsDiff(checked.velocity, (await unstaged.velocity(at, 5)).velocity)).toBe(0);
    // each pass's each stage, checked by a rank holding that stage, agreeing within what float sums reorder
    const checks = executor.takeSpotChecks();
    expect(checks.map((c) => [c.pass, c.stage, c.verdict]).sort()).toEqual([
      [0, 0, 'agreed'],
      [0, 1, 'agreed'],
      [1, 0, 'agreed'],
      [1, 1, 'agreed'],
    ]);
    for (const c of checks) {
      expect(layout.stageHolders(defined(c.stage, 'the stage checked'))).toContain(c.checker);
      expect(c.difference).toBeLessThan(1e-5);
    }
    // lies within any bound: what rank 1 hands on (its tokens and the text it carries, or the text alone: the first
    // values of its hand-off), signed by it, and rank 6's rows of the last stage
    const halved = (values: Float32Array, upTo = values.length) => values.map((v, i) => (i < upTo ? v / 2 : v));
    const lies: [number, 'hands on' | 'rows', (part: Float32Array) => Float32Array, string][] = [
      [1, 'hands on', (part) => halved(part), 'its outputs of pipeline stage 1 differ'],
      [1, 'hands on', (part) => halved(part, 7 * 288 + 1), 'pipeline stage 1 differ'],
      [6, 'rows', halved, 'its rows of the pass differ from a recomputation'],
    ];
    for (const [liar, how, lie, why] of lies) {
      const alters = (r: ExecuteResult) => ({ ...r, rows: lie(r.rows) });
      executor.handsOn = (rank, part) => (rank === liar && how === 'hands on' ? lie(part) : part);
      executor.fault = (rank, method) =>
        rank === liar && how === 'rows' && method === 'executeModel' ? { alters } : null;
      const caught = await executor.velocity({ ...at, step: 1 }, 5).catch((e: unknown) => e);
      expect(caught).toBeInstanceOf(SpotCheckFailed);
      expect(caught).toMatchObject({ rank: liar, breach: true, blame: null });
      const [conviction] = executor.takeSpotChecks().filter((c) => c.verdict !== 'agreed');
      expect(conviction).toMatchObject({ stage: layout.stageOf(liar), verdict: { convicted: [liar] } });
      expect((conviction.verdict as { why: string }).why).toContain(why);
    }
    await Promise.all([executor.shutdown({ graceMs: 500 }), unstaged.shutdown({ graceMs: 500 })]);
  });

  it('PipeFusion: exact through the warm-up; then 3 patches flow through two stages at once, each attending to the later patches as of the step before', async () => {
    const request = { stages: 2, pipeFusionPatches: 3, warmupSteps: 1 };
    const { executor } = await started(new RankLayout(1, 1, null, 2), request);
    const { executor: single } = await started(new RankLayout(1), { spotCheckRate: 0 });
    const at = { job: 3, step: 0, timestep: 600, latent };
    const exact = async (a: typeof at) => (await single.velocity(a, 5)).velocity;
    // the warm-up step: the tokens whole, exact, filling each stage's keys and values
    expect(maxAbsDiff((await executor.velocity(at, 5)).velocity, await exact(at))).toBe(0);
    expect(executor.forwards.filter((f) => f.patch !== undefined && f.patch > 0)).toEqual([]);
    // the step after at the same latent: what each patch attends to as of the step before is what it would be now,
    // so a patch's keys and values written anywhere but its own tokens, or its positions wrong, would show here
    executor.fault = (_rank, method) => (method === 'executeModel' ? { delayMs: 30 } : null);
    executor.forwards.length = 0;
    const same = await executor.velocity({ ...at, step: 1 }, 5);
    const scale = Math.max(...(await exact(at)).map(Math.abs));
    expect(maxAbsDiff(same.velocity, await exact(at)) / scale).toBeLessThan(1e-5);
    // each stage took the 3 patches of each pass in turn, and the second stage computed patch 0 while the first
    // computed patch 1: both stages at once
    const when = (rank: number, patch: number, event: 'start' | 'end') =>
      executor.forwards.findIndex((f) => f.rank === rank && f.pass === 0 && f.patch === patch && f.event === event);
    expect(executor.forwards.filter((f) => f.event === 'start').length).toBe(2 * 2 * 3);
    for (const rank of [0, 1])
      for (const patch of [0, 1]) expect(when(rank, patch, 'end')).toBeLessThan(when(rank, patch + 1, 'start'));
    expect(when(0, 1, 'start')).toBeLessThan(when(1, 0, 'end'));
    expect(when(1, 0, 'start')).toBeLessThan(when(0, 1, 'end'));
    // the reports: each stage's rank, its patches' time summed
    expect(same.ranks.map((r) => r.rank).sort()).toEqual([0, 1]);
    // a step whose latent moved: the later patches' keys and values are the step before's, so the velocity differs
    // from exact, a little
    executor.fault = () => null;
    const moved = {
      ...at,
      step: 2,
      timestep: 500,
      latent: { ...latent, data: latent.data.map((x, i) => x + 0.1 * Math.sin(i)) },
    };
    const deviation = maxAbsDiff((await executor.velocity(moved, 5)).velocity, await exact(moved)) / scale;
    expect(deviation).toBeGreaterThan(1e-4);
    expect(deviation).toBeLessThan(0.1);
    await Promise.all([executor.shutdown({ graceMs: 500 }), single.shutdown({ graceMs: 500 })]);
  });

  it("PipeFusion with CFG parallel: each group's stages take its pass's patches, and keep their keys and values apart", async () => {
    const request = { stages: 2, cfgParallel: true, pipeFusionPatches: 2, warmupSteps: 1 };
    const { executor } = await started(new RankLayout(1, 2, null, 2), request);
    const { executor: unstaged } = await started(new RankLayout(1, 2), { cfgParallel: true, spotCheckRate: 0 });
    const at = { job: 3, step: 0, timestep: 600, latent };
    const exact = (await unstaged.velocity(at, 5)).velocity;
    expect(maxAbsDiff((await executor.velocity(at, 5)).velocity, exact)).toBe(0);
    executor.forwards.length = 0;
    const fused = (await executor.velocity({ ...at, step: 1 }, 5)).velocity;
    expect(maxAbsDiff(fused, exact) / Math.max(...exact.map(Math.abs))).toBeLessThan(1e-5);
    const calls = executor.forwards.filter((f) => f.event === 'start').map((f) => [f.rank, f.pass, f.patch]);
    expect(calls).toEqual(
      expect.arrayContaining([0, 1, 2, 3].flatMap((rank) => [0, 1].map((patch) => [rank, rank < 2 ? 0 : 1, patch]))),
    );
    expect(calls).toHaveLength(8);
    await Promise.all([executor.shutdown({ graceMs: 500 }), unstaged.shutdown({ graceMs: 500 })]);
  });

  it("a stage's rank asked for a patch without every token's keys and values of the step before refuses it, saying why", async () => {
    const { executor } = await started(new RankLayout(1, 1, null, 2), { stages: 2, pipeFusionPatches: 3 });
    const [first] = executor.runtimes;
    const args = { job: 3, step: 4, pass: 0, timestep: 600, latentShape: latent.shape };
    const patches = (rows: number) => new Float32Array(rows * 16 * 4);
    await expect(first.executeModel({ ...args, patches: patches(5), patch: { index: 1, count: 3 } })).rejects.toThrow(
      "PipeFusion's patch 2 of 3 (step 4, pass 0, block 0) attends to every token's keys and values of this step or " +
        'the one before, and this rank holds none: a forward of the whole sequence comes first',
    );
    // the whole sequence first; then a patch two steps later is refused, one a step later taken
    await first.executeModel({ ...args, patches: patches(15), patch: { index: 0, count: 1 } });
    await expect(
      first.executeModel({ ...args, step: 6, patches: patches(5), patch: { index: 1, count: 3 } }),
    ).rejects.toThrow("this rank holds step 4's");
    await first.executeModel({ ...args, step: 5, patches: patches(5), patch: { index: 1, count: 3 } });
    await expect(first.executeModel({ ...args, patches: patches(5), patch: { index: 3, count: 3 } })).rejects.toThrow(
      'patch 3 of 3: patches are numbered from 0',
    );
    await executor.shutdown({ graceMs: 500 });
  });

  it("a stage that hands on a malformed hidden state is named by the next stage's rank, which computes nothing from it; one that returns rows broke the contract", async () => {
    const { executor } = await started(new RankLayout(1, 1, null, 2), { stages: 2 });
    const at = { job: 3, step: 0, pass: 0, timestep: 600, latent };
    // its hand-off a value short, or with NaN in the text it carries (the first values after temb and tproj)
    const malformed: [(part: Float32Array) => Float32Array, string | RegExp][] = [
      [(part) => part.subarray(1), /tensor 0 of its hand-off has \d+ values/],
      [(part) => part.map((v, i) => (i === 7 * 288 ? NaN : v)), 'its context has NaN or infinite values'],
    ];
    for (const [lie, why] of malformed) {
      executor.handsOn = (rank, part) => (rank === 0 ? lie(part) : part);
      const error = await executor.executeModel(at).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(WorkerError);
      expect(error).toMatchObject({ rank: 1, blame: { rank: 0, cause: 'misbehaved' } });
      expect((error as WorkerError).remoteMessage).toMatch(why);
    }
    executor.handsOn = (_rank, part) => part;
    executor.fault = (rank, method) =>
      rank === 0 && method === 'executeModel' ? { alters: (r) => ({ ...r, rows: new Float32Array(4) }) } : null;
    const asked = executor.received[1].length;
    const error = await executor.executeModel(at).catch((e: unknown) => e);
    expect(error).toMatchObject({
      rank: 0,
      breach: true,
      remoteMessage: 'returned rows, but its stage hands a hidden state on',
    });
    expect(executor.received[1].length).toBe(asked);
    executor.fault = () => null;
    expect((await executor.executeModel(at)).output.shape).toEqual(latent.shape);
    await executor.shutdown({ graceMs: 500 });
  });
});
