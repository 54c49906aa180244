import { beforeAll, describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { parseWanConfig } from '../../core/model/config.ts';
import { referenceForward } from '../../core/model/reference.ts';
import { byteTextEncoder } from '../../core/model/text-encoder.ts';
import { latentToRows, patchify, tokenGrid } from '../../core/model/tokens.ts';
import { SeededRandom } from '../../core/random.ts';
import { jsGemm, onnxGemm, type Gemm } from '../../demo/gemm.ts';
import { Tape } from '../../demo/tape.ts';
import { trainDemo } from '../../demo/train.ts';
import {
  forwardBatch,
  initialWan,
  parametersOf,
  toTensorMaps,
  type Batch,
  type TrainableWan,
} from '../../demo/trainable-wan.ts';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { readWeights } from '../../core/model/files.ts';
import { loadTextEncoder } from '../../core/model/text-encoder.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { latentShape, wan21Latent } from '../../core/model/family.ts';
import { CLIP, HELD_OUT_COMBOS } from '../../demo/world.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { sampleLatent, spacedPrompt } from '../../demo/train.ts';
import { fromWeights } from '../../demo/trainable-wan.ts';
import './fixtures.ts';

const DEMO_MODEL_DIR = join(import.meta.dirname, '../../public/models/tiny-wan-demo');

// A small Wan (2 heads × 24, 2 blocks) so finite differences stay cheap; the math is the same at 12 heads.
const config = parseWanConfig(
  {
    num_attention_heads: 2,
    attention_head_dim: 24,
    in_channels: 16,
    text_dim: 8,
    freq_dim: 16,
    ffn_dim: 32,
    num_layers: 2,
  },
  'test',
);
const TEXT_LENGTH = 6;
const shape = [16, 2, 4, 4];
const grid = tokenGrid(config, shape);

function randomised(seed: number): TrainableWan {
  const model = initialWan(config, TEXT_LENGTH, seed);
  const random = new SeededRandom(seed + 1);
  // fresh weights zero the output and the timestep modulation; give them values so every path counts
  for (const [name, v] of model.weights) {
    if (name.startsWith('proj_out') || name.includes('time_proj')) v.data.set(random.normals(v.data.length, 0.1));
    if (name.endsWith('.bias')) v.data.set(random.normals(v.data.length, 0.05));
  }
  return model;
}

const random = new SeededRandom(9);
const latents = [0, 1].map(() => ({ shape, data: random.normals(16 * 32) }));
const batch: Batch = {
  patches: Float32Array.from([...latents.flatMap((l) => [...patchify(config, l).data])]),
  timesteps: [700, 120],
  prompts: ['a red', ''],
  grid,
};

describe('the training forward', () => {
  let onnx: Gemm;
  beforeAll(async () => {
    onnx = await onnxGemm(1, { heads: config.numHeads, headDim: config.headDim });
  });

  for (const backend of ['js', 'onnx'] as const) {
    it(`equals core/model/reference.ts per sample of a batch, max-abs ≤ 1e-5 (${backend} matrix products)`, async () => {
      const model = randomised(1);
      const rows = await forwardBatch(new Tape(backend === 'js' ? jsGemm : onnx), model, batch);
      const { transformer, textEncoder } = toTensorMaps(model);
      const encoder = byteTextEncoder(TEXT_LENGTH, config.textDim, textEncoder);
      let worst = 0;
      latents.forEach((latent, g) => {
        const reference = latentToRows(
          config,
          referenceForward(
            { config, weights: transformer },
            latent,
            batch.timesteps[g],
            encoder.encode(batch.prompts[g]),
          ),
        );
        reference.forEach((v, k) => (worst = Math.max(worst, Math.abs(v - rows.data[g * reference.length + k]))));
      });
      expect(worst).toBeLessThanOrEqual(1e-5);
    });
  }

  it('has gradients that match central finite differences for every weight tensor (transformer and text encoder)', async () => {
    const model = randomised(2);
    const target = new SeededRandom(4).normals(batch.patches.length);
    const lossOf = async () => {
      const tape = new Tape(jsGemm);
      return { tape, loss: tape.meanSquaredError(await forwardBatch(tape, model, batch), target) };
    };
    const { tape, loss } = await lossOf();
    await tape.backward(loss);
    const mismatches: string[] = [];
    for (const [name, v] of parametersOf(model)) {
      const analytic = defined(v.grad, `${name}'s gradient after backward`).slice();
      for (const i of [0, v.data.length >> 1, v.data.length - 1]) {
        const old = v.data[i];
        v.data[i] = old + 1e-2;
        const up = (await lossOf()).loss.data[0];
        v.data[i] = old - 1e-2;
        const down = (await lossOf()).loss.data[0];
        v.data[i] = old;
        const numeric = (up - down) / 2e-2;
        if (Math.abs(numeric - analytic[i]) > 0.02 * Math.max(1e-3, Math.abs(numeric) + Math.abs(analytic[i])))
          mismatches.push(`${name}[${i}]: ${analytic[i]} vs ${numeric}`);
      }
    }
    expect(mismatches).toEqual([]);
  });

  it('lowers the flow-matching loss on the demo world within 100 small steps, the same way for the same seed', async () => {
    const options = {
      config,
      textLength: TEXT_LENGTH,
      seed: 3,
      steps: 100,
      batch: 4,
      lr: 3e-3,
      warmup: 5,
      flowShift: 3,
      dropPrompt: 0.1,
      maxSeconds: 600,
    };
    // the demo clip is 9 × 64 × 64 → latent [16, 3, 8, 8]: 48 tokens at this small width
    const first = await trainDemo(onnx, options);
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    const losses = first.history.map((p) => p.loss);
    expect(mean(losses.slice(-10))).toBeLessThan(0.8 * mean(losses.slice(0, 10)));
    const again = await trainDemo(onnx, options);
    expect(again.history.map((p) => p.loss)).toEqual(losses);
  });
});

describe('training prompts', () => {
  it('are half the time spaced at random so words fall at many byte positions, never past the encoder length, the words unchanged', () => {
    const random = new SeededRandom(4);
    const starts = new Set<number>();
    let asWritten = 0;
    for (const prompt of ['a red circle moving left', 'a yellow triangle standing still']) {
      for (let i = 0; i < 200; i++) {
        const spaced = spacedPrompt(prompt, random, 32);
        if (spaced === prompt) asWritten++;
        expect(spaced.length).toBeLessThanOrEqual(Math.max(32, prompt.length));
        expect(spaced.trim().split(/ +/).join(' ')).toBe(prompt);
        if (prompt.endsWith('left')) starts.add(spaced.indexOf('left'));
      }
    }
    expect(starts.size).toBeGreaterThanOrEqual(6); // 20 … 28: every slack byte used somewhere
    expect(asWritten).toBeGreaterThan(200); // half as users type them (+ the 32-byte one, always), a few more by chance
    expect(asWritten).toBeLessThan(330);
    expect(spacedPrompt('a yellow triangle standing still', random, 32)).toBe('a yellow triangle standing still'); // 32 bytes: no room
  });
});

describe('the shipped demo model', () => {
  it("is under 20 MB, loads through the app's loaders, and its training forward equals the reference on it (max-abs ≤ 1e-4)", async () => {
    const files = folderFiles(DEMO_MODEL_DIR);
    const bytes = [
      'transformer/diffusion_pytorch_model.safetensors',
      'text_encoder/model.safetensors',
      'vae/diffusion_pytorch_model.safetensors',
    ]
      .map((f) => statSync(join(DEMO_MODEL_DIR, f)).size)
      .reduce((a, b) => a + b, 0);
    expect(bytes).toBeLessThan(20 * 2 ** 20);
    const transformer = await loadTransformer(files);
    const encoder = await loadTextEncoder(files);
    const cfg = transformer.config;
    expect([cfg.numHeads, cfg.headDim]).toEqual([12, 24]);
    const trained = fromWeights(
      cfg,
      transformer.weights,
      await readWeights(files, 'text_encoder/model.safetensors'),
      encoder.maxLength,
    );
    const shape = latentShape(CLIP, wan21Latent(cfg.inChannels));
    const demoGrid = tokenGrid(cfg, shape);
    const { latent, prompt } = sampleLatent(HELD_OUT_COMBOS[3], new SeededRandom(8));
    const xt = { shape, data: latent.map((x, i) => 0.4 * x + 0.6 * Math.sin(i)) };
    const reference = latentToRows(cfg, referenceForward(transformer, xt, 600, encoder.encode(prompt)));
    const rows = await forwardBatch(new Tape(jsGemm), trained, {
      patches: patchify(cfg, xt).data,
      timesteps: [600],
      prompts: [prompt],
      grid: demoGrid,
    });
    let worst = 0;
    reference.forEach((v, k) => (worst = Math.max(worst, Math.abs(v - rows.data[k]))));
    expect(worst).toBeLessThanOrEqual(1e-4);
  });
});
