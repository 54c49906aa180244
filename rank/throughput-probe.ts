// How fast this worker computes on an execution provider, the three numbers the cost model needs:
//   flops        one MatMul [n, n]·[n, n]: 2·n³ / time
//   softmaxRate  attention scores per second: Add(bias) + Softmax over [4, 64, 4096] scores, the
//                memory-bound work between QKᵀ and AV that FLOP counts miss (~20% of a step at
//                12k tokens)
//   stageMs      what one stage call costs whatever its size: the stage graphs of a one-block
//                model of Wan's structure run on one token (nearly no FLOPs), per call. At the
//                demo's 48 tokens this, not the FLOPs, is most of a step.
// Each is a warm-up run then the median of up to `runs` timed runs, fewer where a run is slow (at
// least one, and no more once they took core/median.ts's budget): well under a second on wasm, a few seconds on a
// software WebGPU adapter. A worker runs it at join, and again when its share of the cores changes.
import * as ort from 'onnxruntime-web';
import { expectedWeightShapes, wanConfigOfSize } from '../core/model/config.ts';
import { matmulProbe, probeValues } from '../core/model/matmul-probe.ts';
import { OnnxGraph } from '../core/model/onnx-builder.ts';
import { medianMs } from '../core/median.ts';
import { ropeTables, tokenGrid } from '../core/model/tokens.ts';
import type { TensorMap } from '../core/safetensors.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';
import { timestepLevels } from '../core/model/timesteps.ts';
import { onnxStages } from './onnx-stages.ts';
import type { DeviceTensor } from './stages.ts';

export interface ThroughputProbe {
  ep: ExecutionProvider;
  size: number;
  runs: number;
  medianMs: number;
  /** 2·n³ / median MatMul time */
  flops: number;
  /** score elements / median Add+Softmax time */
  softmaxRate: number;
  softmaxMedianMs: number;
  /** the median time of one stage call at one token */
  stageMs: number;
}

const SCORES: [number, number, number] = [4, 64, 4096]; // [h, c, S]: one chunk of attention scores
/** below this a WebGPU adapter is a software one: any GPU multiplies matrices faster */
const SOFTWARE_FLOPS = 1e9;

export async function probeThroughput(ep: ExecutionProvider, { size = 256, runs = 7 } = {}): Promise<ThroughputProbe> {
  const matmul = matmulProbe(size);
  const matmulMs = await medianRunMs(
    ep,
    matmul.graph,
    {
      a: new ort.Tensor('float32', matmul.a, [size, size]),
      b: new ort.Tensor('float32', matmul.b, [size, size]),
    },
    runs,
  );

  // scores [1, c, S] + bias [h, 1, S] → [h, c, S]: the scores are made in the graph, as QKᵀ makes
  // them, rather than copied in; only one row comes back, so no output copy is timed either
  const [h, c, S] = SCORES;
  const softmax = new OnnxGraph('softmax_probe');
  const scores = softmax.op(
    'Softmax',
    [softmax.op('Add', [softmax.input('scores', [1, c, S]), softmax.input('bias', [h, 1, S])])],
    { axis: -1 },
  );
  softmax.output(
    softmax.op('Slice', [scores, softmax.ints([0, 0]), softmax.ints([1, 1]), softmax.ints([0, 1])]),
    'row',
    [1, 1, S],
  );
  const softmaxMs = await medianRunMs(
    ep,
    softmax.toBytes(),
    {
      scores: new ort.Tensor('float32', probeValues(c * S, 3), [1, c, S]),
      bias: new ort.Tensor(
        'float32',
        probeValues(h * S, 4).map((v) => v * 0.1),
        [h, 1, S],
      ),
    },
    runs,
  );
  const elements = h * c * S;

  // A software adapter (SwiftShader, llvmpipe) compiles the five stage graphs' shaders for half a
  // minute; below SOFTWARE_FLOPS its stage call is charged one probe MatMul, which it costs about.
  const flops = matmul.operations / (matmulMs / 1000);
  const stageMs = ep === 'webgpu' && flops < SOFTWARE_FLOPS ? matmulMs : await stageCallMs(ep, runs);
  return {
    ep,
    size,
    runs,
    medianMs: matmulMs,
    flops,
    softmaxRate: elements / (softmaxMs / 1000),
    softmaxMedianMs: softmaxMs,
    stageMs,
  };
}

/**
 * The five stage calls of a one-block forward (embed, pre-attention, attention, post-attention,
 * head) on one token, per call.
 */
async function stageCallMs(ep: ExecutionProvider, runs: number): Promise<number> {
  const config = wanConfigOfSize({ headDim: 24, textDim: 16, ffnDim: 64, numLayers: 1 }, 'the stage-call probe');
  const weights: TensorMap = new Map();
  for (const [name, shape] of expectedWeightShapes(config)) {
    const size = shape.reduce((a, b) => a * b, 1);
    weights.set(name, {
      shape,
      data: Float32Array.from({ length: size }, (_, i) => (((i * 2654435761) >>> 0) / 2 ** 32 - 0.5) * 0.1),
    });
  }
  const stages = await onnxStages({ config, weights }, ep);
  const grid = tokenGrid(config, [config.inChannels, 1, 2, 2]); // one token
  const { cos, sin } = ropeTables(config, grid, 0, 1);
  const patches = new Float32Array(config.inChannels * 4);
  const text = new Float32Array(config.textDim);
  const timesteps = timestepLevels(500, 1);
  const forward = async () => {
    const { x, temb, tproj, context } = await stages.embed(patches, timesteps.values, text);
    const qkv = await stages.preAttention(0, x, tproj, timesteps.index, cos, sin);
    const o = await stages.attention(qkv, qkv.q.length);
    const next = await stages.postAttention(0, x, o, tproj, timesteps.index, context);
    await stages.head(next, temb, timesteps.index);
    await stages.release([x, temb, tproj, context, next].filter((a) => !(a instanceof Float32Array)) as DeviceTensor[]);
  };
  return (await medianMs(forward, runs)) / 5;
}

async function medianRunMs(
  ep: ExecutionProvider,
  graph: Uint8Array,
  feeds: Record<string, ort.Tensor>,
  runs: number,
): Promise<number> {
  const session = await ort.InferenceSession.create(graph, { executionProviders: [ep], graphOptimizationLevel: 'all' });
  try {
    return await medianMs(() => session.run(feeds), runs); // outputs come back to the CPU, as a stage's outputs do
  } finally {
    await session.release();
  }
}
