// AutoencoderKLWan's encoder (Wan2.1's, or Wan2.2's with its 2×2 patches) on onnxruntime-web: the
// first-chunk and later-chunk graphs of wan-vae-graphs.ts as two sessions sharing one set of weight
// tensors, a video's patched frames chunk by chunk (1, then 4 frames) with their causal caches
// carried from run to run, as diffusers' _encode does. On WebGPU the weights are uploaded once and
// the caches stay in GPU buffers (each released once the next run has replaced it).
import * as ort from 'onnxruntime-web';
import { defined } from '../core/defined.ts';
import { buildVaeEncoderChunkGraph, vaeWeightFeeds } from '../core/model/wan-vae-graphs.ts';
import { emptyCaches, encoderPlan, patchify, type Frames, type WanVaeConfig } from '../core/model/wan-vae.ts';
import type { TensorMap } from '../core/safetensors.ts';
import type { Tensor } from '../core/tensor.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';
import { weightTensors, type GpuDevice } from './gpu-weights.ts';

export interface VaeEncoder {
  /** a video [3, F, H, W] in [−1, 1] → the normalised latent [z_dim, 1 + (F − 1)/4, H/(8p), W/(8p)] */
  encode(video: Tensor): Promise<Tensor>;
  /** bytes of the weights it holds (GPU bytes on WebGPU) */
  weightBytes: number;
  release(): Promise<void>;
}

export async function onnxVaeEncoder(
  cfg: WanVaeConfig,
  tensors: TensorMap,
  ep: ExecutionProvider = 'wasm',
): Promise<VaeEncoder> {
  const graphs = [buildVaeEncoderChunkGraph(cfg, true), buildVaeEncoderChunkGraph(cfg, false)];
  const cacheOutputs = [...new Set(graphs.flatMap((g) => g.caches))].map((name) => `${name}.next`);
  const options: ort.InferenceSession.SessionOptions = {
    executionProviders: [ep],
    graphOptimizationLevel: 'all',
    // the caches feed the next run only: on WebGPU they never leave the device
    ...(ep === 'webgpu'
      ? {
          preferredOutputLocation: {
            latent: 'cpu',
            ...Object.fromEntries(cacheOutputs.map((name) => [name, 'gpu-buffer' as const])),
          },
        }
      : {}),
  };
  const sessions = await Promise.all(graphs.map((g) => ort.InferenceSession.create(g.bytes, options)));
  const uploaded = weightTensors(ep === 'webgpu' ? ((await ort.env.webgpu.device) as GpuDevice) : null);
  const feeds = vaeWeightFeeds(graphs[1].weights, tensors);
  let weightBytes = 0;
  const weights: Record<string, ort.Tensor> = {};
  for (const { input, dims } of graphs[1].weights) {
    const data = defined(feeds.get(input), `the VAE encoder's weight ${input}`);
    weightBytes += data.byteLength;
    weights[input] = uploaded.tensor(data, dims);
  }
  return {
    weightBytes,
    async encode(video: Tensor): Promise<Tensor> {
      const frames = patchify(video, cfg.patchSize);
      let caches: ort.Tensor[] = emptyCaches(encoderPlan(cfg), frames.height, frames.width).map(
        (c) => new ort.Tensor('float32', c.data, [c.frames, c.channels, c.height, c.width]),
      );
      const frameSize = frames.channels * frames.height * frames.width;
      const latents: Frames[] = [];
      try {
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
          release(caches);
          caches = graphs[which].caches.map((name) => out[`${name}.next`]);
          const [, Z, h, w] = out.latent.dims;
          latents.push({ frames: 1, channels: Z, height: h, width: w, data: out.latent.data as Float32Array });
        }
      } finally {
        release(caches);
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
    async release() {
      await Promise.all(sessions.map((s) => s.release()));
      uploaded.destroy();
    },
  };
}

/** Frees the GPU buffers of cache tensors (CPU tensors need nothing). */
function release(tensors: ort.Tensor[]): void {
  for (const t of tensors) if (t.location === 'gpu-buffer') t.dispose();
}
