// Writes a Wan2.1-format model, deterministically from a seed:
//   <out>/{model_index.json, transformer/, text_encoder/, vae/}
// The transformer has every key family of Wan2.1-T2V-1.3B (12 heads like it, so Ulysses degrees
// 1, 2, 3, 4, 6 are valid). Presets:
//   tiny   (default) public/models/tiny-wan: width 288, small enough to ship in the repository
//   bench  bench/out/models/bench-wan: width 576 (head dim 48), FFN 3456 (6·D, Wan's ratio), 2 blocks —
//          ~56 MB, so it is generated on demand into a git-ignored folder, never committed
// Explicit flags override the preset's values.
//
//   npm run make-model [-- --preset tiny|bench --out DIR --seed N --layers N --head-dim N --ffn N]

import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { expectedWeightShapes, wanConfigOfSize, toDiffusersConfig } from '../../core/model/config.ts';
import { TEXT_ENCODER_CLASS } from '../../core/model/text-encoder.ts';
import { VAE_DECODER_CLASS } from '../../core/model/vae-decoder.ts';
import { TRANSFORMER_CONFIG, TRANSFORMER_WEIGHTS } from '../../core/model/transformer.ts';
import { SeededRandom } from '../../core/random.ts';
import { writeSafetensors, type TensorMap } from '../../core/safetensors.ts';
import { sizeOf } from '../../core/tensor.ts';

const PRESETS = {
  tiny: { name: 'tiny-wan', out: 'public/models/tiny-wan', seed: '20250225', layers: '2', 'head-dim': '24', ffn: '768', 'text-dim': '64', 'text-length': '32' },
  bench: { name: 'bench-wan', out: 'bench/out/models/bench-wan', seed: '20250226', layers: '2', 'head-dim': '48', ffn: '3456', 'text-dim': '64', 'text-length': '32' },
};
type Preset = keyof typeof PRESETS;

const { values: flags } = parseArgs({
  options: {
    preset: { type: 'string', default: 'tiny' },
    out: { type: 'string' },
    seed: { type: 'string' },
    layers: { type: 'string' },
    'head-dim': { type: 'string' },
    ffn: { type: 'string' },
    'text-dim': { type: 'string' },
    'text-length': { type: 'string' },
  },
});
if (!(flags.preset! in PRESETS)) {
  console.error(`make-model: unknown --preset ${flags.preset}; valid presets: ${Object.keys(PRESETS).join(', ')}`);
  process.exit(1);
}
const preset = PRESETS[flags.preset as Preset];
const values = { ...preset, ...Object.fromEntries(Object.entries(flags).filter(([, v]) => v !== undefined)) };

const textDim = Number(values['text-dim']);
const textLength = Number(values['text-length']);
const config = wanConfigOfSize(
  { headDim: Number(values['head-dim']), textDim: textDim, ffnDim: Number(values.ffn), numLayers: Number(values.layers) },
  'make-model flags',
);
const random = new SeededRandom(Number(values.seed));

/** Initialised so activations stay O(1) through the blocks, as a trained model's do. */
function initialise(name: string, shape: number[]): Float32Array {
  const n = sizeOf(shape);
  if (name.endsWith('scale_shift_table')) return random.normals(n, 1 / Math.sqrt(config.dim));
  if (/norm[_\w]*\.weight$/.test(name)) return random.normals(n, 0.05).map((v) => 1 + v);
  if (name.endsWith('.bias')) return random.normals(n, 0.02);
  const fanIn = n / shape[0];
  return random.normals(n, 1 / Math.sqrt(fanIn));
}

const transformer: TensorMap = new Map();
for (const [name, shape] of expectedWeightShapes(config)) transformer.set(name, { shape, data: initialise(name, shape) });

const textEncoder: TensorMap = new Map([
  ['token_embedding.weight', { shape: [256, textDim], data: random.normals(256 * textDim) }],
  ['position_embedding.weight', { shape: [textLength, textDim], data: random.normals(textLength * textDim, 0.3) }],
]);
const vae: TensorMap = new Map([
  ['conv_out.weight', { shape: [3, 16], data: random.normals(48, 0.5) }],
  ['conv_out.bias', { shape: [3], data: new Float32Array(3) }],
]);

const out = values.out!;
const write = (path: string, data: Uint8Array | object) => {
  mkdirSync(join(out, path, '..'), { recursive: true });
  writeFileSync(join(out, path), data instanceof Uint8Array ? data : JSON.stringify(data, null, 2) + '\n');
};
const made = { generator: flags.preset === 'tiny' ? 'npm run make-model' : `npm run make-model -- --preset ${flags.preset}`, seed: String(values.seed) };
write('model_index.json', { _class_name: 'WanPipeline', name: preset.name, transformer: ['diffusers', 'WanTransformer3DModel'], text_encoder: ['ditswarm', TEXT_ENCODER_CLASS], vae: ['ditswarm', VAE_DECODER_CLASS], flow_shift: 3.0, ...made });
write(TRANSFORMER_CONFIG, toDiffusersConfig(config));
write(TRANSFORMER_WEIGHTS, writeSafetensors(transformer, made));
write('text_encoder/config.json', { _class_name: TEXT_ENCODER_CLASS, max_length: textLength, hidden_size: textDim });
write('text_encoder/model.safetensors', writeSafetensors(textEncoder, made));
write('vae/config.json', { _class_name: VAE_DECODER_CLASS, latent_channels: 16, scale_factor_temporal: 4, scale_factor_spatial: 8 });
write('vae/diffusion_pytorch_model.safetensors', writeSafetensors(vae, made));

const params = [...transformer.values()].reduce((n, t) => n + t.data.length, 0);
console.log(`wrote ${out}: ${config.numLayers} blocks, ${config.numHeads} heads × ${config.headDim}, ${(params / 1e6).toFixed(2)} M transformer parameters`);
