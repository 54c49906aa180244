// One transformer block of Wan2.1-T2V-1.3B at full width, timed where the cost model can be held to
// it: in Node on onnxruntime-web (WASM, one thread), the full-size checkpoint's first block (read
// alone from its shard), at a real sequence length (one 480p latent frame: 30 × 52 = 1,560 tokens)
// against the published 512-row text. The same process measures the probe rates the planner
// plans with, so the report gives the cost model's prediction beside the measurement, and the
// measured block scaled by FLOPs to 480p × 81 frames (32,760 tokens) on this machine. The same block with its
// weights held as float16 and as int8 (weightType, widened in the graph) beside it: its bytes, its time and its
// output's deviation.
// Writes bench/out/block-cost.json, which the projection (bench/projection.ts) reads.
//
//   npm run bench -- block-cost [--model DIR] [--tokens 1560] [--runs 3]

import { parseArgs } from 'node:util';
import * as ort from 'onnxruntime-web';
import { forwardFlops, modelWeights, storedWeightBytes } from '../core/cost-model.ts';
import type { WeightType } from '../core/worker-api.ts';
import { openCheckpoint } from '../core/model/checkpoint.ts';
import { parseWanConfig } from '../core/model/config.ts';
import { readJson } from '../core/model/files.ts';
import type { WanModel } from '../core/model/reference.ts';
import { TRANSFORMER_CONFIG, TRANSFORMER_WEIGHTS_NAME } from '../core/model/transformer.ts';
import { SeededRandom } from '../core/random.ts';
import { readTensor } from '../core/safetensors.ts';
import { onnxStages, type OnnxStages } from '../rank/onnx-stages.ts';
import { maxAbsDiff } from '../core/tensor.ts';
import { probeThroughput } from '../rank/throughput-probe.ts';
import { folderFiles, FULL_SIZE_MODEL_DIR } from '../server/model-folder.ts';
import {
  ensureFullSizeModel,
  SMOKE_MODEL_DIR,
  isMain,
  log,
  machine,
  median,
  round,
  TEXT_TOKENS,
  versions,
  writeReport,
} from './lib.ts';

/** 480p × 81 frames: latent 21 × 60 × 104, patches 1 × 2 × 2 */
export const TOKENS_480P = 32_760;

export interface BlockCostOptions {
  model: string;
  tokens: number;
  runs: number;
}

/** `npm run bench -- --smoke`: the bundled model's block at 16 tokens */
export const SMOKE_BLOCK_COST: BlockCostOptions = { model: SMOKE_MODEL_DIR, tokens: 16, runs: 1 };

export async function runBlockCost(o: BlockCostOptions) {
  await ensureFullSizeModel(o.model);
  ort.env.wasm.numThreads = 1;
  const files = folderFiles(o.model);
  const config = parseWanConfig(await readJson(files, TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
  const checkpoint = await openCheckpoint(files, 'transformer', TRANSFORMER_WEIGHTS_NAME);
  // the first block and what is outside the blocks: a one-block model of the same width
  const wanted = [...checkpoint.tensors.values()].filter(
    (e) => !e.name.startsWith('blocks.') || e.name.startsWith('blocks.0.'),
  );
  const model: WanModel = {
    config: { ...config, numLayers: 1 },
    weights: new Map(await Promise.all(wanted.map(async (e) => [e.name, await readTensor(files, e)] as const))),
  };
  const stages = await onnxStages(model, 'wasm');

  const { dim: D, headDim } = config;
  const random = new SeededRandom(5);
  const T = o.tokens;
  const [x, o1, tproj, context] = [
    random.normals(T * D),
    random.normals(T * D, 0.1),
    random.normals(6 * D, 0.1),
    random.normals(TEXT_TOKENS * D),
  ];
  const [cos, sin] = [random.normals((T * headDim) / 2), random.normals((T * headDim) / 2)];
  const levels = new Int32Array(T); // one timestep for every token
  const timed = async <R>(work: () => Promise<R>): Promise<[number, R]> => {
    const started = performance.now();
    const result = await work();
    return [performance.now() - started, result];
  };
  const samples: { preMs: number; attentionMs: number; postMs: number }[] = [];
  for (let run = 0; run <= o.runs; run++) {
    const [preMs, qkv] = await timed(() => stages.preAttention(0, x, tproj, levels, cos, sin));
    const [attentionMs] = await timed(() => stages.attention(qkv, D)); // q, k, v are [T, heads · head_dim]
    const [postMs] = await timed(() => stages.postAttention(0, x, o1, tproj, levels, context));
    if (run > 0) samples.push({ preMs, attentionMs, postMs }); // the first run warms the sessions
    log(
      `block-cost: ${T} tokens: pre ${preMs.toFixed(0)} ms, attention ${attentionMs.toFixed(0)} ms, ` +
        `post ${postMs.toFixed(0)} ms`,
    );
  }
  const measuredMs = median(samples.map((s) => s.preMs + s.attentionMs + s.postMs));
  const input = { x, tproj, levels, cos, sin, context };
  const [halved, int8] = [
    await storedWeightsBlock(model, 'float16', measuredMs, o.runs, input),
    await storedWeightsBlock(model, 'int8', measuredMs, o.runs, input),
  ];

  const probe = await probeThroughput('wasm');
  const blockFlops = (tokens: number) => forwardFlops(config, tokens, TEXT_TOKENS, 1).block.total;
  const blockScores = (tokens: number) => config.numHeads * tokens * (tokens + TEXT_TOKENS);
  const predictedMs = (blockFlops(T) / probe.flops + blockScores(T) / probe.softmaxRate) * 1000 + 3 * probe.stageMs;
  // the measured block, scaled by its FLOPs (attention grows as tokens²), × blocks × the two guided passes
  const stepAt480pS = (((measuredMs / 1000) * blockFlops(TOKENS_480P)) / blockFlops(T)) * config.numLayers * 2;
  return {
    benchmark: 'block-cost',
    date: new Date().toISOString(),
    config: {
      model: o.model,
      tokens: T,
      textTokens: TEXT_TOKENS,
      runs: o.runs,
      ep: 'wasm',
      threads: 1,
      dim: D,
      ffnDim: config.ffnDim,
      numHeads: config.numHeads,
    },
    machine: machine(),
    versions: versions(),
    measured: {
      blockMs: round(measuredMs, 1),
      partsMs: {
        pre: round(median(samples.map((s) => s.preMs)), 1),
        attention: round(median(samples.map((s) => s.attentionMs)), 1),
        post: round(median(samples.map((s) => s.postMs)), 1),
      },
      blockGflop: round(blockFlops(T) / 1e9, 2),
      effectiveGflopS: round(blockFlops(T) / (measuredMs / 1000) / 1e9, 2),
    },
    probe: {
      gflopS: round(probe.flops / 1e9, 2),
      softmaxPerS: round(probe.softmaxRate, 0),
      stageMs: round(probe.stageMs, 2),
    },
    /** the block with its weights held as float16: their bytes, its time, its output's deviation from float32's */
    float16Weights: halved,
    /** the same with int8 weights (a scale per output channel) */
    int8Weights: int8,
    /** the cost model's block time from the probe rates, and measured / predicted */
    predicted: { blockMs: round(predictedMs, 1), measuredOverPredicted: round(measuredMs / predictedMs, 3) },
    /**
     * this machine, one WASM thread, one browser: a 480p × 81-frame step (two passes, 30 blocks)
     * from the measured block
     */
    stepAt480pS: round(stepAt480pS, 0),
  };
}

export type BlockCostReport = Awaited<ReturnType<typeof runBlockCost>>;

/**
 * The block on runners holding its weights as float32 and as `weightType`: the latter timed over `runs` (after a
 * warm-up) against `float32Ms`, and its output (the block's whole chain) against float32's, relative to its scale.
 */
async function storedWeightsBlock(
  model: WanModel,
  weightType: WeightType,
  float32Ms: number,
  runs: number,
  input: {
    x: Float32Array;
    tproj: Float32Array;
    levels: Int32Array;
    cos: Float32Array;
    sin: Float32Array;
    context: Float32Array;
  },
) {
  const D = model.config.dim;
  const block = async (stages: OnnxStages) => {
    const started = performance.now();
    const qkv = await stages.preAttention(0, input.x, input.tproj, input.levels, input.cos, input.sin);
    const o = await stages.attention(qkv, D);
    const out = (await stages.postAttention(0, input.x, o, input.tproj, input.levels, input.context)) as Float32Array;
    return { ms: performance.now() - started, out };
  };
  const [float32, stored] = [await onnxStages(model, 'wasm'), await onnxStages(model, 'wasm', { weightType })];
  const exact = (await block(float32)).out;
  const times: number[] = [];
  let out = exact;
  for (let run = 0; run <= runs; run++) {
    const r = await block(stored);
    if (run > 0) times.push(r.ms);
    out = r.out;
  }
  await Promise.all([float32.dispose(), stored.dispose()]);
  const blockBytes = (type: WeightType) => storedWeightBytes(modelWeights(model.config).block, type);
  const scale = exact.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
  const blockMs = median(times);
  const deviation = maxAbsDiff(out, exact) / scale;
  const off = `${deviation.toExponential(2)} of float32's scale`;
  log(`block-cost: ${weightType} weights ${blockMs.toFixed(0)} ms a block, ${off}`);
  return {
    blockBytes: blockBytes(weightType),
    float32BlockBytes: blockBytes('float32'),
    blockMs: round(blockMs, 1),
    overFloat32: round(blockMs / float32Ms, 3),
    /** max-abs of the block's output from float32's, over its largest value */
    deviation: Number(deviation.toExponential(3)),
  };
}

export function parseBlockCostArgs(args: string[]): BlockCostOptions {
  const { values } = parseArgs({
    args,
    options: {
      model: { type: 'string', default: FULL_SIZE_MODEL_DIR },
      tokens: { type: 'string', default: '1560' },
      runs: { type: 'string', default: '3' },
    },
  });
  const [tokens, runs] = [Number(values.tokens), Number(values.runs)];
  if (!Number.isInteger(tokens) || tokens < 1 || !Number.isInteger(runs) || runs < 1)
    throw new Error(`--tokens and --runs must be whole numbers ≥ 1, got ${values.tokens} and ${values.runs}`);
  return { model: values.model, tokens, runs };
}

if (isMain(import.meta)) {
  const report = await runBlockCost(parseBlockCostArgs(process.argv.slice(2)));
  writeReport('block-cost.json', report);
  console.log(
    JSON.stringify(
      { measured: report.measured, predicted: report.predicted, stepAt480pS: report.stepAt480pS },
      null,
      2,
    ),
  );
}
