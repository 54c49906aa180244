// The plain TypeScript reference of AutoencoderKLWan (wan-vae.ts), chunk by chunk as diffusers'
// _encode and _decode run it: slow and plain, what the ONNX graphs (wan-vae-graphs.ts) are held to.

import type { TensorMap } from '../safetensors.ts';
import type { Tensor } from '../tensor.ts';
import {
  CACHE_FRAMES,
  decoderPlan,
  emptyCaches,
  encoderPlan,
  framesOf,
  joinFrames,
  latentSlice,
  patchify,
  postQuantConv,
  quantConv,
  spatialScale,
  type CausalConv,
  type Frames,
  type VaeLayer,
  type WanVaeConfig,
  framesOfChunk,
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

/**
 * 2D convolution of every frame, stride 1, zero padding k/2, added into `out` (the bias, or a partial
 * sum): out's frame t reads x's frame xFrame0 + t·frameStep.
 */
function convFramesInto(
  out: Frames,
  x: Frames,
  xFrame0: number,
  w: Float32Array,
  tap: number,
  taps: number,
  k: number,
  frameStep = 1,
): void {
  const { height: H, width: W } = x;
  const Cin = x.channels;
  const Cout = out.channels;
  const pad = k >> 1;
  const plane = H * W;
  for (let t = 0; t < out.frames; t++) {
    const from = xFrame0 + t * frameStep;
    const src = x.data.subarray(from * Cin * plane, (from + 1) * Cin * plane);
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

/** ZeroPad2d((0, 1, 0, 1)) and a 3×3 conv of stride 2 on every frame (Wan's resample.1 when it downsamples). */
function convStride2(x: Frames, w: Float32Array, bias: Float32Array): Frames {
  const { frames: T, channels: Cin, height: H, width: W } = x;
  const Cout = bias.length;
  const [Ho, Wo] = [Math.floor((H - 2) / 2) + 1, Math.floor((W - 2) / 2) + 1];
  const out = withBias(T, Cout, Ho, Wo, bias);
  for (let t = 0; t < T; t++)
    for (let o = 0; o < Cout; o++)
      for (let i = 0; i < Cin; i++)
        for (let ky = 0; ky < 3; ky++)
          for (let kx = 0; kx < 3; kx++) {
            const weight = w[((o * Cin + i) * 3 + ky) * 3 + kx];
            for (let y = 0; y < Ho && 2 * y + ky < H; y++)
              for (let xx = 0; xx < Wo && 2 * xx + kx < W; xx++)
                out.data[((t * Cout + o) * Ho + y) * Wo + xx] +=
                  weight * x.data[((t * Cin + i) * H + 2 * y + ky) * W + 2 * xx + kx];
          }
  return out;
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
  layer: Extract<VaeLayer, { kind: 'residual' }>,
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
function attentionBlock(layer: Extract<VaeLayer, { kind: 'attention' }>, x: Frames, weights: Weights): Frames {
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
  layer: Extract<VaeLayer, { kind: 'upsample' }>,
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

function downsample(
  layer: Extract<VaeLayer, { kind: 'downsample' }>,
  x: Frames,
  caches: Frames[],
  weights: Weights,
  first: boolean,
): Frames {
  x = convStride2(x, weights(`${layer.name}.resample.1.weight`), weights(`${layer.name}.resample.1.bias`));
  if (!layer.timeConv) return x;
  const frame = x.channels * x.height * x.width;
  const slot = layer.timeConv.cache;
  const last = framesOf(1, x.channels, x.height, x.width, x.data.slice((x.frames - 1) * frame));
  if (first) {
    // the first chunk only fills the cache: its one frame goes on as it is
    caches[slot] = last;
    return x;
  }
  // frames [cache, x]: output frame j reads frames 2j, 2j + 1, 2j + 2
  const joined = joinFrames([caches[slot], x]);
  const out = withBias(
    (x.frames + 1 - 3) / 2 + 1,
    x.channels,
    x.height,
    x.width,
    weights(`${layer.timeConv.name}.bias`),
  );
  const w = weights(`${layer.timeConv.name}.weight`);
  for (let tap = 0; tap < 3; tap++) convFramesInto(out, joined, tap, w, tap, 3, 1, 2);
  caches[slot] = last;
  return out;
}

/** AvgDown3D or DupUp3D of the kept input, as diffusers' view/permute/mean or repeat_interleave/view/permute do. */
function shortcut(layer: Extract<VaeLayer, { kind: 'shortcut' }>, kept: Frames, first: boolean): Frames {
  const { factorT: ft, factorS: fs, inDim, outDim } = layer;
  const factor = ft * fs * fs;
  const { frames: T, height: H, width: W } = kept;
  const at = (t: number, c: number, y: number, x: number) => kept.data[((t * inDim + c) * H + y) * W + x];
  if (layer.direction === 'down') {
    const pad = (ft - (T % ft)) % ft;
    const [To, Ho, Wo] = [(T + pad) / ft, H / fs, W / fs];
    const group = (inDim * factor) / outDim;
    const out = framesOf(To, outDim, Ho, Wo);
    for (let t = 0; t < To; t++)
      for (let o = 0; o < outDim; o++)
        for (let y = 0; y < Ho; y++)
          for (let x = 0; x < Wo; x++) {
            let sum = 0;
            for (let g = 0; g < group; g++) {
              // channel k of the view [C·factor]: input channel ⌊k / factor⌋ at offsets (it, iy, ix)
              const k = o * group + g;
              const r = k % factor;
              const tin = t * ft + Math.floor(r / (fs * fs)) - pad;
              if (tin >= 0)
                sum += at(tin, Math.floor(k / factor), y * fs + (Math.floor(r / fs) % fs), x * fs + (r % fs));
            }
            out.data[((t * outDim + o) * Ho + y) * Wo + x] = sum / group;
          }
    return out;
  }
  const repeats = (outDim * factor) / inDim;
  const skip = first ? ft - 1 : 0;
  const [To, Ho, Wo] = [T * ft - skip, H * fs, W * fs];
  const out = framesOf(To, outDim, Ho, Wo);
  for (let t = 0; t < To; t++)
    for (let o = 0; o < outDim; o++)
      for (let y = 0; y < Ho; y++)
        for (let x = 0; x < Wo; x++) {
          const [tt, it] = [Math.floor((t + skip) / ft), (t + skip) % ft];
          const k = ((o * ft + it) * fs + (y % fs)) * fs + (x % fs);
          out.data[((t * outDim + o) * Ho + y) * Wo + x] = at(
            tt,
            Math.floor(k / repeats),
            Math.floor(y / fs),
            Math.floor(x / fs),
          );
        }
  return out;
}

/** One chunk through a plan's layers, its caches updated. */
function runLayers(layers: VaeLayer[], x: Frames, caches: Frames[], weights: Weights, first: boolean): Frames {
  let kept: Frames | null = null;
  for (const layer of layers) {
    if (layer.kind === 'conv') x = causalConv(layer.conv, x, caches, weights);
    else if (layer.kind === 'residual') x = residualBlock(layer, x, caches, weights);
    else if (layer.kind === 'attention') x = attentionBlock(layer, x, weights);
    else if (layer.kind === 'upsample') x = upsample(layer, x, caches, weights, first);
    else if (layer.kind === 'downsample') x = downsample(layer, x, caches, weights, first);
    else if (layer.kind === 'keep') kept = x;
    else if (layer.kind === 'shortcut') {
      if (!kept) throw new Error(`${layer.name}'s shortcut has no kept input`);
      x = addFrames(x, shortcut(layer, kept, first));
    } else
      x = causalConv(
        layer.conv,
        siluFrames(rmsNormChannels(x, weights(`${layer.name}.norm_out.gamma`))),
        caches,
        weights,
      );
  }
  return x;
}

/** One chunk through post_quant_conv and the decoder: a latent frame → 1 (first) or 4 frames [F, 3·p², 8h, 8w]. */
export function decodeChunkReference(
  cfg: WanVaeConfig,
  weights: Weights,
  z: Frames,
  caches: Frames[],
  first: boolean,
): Frames {
  return runLayers(decoderPlan(cfg).layers, causalConv(postQuantConv(cfg), z, caches, weights), caches, weights, first);
}

const weightsOf =
  (tensors: TensorMap): Weights =>
  (name) => {
    const t = tensors.get(name);
    if (!t) throw new Error(`the VAE has no tensor "${name}"`);
    return t.data;
  };

/** A latent [C, T, h, w] (one tile, or all of it) → frames [F, 3·p², 8h, 8w], chunk by chunk, before clamping. */
export function decodeTileReference(cfg: WanVaeConfig, tensors: TensorMap, latent: Tensor): Frames {
  const [, T, h, w] = latent.shape;
  const weights = weightsOf(tensors);
  const caches = emptyCaches(decoderPlan(cfg), h, w);
  const chunks = Array.from({ length: T }, (_, t) =>
    decodeChunkReference(cfg, weights, latentFrame(cfg, latent, t), caches, t === 0),
  );
  return joinFrames(chunks);
}

/** The whole video by the reference, untiled as diffusers' _decode: [3, F, 8p·h, 8p·w] in [−1, 1]. */
export function decodeWanVaeReference(cfg: WanVaeConfig, tensors: TensorMap, latent: Tensor): Tensor {
  const [, , h, w] = latent.shape;
  const side = Math.max(h, w) * spatialScale(cfg);
  const whole = { tile: side, stride: side };
  return blendTiles(
    tilesOf(h, w, whole, cfg.patchSize),
    [decodeTileReference(cfg, tensors, latent)],
    h,
    w,
    whole,
    cfg.patchSize,
  );
}

/**
 * A video [3, F, H, W] in [−1, 1] (F = 1 + 4k) → the latent the pipeline conditions on,
 * [z_dim, 1 + k, H/(8p), W/(8p)]: patchified, encoded the first frame alone and then 4 frames a
 * chunk as diffusers' _encode, quant_conv, the posterior's mean (its mode), normalised
 * ((mean − latents_mean) / latents_std, WanImageToVideoPipeline).
 */
export function encodeWanVaeReference(cfg: WanVaeConfig, tensors: TensorMap, video: Tensor): Tensor {
  const frames = patchify(video, cfg.patchSize);
  const chunk = framesOfChunk(cfg, false);
  if ((frames.frames - 1) % chunk) throw new Error(`the encoder takes 1 + ${chunk}k frames, got ${frames.frames}`);
  const weights = weightsOf(tensors);
  const plan = encoderPlan(cfg);
  const caches = emptyCaches(plan, frames.height, frames.width);
  const frameSize = frames.channels * frames.height * frames.width;
  const chunks: Frames[] = [];
  for (let from = 0; from < frames.frames; from += from === 0 ? 1 : chunk) {
    const n = from === 0 ? 1 : chunk;
    const x = framesOf(
      n,
      frames.channels,
      frames.height,
      frames.width,
      frames.data.slice(from * frameSize, (from + n) * frameSize),
    );
    chunks.push(runLayers(plan.layers, x, caches, weights, from === 0));
  }
  const moments = causalConv(quantConv(cfg), joinFrames(chunks), caches, weights); // [T, 2·z_dim, h, w]
  const { frames: T, height: h, width: w } = moments;
  const Z = cfg.zDim;
  const plane = h * w;
  const latent = new Float32Array(Z * T * plane);
  for (let c = 0; c < Z; c++)
    for (let t = 0; t < T; t++)
      for (let p = 0; p < plane; p++)
        latent[(c * T + t) * plane + p] =
          (moments.data[(t * 2 * Z + c) * plane + p] - cfg.latentsMean[c]) / cfg.latentsStd[c];
  return { shape: [Z, T, h, w], data: latent };
}
