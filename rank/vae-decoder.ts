// Wan2.1's VAE decoder on onnxruntime-web: the first-chunk and later-chunk graphs
// (wan-vae-graphs.ts) as two sessions sharing one set of weight tensors, decoding a tile latent
// frame by latent frame. The causal caches go from one run to the next as tensors: on WebGPU they
// stay in GPU buffers (each released once the next run has replaced it), and the weights are
// uploaded to GPU buffers once; on WASM everything is CPU data.
import * as ort from 'onnxruntime-web';
import { buildVaeChunkGraph, vaeWeightFeeds } from '../core/model/wan-vae-graphs.ts';
import { emptyCaches, decoderPlan, joinFrames, latentSlice, type Frames, type WanVaeConfig } from '../core/model/wan-vae.ts';
import type { TensorMap } from '../core/safetensors.ts';
import type { Tensor } from '../core/tensor.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';

export interface VaeTileDecoder {
  /** a tile's latent [z_dim, T, h, w] → its frames [1 + 4(T−1), 3, 8h, 8w], before blending and clamping */
  decode(latent: Tensor): Promise<Frames>;
  /** bytes of the weights it holds (GPU bytes on WebGPU) */
  weightBytes: number;
  release(): Promise<void>;
}

/** The parts of a WebGPU device this uses (the DOM's WebGPU types are not in this build's lib). */
interface GpuDevice {
  createBuffer(descriptor: { size: number; usage: number }): { destroy(): void };
  queue: { writeBuffer(buffer: unknown, offset: number, data: ArrayBufferLike, dataOffset: number, size: number): void };
}
const GPU_BUFFER_USAGE = { COPY_SRC: 0x0004, COPY_DST: 0x0008, STORAGE: 0x0080 };

export async function onnxVaeDecoder(cfg: WanVaeConfig, tensors: TensorMap, ep: ExecutionProvider): Promise<VaeTileDecoder> {
  const graphs = [buildVaeChunkGraph(cfg, true), buildVaeChunkGraph(cfg, false)];
  const cacheOutputs = graphs[0].caches.map((name) => `${name}.next`);
  const options: ort.InferenceSession.SessionOptions = {
    executionProviders: [ep],
    graphOptimizationLevel: 'all',
    // the caches feed the next run only: on WebGPU they never leave the device
    ...(ep === 'webgpu' ? { preferredOutputLocation: { frames: 'cpu', ...Object.fromEntries(cacheOutputs.map((name) => [name, 'gpu-buffer' as const])) } } : {}),
  };
  const sessions = await Promise.all(graphs.map((g) => ort.InferenceSession.create(g.bytes, options)));
  const device = ep === 'webgpu' ? ((await ort.env.webgpu.device) as GpuDevice) : null;
  const buffers: { destroy(): void }[] = [];
  let weightBytes = 0;
  const weights: Record<string, ort.Tensor> = {};
  const feeds = vaeWeightFeeds(graphs[1].weights, tensors);
  for (const { input, dims } of graphs[1].weights) {
    const data = feeds.get(input)!;
    weightBytes += data.byteLength;
    if (!device) {
      weights[input] = new ort.Tensor('float32', data, dims);
      continue;
    }
    const buffer = device.createBuffer({ size: data.byteLength, usage: GPU_BUFFER_USAGE.STORAGE | GPU_BUFFER_USAGE.COPY_SRC | GPU_BUFFER_USAGE.COPY_DST });
    device.queue.writeBuffer(buffer, 0, data.buffer, data.byteOffset, data.byteLength);
    buffers.push(buffer);
    weights[input] = ort.Tensor.fromGpuBuffer(buffer as never, { dataType: 'float32', dims });
  }
  const plan = decoderPlan(cfg);

  return {
    weightBytes,
    async decode(latent) {
      const [C, T, h, w] = latent.shape;
      if (C !== cfg.zDim) throw new Error(`the VAE decodes latents of ${cfg.zDim} channels, got [${latent.shape}]`);
      let caches: ort.Tensor[] = emptyCaches(plan, h, w).map((c) => new ort.Tensor('float32', c.data, [c.frames, c.channels, c.height, c.width]));
      const chunks: Frames[] = [];
      try {
        for (let t = 0; t < T; t++) {
          const which = t === 0 ? 0 : 1;
          // the graph un-normalises: the frame goes in as the transformer made it
          const feed: Record<string, ort.Tensor> = { latent: new ort.Tensor('float32', latentSlice(latent, t).data, [1, C, h, w]) };
          for (const { input } of graphs[which].weights) feed[input] = weights[input]; // the first chunk's graph has no time_conv
          graphs[which].caches.forEach((name, slot) => (feed[name] = caches[slot]));
          const out = await sessions[which].run(feed);
          const next = cacheOutputs.map((name) => out[name]);
          release(caches.filter((c) => !next.includes(c)));
          caches = next;
          const frames = out.frames;
          const [F, rgb, H, W] = frames.dims;
          chunks.push({ frames: F, channels: rgb, height: H, width: W, data: frames.data as Float32Array });
        }
      } finally {
        release(caches);
      }
      return joinFrames(chunks);
    },
    async release() {
      await Promise.all(sessions.map((s) => s.release()));
      buffers.forEach((b) => b.destroy());
    },
  };
}

/** Frees the GPU buffers of cache tensors (CPU tensors need nothing). */
function release(tensors: ort.Tensor[]): void {
  for (const t of tensors) if (t.location === 'gpu-buffer') t.dispose();
}
