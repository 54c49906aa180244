import type { TensorMap } from '../safetensors.ts';
import type { Tensor } from '../tensor.ts';
import { SPATIAL_SCALE, TEMPORAL_SCALE } from '../model/vae-decoder.ts';

/**
 * The demo model's VAE: a fixed, exact patch transform the transformer can learn in. A latent
 * pixel holds the mean RGB of the four 4×4 quadrants of its 8×8 block, mapped from [0, 1] to
 * [−1, 1] (channel 3·q + rgb, q = 2·row + column of the quadrant; channels 12–15 stay zero). A
 * latent frame t is video frame 4t. The decoder is a PatchVaeDecoder whose weights undo this.
 */
export const QUADRANT = SPATIAL_SCALE / 2;
export const LATENT_CHANNELS = 16;
const USED_CHANNELS = 12;

const quadrantOf = (y: number, x: number) => 2 * Math.floor(y / QUADRANT) + Math.floor(x / QUADRANT);

/** proj.weight [3·8·8, 16] and proj.bias [3·8·8] of the PatchVaeDecoder: pixel = 0.5 + 0.5·z[3q + rgb]. */
export function patchVaeWeights(): TensorMap {
  const S = SPATIAL_SCALE;
  const block = 3 * S * S;
  const weight = new Float32Array(block * LATENT_CHANNELS);
  for (let o = 0; o < 3; o++)
    for (let y = 0; y < S; y++)
      for (let x = 0; x < S; x++) weight[((o * S + y) * S + x) * LATENT_CHANNELS + 3 * quadrantOf(y, x) + o] = 0.5;
  return new Map([
    ['proj.weight', { shape: [block, LATENT_CHANNELS], data: weight }],
    ['proj.bias', { shape: [block], data: new Float32Array(block).fill(0.5) }],
  ]);
}

export const PATCH_VAE_CONFIG = { latent_channels: LATENT_CHANNELS, scale_factor_temporal: TEMPORAL_SCALE, scale_factor_spatial: SPATIAL_SCALE };

/** RGB of the latent frames only, [3, T, 8H, 8W] (video frames 0, 4, 8, …) → latent [16, T, H, W]. */
export function encodeFrames(rgb: Float32Array, T: number, height: number, width: number): Tensor {
  const S = SPATIAL_SCALE;
  const H = height / S;
  const W = width / S;
  const latent = new Float32Array(LATENT_CHANNELS * T * H * W);
  const scale = 2 / (QUADRANT * QUADRANT);
  for (let o = 0; o < 3; o++)
    for (let t = 0; t < T; t++)
      for (let y = 0; y < height; y++)
        for (let x = 0; x < width; x++) {
          const c = 3 * quadrantOf(y % S, x % S) + o;
          latent[((c * T + t) * H + Math.floor(y / S)) * W + Math.floor(x / S)] += scale * rgb[((o * T + t) * height + y) * width + x];
        }
  for (let c = 0; c < USED_CHANNELS; c++) for (let p = 0; p < T * H * W; p++) latent[c * T * H * W + p] -= 1;
  return { shape: [LATENT_CHANNELS, T, H, W], data: latent };
}

/** The video frames a latent of `frames` video frames keeps: 0, 4, 8, … */
export const latentFrameIndices = (frames: number): number[] => Array.from({ length: (frames - 1) / TEMPORAL_SCALE + 1 }, (_, t) => t * TEMPORAL_SCALE);
