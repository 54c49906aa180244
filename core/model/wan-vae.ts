// Wan2.1's VAE (diffusers' AutoencoderKLWan, autoencoder_kl_wan.py) as the published folder holds it
// in vae/: config.json and one diffusion_pytorch_model.safetensors with the encoder's and the
// decoder's tensors. ditswarm decodes only: latents [16, T, h, w] → video [3, 1 + 4(T−1), 8h, 8w].
//
// This file holds the config, the layout (every tensor's name and shape, from the modules'
// structure) and the decoder as a list of layers that both the plain TypeScript reference
// (wan-vae-reference.ts) and the ONNX graphs (wan-vae-graphs.ts) walk; diffusers' spatial tiles are
// wan-vae-tiling.ts. What the decoder does, per diffusers:
//   - latents are un-normalised (z·std + mean, WanPipeline), then post_quant_conv (1×1×1);
//   - the decoder runs one latent frame at a time ("chunks"), each causal 3D convolution keeping the
//     last two frames of its input (CACHE_T) for the next chunk: the same as one causal convolution
//     over the whole sequence, zero-padded in front;
//   - an up-block with temporal upsampling skips its time_conv on the first chunk (diffusers' "Rep"):
//     that chunk stays one frame, and the time_conv's history starts after it, with zeros; later
//     chunks double in time (1 → 2 → 4 frames), so T latents give 1 + 4(T−1) frames;
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
}

const isWholeNumbers = (v: unknown): v is number[] =>
  Array.isArray(v) && v.every((m) => Number.isInteger(m) && (m as number) >= 1);
const isBooleans = (v: unknown): v is boolean[] => Array.isArray(v) && v.every((t) => typeof t === 'boolean');

export function isWanVaeConfig(json: unknown): boolean {
  return (json as { _class_name?: unknown } | null)?._class_name === WAN_VAE_CLASS;
}

/** AutoencoderKLWan's config.json as ditswarm decodes it: Wan2.1's VAE; Wan2.2's (residual, patches) is refused. */
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
    ['scale_factor_spatial', SCALE_FACTOR_SPATIAL],
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
  /** nearest ×2 and a 3×3 conv to outDim; `timeConv` (dim → 2·dim, 3×1×1) doubles time first, but on the first chunk */
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
function convShape(c: CausalConv, timeConv: boolean): number[] {
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

/** Frame t of a latent [C, T, h, w]: one chunk's input, as the transformer made it. */
export function latentSlice(latent: Tensor, t: number): Frames {
  const [C, T, h, w] = latent.shape;
  const plane = h * w;
  const out = framesOf(1, C, h, w);
  for (let c = 0; c < C; c++)
    out.data.set(latent.data.subarray((c * T + t) * plane, (c * T + t + 1) * plane), c * plane);
  return out;
}

/** The causal caches of one tile: zeros before the first chunk, each [2, channels, h·scale, w·scale]. */
export function emptyCaches(plan: DecoderPlan, h: number, w: number): Frames[] {
  return plan.caches.map(({ channels, scale }) => framesOf(CACHE_FRAMES, channels, h * scale, w * scale));
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
export function cacheBytes(plan: DecoderPlan, h: number, w: number): number {
  return plan.caches.reduce(
    (n, { channels, scale }) => n + 4 * sizeOf([CACHE_FRAMES, channels, h * scale, w * scale]),
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
 * The largest magnitude the decoder's output, before clamping, can take in each of its 3 channels,
 * whatever its input: conv_out reads SiLU(norm_out(x)), and norm_out makes each pixel's channels a
 * vector of norm at most √C·|γ| (|SiLU(z)| ≤ |z|), so each tap of channel o adds at most
 * √C·‖W[o, :, tap]·γ‖ (Cauchy–Schwarz), and the bias |b[o]|.
 */
export function decoderOutputBound(cfg: WanVaeConfig, tensors: TensorMap): number[] {
  const [gammaName, weightName, biasName] = decoderHeadNames(cfg);
  const tensor = (name: string) => {
    const t = tensors.get(name);
    if (!t) throw new Error(`the decoder's output bound needs ${name}`);
    return t.data;
  };
  const gamma = tensor(gammaName);
  const weight = tensor(weightName); // [3, C, 3, 3, 3]
  const bias = tensor(biasName);
  const C = gamma.length;
  const taps = weight.length / (3 * C);
  return Array.from({ length: 3 }, (_, o) => {
    let bound = Math.abs(bias[o]);
    for (let k = 0; k < taps; k++) {
      let squares = 0;
      for (let c = 0; c < C; c++) squares += (weight[(o * C + c) * taps + k] * gamma[c]) ** 2;
      bound += Math.sqrt(C * squares);
    }
    return bound;
  });
}

/** A folder's vae/, opened and checked: its config, and the decoder's tensors when asked for. */
export interface WanVaeCheckpoint {
  config: WanVaeConfig;
  /** post_quant_conv's and the decoder's tensors (those of `names` where given), float32 (not the encoder's) */
  decoderTensors(names?: string[], onProgress?: LoadProgress): Promise<TensorMap>;
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
      `${checkpoint.source} holds no decoder tensors (decoder.*, post_quant_conv.*): ` +
        `it is not AutoencoderKLWan's, as ${VAE_CONFIG} says`,
    );
  checkShapes(decoderWeightShapes(config), entries, checkpoint.source);
  return {
    config,
    decoderBytes: [...entries.values()].reduce((n, e) => n + e.end - e.begin, 0),
    decoderTensors: (names, onProgress) =>
      readTensors(
        files,
        [...entries.values()].filter((e) => !names || names.includes(e.name)),
        onProgress,
      ),
  };
}
