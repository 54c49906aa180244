// wan-vae-graphs.ts's ONNX graphs of Wan2.2's VAE on onnxruntime-web (wasm), held to diffusers: the
// decoder (through rank/vae-decoder.ts, as a worker runs it) and the encoder (its two chunk graphs
// run here, chunk by chunk with their caches) against wan22-vae.fixture.json, the float64 numpy
// reading of autoencoder_kl_wan.py, and against the plain TypeScript reference.

import * as ort from 'onnxruntime-web';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { buildVaeEncoderChunkGraph, vaeWeightFeeds } from '../../core/model/wan-vae-graphs.ts';
import {
  emptyCaches,
  encoderPlan,
  framesOfChunk,
  parseWanVaeConfig,
  patchify,
  type Frames,
} from '../../core/model/wan-vae.ts';
import { decodeTileReference } from '../../core/model/wan-vae-reference.ts';
import { blendTiles, tilesOf } from '../../core/model/wan-vae-tiling.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import { onnxVaeDecoder, type VaeTileDecoder } from '../../rank/vae-decoder.ts';
import { FIXTURE22_PATH, seededLatent, seededVaeTensors, seededVideo } from '../reference/make-wan-vae-fixture.ts';
import { expectCase, readVaeFixture } from './vae-fixture-check.ts';

const fixture = readVaeFixture(FIXTURE22_PATH);
const cfg = parseWanVaeConfig(fixture.config, 'wan22-vae.fixture.json');
const tensors = seededVaeTensors(cfg, fixture.seed);

/**
 * As wan22-vae-reference.test.ts's: ten times the float32 rounding the graphs carry (no more than the
 * reference's), far below what the narrowest plausible bug moves (that test measures it on these cases).
 */
const TOLERANCE = 2e-5;

/** The encoder's first-chunk and later-chunk graphs as sessions: a video [3, F, H, W] → the normalised latent. */
async function onnxEncoder() {
  const graphs = [buildVaeEncoderChunkGraph(cfg, true), buildVaeEncoderChunkGraph(cfg, false)];
  const sessions = await Promise.all(
    graphs.map((g) => ort.InferenceSession.create(g.bytes, { executionProviders: ['wasm'] })),
  );
  const feeds = vaeWeightFeeds(graphs[1].weights, tensors);
  const weights = Object.fromEntries(
    graphs[1].weights.map(({ input, dims }) => [
      input,
      new ort.Tensor('float32', defined(feeds.get(input), input), dims),
    ]),
  );
  return {
    async encode(video: Tensor): Promise<Tensor> {
      const frames = patchify(video, cfg.patchSize);
      let caches: ort.Tensor[] = emptyCaches(encoderPlan(cfg), frames.height, frames.width).map(
        (c) => new ort.Tensor('float32', c.data, [c.frames, c.channels, c.height, c.width]),
      );
      const frameSize = frames.channels * frames.height * frames.width;
      const latents: Frames[] = [];
      for (let from = 0, which = 0; from < frames.frames; from += graphs[which].frames, which = 1) {
        const n = graphs[which].frames;
        const feed: Record<string, ort.Tensor> = {
          frames: new ort.Tensor('float32', frames.data.slice(from * frameSize, (from + n) * frameSize), [
            n,
            frames.channels,
            frames.height,
            frames.width,
          ]),
        };
        for (const { input } of graphs[which].weights) feed[input] = weights[input];
        graphs[which].caches.forEach((name, slot) => (feed[name] = caches[slot]));
        const out = await sessions[which].run(feed);
        caches = graphs[which].caches.map((name) => out[`${name}.next`]);
        const [, Z, h, w] = out.latent.dims;
        latents.push({ frames: 1, channels: Z, height: h, width: w, data: out.latent.data as Float32Array });
      }
      // [T, z, h, w] → [z, T, h, w]
      const [{ channels: Z, height: h, width: w }] = latents;
      const T = latents.length;
      const data = new Float32Array(Z * T * h * w);
      latents.forEach((l, t) => {
        for (let c = 0; c < Z; c++) data.set(l.data.subarray(c * h * w, (c + 1) * h * w), (c * T + t) * h * w);
      });
      return { shape: [Z, T, h, w], data };
    },
    release: () => Promise.all(sessions.map((s) => s.release())),
  };
}

describe("Wan2.2's VAE as ONNX graphs on onnxruntime-web, against diffusers (numpy, float64)", () => {
  let decoder: VaeTileDecoder | undefined;
  let encoder: Awaited<ReturnType<typeof onnxEncoder>> | undefined;
  beforeAll(async () => {
    decoder = await onnxVaeDecoder(cfg, tensors, 'wasm');
    encoder = await onnxEncoder();
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
