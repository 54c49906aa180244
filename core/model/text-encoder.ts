// A small stand-in for Wan's umT5 text encoder with the same interface: prompt → [L, text_dim],
// rows past the prompt zero as diffusers pads them. Tokens are the prompt's UTF-8 bytes.

import type { TensorMap } from '../safetensors.ts';
import { layerNorm } from './ops.ts';
import { readJson, readWeights, type ModelFiles } from './files.ts';
import { TEXT_ENCODER_CONFIG } from './umt5.ts';

export interface TextEncoder {
  maxLength: number;
  dim: number;
  encode(prompt: string): Float32Array; // [L, text_dim]
}

export const TEXT_ENCODER_CLASS = 'ByteTextEncoder';

export function byteTextEncoder(maxLength: number, dim: number, weights: TensorMap): TextEncoder {
  const token = weights.get('token_embedding.weight')?.data;
  const position = weights.get('position_embedding.weight')?.data;
  if (!token || token.length !== 256 * dim || !position || position.length !== maxLength * dim) {
    throw new Error(
      `text encoder weights must be token_embedding.weight [256, ${dim}] ` +
        `and position_embedding.weight [${maxLength}, ${dim}]`,
    );
  }
  return {
    maxLength,
    dim,
    encode(prompt) {
      const bytes = new globalThis.TextEncoder().encode(prompt).subarray(0, maxLength);
      const rows = new Float32Array(bytes.length * dim);
      bytes.forEach((b, i) => {
        for (let e = 0; e < dim; e++) rows[i * dim + e] = token[b * dim + e] + position[i * dim + e];
      });
      const out = new Float32Array(maxLength * dim);
      out.set(layerNorm(rows, dim, 1e-6));
      return out;
    },
  };
}

/** This folder's text encoder cannot run here: what to give the job instead. */
export class UnsupportedTextEncoder extends Error {
  override name = 'UnsupportedTextEncoder';
}

export async function loadTextEncoder(files: ModelFiles): Promise<TextEncoder> {
  const config = (await readJson(files, TEXT_ENCODER_CONFIG)) as {
    _class_name?: string;
    architectures?: unknown;
    max_length: number;
    hidden_size: number;
  };
  if (config._class_name !== TEXT_ENCODER_CLASS) {
    const name =
      config._class_name ??
      (Array.isArray(config.architectures) ? config.architectures.join(', ') : 'an unknown class');
    throw new UnsupportedTextEncoder(
      `text_encoder/ is ${name}, which ditswarm cannot run yet: give the prompt's embeddings instead ` +
        '(promptEmbeds [L, text_dim]; --prompt-embeds FILE with npm run generate)',
    );
  }
  return byteTextEncoder(
    config.max_length,
    config.hidden_size,
    await readWeights(files, 'text_encoder/model.safetensors'),
  );
}
