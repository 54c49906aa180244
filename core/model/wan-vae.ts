// Wan2.1's VAE (diffusers' AutoencoderKLWan, autoencoder_kl_wan.py) as the published folder holds it
// in vae/: config.json and one diffusion_pytorch_model.safetensors with the encoder's and the
// decoder's tensors. ditswarm decodes only: latents [16, T, h, w] → video [3, 1 + 4(T−1), 8h, 8w].
//
// This file holds the layout (every tensor's name and shape, from the modules' structure), the
// decoder as a list of layers that both the plain TypeScript reference below and the ONNX graphs
// (wan-vae-graphs.ts) walk, and diffusers' spatial tiling. What the decoder does, per diffusers:
//   - latents are un-normalised (z·std + mean, WanPipeline), then post_quant_conv (1×1×1);
//   - the decoder runs one latent frame at a time ("chunks"), each causal 3D convolution keeping the
//     last two frames of its input (CACHE_T) for the next chunk: the same as one causal convolution
//     over the whole sequence, zero-padded in front;
//   - an up-block with temporal upsampling skips its time_conv on the first chunk (diffusers' "Rep"):
//     that chunk stays one frame, and the time_conv's history starts after it, with zeros; later
//     chunks double in time (1 → 2 → 4 frames), so T latents give 1 + 4(T−1) frames;
//   - norms are F.normalize over channels · √C · γ; attention is one head over a frame's pixels.
// Tensors here are frame-major, [frames, channels, height, width]: every 2D operation is per frame.

import { readTensor, type TensorMap } from '../safetensors.ts';
import { sizeOf, type Tensor } from '../tensor.ts';
import { openCheckpoint } from './checkpoint.ts';
import { checkShapes, ModelConfigError } from './config.ts';
import { readJson, type ModelFiles } from './files.ts';

export const WAN_VAE_CLASS = 'AutoencoderKLWan';
export const VAE_CONFIG = 'vae/config.json';
export const VAE_WEIGHTS = 'vae/diffusion_pytorch_model.safetensors';
/** frames of a causal convolution's input each chunk keeps for the next */
export const CACHE_FRAMES = 2;

export interface WanVaeConfig {
  baseDim: number;
  decoderBaseDim: number;
  zDim: number;
  dimMult: number[];
  numResBlocks: number;
  /** the encoder's temporal downsampling per block; the decoder's up-blocks upsample in reverse order */
  temporalDownsample: boolean[];
  latentsMean: number[];
  latentsStd: number[];
}

export function isWanVaeConfig(json: unknown): boolean {
  return (json as { _class_name?: unknown } | null)?._class_name === WAN_VAE_CLASS;
}

/** diffusers' AutoencoderKLWan config.json as ditswarm decodes it: Wan2.1's VAE. Wan2.2's (residual blocks, patches) is refused by name. */
export function parseWanVaeConfig(json: unknown, source: string): WanVaeConfig {
  const c = (json ?? {}) as Record<string, unknown>;
  const fail = (what: string) => new ModelConfigError(`${source}: ${what}`);
  const whole = (key: string, fallback: number) => {
    const v = c[key] ?? fallback;
    if (!Number.isInteger(v) || (v as number) < 1)
      throw fail(`${key} must be a whole number ≥ 1, got ${JSON.stringify(v)}`);
    return v as number;
  };
  if (c.is_residual === true)
    throw fail("is_residual is true (Wan2.2's VAE): ditswarm decodes Wan2.1's AutoencoderKLWan");
  if (c.patch_size !== undefined && c.patch_size !== null)
    throw fail(`patch_size ${JSON.stringify(c.patch_size)} (Wan2.2's VAE): ditswarm decodes Wan2.1's AutoencoderKLWan`);
  for (const [key, wanted] of [
    ['scale_factor_temporal', 4],
    ['scale_factor_spatial', 8],
    ['in_channels', 3],
    ['out_channels', 3],
  ] as const) {
    if (c[key] !== undefined && c[key] !== null && c[key] !== wanted)
      throw fail(`${key} is ${JSON.stringify(c[key])}; Wan2.1's VAE has ${wanted}`);
  }
  const baseDim = whole('base_dim', 96);
  const zDim = whole('z_dim', 16);
  const dimMult = (c.dim_mult ?? [1, 2, 4, 4]) as unknown;
  // four blocks: three spatial doublings, the ×8 every latent pixel decodes to
  if (!Array.isArray(dimMult) || dimMult.length !== 4 || !dimMult.every((m) => Number.isInteger(m) && m >= 1))
    throw fail(
      `dim_mult must be 4 whole numbers ≥ 1 (Wan2.1's VAE: 8 pixels a latent pixel), got ${JSON.stringify(dimMult)}`,
    );
  if (Array.isArray(c.attn_scales) && c.attn_scales.length)
    throw fail(`attn_scales ${JSON.stringify(c.attn_scales)}: Wan2.1's VAE has no attention in its down-blocks ([])`);
  const temporal = (c.temperal_downsample ?? [false, true, true]) as unknown;
  if (
    !Array.isArray(temporal) ||
    temporal.length !== dimMult.length - 1 ||
    !temporal.every((t) => typeof t === 'boolean')
  ) {
    throw fail(
      `temperal_downsample must be ${dimMult.length - 1} booleans (one per downsampling block), got ${JSON.stringify(temporal)}`,
    );
  }
  if (temporal.filter(Boolean).length !== 2)
    throw fail(
      `temperal_downsample ${JSON.stringify(temporal)} halves time ${temporal.filter(Boolean).length} times; Wan2.1's VAE (4 frames a latent) halves it twice`,
    );
  const stats = (key: string) => {
    const v = c[key];
    if (!Array.isArray(v) || v.length !== zDim || !v.every((x) => typeof x === 'number' && Number.isFinite(x)))
      throw fail(`${key} must be ${zDim} numbers (one per latent channel), got ${JSON.stringify(v)}`);
    return v as number[];
  };
  const latentsStd = stats('latents_std');
  if (!latentsStd.every((s) => s > 0)) throw fail('latents_std must be positive');
  const decoderBaseDim =
    c.decoder_base_dim === undefined || c.decoder_base_dim === null ? baseDim : whole('decoder_base_dim', baseDim);
  for (const dim of [baseDim, decoderBaseDim])
    if (dim % 2) throw fail(`base widths must be even (the decoder halves them before each up-block), got ${dim}`);
  return {
    baseDim,
    decoderBaseDim,
    zDim,
    dimMult,
    numResBlocks: whole('num_res_blocks', 2),
    temporalDownsample: temporal,
    latentsMean: stats('latents_mean'),
    latentsStd,
  };
}

/** A 3D convolution whose time is padded in front only; 3×3×3 ones keep a cache (`cache`: its slot). */
export interface CausalConv {
  name: string;
  inDim: number;
  outDim: number;
  /** 3 (3×3×3), or 1 (1×1×1: shortcuts, post_quant_conv) */
  kernel: 3 | 1;
  cache: number | null;
}

/** The decoder's layers in the order they run. */
export type DecoderLayer =
  | { kind: 'conv'; conv: CausalConv }
  | {
      kind: 'residual';
      name: string;
      inDim: number;
      outDim: number;
      conv1: CausalConv;
      conv2: CausalConv;
      shortcut: CausalConv | null;
    }
  | { kind: 'attention'; name: string; dim: number }
  /** nearest ×2 and a 3×3 conv to outDim; `timeConv` (dim → 2·dim, 3×1×1) doubles time first, except on the first chunk */
  | { kind: 'upsample'; name: string; dim: number; outDim: number; timeConv: (CausalConv & { cache: number }) | null }
  /** norm_out, SiLU, conv_out */
  | { kind: 'head'; name: string; dim: number; conv: CausalConv };

/** A causal cache: its channels and the spatial scale of its level (1 at the latent's size, 8 at the video's). */
export interface CacheSlot {
  channels: number;
  scale: number;
}

export interface DecoderPlan {
  layers: DecoderLayer[];
  caches: CacheSlot[];
}

/** WanDecoder3d's structure, from diffusers: dims [4,4,2,1]·base after the middle, halved into each later up-block. */
export function decoderPlan(cfg: WanVaeConfig): DecoderPlan {
  const caches: CacheSlot[] = [];
  let scale = 1;
  const conv = (name: string, inDim: number, outDim: number, kernel: 3 | 1): CausalConv => {
    if (kernel === 1) return { name, inDim, outDim, kernel, cache: null };
    caches.push({ channels: inDim, scale });
    return { name, inDim, outDim, kernel, cache: caches.length - 1 };
  };
  const residual = (name: string, inDim: number, outDim: number): DecoderLayer => ({
    kind: 'residual',
    name,
    inDim,
    outDim,
    conv1: conv(`${name}.conv1`, inDim, outDim, 3),
    conv2: conv(`${name}.conv2`, outDim, outDim, 3),
    shortcut: inDim === outDim ? null : conv(`${name}.conv_shortcut`, inDim, outDim, 1),
  });
  const mult = cfg.dimMult;
  const dims = [mult[mult.length - 1], ...[...mult].reverse()].map((m) => m * cfg.decoderBaseDim);
  const temporalUpsample = [...cfg.temporalDownsample].reverse();
  const layers: DecoderLayer[] = [{ kind: 'conv', conv: conv('decoder.conv_in', cfg.zDim, dims[0], 3) }];
  layers.push(residual('decoder.mid_block.resnets.0', dims[0], dims[0]));
  layers.push({ kind: 'attention', name: 'decoder.mid_block.attentions.0', dim: dims[0] });
  layers.push(residual('decoder.mid_block.resnets.1', dims[0], dims[0]));
  for (let i = 0; i < mult.length; i++) {
    const name = `decoder.up_blocks.${i}`;
    let inDim = i > 0 ? dims[i] / 2 : dims[i];
    const outDim = dims[i + 1];
    for (let r = 0; r <= cfg.numResBlocks; r++, inDim = outDim)
      layers.push(residual(`${name}.resnets.${r}`, inDim, outDim));
    if (i === mult.length - 1) break;
    const up = `${name}.upsamplers.0`;
    const timeConv = temporalUpsample[i]
      ? (conv(`${up}.time_conv`, outDim, 2 * outDim, 3) as CausalConv & { cache: number })
      : null;
    layers.push({ kind: 'upsample', name: up, dim: outDim, outDim: outDim / 2, timeConv });
    scale *= 2;
  }
  const last = dims[dims.length - 1];
  layers.push({ kind: 'head', name: 'decoder', dim: last, conv: conv('decoder.conv_out', last, 3, 3) });
  return { layers, caches };
}

/** Frames a decoder chunk makes at each latent frame: 1 for the first, 2^(temporal upsamplings) after. */
export function framesOfChunk(cfg: WanVaeConfig, first: boolean): number {
  return first ? 1 : 2 ** cfg.temporalDownsample.filter(Boolean).length;
}

export function videoFrames(cfg: WanVaeConfig, latentFrames: number): number {
  return 1 + framesOfChunk(cfg, false) * (latentFrames - 1);
}

/** A time_conv's weight is [2·dim, dim, 3, 1, 1]; every other 3-kernel conv's [out, in, 3, 3, 3]. */
function convShape(c: CausalConv, timeConv = false): number[] {
  return c.kernel === 1
    ? [c.outDim, c.inDim, 1, 1, 1]
    : timeConv
      ? [c.outDim, c.inDim, 3, 1, 1]
      : [c.outDim, c.inDim, 3, 3, 3];
}

/** The decoder's tensors (post_quant_conv's and decoder.*) and their shapes, as the published file holds them. */
export function decoderWeightShapes(cfg: WanVaeConfig): Map<string, number[]> {
  const shapes = new Map<string, number[]>();
  const conv = (c: CausalConv, timeConv = false) =>
    shapes.set(`${c.name}.weight`, convShape(c, timeConv)).set(`${c.name}.bias`, [c.outDim]);
  conv({ name: 'post_quant_conv', inDim: cfg.zDim, outDim: cfg.zDim, kernel: 1, cache: null });
  for (const layer of decoderPlan(cfg).layers) {
    if (layer.kind === 'conv') conv(layer.conv);
    else if (layer.kind === 'residual') {
      shapes.set(`${layer.name}.norm1.gamma`, [layer.inDim, 1, 1, 1]);
      conv(layer.conv1);
      shapes.set(`${layer.name}.norm2.gamma`, [layer.outDim, 1, 1, 1]);
      conv(layer.conv2);
      if (layer.shortcut) conv(layer.shortcut);
    } else if (layer.kind === 'attention') {
      shapes.set(`${layer.name}.norm.gamma`, [layer.dim, 1, 1]);
      shapes
        .set(`${layer.name}.to_qkv.weight`, [3 * layer.dim, layer.dim, 1, 1])
        .set(`${layer.name}.to_qkv.bias`, [3 * layer.dim]);
      shapes.set(`${layer.name}.proj.weight`, [layer.dim, layer.dim, 1, 1]).set(`${layer.name}.proj.bias`, [layer.dim]);
    } else if (layer.kind === 'upsample') {
      shapes
        .set(`${layer.name}.resample.1.weight`, [layer.outDim, layer.dim, 3, 3])
        .set(`${layer.name}.resample.1.bias`, [layer.outDim]);
      if (layer.timeConv) conv(layer.timeConv, true);
    } else {
      shapes.set(`${layer.name}.norm_out.gamma`, [layer.dim, 1, 1, 1]);
      conv(layer.conv);
    }
  }
  return shapes;
}

/**
 * Every tensor of the published file: the encoder's (WanEncoder3d: down-blocks as one flat list of
 * residual blocks and resamplers, a middle block, a head to 2·z_dim, quant_conv) and the decoder's.
 */
export function wanVaeWeightShapes(cfg: WanVaeConfig): Map<string, number[]> {
  const shapes = new Map<string, number[]>();
  const conv = (name: string, inDim: number, outDim: number, kernel: number[]) =>
    shapes.set(`${name}.weight`, [outDim, inDim, ...kernel]).set(`${name}.bias`, [outDim]);
  const cube = [3, 3, 3];
  const residual = (name: string, inDim: number, outDim: number) => {
    shapes.set(`${name}.norm1.gamma`, [inDim, 1, 1, 1]);
    conv(`${name}.conv1`, inDim, outDim, cube);
    shapes.set(`${name}.norm2.gamma`, [outDim, 1, 1, 1]);
    conv(`${name}.conv2`, outDim, outDim, cube);
    if (inDim !== outDim) conv(`${name}.conv_shortcut`, inDim, outDim, [1, 1, 1]);
  };
  const dims = [1, ...cfg.dimMult].map((m) => m * cfg.baseDim);
  conv('encoder.conv_in', 3, dims[0], cube);
  let index = 0;
  for (let i = 0; i < cfg.dimMult.length; i++) {
    let inDim = dims[i];
    for (let r = 0; r < cfg.numResBlocks; r++, inDim = dims[i + 1])
      residual(`encoder.down_blocks.${index++}`, inDim, dims[i + 1]);
    if (i === cfg.dimMult.length - 1) continue;
    const name = `encoder.down_blocks.${index++}`;
    conv(`${name}.resample.1`, dims[i + 1], dims[i + 1], [3, 3]);
    if (cfg.temporalDownsample[i]) conv(`${name}.time_conv`, dims[i + 1], dims[i + 1], [3, 1, 1]);
  }
  const last = dims[dims.length - 1];
  residual('encoder.mid_block.resnets.0', last, last);
  shapes.set('encoder.mid_block.attentions.0.norm.gamma', [last, 1, 1]);
  conv('encoder.mid_block.attentions.0.to_qkv', last, 3 * last, [1, 1]);
  conv('encoder.mid_block.attentions.0.proj', last, last, [1, 1]);
  residual('encoder.mid_block.resnets.1', last, last);
  shapes.set('encoder.norm_out.gamma', [last, 1, 1, 1]);
  conv('encoder.conv_out', last, 2 * cfg.zDim, cube);
  conv('quant_conv', 2 * cfg.zDim, 2 * cfg.zDim, [1, 1, 1]);
  for (const [name, shape] of decoderWeightShapes(cfg)) shapes.set(name, shape);
  return shapes;
}

// ---------------------------------------------------------------------------------------------
// The plain TypeScript reference, frame by frame as diffusers' _decode runs it.

/** [frames, channels, height, width] */
export interface Frames {
  frames: number;
  channels: number;
  height: number;
  width: number;
  data: Float32Array;
}

const framesOf = (
  frames: number,
  channels: number,
  height: number,
  width: number,
  data = new Float32Array(frames * channels * height * width),
): Frames => ({ frames, channels, height, width, data });

/** Frame t of a latent [C, T, h, w]: one chunk's input, as the transformer made it. */
export function latentSlice(latent: Tensor, t: number): Frames {
  const [C, T, h, w] = latent.shape;
  const plane = h * w;
  const out = framesOf(1, C, h, w);
  for (let c = 0; c < C; c++)
    out.data.set(latent.data.subarray((c * T + t) * plane, (c * T + t + 1) * plane), c * plane);
  return out;
}

/** Frame t un-normalised (z·std + mean), as WanPipeline does before decoding. */
function latentFrame(cfg: WanVaeConfig, latent: Tensor, t: number): Frames {
  const z = latentSlice(latent, t);
  const plane = z.height * z.width;
  for (let c = 0; c < z.channels; c++)
    for (let p = 0; p < plane; p++)
      z.data[c * plane + p] = z.data[c * plane + p] * cfg.latentsStd[c] + cfg.latentsMean[c];
  return z;
}

/** 2D convolution of every frame, stride 1, zero padding k/2: adds into `out` (which holds the bias or a partial sum). */
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

/** The causal caches of one tile: zeros before the first chunk, each [2, channels, h·scale, w·scale]. */
export function emptyCaches(plan: DecoderPlan, h: number, w: number): Frames[] {
  return plan.caches.map(({ channels, scale }) => framesOf(CACHE_FRAMES, channels, h * scale, w * scale));
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

/** One chunk through post_quant_conv and the decoder: one latent frame → 1 (first) or 4 frames [F, 3, 8h, 8w], before clamping. */
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

export function joinFrames(chunks: Frames[]): Frames {
  const [{ channels, height, width }] = chunks;
  const out = framesOf(
    chunks.reduce((n, c) => n + c.frames, 0),
    channels,
    height,
    width,
  );
  let at = 0;
  for (const c of chunks) out.data.set(c.data, (at += c.data.length) - c.data.length);
  return out;
}

// ---------------------------------------------------------------------------------------------
// diffusers' tiled decode: overlapping tiles of the latent, decoded on their own, blended.

/** diffusers' defaults: 256-pixel tiles every 192 pixels */
export const TILE_PIXELS = 256;
export const TILE_STRIDE_PIXELS = 192;
const SPATIAL = 8;

/** A tile: latent rows [y, y + height) and columns [x, x + width); row and column in the grid. */
export interface VaeTile {
  row: number;
  col: number;
  y: number;
  x: number;
  height: number;
  width: number;
}

export interface Tiling {
  /** tile and stride in video pixels (multiples of 8) */
  tile: number;
  stride: number;
}

/** The tiles diffusers' tiled_decode makes of an h×w latent (one tile when it fits in one, as _decode decides). */
export function tilesOf(h: number, w: number, { tile, stride }: Tiling): VaeTile[] {
  const [t, s] = [tile / SPATIAL, stride / SPATIAL];
  if (h <= t && w <= t) return [{ row: 0, col: 0, y: 0, x: 0, height: h, width: w }];
  const tiles: VaeTile[] = [];
  for (let y = 0, row = 0; y < h; y += s, row++)
    for (let x = 0, col = 0; x < w; x += s, col++)
      tiles.push({ row, col, y, x, height: Math.min(t, h - y), width: Math.min(t, w - x) });
  return tiles;
}

/** Tile `tile`'s latent [C, T, tile.height, tile.width] cut from [C, T, h, w]. */
export function cutTile(latent: Tensor, tile: VaeTile): Tensor {
  const [C, T, h, w] = latent.shape;
  const data = new Float32Array(C * T * tile.height * tile.width);
  for (let ct = 0; ct < C * T; ct++)
    for (let y = 0; y < tile.height; y++) {
      const from = (ct * h + tile.y + y) * w + tile.x;
      data.set(latent.data.subarray(from, from + tile.width), (ct * tile.height + y) * tile.width);
    }
  return { shape: [C, T, tile.height, tile.width], data };
}

/**
 * Decoded tiles blended as tiled_decode blends them, in its order and in place (each tile takes
 * the rows above from the finished tile above it, then the columns to its left from the finished
 * tile before it), each cropped to the stride, joined, clamped to [−1, 1]: video [3, F, 8h, 8w].
 */
export function blendTiles(tiles: VaeTile[], decoded: Frames[], h: number, w: number, tiling: Tiling): Tensor {
  const { frames: F, channels: C } = decoded[0];
  const [H, W] = [h * SPATIAL, w * SPATIAL];
  const blend = tiling.tile - tiling.stride;
  const byPlace = new Map(tiles.map((t, i) => [`${t.row},${t.col}`, decoded[i]]));
  const single = tiles.length === 1;
  const out = new Float32Array(C * F * H * W);
  for (const [i, tile] of tiles.entries()) {
    const b = decoded[i];
    const above = byPlace.get(`${tile.row - 1},${tile.col}`);
    const left = byPlace.get(`${tile.row},${tile.col - 1}`);
    const at = (f: Frames, t: number, c: number, y: number, x: number) => ((t * C + c) * f.height + y) * f.width + x;
    if (above) {
      const extent = Math.min(above.height, b.height, blend);
      for (let t = 0; t < F; t++)
        for (let c = 0; c < C; c++)
          for (let y = 0; y < extent; y++)
            for (let x = 0; x < b.width; x++)
              b.data[at(b, t, c, y, x)] =
                above.data[at(above, t, c, above.height - extent + y, x)] * (1 - y / extent) +
                b.data[at(b, t, c, y, x)] * (y / extent);
    }
    if (left) {
      const extent = Math.min(left.width, b.width, blend);
      for (let t = 0; t < F; t++)
        for (let c = 0; c < C; c++)
          for (let y = 0; y < b.height; y++)
            for (let x = 0; x < extent; x++)
              b.data[at(b, t, c, y, x)] =
                left.data[at(left, t, c, y, left.width - extent + x)] * (1 - x / extent) +
                b.data[at(b, t, c, y, x)] * (x / extent);
    }
    // the part of this tile the video keeps: up to the stride (all of it when it is the only one)
    const [y0, x0] = [tile.y * SPATIAL, tile.x * SPATIAL];
    const keepH = single ? b.height : Math.min(tiling.stride, b.height, H - y0);
    const keepW = single ? b.width : Math.min(tiling.stride, b.width, W - x0);
    for (let t = 0; t < F; t++)
      for (let c = 0; c < C; c++)
        for (let y = 0; y < keepH; y++)
          for (let x = 0; x < keepW; x++)
            out[((c * F + t) * H + y0 + y) * W + x0 + x] = Math.min(1, Math.max(-1, b.data[at(b, t, c, y, x)]));
  }
  return { shape: [C, F, H, W], data: out };
}

/** The whole video by the reference, untiled as diffusers' _decode: [3, F, 8h, 8w] in [−1, 1]. */
export function decodeWanVaeReference(cfg: WanVaeConfig, tensors: TensorMap, latent: Tensor): Tensor {
  const [, , h, w] = latent.shape;
  const whole = { tile: Math.max(h, w) * SPATIAL, stride: Math.max(h, w) * SPATIAL };
  return blendTiles(tilesOf(h, w, whole), [decodeTileReference(cfg, tensors, latent)], h, w, whole);
}

/** Bytes of a tile's causal caches in float32. */
export function cacheBytes(plan: DecoderPlan, h: number, w: number): number {
  return plan.caches.reduce(
    (n, { channels, scale }) => n + 4 * sizeOf([CACHE_FRAMES, channels, h * scale, w * scale]),
    0,
  );
}

/** A folder's vae/, opened and checked: its config, and the decoder's tensors when asked for. */
export interface WanVaeCheckpoint {
  config: WanVaeConfig;
  /** post_quant_conv's and the decoder's tensors, float32 (the encoder's are not read) */
  decoderTensors(): Promise<TensorMap>;
  /** bytes the decoder's tensors take in the file */
  decoderBytes: number;
}

/**
 * Opens vae/ of a model folder: its config and its file's header, the decoder's tensors checked
 * against the config (names and shapes) before any is read. The encoder's tensors are left alone.
 */
export async function openWanVae(files: ModelFiles): Promise<WanVaeCheckpoint> {
  const config = parseWanVaeConfig(await readJson(files, VAE_CONFIG), VAE_CONFIG);
  const checkpoint = await openCheckpoint(files, 'vae', 'diffusion_pytorch_model');
  const isDecoder = (name: string) => name.startsWith('decoder.') || name.startsWith('post_quant_conv.');
  const entries = new Map([...checkpoint.tensors].filter(([name]) => isDecoder(name)));
  if (!entries.size)
    throw new ModelConfigError(
      `${checkpoint.source} holds no decoder tensors (decoder.*, post_quant_conv.*): it is not AutoencoderKLWan's, as ${VAE_CONFIG} says`,
    );
  checkShapes(decoderWeightShapes(config), entries, checkpoint.source);
  return {
    config,
    decoderBytes: [...entries.values()].reduce((n, e) => n + e.end - e.begin, 0),
    async decoderTensors() {
      const tensors: TensorMap = new Map();
      for (const [name, entry] of entries) tensors.set(name, await readTensor(files, entry));
      return tensors;
    },
  };
}
