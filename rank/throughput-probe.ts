// How fast this worker computes on an execution provider, the two numbers the cost model needs:
//   flops        one MatMul [n, n]·[n, n]: 2·n³ / time
//   softmaxRate  attention scores per second: Add(bias) + Softmax over [4, 64, 4096] scores, the
//                memory-bound work between QKᵀ and AV that FLOP counts miss (~20% of a step at
//                12k tokens)
// Each is a warm-up run then the median of `runs` timed runs; the whole probe takes ~50 ms on
// wasm. A worker runs it once at join.
import * as ort from 'onnxruntime-web';
import { OnnxGraph } from '../core/model/onnx-builder.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';

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
}

const SCORES: [number, number, number] = [4, 64, 4096]; // [h, c, S]: one chunk of attention scores

export async function probeThroughput(ep: ExecutionProvider, { size = 256, runs = 7 } = {}): Promise<ThroughputProbe> {
  // values in [−1, 1): no denormals or infinities to slow a run down
  const values = (n: number, seed: number) => Float32Array.from({ length: n }, (_, i) => ((i * 2654435761 + seed) >>> 0) / 2 ** 31 - 1);

  const matmul = new OnnxGraph('throughput_probe');
  matmul.output(matmul.op('MatMul', [matmul.input('a', [size, size]), matmul.input('b', [size, size])]), 'c', [size, size]);
  const matmulMs = await medianRunMs(ep, matmul.toBytes(), { a: new ort.Tensor('float32', values(size * size, 1), [size, size]), b: new ort.Tensor('float32', values(size * size, 2), [size, size]) }, runs);

  // scores [1, c, S] + bias [h, 1, S] → [h, c, S]: the scores are made in the graph, as QKᵀ makes
  // them, rather than copied in; only one row comes back, so no output copy is timed either
  const [h, c, S] = SCORES;
  const softmax = new OnnxGraph('softmax_probe');
  const scores = softmax.op('Softmax', [softmax.op('Add', [softmax.input('scores', [1, c, S]), softmax.input('bias', [h, 1, S])])], { axis: -1 });
  softmax.output(softmax.op('Slice', [scores, softmax.ints([0, 0]), softmax.ints([1, 1]), softmax.ints([0, 1])]), 'row', [1, 1, S]);
  const softmaxMs = await medianRunMs(ep, softmax.toBytes(), { scores: new ort.Tensor('float32', values(c * S, 3), [1, c, S]), bias: new ort.Tensor('float32', values(h * S, 4).map((v) => v * 0.1), [h, 1, S]) }, runs);
  const elements = h * c * S;

  return { ep, size, runs, medianMs: matmulMs, flops: (2 * size ** 3) / (matmulMs / 1000), softmaxRate: elements / (softmaxMs / 1000), softmaxMedianMs: softmaxMs };
}

async function medianRunMs(ep: ExecutionProvider, graph: Uint8Array, feeds: Record<string, ort.Tensor>, runs: number): Promise<number> {
  const session = await ort.InferenceSession.create(graph, { executionProviders: [ep], graphOptimizationLevel: 'all' });
  try {
    await session.run(feeds);
    const times: number[] = [];
    for (let i = 0; i < runs; i++) {
      const start = performance.now();
      await session.run(feeds); // outputs come back to the CPU, as a stage's outputs do
      times.push(performance.now() - start);
    }
    return times.sort((x, y) => x - y)[Math.floor(runs / 2)];
  } finally {
    await session.release();
  }
}
