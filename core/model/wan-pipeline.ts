// The parts of a WanPipeline folder that run beside the transformer (it runs on the ranks): the
// transformer's config, the text encoder, the VAE decoder and the sampler's flow shift, read from the
// folder as diffusers lays it out. The coordinator's pipeline and the demo's Node sampler load them here.
// The text encoder and the decoder load when first used: a job given prompt embeddings needs no text
// encoder, one asking for the latent no decoder (as WanPipeline's prompt_embeds= and output_type="latent").
import { DEFAULT_JOB } from '../job.ts';
import type { Tensor } from '../tensor.ts';
import { parseWanConfig, type WanConfig } from './config.ts';
import { readJson, type ModelFiles } from './files.ts';
import { loadTextEncoder, TEXT_ENCODER_CLASS, type TextEncoder } from './text-encoder.ts';
import { TRANSFORMER_CONFIG } from './transformer.ts';
import { isUmt5Config } from './umt5.ts';
import { loadVaeDecoder, type DecodedVideo } from './vae-decoder.ts';

/** WanPipeline's max_sequence_length: an encoded prompt is padded to this many rows */
export const WAN_TEXT_TOKENS = 512;

export interface WanPipelineParts {
  config: WanConfig;
  /** rows of every text embedding the text encoder makes: the cross-attention length */
  textTokens: number;
  /** text_encoder/ is umT5's encoder (the published folders'): too large for one tab, it runs on the workers (coordinator/text-encoding.ts) */
  umt5: boolean;
  /** the tiny models' stand-in encoder */
  textEncoder(): Promise<TextEncoder>;
  decoder(): Promise<(latent: Tensor) => DecodedVideo>;
  /** the folder's flow shift (model_index.json), the default job's where it has none */
  flowShift: number;
}

/** `load` once, when first asked; a failed load is tried again next time. */
function once<T>(load: () => Promise<T>): () => Promise<T> {
  let loading: Promise<T> | null = null;
  return () => (loading ??= load().catch((e) => ((loading = null), Promise.reject(e))));
}

export async function loadWanPipelineParts(files: ModelFiles): Promise<WanPipelineParts> {
  const [config, textConfig, index] = await Promise.all([
    readJson(files, TRANSFORMER_CONFIG).then((json) => parseWanConfig(json, TRANSFORMER_CONFIG)),
    readJson(files, 'text_encoder/config.json') as Promise<{ _class_name?: string; max_length?: number }>,
    readJson(files, 'model_index.json'),
  ]);
  const flowShift = (index as { flow_shift?: unknown }).flow_shift;
  return {
    config,
    textTokens: textConfig._class_name === TEXT_ENCODER_CLASS && typeof textConfig.max_length === 'number' ? textConfig.max_length : WAN_TEXT_TOKENS,
    umt5: isUmt5Config(textConfig),
    textEncoder: once(() => loadTextEncoder(files)),
    decoder: once(() => loadVaeDecoder(files)),
    flowShift: typeof flowShift === 'number' ? flowShift : DEFAULT_JOB.flowShift,
  };
}
