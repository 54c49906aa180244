import * as ort from 'onnxruntime-web';
import { OnnxGraph } from '../core/model/onnx-builder.ts';
import type { ExecutionProvider } from './onnx-stages.ts';

/**
 * How fast this worker multiplies matrices on an execution provider: one MatMul session of
 * [n, n]·[n, n], a warm-up run, then the median of `runs` timed runs. What the cost model's
 * per-worker FLOP/s comes from; a worker runs it once at join (a few tens of ms on wasm).
 */
export interface ThroughputProbe {
  ep: ExecutionProvider;
  size: number;
  runs: number;
  medianMs: number;
  /** 2·n³ / median time */
  flops: number;
}

export async function probeThroughput(ep: ExecutionProvider, { size = 256, runs = 7 } = {}): Promise<ThroughputProbe> {
  const g = new OnnxGraph('throughput_probe');
  g.output(g.op('MatMul', [g.input('a', [size, size]), g.input('b', [size, size])]), 'c', [size, size]);
  const session = await ort.InferenceSession.create(g.toBytes(), { executionProviders: [ep], graphOptimizationLevel: 'all' });
  try {
    // values in [−1, 1): no denormals or infinities to slow a run down
    const values = (seed: number) => Float32Array.from({ length: size * size }, (_, i) => (((i * 2654435761 + seed) >>> 0) / 2 ** 31) - 1);
    const feeds = { a: new ort.Tensor('float32', values(1), [size, size]), b: new ort.Tensor('float32', values(2), [size, size]) };
    await session.run(feeds);
    const times: number[] = [];
    for (let i = 0; i < runs; i++) {
      const start = performance.now();
      await session.run(feeds); // outputs come back to the CPU, as a stage's outputs do
      times.push(performance.now() - start);
    }
    times.sort((x, y) => x - y);
    const medianMs = times[Math.floor(runs / 2)];
    return { ep, size, runs, medianMs, flops: (2 * size ** 3) / (medianMs / 1000) };
  } finally {
    await session.release();
  }
}
