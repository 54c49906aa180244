// AutoencoderKLWan's decoder (Wan2.1's or Wan2.2's) on onnxruntime-web: the first-chunk and
// later-chunk graphs (wan-vae-graphs.ts) as two sessions sharing one set of weight tensors,
// decoding a tile latent frame by latent frame. The causal caches go from one run to the next as
// tensors: on WebGPU they stay in GPU buffers (each released once the next run has replaced it),
// and the weights are uploaded to GPU buffers once; on WASM everything is CPU data.
import * as ort from 'onnxruntime-web';
import { defined } from '../core/defined.ts';
import { buildVaeChunkGraph, vaeWeightFeeds } from '../core/model/wan-vae-graphs.ts';
import {
  cacheBytes,
  emptyCaches,
  decoderPlan,
  joinFrames,
  latentSlice,
  type Frames,
  type WanVaeConfig,
} from '../core/model/wan-vae.ts';
import type { TensorMap } from '../core/safetensors.ts';
import type { Tensor } from '../core/tensor.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';
import { weightTensors, type GpuDevice } from './gpu-weights.ts';

/** One tile being decoded: its latent frames go in a run at a time, the causal caches carried between them. */
export interface VaeTileStream {
  /**
   * the tile's next latent frames [z_dim, n, h, w] → their frames [n', 3·p², 8h, 8w] (n' = 1 + 4(n−1)
   * for the first run, 4n after; p = 2 with Wan2.2's patches, else 1: decodedFramesShape), before
   * blending and clamping
   */
  next(latent: Tensor): Promise<Frames>;
  /** latent frames decoded so far */
  readonly done: number;
  /** bytes its causal caches take */
  readonly cacheBytes: number;
  close(): void;
}

export interface VaeTileDecoder {
  /** starts a tile of h×w latent pixels */
  open(h: number, w: number): VaeTileStream;
  /** a whole tile: [z_dim, T, h, w] → [1 + 4(T−1), 3·p², 8h, 8w] */
  decode(latent: Tensor): Promise<Frames>;
  /** bytes of the weights it holds (GPU bytes on WebGPU) */
  weightBytes: number;
  release(): Promise<void>;
}

export async function onnxVaeDecoder(
  cfg: WanVaeConfig,
  tensors: TensorMap,
  ep: ExecutionProvider,
): Promise<VaeTileDecoder> {
  const graphs = [buildVaeChunkGraph(cfg, true), buildVaeChunkGraph(cfg, false)];
  const cacheOutputs = graphs[0].caches.map((name) => `${name}.next`);
  const options: ort.InferenceSession.SessionOptions = {
    executionProviders: [ep],
    graphOptimizationLevel: 'all',
    // the caches feed the next run only: on WebGPU they never leave the device
    ...(ep === 'webgpu'
      ? {
          preferredOutputLocation: {
            frames: 'cpu',
            ...Object.fromEntries(cacheOutputs.map((name) => [name, 'gpu-buffer' as const])),
          },
        }
      : {}),
  };
  const sessions = await Promise.all(graphs.map((g) => ort.InferenceSession.create(g.bytes, options)));
  const uploaded = weightTensors(ep === 'webgpu' ? ((await ort.env.webgpu.device) as GpuDevice) : null);
  let weightBytes = 0;
  const weights: Record<string, ort.Tensor> = {};
  const feeds = vaeWeightFeeds(graphs[1].weights, tensors);
  for (const { input, dims } of graphs[1].weights) {
    const data = defined(feeds.get(input), `the VAE decoder's weight ${input}`);
    weightBytes += data.byteLength;
    weights[input] = uploaded.tensor(data, dims);
  }
  const plan = decoderPlan(cfg);

  const open = (h: number, w: number): VaeTileStream => {
    let caches: ort.Tensor[] | null = emptyCaches(plan, h, w).map(
      (c) => new ort.Tensor('float32', c.data, [c.frames, c.channels, c.height, c.width]),
    );
    let done = 0;
    return {
      get done() {
        return done;
      },
      cacheBytes: cacheBytes(plan, h, w),
      async next(latent) {
        const [C, T, lh, lw] = latent.shape;
        if (C !== cfg.zDim || lh !== h || lw !== w)
          throw new Error(`this tile decodes latents [${cfg.zDim}, T, ${h}, ${w}], got [${latent.shape.join(',')}]`);
        const chunks: Frames[] = [];
        for (let t = 0; t < T; t++) {
          if (!caches) throw new Error('this tile was closed');
          const carried = caches;
          const which = done === 0 ? 0 : 1;
          // the graph un-normalises: the frame goes in as the transformer made it
          const feed: Record<string, ort.Tensor> = {
            latent: new ort.Tensor('float32', latentSlice(latent, t).data, [1, C, h, w]),
          };
          // the first chunk's graph has no time_conv
          for (const { input } of graphs[which].weights) feed[input] = weights[input];
          for (const [slot, name] of graphs[which].caches.entries()) feed[name] = carried[slot];
          const out = await sessions[which].run(feed);
          release(caches);
          caches = cacheOutputs.map((name) => out[name]);
          done++;
          const [F, rgb, H, W] = out.frames.dims;
          chunks.push({ frames: F, channels: rgb, height: H, width: W, data: out.frames.data as Float32Array });
        }
        return joinFrames(chunks);
      },
      close() {
        if (caches) release(caches);
        caches = null;
      },
    };
  };

  return {
    weightBytes,
    open,
    async decode(latent) {
      const tile = open(latent.shape[2], latent.shape[3]);
      try {
        return await tile.next(latent);
      } finally {
        tile.close();
      }
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
