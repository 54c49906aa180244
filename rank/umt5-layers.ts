// umT5's encoder layers on onnxruntime-web: one session for every layer (umt5-graphs.ts), run with
// the layer's weights as inputs, so a worker holds only the layers it was given and a lone worker
// can stream them one at a time.
import * as ort from 'onnxruntime-web';
import { buildUmt5LayerGraph } from '../core/model/umt5-graphs.ts';
import type { Umt5Config, Umt5LayerFn } from '../core/model/umt5.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';

export interface Umt5LayerRunner {
  /** hidden [T, d_model] through one layer with these weights; buckets [T, T] from relativePositionBuckets */
  run: Umt5LayerFn;
  release(): Promise<void>;
}

export async function onnxUmt5Layers(cfg: Umt5Config, ep: ExecutionProvider): Promise<Umt5LayerRunner> {
  const graph = buildUmt5LayerGraph(cfg);
  const session = await ort.InferenceSession.create(graph.bytes, {
    executionProviders: [ep],
    graphOptimizationLevel: 'all',
  });
  const d = cfg.dModel;
  // a prompt's buckets go through every layer: converted to int64 once, not per layer
  let int64: { of: Int32Array; tensor: ort.Tensor } | null = null;
  return {
    async run(weights, hidden, buckets) {
      const tokens = hidden.length / d;
      if (int64?.of !== buckets)
        int64 = {
          of: buckets,
          tensor: new ort.Tensor(
            'int64',
            BigInt64Array.from(buckets, (b) => BigInt(b)),
            [tokens, tokens],
          ),
        };
      const feeds: Record<string, ort.Tensor> = {
        hidden: new ort.Tensor('float32', hidden, [tokens, d]),
        buckets: int64.tensor,
      };
      for (const { weight, dims } of graph.weights) feeds[weight] = new ort.Tensor('float32', weights[weight], dims);
      return (await session.run(feeds)).hidden_out.data as Float32Array;
    },
    release: () => session.release(),
  };
}
