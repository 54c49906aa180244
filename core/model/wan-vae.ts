// diffusers' AutoencoderKLWan (autoencoder_kl_wan.py) as the published folder holds it in vae/:
// config.json and one diffusion_pytorch_model.safetensors with the encoder's and the decoder's
// tensors. Two variants: Wan2.1's (latents [16, T, h, w] ↔ video [3, 1 + 4(T−1), 8h, 8w]) and
// Wan2.2's (is_residual, 2×2 patches: latents [48, T, h, w] ↔ video [3, 1 + 4(T−1), 16h, 16w]).
//
// This file holds the config, the layout (every tensor's name and shape, from the modules'
// structure) and the encoder and the decoder as plans, lists of layers that both the plain
// TypeScript reference (wan-vae-reference.ts) and the ONNX graphs (wan-vae-graphs.ts) walk;
// diffusers' spatial tiles are wan-vae-tiling.ts. What the VAE does, per diffusers:
//   - decoding: latents are un-normalised (z·std + mean, WanPipeline), then post_quant_conv (1×1×1);
//     the decoder runs one latent frame at a time ("chunks"), each causal 3D convolution keeping the
//     last two frames of its input (CACHE_T) for the next chunk: the same as one causal convolution
//     over the whole sequence, zero-padded in front;
//   - an up-block with temporal upsampling skips its time_conv on the first chunk (diffusers' "Rep"):
//     that chunk stays one frame, and the time_conv's history starts after it, with zeros; later
//     chunks double in time (1 → 2 → 4 frames), so T latents give 1 + 4(T−1) frames;
//   - encoding: the first frame alone, then 4 frames a chunk; a downsampler with temporal
//     downsampling only keeps the first chunk's frame, later chunks halve in time (4 → 2 → 1) over
//     [that kept last frame, chunk]; quant_conv, and the posterior's mean, normalised, is the latent;
//   - Wan2.2's blocks add a shortcut of their input: AvgDown3D in the encoder (an average of channel,
//     time and pixel groups), DupUp3D in the decoder (their repetition; the first chunk keeps its last
//     frame); the decoder's 12 channels unpatchify to 3 at twice the size, the encoder's input is the
//     video patchified;
//   - norms are F.normalize over channels · √C · γ; attention is one head over a frame's pixels.
// Tensors here are frame-major, [frames, channels, height, width]: every 2D operation is per frame.

import { readTensors, type TensorMap } from '../safetensors.ts';
import { sizeOf, type Tensor } from '../tensor.ts';
import { openCheckpoint } from './checkpoint.ts';
import { checkShapes, ModelConfigError } from './config.ts';
import { readJson, type LoadProgress, type ModelFiles } from './files.ts';

export const WAN_VAE_CLASS = 'AutoencoderKLWan';
export const VAE_CONFIG = 'vae/config.json';
export const VAE_WEIGHTS = 'vae/diffusion_pytorch_model.safetensors';
/** frames of a causal convolution's input each chunk keeps for the next */
export const CACHE_FRAMES = 2;
/** video pixels a latent pixel decodes to, each way (scale_factor_spatial) */
export const SCALE_FACTOR_SPATIAL = 8;

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
  /** Wan2.2's blocks: AvgDown3D / DupUp3D shortcuts around each down- and up-block, no halving into up-blocks */
  isResidual: boolean;
  /** the side of the pixel patches folded into channels before the encoder and unfolded after the decoder */
  patchSize: number;
}

const isWholeNumbers = (v: unknown): v is number[] =>
  Array.isArray(v) && v.every((m) => Number.isInteger(m) && (m as number) >= 1);
const isBooleans = (v: unknown): v is boolean[] => Array.isArray(v) && v.every((t) => typeof t === 'boolean');

export function isWanVaeConfig(json: unknown): boolean {
  return (json as { _class_name?: unknown } | null)?._class_name === WAN_VAE_CLASS;
}

/** The fields that tell the two published VAEs apart, as each config.json has them; null is diffusers' default. */
const VARIANTS = {
  "Wan2.1's VAE": {
    is_residual: false,
    patch_size: null,
    in_channels: 3,
    out_channels: 3,
    scale_factor_temporal: 4,
    scale_factor_spatial: SCALE_FACTOR_SPATIAL,
  },
  "Wan2.2's VAE": {
    is_residual: true,
    patch_size: 2,
    in_channels: 12,
    out_channels: 12,
    scale_factor_temporal: 4,
    scale_factor_spatial: 2 * SCALE_FACTOR_SPATIAL,
  },
} as const;

/**
 * AutoencoderKLWan's config.json as ditswarm runs it: Wan2.1's VAE, or Wan2.2's (is_residual, 2×2
 * patches, 16× spatially); any other mix of the fields that tell them apart is refused.
 */
export function parseWanVaeConfig(json: unknown, source: string): WanVaeConfig {
  const c = (json ?? {}) as Record<string, unknown>;
  const fail = (what: string) => new ModelConfigError(`${source}: ${what}`);
  const whole = (key: string, fallback: number) => {
    const v = c[key] ?? fallback;
    if (!Number.isInteger(v) || (v as number) < 1)
      throw fail(`${key} must be a whole number ≥ 1, got ${JSON.stringify(v)}`);
    return v as number;
  };
  const isResidual = c.is_residual === true;
  const variant = isResidual ? "Wan2.2's VAE" : "Wan2.1's VAE";
  const fields = VARIANTS[variant];
  if (!isResidual && c.patch_size !== undefined && c.patch_size !== null)
    throw fail(
      `patch_size ${JSON.stringify(c.patch_size)} (Wan2.2's VAE) without is_residual true: ${variant} has none`,
    );
  for (const [key, wanted] of Object.entries(fields)) {
    // diffusers' __init__ defaults are Wan2.1's: an absent field is Wan2.1's value
    const given = c[key] ?? VARIANTS["Wan2.1's VAE"][key as keyof typeof fields];
    if (given !== wanted)
      throw fail(
        (isResidual ? "is_residual is true (Wan2.2's VAE): " : '') +
          `${key} is ${JSON.stringify(given)}; ${variant} has ${JSON.stringify(wanted)}`,
      );
  }
  const baseDim = whole('base_dim', 96);
  const zDim = whole('z_dim', 16);
  const dimMult = (c.dim_mult ?? [1, 2, 4, 4]) as unknown;
  // four blocks: three spatial doublings, the ×8 every latent pixel decodes to before unpatchify
  if (!isWholeNumbers(dimMult) || dimMult.length !== 4)
    throw fail(
      `dim_mult must be 4 whole numbers ≥ 1 (Wan2.1's VAE: 8 pixels a latent pixel), got ${JSON.stringify(dimMult)}`,
    );
  if (Array.isArray(c.attn_scales) && c.attn_scales.length)
    throw fail(`attn_scales ${JSON.stringify(c.attn_scales)}: Wan2.1's VAE has no attention in its down-blocks ([])`);
  const temporal = (c.temperal_downsample ?? [false, true, true]) as unknown;
  if (!isBooleans(temporal) || temporal.length !== dimMult.length - 1) {
    throw fail(
      `temperal_downsample must be ${dimMult.length - 1} booleans (one per downsampling block), ` +
        `got ${JSON.stringify(temporal)}`,
    );
  }
  if (temporal.filter(Boolean).length !== 2)
    throw fail(
      `temperal_downsample ${JSON.stringify(temporal)} halves time ${temporal.filter(Boolean).length} times; ` +
        "Wan2.1's VAE (4 frames a latent) halves it twice",
    );
  const stats = (key: string) => {
    const v = c[key];
    if (!Array.isArray(v) || v.length !== zDim || !v.every((x) => typeof x === 'number' && Number.isFinite(x)))
      throw fail(`${key} must be ${zDim} numbers (one per latent channel), got ${JSON.stringify(v)}`);
    return v as number[];
  };
  const latentsStd = stats('latents_std');
  if (!latentsStd.every((s) => s > 0)) throw fail('latents_std must be positive');
  const decoderBaseDim = whole('decoder_base_dim', baseDim);
  if (!isResidual)
    for (const dim of [baseDim, decoderBaseDim])
      if (dim % 2) throw fail(`base widths must be even (the decoder halves them before each up-block), got ${dim}`);
  const cfg: WanVaeConfig = {
    baseDim,
    decoderBaseDim,
    zDim,
    dimMult,
    numResBlocks: whole('num_res_blocks', 2),
    temporalDownsample: temporal,
    latentsMean: stats('latents_mean'),
    latentsStd,
    isResidual,
    patchSize: fields.patch_size ?? 1,
  };
  // AvgDown3D averages whole groups of its input's values, DupUp3D repeats its input's channels a whole number of times
  for (const l of [...encoderPlan(cfg).layers, ...decoderPlan(cfg).layers])
    if (l.kind === 'shortcut') {
      const [from, to] = l.direction === 'down' ? [l.inDim, l.outDim] : [l.outDim, l.inDim];
      if ((from * l.factorT * l.factorS ** 2) % to)
        throw fail(
          `${l.name}'s shortcut maps ${l.inDim} channels to ${l.outDim} by ${l.factorT}×${l.factorS}×${l.factorS}: ` +
            `${from}·${l.factorT * l.factorS ** 2} does not divide by ${to}; give dim_mult whose steps are ×1 or ×2`,
        );
    }
  return cfg;
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

type CachedConv = CausalConv & { cache: number };

/** The encoder's and the decoder's layers in the order they run. */
export type VaeLayer =
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
  /** nearest ×2 and a 3×3 conv to outDim; `timeConv` (dim → 2·dim, 3×1×1) doubles time first, but on the first chunk */
  | { kind: 'upsample'; name: string; dim: number; outDim: number; timeConv: CachedConv | null }
  /**
   * ZeroPad2d right and bottom, a 3×3 conv of stride 2; `timeConv` (3×1×1, stride 2, unpadded) then
   * halves time over [the cached last frame, chunk], but on the first chunk, which only fills the cache
   */
  | { kind: 'downsample'; name: string; dim: number; timeConv: CachedConv | null }
  /** a residual block's input, kept for its `shortcut` layer */
  | { kind: 'keep' }
  /**
   * AvgDown3D ('down': each output channel the mean of a group of the input's channels × time × space
   * offsets, time zero-padded in front to a multiple of factorT) or DupUp3D ('up': the inverse
   * reading, the first chunk's frames but the last dropped), of the kept input, added
   */
  | {
      kind: 'shortcut';
      name: string;
      direction: 'down' | 'up';
      inDim: number;
      outDim: number;
      factorT: number;
      factorS: number;
    }
  /** norm_out, SiLU, conv_out */
  | { kind: 'head'; name: string; dim: number; conv: CausalConv };

/**
 * A cache: its frames (two for a causal convolution, the last one for a strided time_conv), its
 * channels, and the spatial scale of its level against the chunk's input (the decoder's grow from
 * 1 at the latent, the encoder's shrink from 1 at the patched video).
 */
export interface CacheSlot {
  frames: number;
  channels: number;
  scale: number;
}

export interface VaePlan {
  layers: VaeLayer[];
  caches: CacheSlot[];
}

/** Convolutions and blocks numbered into one plan's caches, at the spatial scale the plan has reached. */
function planBuilder() {
  const caches: CacheSlot[] = [];
  let scale = 1;
  const conv = (name: string, inDim: number, outDim: number, kernel: 3 | 1, frames = CACHE_FRAMES): CausalConv => {
    if (kernel === 1) return { name, inDim, outDim, kernel, cache: null };
    caches.push({ frames, channels: inDim, scale });
    return { name, inDim, outDim, kernel, cache: caches.length - 1 };
  };
  const residual = (name: string, inDim: number, outDim: number): VaeLayer => ({
    kind: 'residual',
    name,
    inDim,
    outDim,
    conv1: conv(`${name}.conv1`, inDim, outDim, 3),
    conv2: conv(`${name}.conv2`, outDim, outDim, 3),
    shortcut: inDim === outDim ? null : conv(`${name}.conv_shortcut`, inDim, outDim, 1),
  });
  const midBlock = (name: string, dim: number): VaeLayer[] => [
    residual(`${name}.resnets.0`, dim, dim),
    { kind: 'attention', name: `${name}.attentions.0`, dim },
    residual(`${name}.resnets.1`, dim, dim),
  ];
  return {
    caches,
    conv,
    residual,
    midBlock,
    scaleBy: (factor: number) => (scale *= factor),
  };
}

/**
 * WanDecoder3d's structure, from diffusers: dims [4,4,2,1]·base after the middle; Wan2.1 halves
 * them into each later up-block, Wan2.2 keeps them and adds a DupUp3D shortcut around each
 * upsampling block.
 */
export function decoderPlan(cfg: WanVaeConfig): VaePlan {
  const b = planBuilder();
  const mult = cfg.dimMult;
  const dims = [mult[mult.length - 1], ...[...mult].reverse()].map((m) => m * cfg.decoderBaseDim);
  const temporalUpsample = [...cfg.temporalDownsample].reverse();
  const layers: VaeLayer[] = [{ kind: 'conv', conv: b.conv('decoder.conv_in', cfg.zDim, dims[0], 3) }];
  layers.push(...b.midBlock('decoder.mid_block', dims[0]));
  for (let i = 0; i < mult.length; i++) {
    const name = `decoder.up_blocks.${i}`;
    const up = i !== mult.length - 1;
    const blockIn = i > 0 && !cfg.isResidual ? dims[i] / 2 : dims[i];
    const outDim = dims[i + 1];
    if (up && cfg.isResidual) layers.push({ kind: 'keep' });
    for (let r = 0, inDim = blockIn; r <= cfg.numResBlocks; r++, inDim = outDim)
      layers.push(b.residual(`${name}.resnets.${r}`, inDim, outDim));
    if (!up) break;
    const upsampler = cfg.isResidual ? `${name}.upsampler` : `${name}.upsamplers.0`;
    const timeConv = temporalUpsample[i]
      ? (b.conv(`${upsampler}.time_conv`, outDim, 2 * outDim, 3) as CachedConv)
      : null;
    layers.push({
      kind: 'upsample',
      name: upsampler,
      dim: outDim,
      outDim: cfg.isResidual ? outDim : outDim / 2,
      timeConv,
    });
    if (cfg.isResidual)
      layers.push({
        kind: 'shortcut',
        name,
        direction: 'up',
        inDim: blockIn,
        outDim,
        factorT: temporalUpsample[i] ? 2 : 1,
        factorS: 2,
      });
    b.scaleBy(2);
  }
  const last = dims[dims.length - 1];
  const out = decoderOutputChannels(cfg);
  layers.push({ kind: 'head', name: 'decoder', dim: last, conv: b.conv('decoder.conv_out', last, out, 3) });
  return { layers, caches: b.caches };
}

/**
 * WanEncoder3d's structure, from diffusers: dims [1,1,2,4,4]·base; Wan2.1's down-blocks are one flat
 * list of residual blocks and resamplers, Wan2.2's are blocks of their own (resnets, a downsampler,
 * an AvgDown3D shortcut; the last block's shortcut is the identity). The head makes 2·z_dim channels.
 */
export function encoderPlan(cfg: WanVaeConfig): VaePlan {
  const b = planBuilder();
  const dims = [1, ...cfg.dimMult].map((m) => m * cfg.baseDim);
  const layers: VaeLayer[] = [{ kind: 'conv', conv: b.conv('encoder.conv_in', 3 * cfg.patchSize ** 2, dims[0], 3) }];
  let index = 0;
  for (let i = 0; i < cfg.dimMult.length; i++) {
    const down = i !== cfg.dimMult.length - 1;
    const temporal = down && cfg.temporalDownsample[i];
    const block = cfg.isResidual ? `encoder.down_blocks.${i}` : '';
    const [inDim, outDim] = [dims[i], dims[i + 1]];
    if (cfg.isResidual) layers.push({ kind: 'keep' });
    for (let r = 0, from = inDim; r < cfg.numResBlocks; r++, from = outDim)
      layers.push(
        b.residual(cfg.isResidual ? `${block}.resnets.${r}` : `encoder.down_blocks.${index++}`, from, outDim),
      );
    if (down) {
      const name = cfg.isResidual ? `${block}.downsampler` : `encoder.down_blocks.${index++}`;
      b.scaleBy(1 / 2);
      const timeConv = temporal ? (b.conv(`${name}.time_conv`, outDim, outDim, 3, 1) as CachedConv) : null;
      layers.push({ kind: 'downsample', name, dim: outDim, timeConv });
    }
    if (cfg.isResidual)
      layers.push({
        kind: 'shortcut',
        name: block,
        direction: 'down',
        inDim,
        outDim,
        factorT: temporal ? 2 : 1,
        factorS: down ? 2 : 1,
      });
  }
  const last = dims[dims.length - 1];
  layers.push(...b.midBlock('encoder.mid_block', last));
  layers.push({ kind: 'head', name: 'encoder', dim: last, conv: b.conv('encoder.conv_out', last, 2 * cfg.zDim, 3) });
  return { layers, caches: b.caches };
}

/** Frames a decoder chunk makes at each latent frame: 1 for the first, 2^(temporal upsamplings) after. */
export function framesOfChunk(cfg: WanVaeConfig, first: boolean): number {
  return first ? 1 : 2 ** cfg.temporalDownsample.filter(Boolean).length;
}

export function videoFrames(cfg: WanVaeConfig, latentFrames: number): number {
  return 1 + framesOfChunk(cfg, false) * (latentFrames - 1);
}

/** Video pixels a latent pixel stands for, each way (scale_factor_spatial): the decoder's ×8, times the patch. */
export function spatialScale(cfg: WanVaeConfig): number {
  return SCALE_FACTOR_SPATIAL * cfg.patchSize;
}

/** Channels the decoder's head makes: RGB for each pixel of a p×p patch (3, or Wan2.2's 12), before unpatchify. */
export function decoderOutputChannels(cfg: WanVaeConfig): number {
  return 3 * cfg.patchSize ** 2;
}

/**
 * What the decoder makes of n latent frames of h×w, a tile's first among them or not: frames
 * [F, 3·p², 8h, 8w], its ×8 with the patches still folded into channels (blendTiles unpatchifies
 * the blended whole, as diffusers' tiled_decode does).
 */
export function decodedFramesShape(
  cfg: WanVaeConfig,
  { frames, height, width, first }: { frames: number; height: number; width: number; first: boolean },
): [number, number, number, number] {
  const later = framesOfChunk(cfg, false);
  const F = first ? framesOfChunk(cfg, true) + later * (frames - 1) : later * frames;
  return [F, decoderOutputChannels(cfg), SCALE_FACTOR_SPATIAL * height, SCALE_FACTOR_SPATIAL * width];
}

/** A time_conv's weight is [out, in, 3, 1, 1]; every other 3-kernel conv's [out, in, 3, 3, 3]. */
function convShape(c: CausalConv, timeConv: boolean): number[] {
  return c.kernel === 1
    ? [c.outDim, c.inDim, 1, 1, 1]
    : timeConv
      ? [c.outDim, c.inDim, 3, 1, 1]
      : [c.outDim, c.inDim, 3, 3, 3];
}

/** The tensors of a plan's layers and their shapes, in the order the modules hold them. */
function layerShapes(layers: VaeLayer[], shapes: Map<string, number[]>): Map<string, number[]> {
  const conv = (c: CausalConv, timeConv = false) =>
    shapes.set(`${c.name}.weight`, convShape(c, timeConv)).set(`${c.name}.bias`, [c.outDim]);
  const resample = (name: string, inDim: number, outDim: number) =>
    shapes.set(`${name}.resample.1.weight`, [outDim, inDim, 3, 3]).set(`${name}.resample.1.bias`, [outDim]);
  for (const layer of layers) {
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
      resample(layer.name, layer.dim, layer.outDim);
      if (layer.timeConv) conv(layer.timeConv, true);
    } else if (layer.kind === 'downsample') {
      resample(layer.name, layer.dim, layer.dim);
      if (layer.timeConv) conv(layer.timeConv, true);
    } else if (layer.kind === 'head') {
      shapes.set(`${layer.name}.norm_out.gamma`, [layer.dim, 1, 1, 1]);
      conv(layer.conv);
    }
  }
  return shapes;
}

/** post_quant_conv, 1×1×1 on the latent before the decoder */
export const postQuantConv = (cfg: WanVaeConfig): CausalConv => ({
  name: 'post_quant_conv',
  inDim: cfg.zDim,
  outDim: cfg.zDim,
  kernel: 1,
  cache: null,
});

/** quant_conv, 1×1×1 on the encoder's 2·z_dim channels (the posterior's mean and log-variance) */
export const quantConv = (cfg: WanVaeConfig): CausalConv => ({
  name: 'quant_conv',
  inDim: 2 * cfg.zDim,
  outDim: 2 * cfg.zDim,
  kernel: 1,
  cache: null,
});

/** The decoder's tensors (post_quant_conv's and decoder.*) and their shapes, as the published file holds them. */
export function decoderWeightShapes(cfg: WanVaeConfig): Map<string, number[]> {
  return layerShapes(decoderPlan(cfg).layers, layerShapes([{ kind: 'conv', conv: postQuantConv(cfg) }], new Map()));
}

/** The encoder's tensors (encoder.* and quant_conv's) and their shapes. */
export function encoderWeightShapes(cfg: WanVaeConfig): Map<string, number[]> {
  return layerShapes([{ kind: 'conv', conv: quantConv(cfg) }], layerShapes(encoderPlan(cfg).layers, new Map()));
}

/** Every tensor of the published file: the encoder's, then the decoder's. */
export function wanVaeWeightShapes(cfg: WanVaeConfig): Map<string, number[]> {
  return new Map([...encoderWeightShapes(cfg), ...decoderWeightShapes(cfg)]);
}

/** [frames, channels, height, width] */
export interface Frames {
  frames: number;
  channels: number;
  height: number;
  width: number;
  data: Float32Array;
}

export const framesOf = (
  frames: number,
  channels: number,
  height: number,
  width: number,
  data = new Float32Array(frames * channels * height * width),
): Frames => ({ frames, channels, height, width, data });

/**
 * diffusers' patchify of a video [3, F, H, W] into frames [F, 3·p², H/p, W/p]: channel c·p² + a·p + b
 * holds the pixels at column offset a and row offset b of each p×p patch (the column offset first).
 */
export function patchify(video: Tensor, p: number): Frames {
  const [C, F, H, W] = video.shape;
  if (H % p || W % p) throw new Error(`a video of ${H}×${W} pixels does not cut into ${p}×${p} patches`);
  const [h, w] = [H / p, W / p];
  const out = framesOf(F, C * p * p, h, w);
  for (let c = 0; c < C; c++)
    for (let t = 0; t < F; t++)
      for (let a = 0; a < p; a++)
        for (let b = 0; b < p; b++) {
          const plane = ((t * C + c) * p * p + a * p + b) * h * w;
          for (let y = 0; y < h; y++)
            for (let x = 0; x < w; x++)
              out.data[plane + y * w + x] = video.data[((c * F + t) * H + y * p + b) * W + x * p + a];
        }
  return out;
}

/** diffusers' unpatchify, the inverse of patchify: a video [3·p², F, h, w] → [3, F, p·h, p·w]. */
export function unpatchify(video: Tensor, p: number): Tensor {
  if (p === 1) return video;
  const [Cp, F, h, w] = video.shape;
  const C = Cp / (p * p);
  const [H, W] = [h * p, w * p];
  const out = new Float32Array(C * F * H * W);
  for (let c = 0; c < C; c++)
    for (let a = 0; a < p; a++)
      for (let b = 0; b < p; b++)
        for (let t = 0; t < F; t++) {
          const plane = ((c * p * p + a * p + b) * F + t) * h * w;
          for (let y = 0; y < h; y++)
            for (let x = 0; x < w; x++)
              out[((c * F + t) * H + y * p + b) * W + x * p + a] = video.data[plane + y * w + x];
        }
  return { shape: [C, F, H, W], data: out };
}

/** Frame t of a latent [C, T, h, w]: one chunk's input, as the transformer made it. */
export function latentSlice(latent: Tensor, t: number): Frames {
  const [C, T, h, w] = latent.shape;
  const plane = h * w;
  const out = framesOf(1, C, h, w);
  for (let c = 0; c < C; c++)
    out.data.set(latent.data.subarray((c * T + t) * plane, (c * T + t + 1) * plane), c * plane);
  return out;
}

/** The caches of one tile: zeros before the first chunk, each [frames, channels, h·scale, w·scale]. */
export function emptyCaches(plan: VaePlan, h: number, w: number): Frames[] {
  return plan.caches.map(({ frames, channels, scale }) => framesOf(frames, channels, h * scale, w * scale));
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

/** Bytes of a tile's causal caches in float32. */
export function cacheBytes(plan: VaePlan, h: number, w: number): number {
  return plan.caches.reduce(
    (n, { frames, channels, scale }) => n + 4 * sizeOf([frames, channels, h * scale, w * scale]),
    0,
  );
}

/** The head's tensors (norm_out's γ, conv_out's weight and bias), which decoderOutputBound reads. */
export function decoderHeadNames(cfg: WanVaeConfig): string[] {
  const head = decoderPlan(cfg).layers.at(-1);
  if (head?.kind !== 'head') throw new Error("the decoder's plan ends in its head");
  return [`${head.name}.norm_out.gamma`, `${head.conv.name}.weight`, `${head.conv.name}.bias`];
}

/**
 * The largest magnitude the decoder's output, before clamping, can take in each of its channels (3,
 * or Wan2.2's 12 before unpatchify), whatever its input: conv_out reads SiLU(norm_out(x)), and
 * norm_out makes each pixel's channels a vector of norm at most √C·|γ| (|SiLU(z)| ≤ |z|), so each
 * tap of channel o adds at most √C·‖W[o, :, tap]·γ‖ (Cauchy–Schwarz), and the bias |b[o]|.
 */
export function decoderOutputBound(cfg: WanVaeConfig, tensors: TensorMap): number[] {
  const [gammaName, weightName, biasName] = decoderHeadNames(cfg);
  const tensor = (name: string) => {
    const t = tensors.get(name);
    if (!t) throw new Error(`the decoder's output bound needs ${name}`);
    return t.data;
  };
  const gamma = tensor(gammaName);
  const weight = tensor(weightName); // [3·p², C, 3, 3, 3]
  const bias = tensor(biasName);
  const C = gamma.length;
  const taps = weight.length / (bias.length * C);
  return Array.from(bias, (b, o) => {
    let bound = Math.abs(b);
    for (let k = 0; k < taps; k++) {
      let squares = 0;
      for (let c = 0; c < C; c++) squares += (weight[(o * C + c) * taps + k] * gamma[c]) ** 2;
      bound += Math.sqrt(C * squares);
    }
    return bound;
  });
}

/** The tensors encodedLatentBound reads: the encoder head's (norm_out's γ, conv_out's) and quant_conv's. */
export function encoderHeadNames(cfg: WanVaeConfig): string[] {
  const head = encoderPlan(cfg).layers.at(-1);
  if (head?.kind !== 'head') throw new Error("the encoder's plan ends in its head");
  const quant = quantConv(cfg).name;
  return [
    `${head.name}.norm_out.gamma`,
    `${head.conv.name}.weight`,
    `${head.conv.name}.bias`,
    `${quant}.weight`,
    `${quant}.bias`,
  ];
}

/**
 * The largest magnitude each of the z_dim channels of an encoded latent (the posterior's mean,
 * normalised) can take, whatever the video: the mean is quant_conv (1×1×1) of conv_out of
 * SiLU(norm_out(x)), a linear map Q·W of a vector whose pixels each have norm at most √C·|γ|
 * (|SiLU(z)| ≤ |z|), so channel o is at most √C·‖(Q·W)[o, :, tap]·γ‖ from Q·b + q at each tap
 * (Cauchy–Schwarz, as decoderOutputBound); then (mean − latents_mean) / latents_std.
 */
export function encodedLatentBound(cfg: WanVaeConfig, tensors: TensorMap): number[] {
  const [gammaName, weightName, biasName, quantWeightName, quantBiasName] = encoderHeadNames(cfg);
  const tensor = (name: string) => {
    const t = tensors.get(name);
    if (!t) throw new Error(`the encoded latent's bound needs ${name}`);
    return t.data;
  };
  const gamma = tensor(gammaName);
  const weight = tensor(weightName); // [2·z, C, 3, 3, 3]
  const bias = tensor(biasName);
  const quant = tensor(quantWeightName); // [2·z, 2·z, 1, 1, 1]
  const quantBias = tensor(quantBiasName);
  const C = gamma.length;
  const J = bias.length;
  const taps = weight.length / (J * C);
  return Array.from({ length: cfg.zDim }, (_, o) => {
    // the mean's channel o, as one map from the head's input: Q[o, :]·W and Q[o, :]·b + q[o]
    const row = new Float64Array(C * taps);
    let offset = quantBias[o];
    for (let j = 0; j < J; j++) {
      const q = quant[o * J + j];
      offset += q * bias[j];
      for (let i = 0; i < C * taps; i++) row[i] += q * weight[j * C * taps + i];
    }
    let reach = 0;
    for (let k = 0; k < taps; k++) {
      let squares = 0;
      for (let c = 0; c < C; c++) squares += (row[c * taps + k] * gamma[c]) ** 2;
      reach += Math.sqrt(C * squares);
    }
    return (Math.abs(offset - cfg.latentsMean[o]) + reach) / cfg.latentsStd[o];
  });
}

/** A folder's vae/, opened and checked: its config, and the decoder's or the encoder's tensors when asked for. */
export interface WanVaeCheckpoint {
  config: WanVaeConfig;
  /** post_quant_conv's and the decoder's tensors (those of `names` where given), float32 (not the encoder's) */
  decoderTensors(names?: string[], onProgress?: LoadProgress): Promise<TensorMap>;
  /** bytes the decoder's tensors take in the file */
  decoderBytes: number;
  /**
   * the encoder's tensors and quant_conv's (those of `names` where given), float32, checked against the config
   * first (names and shapes)
   */
  encoderTensors(onProgress?: LoadProgress, names?: string[]): Promise<TensorMap>;
}

/**
 * Opens vae/ of a model folder: its config and its file's header, the decoder's tensors checked
 * against the config (names and shapes) before any is read. The encoder's tensors are left alone
 * until they are asked for: a folder that only decodes needs none.
 */
export async function openWanVae(files: ModelFiles): Promise<WanVaeCheckpoint> {
  const config = parseWanVaeConfig(await readJson(files, VAE_CONFIG), VAE_CONFIG);
  const checkpoint = await openCheckpoint(files, 'vae', 'diffusion_pytorch_model');
  const isDecoder = (name: string) => name.startsWith('decoder.') || name.startsWith('post_quant_conv.');
  const entries = new Map([...checkpoint.tensors].filter(([name]) => isDecoder(name)));
  if (!entries.size)
    throw new ModelConfigError(
      `${checkpoint.source} holds no decoder tensors (decoder.*, post_quant_conv.*): ` +
        `it is not AutoencoderKLWan's, as ${VAE_CONFIG} says`,
    );
  checkShapes(decoderWeightShapes(config), entries, checkpoint.source);
  const isEncoder = (name: string) => name.startsWith('encoder.') || name.startsWith('quant_conv.');
  return {
    config,
    decoderBytes: [...entries.values()].reduce((n, e) => n + e.end - e.begin, 0),
    decoderTensors: (names, onProgress) =>
      readTensors(
        files,
        [...entries.values()].filter((e) => !names || names.includes(e.name)),
        onProgress,
      ),
    encoderTensors: (onProgress, names) => {
      const encoder = new Map([...checkpoint.tensors].filter(([name]) => isEncoder(name)));
      checkShapes(encoderWeightShapes(config), encoder, checkpoint.source);
      return readTensors(
        files,
        [...encoder.values()].filter((e) => !names || names.includes(e.name)),
        onProgress,
      );
    },
  };
}
