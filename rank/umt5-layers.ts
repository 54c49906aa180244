// umT5's encoder layers on onnxruntime-web: one session for every layer (umt5-graphs.ts), run with
// the layer's weights as inputs, so a worker holds only the layers it was given and a lone worker
// can stream them one at a time.
import * as ort from 'onnxruntime-web';
import { buildUmt5LayerGraph } from '../core/model/umt5-graphs.ts';
import type { Umt5Config, Umt5LayerWeights } from '../core/model/umt5.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';

export interface Umt5LayerRunner {
  /** hidden [T, d_model] through one layer with these weights; buckets [T, T] from relativePositionBuckets */
  run(weights: Umt5LayerWeights, hidden: Float32Array, buckets: Int32Array): Promise<Float32Array>;
}

export async function onnxUmt5Layers(cfg: Umt5Config, ep: ExecutionProvider): Promise<Umt5LayerRunner> {
  const graph = buildUmt5LayerGraph(cfg);
  const session = await ort.InferenceSession.create(graph.bytes, { executionProviders: [ep], graphOptimizationLevel: 'all' });
  const d = cfg.dModel;
  return {
    async run(weights, hidden, buckets) {
      const tokens = hidden.length / d;
      const feeds: Record<string, ort.Tensor> = {
        hidden: new ort.Tensor('float32', hidden, [tokens, d]),
        buckets: new ort.Tensor('int64', BigInt64Array.from(buckets, (b) => BigInt(b)), [tokens, tokens]),
      };
      for (const { weight, dims } of graph.weights) feeds[weight] = new ort.Tensor('float32', weights[weight], dims);
      return (await session.run(feeds)).hidden_out.data as Float32Array;
    },
  };
}
