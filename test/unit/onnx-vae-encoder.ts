// Wan's VAE encoder as the ONNX graphs of wan-vae-graphs.ts run it (onnxruntime-web, wasm): its
// first-chunk and later-chunk sessions, a video's patched frames chunk by chunk with their caches.
// The tests' runner: no worker encodes yet.

import * as ort from 'onnxruntime-web';
import { defined } from '../../core/defined.ts';
import { buildVaeEncoderChunkGraph, vaeWeightFeeds } from '../../core/model/wan-vae-graphs.ts';
import { emptyCaches, encoderPlan, patchify, type Frames, type WanVaeConfig } from '../../core/model/wan-vae.ts';
import type { TensorMap } from '../../core/safetensors.ts';
import type { Tensor } from '../../core/tensor.ts';

export interface OnnxVaeEncoder {
  /** a video [3, F, H, W] → the normalised latent [z_dim, 1 + (F − 1)/4, H/(8p), W/(8p)] */
  encode(video: Tensor): Promise<Tensor>;
  release(): Promise<void>;
}

export async function onnxVaeEncoder(cfg: WanVaeConfig, tensors: TensorMap): Promise<OnnxVaeEncoder> {
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
    release: async () => {
      await Promise.all(sessions.map((s) => s.release()));
    },
  };
}
