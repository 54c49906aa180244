import { beforeAll, describe, expect, it } from 'vitest';
import { referenceForward, type WanModel } from '../../core/model/reference.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { exchangeFloatsPerBlock, planUlysses } from '../../core/parallel.ts';
import { SeededRandom } from '../../core/random.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import { memoryExchanges } from '../../worker/memory-exchange.ts';
import { onnxStages } from '../../worker/onnx-stages.ts';
import type { StageRunner } from '../../worker/stages.ts';
import { forwardInProcess } from '../../worker/ulysses.ts';
import { tinyModelFiles } from './fixtures.ts';

/** Ulysses over the in-memory transport: P ranks give the single-rank result. */
let m: WanModel;
let onnx: StageRunner;
let text: Float32Array;
const random = new SeededRandom(11);
const latents: Record<string, Tensor> = {
  'divisible (72 tokens)': { shape: [16, 3, 8, 12], data: random.normals(16 * 3 * 8 * 12) },
  'padded (35 tokens)': { shape: [16, 1, 14, 10], data: random.normals(16 * 14 * 10) },
};

beforeAll(async () => {
  m = await loadTransformer(tinyModelFiles);
  onnx = await onnxStages(m, 'wasm');
  text = random.normals(32 * m.config.textDim);
});

describe('Ulysses sequence parallelism, in memory', () => {
  for (const [name, latent] of Object.entries(latents)) {
    it(`P = 1, 2, 3, 4, 6 equal the reference forward within 1e-4: ${name}`, async () => {
      const reference = referenceForward(m, latent, 500, text);
      const single = await forwardInProcess(m.config, onnx, memoryExchanges(1), latent, 500, text);
      expect(maxAbsDiff(single.data, reference.data)).toBeLessThan(1e-4);
      for (const P of [2, 3, 4, 6]) {
        const out = await forwardInProcess(m.config, onnx, memoryExchanges(P), latent, 500, text);
        const diff = maxAbsDiff(out.data, single.data);
        console.log(`${name}: P=${P} max-abs vs P=1 ${diff.toExponential(2)}`);
        expect(diff, `P=${P}`).toBeLessThan(1e-4);
      }
    });
  }

  it('each rank sends 4·ceil(S/P)·D·(P−1)/P floats per block', async () => {
    const latent = latents['padded (35 tokens)'];
    for (const P of [2, 3, 4]) {
      const exchanges = memoryExchanges(P);
      await forwardInProcess(m.config, onnx, exchanges, latent, 500, text);
      const plan = planUlysses(m.config, tokenGrid(m.config, latent.shape).count, P);
      const expected = 4 * exchangeFloatsPerBlock(plan, m.config.dim) * m.config.numLayers;
      expect(expected).toBe(4 * Math.ceil(35 / P) * m.config.dim * ((P - 1) / P) * 4 * m.config.numLayers);
      for (const e of exchanges) expect(e.bytesSent, `P=${P} rank ${e.rank}`).toBe(expected);
    }
  });

  it('padding without the key mask would change the result (the mask is what keeps parity)', async () => {
    const latent = latents['padded (35 tokens)'];
    const unmasked: StageRunner = { ...onnx, attention: (qkv, bias) => onnx.attention(qkv, bias.map(() => 0)) };
    const single = await forwardInProcess(m.config, onnx, memoryExchanges(1), latent, 500, text);
    const out = await forwardInProcess(m.config, unmasked, memoryExchanges(4), latent, 500, text);
    expect(maxAbsDiff(out.data, single.data)).toBeGreaterThan(1e-3);
  });
});
