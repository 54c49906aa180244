// wan-vae-graphs.ts's ONNX graphs of Wan2.2's VAE on onnxruntime-web (wasm), held to diffusers: the
// decoder (through rank/vae-decoder.ts, as a worker runs it) and the encoder (its two chunk graphs,
// chunk by chunk with their caches: rank/vae-encoder.ts) against wan22-vae.fixture.json, the float64 numpy
// reading of autoencoder_kl_wan.py, and against the plain TypeScript reference.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { framesOfChunk, parseWanVaeConfig } from '../../core/model/wan-vae.ts';
import { decodeTileReference } from '../../core/model/wan-vae-reference.ts';
import { blendTiles, tilesOf } from '../../core/model/wan-vae-tiling.ts';
import { maxAbsDiff } from '../../core/tensor.ts';
import { onnxVaeDecoder, type VaeTileDecoder } from '../../rank/vae-decoder.ts';
import { FIXTURE22_PATH, seededLatent, seededVaeTensors, seededVideo } from '../reference/make-wan-vae-fixture.ts';
import { onnxVaeEncoder, type VaeEncoder } from '../../rank/vae-encoder.ts';
import { expectCase, readVaeFixture } from './vae-fixture-check.ts';

const fixture = readVaeFixture(FIXTURE22_PATH);
const cfg = parseWanVaeConfig(fixture.config, 'wan22-vae.fixture.json');
const tensors = seededVaeTensors(cfg, fixture.seed);

/**
 * As wan22-vae-reference.test.ts's: ten times the float32 rounding the graphs carry (no more than the
 * reference's), far below what the narrowest plausible bug moves (that test measures it on these cases).
 */
const TOLERANCE = 2e-5;

describe("Wan2.2's VAE as ONNX graphs on onnxruntime-web, against diffusers (numpy, float64)", () => {
  let decoder: VaeTileDecoder | undefined;
  let encoder: VaeEncoder | undefined;
  beforeAll(async () => {
    decoder = await onnxVaeDecoder(cfg, tensors, 'wasm');
    encoder = await onnxVaeEncoder(cfg, tensors);
  });
  afterAll(async () => {
    await decoder?.release();
    await encoder?.release();
  });

  it('builds the encoder’s chunks of 1 and then 4 frames', () => {
    expect([true, false].map((first) => framesOfChunk(cfg, first))).toEqual([1, 4]);
  });

  for (const c of fixture.cases.filter((k) => !k.tiling)) {
    if (c.latentShape) {
      const shape = c.latentShape;
      it(`decodes ${c.name} [${shape.join(',')}] as diffusers does, and as the reference does`, async () => {
        const latent = seededLatent(fixture.seed, shape);
        const frames = await defined(decoder, 'the ONNX decoder').decode(latent);
        const expected = decodeTileReference(cfg, tensors, latent);
        expect([frames.frames, frames.channels, frames.height, frames.width]).toEqual([
          expected.frames,
          12,
          8 * shape[2],
          8 * shape[3],
        ]);
        expect(maxAbsDiff(frames.data, expected.data)).toBeLessThan(TOLERANCE);
        const [, , h, w] = shape;
        const whole = { tile: 16 * Math.max(h, w), stride: 16 * Math.max(h, w) };
        expectCase(c, fixture.seed, blendTiles(tilesOf(h, w, whole, 2), [frames], h, w, whole, 2), TOLERANCE);
      });
    } else {
      const shape = c.videoShape ?? [];
      it(`encodes ${c.name} [${shape.join(',')}] as diffusers does`, async () => {
        const latent = await defined(encoder, 'the ONNX encoder').encode(seededVideo(fixture.seed, shape));
        expectCase(c, fixture.seed, latent, TOLERANCE);
      });
    }
  }
});
