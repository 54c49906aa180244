import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { PATCH_VAE_CONFIG, patchVaeWeights } from './patch-vae.ts';
import { toDiffusersConfig } from '../core/model/config.ts';
import { TEXT_ENCODER_CLASS } from '../core/model/text-encoder.ts';
import { TRANSFORMER_CONFIG, TRANSFORMER_WEIGHTS } from '../core/model/transformer.ts';
import { PATCH_VAE_DECODER_CLASS } from '../core/model/vae-decoder.ts';
import { writeSafetensors } from '../core/safetensors.ts';
import { toTensorMaps, type TrainableWan } from './trainable-wan.ts';

/**
 * Writes a trained demo model in the layout `npm run make-model` writes (diffusers' folders, the
 * same loaders read it): model_index.json, transformer/, text_encoder/, vae/ (the patch VAE).
 */
export function writeDemoModel(
  out: string,
  model: TrainableWan,
  meta: { name: string; seed: number; flowShift: number },
): void {
  const write = (path: string, data: Uint8Array | object) => {
    mkdirSync(join(out, path, '..'), { recursive: true });
    writeFileSync(join(out, path), data instanceof Uint8Array ? data : JSON.stringify(data, null, 2) + '\n');
  };
  const made = { generator: 'npm run train-demo', seed: String(meta.seed) };
  const { transformer, textEncoder } = toTensorMaps(model);
  write('model_index.json', {
    _class_name: 'WanPipeline',
    name: meta.name,
    transformer: ['diffusers', 'WanTransformer3DModel'],
    text_encoder: ['ditswarm', TEXT_ENCODER_CLASS],
    vae: ['ditswarm', PATCH_VAE_DECODER_CLASS],
    flow_shift: meta.flowShift,
    ...made,
  });
  write(TRANSFORMER_CONFIG, toDiffusersConfig(model.config));
  write(TRANSFORMER_WEIGHTS, writeSafetensors(transformer, made));
  write('text_encoder/config.json', {
    _class_name: TEXT_ENCODER_CLASS,
    max_length: model.textLength,
    hidden_size: model.config.textDim,
  });
  write('text_encoder/model.safetensors', writeSafetensors(textEncoder, made));
  write('vae/config.json', { _class_name: PATCH_VAE_DECODER_CLASS, ...PATCH_VAE_CONFIG });
  write('vae/diffusion_pytorch_model.safetensors', writeSafetensors(patchVaeWeights(), made));
}
