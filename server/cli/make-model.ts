// Writes a Wan2.1-format model of seeded random weights (each tensor seeded by its name, so the
// values do not depend on how the checkpoint is split):
//   <out>/{model_index.json, transformer/, text_encoder/, vae/, scheduler/}
// Presets:
//   tiny   (default) public/models/tiny-wan: width 288, small enough to ship in the repository
//   bench  bench/out/models/bench-wan: width 576 (head dim 48), FFN 3456 (6·D, Wan's ratio), 2 blocks,
//          generated on demand into a git-ignored folder, never committed
//   wan2.1-t2v-1.3b  the published Wan-AI/Wan2.1-T2V-1.3B-Diffusers folder's layout at full width: the
//          transformer exactly as published (its config.json, 30 blocks of width 1536, fp32 shards split
//          at 5 GB in state-dict order with their index, 5.68 GB), the folder's model_index.json and
//          scheduler config, the VAE (AutoencoderKLWan, encoder and decoder, one 508 MB file as
//          published), and the text encoder (umT5-XXL's encoder at full width, `--text-layers N` of its
//          24 layers, default 2, with a small vocabulary and tokenizer of the same format). `--layers N`
//          keeps the layout with fewer blocks. Outside the repository: ~/.cache/ditswarm/…
//   wan2.1-few-layers  the same with 2 transformer blocks and 2 umT5 layers (4.3 GB): every part of
//          the published folder at its width, for end-to-end runs that finish
//   wan2.1-t2v-14b  Wan-AI/Wan2.1-T2V-14B-Diffusers' layout: its transformer (40 heads × 128, ffn
//          13824, 40 blocks, 351 M parameters a block) with the 1.3B folder's other parts; `--layers N`
//          keeps fewer blocks, `--dtype bf16` stores the transformer as bfloat16 (as 14B checkpoints
//          are shipped: 28 GB in all instead of 56)
//   wan2.2-ti2v-5b  Wan-AI/Wan2.2-TI2V-5B-Diffusers' layout: its model_index.json (expand_timesteps), transformer (24
//          heads × 128, 48 latent channels, ffn 14336, 30 blocks; fp32 as published, 20 GB, or `--dtype bf16`), its
//          scheduler, Wan2.2's VAE (z_dim 48, residual, 2×2 patches) and Wan2.1's umT5; `--layers N` keeps fewer blocks
// The small presets' transformers have every key family of Wan2.1-T2V-1.3B and its 12 heads (so
// Ulysses degrees 1, 2, 3, 4, 6 are valid), with a stand-in text encoder and VAE.
//
//   npm run make-model [-- --preset tiny|bench|wan2.1-t2v-1.3b|wan2.1-few-layers|wan2.1-t2v-14b|wan2.2-ti2v-5b
//                          --out DIR --seed N --layers N --text-layers N --head-dim N --ffn N --shard-bytes N
//                          --dtype fp32|bf16|fp16]

import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import {
  expectedWeightShapes,
  parseWanConfig,
  toDiffusersConfig,
  wanConfigOfSize,
  type WanConfig,
} from '../../core/model/config.ts';
import { defined } from '../../core/defined.ts';
import { TEXT_ENCODER_CLASS } from '../../core/model/text-encoder.ts';
import { TRANSFORMER_CONFIG, TRANSFORMER_WEIGHTS_NAME } from '../../core/model/transformer.ts';
import { VAE_DECODER_CLASS } from '../../core/model/vae-decoder.ts';
import { SeededRandom } from '../../core/random.ts';
import { storedBytes, writeSafetensors, type SafetensorsDType, type TensorMap } from '../../core/safetensors.ts';
import { sizeOf } from '../../core/tensor.ts';
import {
  FEW_LAYERS_MODEL_DIR,
  FULL_SIZE_MODEL_DIR,
  MAX_SHARD_BYTES,
  WAN_14B_MODEL_DIR,
  WAN22_TI2V_5B_MODEL_DIR,
  seededRandom,
  seededTransformerWeight,
  writeCheckpoint,
  writeUmt5Folder,
  writeWanVaeFolder,
} from '../model-folder.ts';
import { byteProgress } from './progress.ts';
import { WAN21_T2V_14B, WAN21_T2V_1_3B } from '../wan21-layout.ts';
import { WAN22_TI2V_5B } from '../wan22-layout.ts';
import { MAKE_MODEL_OPTIONS } from './flags.ts';

const PRESETS = {
  tiny: {
    name: 'tiny-wan',
    out: 'public/models/tiny-wan',
    seed: '20250225',
    layers: '2',
    'head-dim': '24',
    ffn: '768',
    'text-dim': '64',
    'text-length': '32',
  },
  bench: {
    name: 'bench-wan',
    out: 'bench/out/models/bench-wan',
    seed: '20250226',
    layers: '2',
    'head-dim': '48',
    ffn: '3456',
    'text-dim': '64',
    'text-length': '32',
  },
  'wan2.1-t2v-1.3b': {
    name: 'wan2.1-t2v-1.3b',
    out: FULL_SIZE_MODEL_DIR,
    seed: '20250227',
    layers: '30',
    'text-layers': '2',
    'head-dim': '128',
    ffn: '8960',
    'text-dim': '4096',
    'text-length': '512',
  },
  'wan2.1-few-layers': {
    name: 'wan2.1-few-layers',
    out: FEW_LAYERS_MODEL_DIR,
    seed: '20250227',
    layers: '2',
    'text-layers': '2',
    'head-dim': '128',
    ffn: '8960',
    'text-dim': '4096',
    'text-length': '512',
  },
  'wan2.1-t2v-14b': {
    name: 'wan2.1-t2v-14b',
    out: WAN_14B_MODEL_DIR,
    seed: '20250228',
    layers: '40',
    'text-layers': '2',
    'head-dim': '128',
    ffn: '13824',
    'text-dim': '4096',
    'text-length': '512',
  },
  'wan2.2-ti2v-5b': {
    name: 'wan2.2-ti2v-5b',
    out: WAN22_TI2V_5B_MODEL_DIR,
    seed: '20251207',
    layers: '30',
    'text-layers': '2',
    'head-dim': '128',
    ffn: '14336',
    'text-dim': '4096',
    'text-length': '512',
  },
};
type Preset = keyof typeof PRESETS;
/** the published folder each wan preset writes the layout of */
const PUBLISHED: Partial<Record<Preset, typeof WAN21_T2V_1_3B | typeof WAN21_T2V_14B | typeof WAN22_TI2V_5B>> = {
  'wan2.1-t2v-1.3b': WAN21_T2V_1_3B,
  'wan2.1-few-layers': WAN21_T2V_1_3B,
  'wan2.1-t2v-14b': WAN21_T2V_14B,
  'wan2.2-ti2v-5b': WAN22_TI2V_5B,
};
/** --dtype: how the transformer's weights are stored */
const DTYPES: Record<string, SafetensorsDType> = { fp32: 'F32', bf16: 'BF16', fp16: 'F16' };

const { values: flags } = parseArgs({
  options: MAKE_MODEL_OPTIONS,
});
const fail = (message: string): never => {
  console.error(`make-model: ${message}`);
  process.exit(1);
};
if (!Object.hasOwn(PRESETS, flags.preset))
  fail(`unknown --preset ${flags.preset}; valid presets: ${Object.keys(PRESETS).join(', ')}`);
const layout = PUBLISHED[flags.preset as Preset];
const published = layout !== undefined;
const dtype = Object.hasOwn(DTYPES, flags.dtype)
  ? DTYPES[flags.dtype]
  : fail(`--dtype must be one of ${Object.keys(DTYPES).join(', ')}, got ${JSON.stringify(flags.dtype)}`);
if (published && (flags['head-dim'] || flags.ffn || flags['text-dim'] || flags['text-length']))
  fail(
    `--preset ${flags.preset} is the published layout: ` +
      'only --layers, --text-layers, --dtype, --out and --seed change it',
  );
if (!published && flags['text-layers'])
  fail('--text-layers is for the wan2.1 presets (umT5): the small presets have a stand-in text encoder');
const preset = PRESETS[flags.preset as Preset];
// parseArgs leaves out the flags not given, so the preset's values stand for them
const values = { ...preset, ...flags };
const whole = (flag: string, min: number): number => {
  const value = (values as Record<string, string | undefined>)[flag];
  const n = Number(value);
  return Number.isInteger(n) && n >= min
    ? n
    : fail(`--${flag} must be a whole number ≥ ${min}, got ${JSON.stringify(value)}`);
};

const seed = whole('seed', 0);
const textDim = whole('text-dim', 1);
const textLength = whole('text-length', 1);
const config: WanConfig = layout
  ? parseWanConfig({ ...layout.transformer, num_layers: whole('layers', 1) }, `the published ${flags.preset} config`)
  : wanConfigOfSize(
      { headDim: whole('head-dim', 2), textDim, ffnDim: whole('ffn', 1), numLayers: whole('layers', 1) },
      'make-model flags',
    );
const shardBytes =
  flags['shard-bytes'] === undefined
    ? MAX_SHARD_BYTES
    : Number(flags['shard-bytes']) >= 1
      ? Number(flags['shard-bytes'])
      : fail(`--shard-bytes must be a number ≥ 1, got ${JSON.stringify(flags['shard-bytes'])}`);

const randomFor = (name: string): SeededRandom => seededRandom(String(seed), name);

const out = values.out;
const write = (path: string, data: Uint8Array | object) => {
  mkdirSync(join(out, path, '..'), { recursive: true });
  writeFileSync(join(out, path), data instanceof Uint8Array ? data : JSON.stringify(data, null, 2) + '\n');
};
const made = {
  generator: flags.preset === 'tiny' ? 'npm run make-model' : `npm run make-model -- --preset ${flags.preset}`,
  seed: String(seed),
};
const started = performance.now();
const tensors = [...expectedWeightShapes(config)].map(([name, shape]) => ({ name, shape }));
const totalBytes = tensors.reduce((n, t) => n + storedBytes(t.shape, dtype), 0);
const progress = published ? byteProgress('make-model') : null;
let written = 0;
const files = await writeCheckpoint(
  join(out, 'transformer'),
  TRANSFORMER_WEIGHTS_NAME,
  tensors,
  ({ name, shape }) => {
    progress?.((written += storedBytes(shape, dtype)), totalBytes);
    return seededTransformerWeight(String(seed), name, shape, config.dim);
  },
  { maxShardBytes: shardBytes, metadata: published ? { format: 'pt' } : made, dtype },
);

if (layout) {
  // the folder's own files as published
  write('model_index.json', layout.modelIndex);
  write(TRANSFORMER_CONFIG, { ...layout.transformer, num_layers: config.numLayers });
  write('scheduler/scheduler_config.json', layout.scheduler);
  const { bytes } = await writeWanVaeFolder(out, layout.vae, {
    seed: String(seed),
    onProgress: byteProgress('make-model VAE'),
  });
  console.log(`wrote ${out}/vae: AutoencoderKLWan, encoder and decoder, ${(bytes / 1e6).toFixed(0)} MB`);
  await writeTextEncoder(whole('text-layers', 1));
} else {
  const random = randomFor('text_encoder and vae');
  const textEncoder: TensorMap = new Map([
    ['token_embedding.weight', { shape: [256, textDim], data: random.normals(256 * textDim) }],
    ['position_embedding.weight', { shape: [textLength, textDim], data: random.normals(textLength * textDim, 0.3) }],
  ]);
  const vae: TensorMap = new Map([
    ['conv_out.weight', { shape: [3, 16], data: random.normals(48, 0.5) }],
    ['conv_out.bias', { shape: [3], data: new Float32Array(3) }],
  ]);
  write('model_index.json', {
    _class_name: 'WanPipeline',
    name: preset.name,
    transformer: ['diffusers', 'WanTransformer3DModel'],
    text_encoder: ['ditswarm', TEXT_ENCODER_CLASS],
    vae: ['ditswarm', VAE_DECODER_CLASS],
    flow_shift: 3.0,
    ...made,
  });
  write(TRANSFORMER_CONFIG, toDiffusersConfig(config));
  write('text_encoder/config.json', { _class_name: TEXT_ENCODER_CLASS, max_length: textLength, hidden_size: textDim });
  write('text_encoder/model.safetensors', writeSafetensors(textEncoder, made));
  write('vae/config.json', {
    _class_name: VAE_DECODER_CLASS,
    latent_channels: 16,
    scale_factor_temporal: 4,
    scale_factor_spatial: 8,
  });
  write('vae/diffusion_pytorch_model.safetensors', writeSafetensors(vae, made));
}

/** umT5-XXL's encoder at full width with `layers` layers, and its test tokenizer (writeUmt5Folder). */
async function writeTextEncoder(layers: number): Promise<void> {
  const progress = byteProgress('make-model text encoder');
  const { config: umt5, files } = await writeUmt5Folder(
    out,
    { ...defined(layout, 'a published layout').textEncoder, num_layers: layers, num_decoder_layers: layers },
    { seed: String(seed), maxShardBytes: shardBytes, onProgress: progress },
  );
  console.log(
    `wrote ${out}/text_encoder: umT5 encoder, ${layers} layers of width ${umt5.dModel}, ` +
      `vocabulary ${umt5.vocabSize}, in ${files.join(', ')}`,
  );
}

const params = tensors.reduce((n, t) => n + sizeOf(t.shape), 0);
console.log(
  `wrote ${out}: ${config.numLayers} blocks, ${config.numHeads} heads × ${config.headDim}, ` +
    `${(params / 1e6).toFixed(2)} M transformer parameters in transformer/${files.join(', ')} ` +
    `(${((performance.now() - started) / 1000).toFixed(1)} s)`,
);
