// The demo model's VAE: a fixed, exact, motion-compensated patch transform the transformer can
// learn in. A latent pixel holds the mean RGB of the four 4×4 quadrants of its 8×8 block, mapped
// from [0, 1] to [−1, 1] (channel 3·q + rgb, q = 2·row + column of the quadrant), and the clip's
// motion (±2 for SPEED pixels per frame) in channels 12 (x) and 13 (y); 14 and 15 stay zero.
// Every latent frame holds the scene as at frame 0 (a shape that moves rigidly on a plain
// background is the same picture, moved), so direction is a property of every token, as colour
// is. The decoder is a PatchVaeDecoder whose weights undo the quadrants and whose motion
// channels move the picture back along the clip.
//
// The first version kept latent frame t = video frame 4t with the motion between frames; the
// transformer learned colour in 200 steps and direction not in 1800 (chance level), because
// where a shape goes is decided at high noise, where the prompt hardly lowers the loss.

import type { TensorMap } from '../core/safetensors.ts';
import type { Tensor } from '../core/tensor.ts';
import { SPATIAL_SCALE, TEMPORAL_SCALE, type VaeConfig } from '../core/model/vae-decoder.ts';
import { MOTION, renderClip, SPEED, type ClipSpec } from './world.ts';

export const QUADRANT = SPATIAL_SCALE / 2;
export const LATENT_CHANNELS = 16;
const COLOUR_CHANNELS = 12;
const MOTION_CHANNELS: [number, number] = [12, 13];
/**
 * A moving clip's motion channels hold ±2, not ±1: the flow-matching loss then weighs motion as
 * much as the colours it shares the latent with, and the same error in the model's output moves
 * a "still" shape half as far.
 */
const MOTION_UNITS = 2;

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

export const PATCH_VAE_CONFIG: VaeConfig & Record<string, unknown> = {
  latent_channels: LATENT_CHANNELS,
  scale_factor_temporal: TEMPORAL_SCALE,
  scale_factor_spatial: SPATIAL_SCALE,
  motion_channels: MOTION_CHANNELS,
  motion_pixels_per_frame: SPEED / MOTION_UNITS,
  motion_limit: MOTION_UNITS,
};

/** A clip's latent [16, T, H, W]: its frame 0 in every latent frame, its motion in channels 12–13. */
export function encodeClip(spec: ClipSpec, frames: number, height: number, width: number): Tensor {
  const T = (frames - 1) / TEMPORAL_SCALE + 1;
  const first = quadrantLatent(renderClip(spec, [0], height, width), 1, height, width);
  const plane = (height / SPATIAL_SCALE) * (width / SPATIAL_SCALE);
  const latent = new Float32Array(LATENT_CHANNELS * T * plane);
  for (let c = 0; c < COLOUR_CHANNELS; c++)
    for (let t = 0; t < T; t++) latent.set(first.data.subarray(c * plane, (c + 1) * plane), (c * T + t) * plane);
  const [mx, my] = MOTION[spec.direction];
  const units = (m: number) => (m * spec.speed * MOTION_UNITS) / SPEED;
  latent.fill(units(mx), MOTION_CHANNELS[0] * T * plane, (MOTION_CHANNELS[0] + 1) * T * plane);
  latent.fill(units(my), MOTION_CHANNELS[1] * T * plane, (MOTION_CHANNELS[1] + 1) * T * plane);
  return { shape: [LATENT_CHANNELS, T, height / SPATIAL_SCALE, width / SPATIAL_SCALE], data: latent };
}

/** RGB frames [3, T, 8H, 8W] → latent [16, T, H, W] of their quadrant colours, no motion. */
export function quadrantLatent(rgb: Float32Array, T: number, height: number, width: number): Tensor {
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
          latent[((c * T + t) * H + Math.floor(y / S)) * W + Math.floor(x / S)] +=
            scale * rgb[((o * T + t) * height + y) * width + x];
        }
  for (let c = 0; c < COLOUR_CHANNELS; c++) for (let p = 0; p < T * H * W; p++) latent[c * T * H * W + p] -= 1;
  return { shape: [LATENT_CHANNELS, T, H, W], data: latent };
}
