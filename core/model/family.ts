// What one Wan family differs from another by, in one place: the latent a job's video is made in, how the
// transformer is given its timestep, the video's frame rate and what a job on the published folder is by default. A
// folder's family is read from its model_index.json and its VAE (wan-pipeline.ts); the planner, the pipeline, the CLI
// and make-model ask it instead of knowing Wan2.1.
import { JobParamsError, type FieldErrors, type JobParams } from '../job.ts';
import { firstFrameHeldTimesteps, type Timestep } from './timesteps.ts';
import type { TokenGrid } from './tokens.ts';
import { spatialScale, type WanVaeConfig } from './wan-vae.ts';

/** The latent a video is made in: its channels, and how many frames and pixels one latent frame and pixel stand for. */
export interface LatentFormat {
  channels: number;
  /** video frames per latent frame after the first (the VAE keeps the first frame alone) */
  temporalScale: number;
  /** video pixels per latent pixel, each way */
  spatialScale: number;
}

export interface ModelFamily {
  name: string;
  latent: LatentFormat;
  /**
   * diffusers' `expand_timesteps` (Wan2.2 TI2V): the transformer is given a timestep per token, and an image to
   * start from is held as the first latent frame at timestep 0 (image to video with the same model)
   */
  expandTimesteps: boolean;
  /** frames per second of the video its published pipeline writes */
  fps: number;
  /** what WanPipeline.__call__ makes a job on the published folder by default (the folder's flow shift aside) */
  published: Pick<JobParams, 'height' | 'width' | 'frames' | 'steps' | 'guidance'>;
  /** the sizes it was trained at, by name: the dashboard's presets (with the flow shift Wan's examples give each) */
  sizes: Record<string, Pick<JobParams, 'height' | 'width'> & Partial<Pick<JobParams, 'flowShift'>>>;
}

/** the transformer's 2×2 patches of latent pixels: a side is a multiple of the VAE's scale times this */
const PATCH = 2;

/** Wan2.1 text to video (and the tiny models of its layout): 16 channels, 4× in time, 8× in space, 16 fps. */
export const WAN21: ModelFamily = {
  name: 'Wan2.1',
  latent: { channels: 16, temporalScale: 4, spatialScale: 8 },
  expandTimesteps: false,
  fps: 16,
  published: { height: 480, width: 832, frames: 81, steps: 50, guidance: 5 },
  // diffusers' Wan example: "5.0 for 720P, 3.0 for 480P"
  sizes: {
    '480p': { height: 480, width: 832, flowShift: 3 },
    '720p': { height: 720, width: 1280, flowShift: 5 },
  },
};

/** Wan2.2 TI2V-5B: text and image to 720p video, 48 channels, 16× in space, a timestep per token, 24 fps. */
export const WAN22_TI2V: ModelFamily = {
  name: 'Wan2.2 TI2V',
  latent: { channels: 48, temporalScale: 4, spatialScale: 16 },
  expandTimesteps: true,
  fps: 24,
  published: { height: 704, width: 1280, frames: 121, steps: 50, guidance: 5 },
  // Wan2.2's SIZE_CONFIGS for ti2v-5B: 1280*704 and 704*1280; the shift is the scheduler config's
  sizes: {
    '720p': { height: 704, width: 1280 },
    '720p portrait': { height: 1280, width: 704 },
  },
};

/**
 * A folder's family: Wan2.2 TI2V where model_index.json sets expand_timesteps or its VAE is Wan2.2's (16× in
 * space), else Wan2.1. `inChannels`, the transformer's, sets the latent's channels (the tiny models' are their own).
 */
export function familyOf(folder: {
  expandTimesteps: boolean;
  vae: WanVaeConfig | null;
  inChannels: number | null;
}): ModelFamily {
  const base = folder.expandTimesteps || (folder.vae && spatialScale(folder.vae) === 16) ? WAN22_TI2V : WAN21;
  const spatial = folder.vae ? spatialScale(folder.vae) : base.latent.spatialScale;
  return {
    ...base,
    latent: { ...base.latent, channels: folder.inChannels ?? base.latent.channels, spatialScale: spatial },
  };
}

/** [C, T, H, W] of a job's latent: T = (frames − 1)/4 + 1, H and W the video's over the VAE's scale. */
export function latentShape(p: Pick<JobParams, 'frames' | 'height' | 'width'>, latent: LatentFormat): number[] {
  const { channels, temporalScale, spatialScale: s } = latent;
  return [channels, (p.frames - 1) / temporalScale + 1, p.height / s, p.width / s];
}

/** Wan2.1's latent with a model's own channels (the tiny models of its layout). */
export const wan21Latent = (channels: number): LatentFormat => ({ ...WAN21.latent, channels });

/** What a job's size must be a multiple of on this family: the VAE's scale times the transformer's patch. */
export const sizeMultiple = (family: Pick<ModelFamily, 'latent'>): number => family.latent.spatialScale * PATCH;

/** What `checkJobParams` cannot know without the folder: the family's own constraints, one problem per field. */
export function familyErrors(family: ModelFamily, p: Pick<JobParams, 'height' | 'width'>): FieldErrors {
  const m = sizeMultiple(family);
  const errors: FieldErrors = {};
  for (const key of ['height', 'width'] as const)
    if (p[key] % m)
      errors[key] =
        `must be a multiple of ${m} on ${family.name} (its VAE's ${family.latent.spatialScale}× and 2×2 patches), ` +
        `got ${p[key]}; try ${Math.max(m, m * Math.round(p[key] / m))}`;
  return errors;
}

/** Throws a JobParamsError naming each field the family cannot take. */
export function checkFamilyParams(family: ModelFamily, p: Pick<JobParams, 'height' | 'width'>): void {
  const errors = familyErrors(family, p);
  if (Object.keys(errors).length) throw new JobParamsError(errors);
}

/**
 * The timestep the transformer is given at a step's `t`: one for all tokens, or, with an image held as the first
 * latent frame (expand_timesteps), that frame's tokens at 0 and the rest at t.
 */
export const stepTimestep = (grid: TokenGrid, t: number, firstFrameHeld: boolean): Timestep =>
  firstFrameHeld ? firstFrameHeldTimesteps(grid, t) : t;
