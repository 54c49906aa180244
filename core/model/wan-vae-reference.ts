// The plain TypeScript reference of AutoencoderKLWan's decoder (wan-vae.ts), frame by frame as
// diffusers' _decode runs it: slow and plain, what the ONNX graphs (wan-vae-graphs.ts) are held to.

import type { TensorMap } from '../safetensors.ts';
import type { Tensor } from '../tensor.ts';
import {
  CACHE_FRAMES,
  decoderPlan,
  emptyCaches,
  framesOf,
  joinFrames,
  latentSlice,
  SCALE_FACTOR_SPATIAL,
  type CausalConv,
  type DecoderLayer,
  type Frames,
  type WanVaeConfig,
} from './wan-vae.ts';
import { blendTiles, tilesOf } from './wan-vae-tiling.ts';

/** Frame t un-normalised (z·std + mean), as WanPipeline does before decoding. */
function latentFrame(cfg: WanVaeConfig, latent: Tensor, t: number): Frames {
  const z = latentSlice(latent, t);
  const plane = z.height * z.width;
  for (let c = 0; c < z.channels; c++)
    for (let p = 0; p < plane; p++)
      z.data[c * plane + p] = z.data[c * plane + p] * cfg.latentsStd[c] + cfg.latentsMean[c];
  return z;
}

/** 2D convolution of every frame, stride 1, zero padding k/2, added into `out` (the bias, or a partial sum). */
function convFramesInto(
  out: Frames,
  x: Frames,
  xFrame0: number,
  w: Float32Array,
  tap: number,
  taps: number,
  k: number,
): void {
  const { height: H, width: W } = x;
  const Cin = x.channels;
  const Cout = out.channels;
  const pad = k >> 1;
  const plane = H * W;
  for (let t = 0; t < out.frames; t++) {
    const src = x.data.subarray((xFrame0 + t) * Cin * plane, (xFrame0 + t + 1) * Cin * plane);
    for (let o = 0; o < Cout; o++) {
      const dst = out.data.subarray((t * Cout + o) * plane, (t * Cout + o + 1) * plane);
      for (let i = 0; i < Cin; i++) {
        const channel = src.subarray(i * plane, (i + 1) * plane);
        for (let ky = 0; ky < k; ky++)
          for (let kx = 0; kx < k; kx++) {
            const weight = w[(((o * Cin + i) * taps + tap) * k + ky) * k + kx];
            const dy = ky - pad;
            const dx = kx - pad;
            const x0 = Math.max(0, -dx);
            const x1 = Math.min(W, W - dx);
            for (let y = Math.max(0, -dy); y < Math.min(H, H - dy); y++) {
              const row = y * W;
              const from = (y + dy) * W + dx;
              for (let xx = x0; xx < x1; xx++) dst[row + xx] += weight * channel[from + xx];
            }
          }
      }
    }
  }
}

function withBias(frames: number, channels: number, height: number, width: number, bias: Float32Array): Frames {
  const out = framesOf(frames, channels, height, width);
  const plane = height * width;
  for (let t = 0; t < frames; t++)
    for (let c = 0; c < channels; c++)
      out.data.fill(bias[c], (t * channels + c) * plane, (t * channels + c + 1) * plane);
  return out;
}

/** The last two frames of [cache, x]: what the next chunk's convolution sees before its own. */
function nextCache(cache: Frames, x: Frames): Frames {
  const frame = x.channels * x.height * x.width;
  const joined = new Float32Array((CACHE_FRAMES + x.frames) * frame);
  joined.set(cache.data);
  joined.set(x.data, CACHE_FRAMES * frame);
  return framesOf(CACHE_FRAMES, x.channels, x.height, x.width, joined.slice(x.frames * frame));
}

type Weights = (name: string) => Float32Array;

/** A causal convolution on a chunk, its cache updated in `caches`. A time_conv's kernel is 3×1×1. */
function causalConv(c: CausalConv, x: Frames, caches: Frames[], weights: Weights, timeConv = false): Frames {
  const out = withBias(x.frames, c.outDim, x.height, x.width, weights(`${c.name}.bias`));
  const w = weights(`${c.name}.weight`);
  if (c.cache === null) {
    convFramesInto(out, x, 0, w, 0, 1, 1);
    return out;
  }
  const cache = caches[c.cache];
  const joined = framesOf(CACHE_FRAMES + x.frames, x.channels, x.height, x.width);
  joined.data.set(cache.data);
  joined.data.set(x.data, cache.data.length);
  for (let tap = 0; tap < 3; tap++) convFramesInto(out, joined, tap, w, tap, 3, timeConv ? 1 : 3);
  caches[c.cache] = nextCache(cache, x);
  return out;
}

/** F.normalize over channels · √C · γ, per pixel (WanRMS_norm, no bias). */
function rmsNormChannels(x: Frames, gamma: Float32Array): Frames {
  const { frames: T, channels: C } = x;
  const plane = x.height * x.width;
  const out = framesOf(T, C, x.height, x.width);
  const scale = Math.sqrt(C);
  for (let t = 0; t < T; t++) {
    const base = t * C * plane;
    const sums = new Float64Array(plane);
    for (let c = 0; c < C; c++) for (let p = 0; p < plane; p++) sums[p] += x.data[base + c * plane + p] ** 2;
    for (let c = 0; c < C; c++)
      for (let p = 0; p < plane; p++)
        out.data[base + c * plane + p] =
          (x.data[base + c * plane + p] / Math.max(Math.sqrt(sums[p]), 1e-12)) * scale * gamma[c];
  }
  return out;
}

const siluFrames = (x: Frames): Frames => ({ ...x, data: x.data.map((v) => v / (1 + Math.exp(-v))) });
const addFrames = (a: Frames, b: Frames): Frames => ({ ...a, data: a.data.map((v, i) => v + b.data[i]) });

function residualBlock(
  layer: Extract<DecoderLayer, { kind: 'residual' }>,
  x: Frames,
  caches: Frames[],
  weights: Weights,
): Frames {
  const h = layer.shortcut ? causalConv(layer.shortcut, x, caches, weights) : x;
  let y = siluFrames(rmsNormChannels(x, weights(`${layer.name}.norm1.gamma`)));
  y = causalConv(layer.conv1, y, caches, weights);
  y = siluFrames(rmsNormChannels(y, weights(`${layer.name}.norm2.gamma`)));
  y = causalConv(layer.conv2, y, caches, weights);
  return addFrames(y, h);
}

/** One head over each frame's pixels: q, k, v the three thirds of to_qkv's channels, scaled by 1/√C. */
function attentionBlock(layer: Extract<DecoderLayer, { kind: 'attention' }>, x: Frames, weights: Weights): Frames {
  const { frames: T, channels: C, height: H, width: W } = x;
  const n = H * W;
  const normed = rmsNormChannels(x, weights(`${layer.name}.norm.gamma`));
  const qkv = withBias(T, 3 * C, H, W, weights(`${layer.name}.to_qkv.bias`));
  convFramesInto(qkv, normed, 0, weights(`${layer.name}.to_qkv.weight`), 0, 1, 1);
  const attended = framesOf(T, C, H, W);
  const scale = 1 / Math.sqrt(C);
  const scores = new Float64Array(n);
  for (let t = 0; t < T; t++) {
    const at = (part: number, c: number, p: number) => qkv.data[((t * 3 + part) * C + c) * n + p];
    for (let i = 0; i < n; i++) {
      let max = -Infinity;
      for (let j = 0; j < n; j++) {
        let s = 0;
        for (let c = 0; c < C; c++) s += at(0, c, i) * at(1, c, j);
        scores[j] = s * scale;
        max = Math.max(max, scores[j]);
      }
      let total = 0;
      for (let j = 0; j < n; j++) total += scores[j] = Math.exp(scores[j] - max);
      for (let c = 0; c < C; c++) {
        let v = 0;
        for (let j = 0; j < n; j++) v += scores[j] * at(2, c, j);
        attended.data[(t * C + c) * n + i] = v / total;
      }
    }
  }
  const out = withBias(T, C, H, W, weights(`${layer.name}.proj.bias`));
  convFramesInto(out, attended, 0, weights(`${layer.name}.proj.weight`), 0, 1, 1);
  return addFrames(out, x);
}

function upsample(
  layer: Extract<DecoderLayer, { kind: 'upsample' }>,
  x: Frames,
  caches: Frames[],
  weights: Weights,
  first: boolean,
): Frames {
  if (layer.timeConv && !first) {
    // dim → 2·dim channels, then frame 2t is the first half at t and frame 2t+1 the second
    const doubled = causalConv(layer.timeConv, x, caches, weights, true);
    x = { ...x, frames: 2 * x.frames, data: doubled.data };
  }
  const { frames: T, channels: C, height: H, width: W } = x;
  const big = framesOf(T, C, 2 * H, 2 * W);
  for (let tc = 0; tc < T * C; tc++)
    for (let y = 0; y < 2 * H; y++)
      for (let xx = 0; xx < 2 * W; xx++)
        big.data[(tc * 2 * H + y) * 2 * W + xx] = x.data[(tc * H + (y >> 1)) * W + (xx >> 1)];
  const out = withBias(T, layer.outDim, 2 * H, 2 * W, weights(`${layer.name}.resample.1.bias`));
  convFramesInto(out, big, 0, weights(`${layer.name}.resample.1.weight`), 0, 1, 3);
  return out;
}

/** One chunk through post_quant_conv and the decoder: a latent frame → 1 (first) or 4 frames [F, 3, 8h, 8w]. */
export function decodeChunkReference(
  cfg: WanVaeConfig,
  weights: Weights,
  z: Frames,
  caches: Frames[],
  first: boolean,
): Frames {
  let x = causalConv(
    { name: 'post_quant_conv', inDim: cfg.zDim, outDim: cfg.zDim, kernel: 1, cache: null },
    z,
    caches,
    weights,
  );
  for (const layer of decoderPlan(cfg).layers) {
    if (layer.kind === 'conv') x = causalConv(layer.conv, x, caches, weights);
    else if (layer.kind === 'residual') x = residualBlock(layer, x, caches, weights);
    else if (layer.kind === 'attention') x = attentionBlock(layer, x, weights);
    else if (layer.kind === 'upsample') x = upsample(layer, x, caches, weights, first);
    else
      x = causalConv(
        layer.conv,
        siluFrames(rmsNormChannels(x, weights(`${layer.name}.norm_out.gamma`))),
        caches,
        weights,
      );
  }
  return x;
}

/** A latent [C, T, h, w] (one tile, or all of it) → frames [F, 3, 8h, 8w], chunk by chunk, before clamping. */
export function decodeTileReference(cfg: WanVaeConfig, tensors: TensorMap, latent: Tensor): Frames {
  const [, T, h, w] = latent.shape;
  const weights: Weights = (name) => {
    const t = tensors.get(name);
    if (!t) throw new Error(`the VAE has no tensor "${name}"`);
    return t.data;
  };
  const caches = emptyCaches(decoderPlan(cfg), h, w);
  const chunks = Array.from({ length: T }, (_, t) =>
    decodeChunkReference(cfg, weights, latentFrame(cfg, latent, t), caches, t === 0),
  );
  return joinFrames(chunks);
}

/** The whole video by the reference, untiled as diffusers' _decode: [3, F, 8h, 8w] in [−1, 1]. */
export function decodeWanVaeReference(cfg: WanVaeConfig, tensors: TensorMap, latent: Tensor): Tensor {
  const [, , h, w] = latent.shape;
  const whole = { tile: Math.max(h, w) * SCALE_FACTOR_SPATIAL, stride: Math.max(h, w) * SCALE_FACTOR_SPATIAL };
  return blendTiles(tilesOf(h, w, whole), [decodeTileReference(cfg, tensors, latent)], h, w, whole);
}
