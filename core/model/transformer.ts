import { checkWeights, parseWanConfig } from './config.ts';
import { readJson, readWeights, type ModelFiles } from './files.ts';
import type { WanModel } from './reference.ts';

export const TRANSFORMER_CONFIG = 'transformer/config.json';
export const TRANSFORMER_WEIGHTS = 'transformer/diffusion_pytorch_model.safetensors';

/** Loads and validates a diffusers WanTransformer3DModel folder (single-file safetensors). */
export async function loadTransformer(files: ModelFiles): Promise<WanModel> {
  const config = parseWanConfig(await readJson(files, TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
  const weights = await readWeights(files, TRANSFORMER_WEIGHTS);
  checkWeights(config, weights, TRANSFORMER_WEIGHTS);
  return { config, weights };
}
