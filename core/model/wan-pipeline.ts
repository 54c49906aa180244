// The parts of a WanPipeline folder that run beside the transformer (it runs on the ranks): the
// transformer's config, the text encoder, the VAE decoder and the sampler's flow shift, read from the
// folder as diffusers lays it out. The coordinator's pipeline and the demo's Node sampler load them here.
import { DEFAULT_JOB } from '../job.ts';
import type { Tensor } from '../tensor.ts';
import { parseWanConfig, type WanConfig } from './config.ts';
import { readJson, type ModelFiles } from './files.ts';
import { loadTextEncoder, type TextEncoder } from './text-encoder.ts';
import { TRANSFORMER_CONFIG } from './transformer.ts';
import { loadVaeDecoder, type DecodedVideo } from './vae-decoder.ts';

export interface WanPipelineParts {
  config: WanConfig;
  textEncoder: TextEncoder;
  decode(latent: Tensor): DecodedVideo;
  /** the folder's flow shift (model_index.json), the default job's where it has none */
  flowShift: number;
}

export async function loadWanPipelineParts(files: ModelFiles): Promise<WanPipelineParts> {
  const [config, textEncoder, decode, index] = await Promise.all([
    readJson(files, TRANSFORMER_CONFIG).then((json) => parseWanConfig(json, TRANSFORMER_CONFIG)),
    loadTextEncoder(files),
    loadVaeDecoder(files),
    readJson(files, 'model_index.json'),
  ]);
  const flowShift = (index as { flow_shift?: unknown }).flow_shift;
  return { config, textEncoder, decode, flowShift: typeof flowShift === 'number' ? flowShift : DEFAULT_JOB.flowShift };
}
