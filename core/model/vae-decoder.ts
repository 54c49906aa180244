import type { TensorMap } from '../safetensors.ts';
import type { Tensor } from '../tensor.ts';
import { readJson, readWeights, type ModelFiles } from './files.ts';

/**
 * A small stand-in for Wan's VAE decoder with the same interface: latent [16, T, H, W] → RGB
 * frames [3, 1 + 4(T−1), 8H, 8W] in [0, 1]. Each latent pixel maps to a colour by a learned 1×1
 * projection; frames in between latent frames blend their neighbours, pixels repeat 8×8.
 */
export interface DecodedVideo {
  count: number;
  height: number;
  width: number;
  rgb: Float32Array; // [3, count, height, width]
}

export const VAE_DECODER_CLASS = 'PixelVaeDecoder';
export const TEMPORAL_SCALE = 4;
export const SPATIAL_SCALE = 8;

export function decodeLatent(weights: TensorMap, latent: Tensor): DecodedVideo {
  const [C, T, H, W] = latent.shape;
  const w = weights.get('conv_out.weight')?.data;
  const b = weights.get('conv_out.bias')?.data;
  if (!w || w.length !== 3 * C || !b || b.length !== 3) throw new Error(`VAE decoder needs conv_out.weight [3, ${C}] and conv_out.bias [3]`);
  const colour = new Float32Array(3 * T * H * W); // [3, T, H, W]
  for (let o = 0; o < 3; o++)
    for (let p = 0; p < T * H * W; p++) {
      let sum = b[o];
      for (let c = 0; c < C; c++) sum += w[o * C + c] * latent.data[c * T * H * W + p];
      colour[o * T * H * W + p] = 1 / (1 + Math.exp(-sum));
    }
  const count = 1 + TEMPORAL_SCALE * (T - 1);
  const height = H * SPATIAL_SCALE;
  const width = W * SPATIAL_SCALE;
  const rgb = new Float32Array(3 * count * height * width);
  for (let f = 0; f < count; f++) {
    // frame 0 is latent frame 0; frames 4t−3 … 4t blend latent frames t−1 and t
    const t = Math.ceil(f / TEMPORAL_SCALE);
    const alpha = f === 0 ? 1 : 1 - (t * TEMPORAL_SCALE - f) / TEMPORAL_SCALE;
    const t0 = Math.max(t - 1, 0);
    for (let o = 0; o < 3; o++)
      for (let y = 0; y < height; y++)
        for (let x = 0; x < width; x++) {
          const p = Math.floor(y / SPATIAL_SCALE) * W + Math.floor(x / SPATIAL_SCALE);
          const at = (tt: number) => colour[(o * T + tt) * H * W + p];
          rgb[((o * count + f) * height + y) * width + x] = alpha * at(t) + (1 - alpha) * at(t0);
        }
  }
  return { count, height, width, rgb };
}

export async function loadVaeDecoder(files: ModelFiles): Promise<(latent: Tensor) => DecodedVideo> {
  const config = (await readJson(files, 'vae/config.json')) as { _class_name?: string };
  if (config._class_name !== VAE_DECODER_CLASS) throw new Error(`vae/config.json: unsupported _class_name ${config._class_name}`);
  const weights = await readWeights(files, 'vae/diffusion_pytorch_model.safetensors');
  return (latent) => decodeLatent(weights, latent);
}
