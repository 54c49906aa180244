import * as ort from 'onnxruntime-web';
import { describe, expect, it } from 'vitest';
import { buildChunkedAttentionGraph } from '../../core/model/attention-graph.ts';
import { attention } from '../../core/model/ops.ts';
import { SeededRandom } from '../../core/random.ts';
import { maxAbsDiff } from '../../core/tensor.ts';
import './fixtures.ts';

const random = new SeededRandom(11);

async function chunked(
  headDim: number,
  budget: number,
  q: Float32Array,
  k: Float32Array,
  v: Float32Array,
  S: number,
): Promise<Float32Array> {
  const session = await ort.InferenceSession.create(buildChunkedAttentionGraph(headDim, budget), {
    executionProviders: ['wasm'],
  });
  const t = (x: Float32Array) => new ort.Tensor('float32', x, [S, x.length / S]);
  const r = await session.run({ q: t(q), k: t(k), v: t(v) });
  expect(r.o.dims).toEqual([S, q.length / S]);
  return r.o.data as Float32Array;
}

describe('query-chunked attention graph equals the reference attention (max-abs ≤ 1e-4)', () => {
  // S = 77 tokens; budgets give 1 chunk, ragged chunks of 9 rows, and 1-row chunks
  for (const [heads, budget, chunkRows] of [
    [3, 1 << 22, 77],
    [3, 3 * 77 * 9, 9],
    [2, 1, 1],
  ] as const) {
    it(`${heads} heads × 24, chunks of ${chunkRows} query rows`, async () => {
      const S = 77;
      const width = heads * 24;
      const [q, k, v] = [random.normals(S * width), random.normals(S * width), random.normals(S * width)];
      const got = await chunked(24, budget, q, k, v, S);
      expect(maxAbsDiff(got, attention(q, k, v, 24, width))).toBeLessThan(1e-4);
    });
  }
});
