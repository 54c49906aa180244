// Small stand-ins for Wan's VAE decoder with the same interface: latent [16, T, H, W] → RGB
// frames [3, 1 + 4(T−1), 8H, 8W] in [0, 1]. Each latent frame decodes on its own; frames in
// between latent frames blend their neighbours. Two kinds:
//   PixelVaeDecoder  each latent pixel → one colour by a 1×1 projection and a sigmoid, repeated 8×8
//   PatchVaeDecoder  each latent pixel → its 8×8 RGB block by a fixed linear map, clamped to [0, 1]
//                    (an exact patch transform with a matching encoder: what the demo model learns in)
// A PatchVaeDecoder whose config names `motion_channels` is motion-compensated, as a video codec's
// key frame plus motion vector: every latent frame holds the scene where it was at frame 0 (the
// key frame is their mean), and the mean of the two motion channels over the latent is one motion
// vector (vx, vy); frame f is the key frame moved by f · motion_pixels_per_frame · (vx, vy), what
// it uncovers filled with the background (the median of the key frame's border). Motion is then
// a property of every token, like colour, instead of a relation between tokens in different frames.

import { INSTEAD_OF } from '../job.ts';
import type { TensorMap } from '../safetensors.ts';
import type { Tensor } from '../tensor.ts';
import { readJson, readWeights, type ModelFiles } from './files.ts';

export interface DecodedVideo {
  count: number;
  height: number;
  width: number;
  rgb: Float32Array; // [3, count, height, width]
}

export const VAE_DECODER_CLASS = 'PixelVaeDecoder';
export const PATCH_VAE_DECODER_CLASS = 'PatchVaeDecoder';
export const TEMPORAL_SCALE = 4;
export const SPATIAL_SCALE = 8;

export function decodeLatent(weights: TensorMap, latent: Tensor): DecodedVideo {
  const [C, T, H, W] = latent.shape;
  const w = weights.get('conv_out.weight')?.data;
  const b = weights.get('conv_out.bias')?.data;
  if (!w || w.length !== 3 * C || !b || b.length !== 3)
    throw new Error(`VAE decoder needs conv_out.weight [3, ${C}] and conv_out.bias [3]`);
  const colour = new Float32Array(3 * T * H * W); // [3, T, H, W]
  for (let o = 0; o < 3; o++)
    for (let p = 0; p < T * H * W; p++) {
      let sum = b[o];
      for (let c = 0; c < C; c++) sum += w[o * C + c] * latent.data[c * T * H * W + p];
      colour[o * T * H * W + p] = 1 / (1 + Math.exp(-sum));
    }
  return blendFrames(
    T,
    H * SPATIAL_SCALE,
    W * SPATIAL_SCALE,
    (o, t, y, x) => colour[(o * T + t) * H * W + Math.floor(y / SPATIAL_SCALE) * W + Math.floor(x / SPATIAL_SCALE)],
  );
}

export interface VaeConfig {
  _class_name?: string;
  /** PatchVaeDecoder: the latent channels holding the motion vector (x, y), when it is motion-compensated */
  motion_channels?: [number, number];
  /** PatchVaeDecoder: pixels per frame of a unit motion vector */
  motion_pixels_per_frame?: number;
  /** PatchVaeDecoder: the largest motion component the encoder makes; the decoder clamps to it */
  motion_limit?: number;
}

/** latent [C, T, H, W] → frames: each latent pixel's 8×8 block is proj.weight [3·8·8, C] · z + proj.bias, clamped. */
export function decodePatchLatent(weights: TensorMap, latent: Tensor, config: VaeConfig = {}): DecodedVideo {
  const [C, T, H, W] = latent.shape;
  const S = SPATIAL_SCALE;
  const block = 3 * S * S;
  const w = weights.get('proj.weight')?.data;
  const b = weights.get('proj.bias')?.data;
  if (!w || w.length !== block * C || !b || b.length !== block)
    throw new Error(`patch VAE decoder needs proj.weight [${block}, ${C}] and proj.bias [${block}]`);
  const height = H * S;
  const width = W * S;
  const frames = new Float32Array(3 * T * height * width); // [3, T, 8H, 8W]
  const z = new Float32Array(C);
  for (let t = 0; t < T; t++)
    for (let i = 0; i < H; i++)
      for (let j = 0; j < W; j++) {
        for (let c = 0; c < C; c++) z[c] = latent.data[((c * T + t) * H + i) * W + j];
        for (let r = 0; r < block; r++) {
          let sum = b[r];
          for (let c = 0; c < C; c++) sum += w[r * C + c] * z[c];
          const o = Math.floor(r / (S * S));
          const y = i * S + Math.floor((r % (S * S)) / S);
          const x = j * S + (r % S);
          frames[((o * T + t) * height + y) * width + x] = Math.min(1, Math.max(0, sum));
        }
      }
  if (config.motion_channels)
    return moveFrames(
      frames,
      T,
      height,
      width,
      motionVector(latent, config.motion_channels, config.motion_limit ?? Infinity),
      config.motion_pixels_per_frame ?? 1,
    );
  return blendFrames(T, height, width, (o, t, y, x) => frames[((o * T + t) * height + y) * width + x]);
}

/** Latent frames → 1 + 4(T−1) frames: frame 0 is latent frame 0; frames 4t−3 … 4t blend latent frames t−1 and t. */
function blendFrames(
  T: number,
  height: number,
  width: number,
  at: (o: number, t: number, y: number, x: number) => number,
): DecodedVideo {
  const count = 1 + TEMPORAL_SCALE * (T - 1);
  const rgb = new Float32Array(3 * count * height * width);
  for (let f = 0; f < count; f++) {
    const t = Math.ceil(f / TEMPORAL_SCALE);
    const alpha = f === 0 ? 1 : 1 - (t * TEMPORAL_SCALE - f) / TEMPORAL_SCALE;
    const t0 = Math.max(t - 1, 0);
    for (let o = 0; o < 3; o++)
      for (let y = 0; y < height; y++)
        for (let x = 0; x < width; x++)
          rgb[((o * count + f) * height + y) * width + x] = alpha * at(o, t, y, x) + (1 - alpha) * at(o, t0, y, x);
  }
  return { count, height, width, rgb };
}

/**
 * The mean over the latent of each motion channel, clamped to ±limit as colours are clamped to
 * what the encoder makes: guidance extrapolates motion as it saturates colours.
 */
function motionVector(latent: Tensor, [cx, cy]: [number, number], limit: number): [number, number] {
  const [C, T, H, W] = latent.shape;
  if (cx >= C || cy >= C)
    throw new Error(`vae/config.json: motion_channels [${cx}, ${cy}] outside a latent of ${C} channels`);
  const plane = T * H * W;
  const mean = (c: number) =>
    Math.min(
      limit,
      Math.max(-limit, latent.data.subarray(c * plane, (c + 1) * plane).reduce((a, v) => a + v, 0) / plane),
    );
  return [mean(cx), mean(cy)];
}

/** Frame f = the mean of the decoded latent frames moved by f·pixelsPerFrame·(vx, vy), sampled bilinearly. */
function moveFrames(
  frames: Float32Array,
  T: number,
  height: number,
  width: number,
  [vx, vy]: [number, number],
  pixelsPerFrame: number,
): DecodedVideo {
  const count = 1 + TEMPORAL_SCALE * (T - 1);
  const plane = height * width;
  const key = new Float32Array(3 * plane);
  for (let o = 0; o < 3; o++)
    for (let t = 0; t < T; t++)
      for (let p = 0; p < plane; p++) key[o * plane + p] += frames[(o * T + t) * plane + p] / T;
  // what a moved picture uncovers: the background, the median of the key frame's border
  const border = (o: number) => {
    const v: number[] = [];
    for (let x = 0; x < width; x++) v.push(key[o * plane + x], key[o * plane + (height - 1) * width + x]);
    for (let y = 1; y < height - 1; y++) v.push(key[o * plane + y * width], key[o * plane + y * width + width - 1]);
    return v.sort((a, b) => a - b)[v.length >> 1];
  };
  const background = [border(0), border(1), border(2)];
  const rgb = new Float32Array(3 * count * plane);
  for (let f = 0; f < count; f++) {
    const sx = f * pixelsPerFrame * vx;
    const sy = f * pixelsPerFrame * vy;
    for (let y = 0; y < height; y++) {
      const fy = y - sy;
      const y0 = Math.floor(fy);
      const ay = fy - y0;
      const [ya, yb] = [y0, y0 + 1];
      for (let x = 0; x < width; x++) {
        const fx = x - sx;
        const x0 = Math.floor(fx);
        const ax = fx - x0;
        const [xa, xb] = [x0, x0 + 1];
        for (let o = 0; o < 3; o++) {
          const at = (yy: number, xx: number) =>
            yy < 0 || yy >= height || xx < 0 || xx >= width ? background[o] : key[o * plane + yy * width + xx];
          rgb[((o * count + f) * height + y) * width + x] =
            (1 - ay) * ((1 - ax) * at(ya, xa) + ax * at(ya, xb)) + ay * ((1 - ax) * at(yb, xa) + ax * at(yb, xb));
        }
      }
    }
  }
  return { count, height, width, rgb };
}

const DECODERS: Partial<Record<string, (weights: TensorMap, latent: Tensor, config: VaeConfig) => DecodedVideo>> = {
  [VAE_DECODER_CLASS]: decodeLatent,
  [PATCH_VAE_DECODER_CLASS]: decodePatchLatent,
};

export async function loadVaeDecoder(files: ModelFiles): Promise<(latent: Tensor) => DecodedVideo> {
  const config = (await readJson(files, 'vae/config.json')) as VaeConfig;
  const decode = DECODERS[config._class_name ?? ''];
  if (!decode)
    throw new Error(
      `vae/ is ${config._class_name}, which ditswarm does not decode ` +
        `(it decodes AutoencoderKLWan, on the workers, and the stand-ins ${Object.keys(DECODERS).join(', ')}): ` +
        INSTEAD_OF.vae,
    );
  const weights = await readWeights(files, 'vae/diffusion_pytorch_model.safetensors');
  return (latent) => decode(weights, latent, config);
}
