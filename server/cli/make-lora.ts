// Writes a LoRA of seeded random weights for a model folder's transformer, in the original Wan /
// ComfyUI keys (`diffusion_model.blocks.0.self_attn.q.lora_down.weight`, `lora_up.weight`, `alpha`,
// and whole-tensor `diff` / bias `diff_b` changes): a low-rank pair with its alpha on every linear
// and the patch embedding (a convolution: its down [rank, C, 1, 2, 2], up [D, rank, 1, 1, 1]),
// diffs on the cross-attention norms (the original's norm3), the modulations and the query norms,
// bias diffs on a few. Shapes come from the config by the original module names, written out here
// (not from the loader's name map). Each change moves its module by about a third of a weight at
// the strength given, so that a LoRA merged wrong shows in the output. Nothing can download a
// published LoRA here: tests and benchmarks use these.
//
//   npm run make-lora -- --model DIR --out FILE [--rank 16] [--alpha 8] [--strength 1] [--seed lora]

import { writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { parseWanConfig, type WanConfig } from '../../core/model/config.ts';
import { readJson } from '../../core/model/files.ts';
import { TRANSFORMER_CONFIG } from '../../core/model/transformer.ts';
import { writeSafetensors, type TensorMap } from '../../core/safetensors.ts';
import { sizeOf } from '../../core/tensor.ts';
import { folderFiles, seededRandom } from '../model-folder.ts';
import { MAKE_LORA_OPTIONS } from './flags.ts';

export interface RandomLora {
  rank: number;
  alpha: number;
  /** the strength it is meant to be merged at: its changes are sized for it */
  strength: number;
  seed: string;
}

/** A seeded LoRA over every module of `cfg`'s transformer, in the original Wan keys. */
export function randomWanLora(cfg: WanConfig, { rank, alpha, strength, seed }: RandomLora): TensorMap {
  const { dim: D, ffnDim: F, textDim, freqDim } = cfg;
  const outputs = cfg.outChannels * cfg.patchSize.reduce((n, p) => n * p, 1);
  const pairs: [string, number, number[]][] = [
    ['patch_embedding', D, [cfg.inChannels, ...cfg.patchSize]],
    ['text_embedding.0', D, [textDim]],
    ['text_embedding.2', D, [D]],
    ['time_embedding.0', D, [freqDim]],
    ['time_embedding.2', D, [D]],
    ['time_projection.1', 6 * D, [D]],
    ['head.head', outputs, [D]],
  ];
  const diffs: [string, number[], number][] = [['head.modulation', [1, 2, D], 0.3 / Math.sqrt(D)]];
  const biases: [string, number][] = [
    ['head.head', outputs],
    ['time_projection.1', 6 * D],
  ];
  for (let i = 0; i < cfg.numLayers; i++) {
    const b = `blocks.${i}`;
    for (const attn of ['self_attn', 'cross_attn'])
      for (const p of ['q', 'k', 'v', 'o']) pairs.push([`${b}.${attn}.${p}`, D, [D]]);
    pairs.push([`${b}.ffn.0`, F, [D]], [`${b}.ffn.2`, D, [F]]);
    diffs.push([`${b}.modulation`, [1, 6, D], 0.3 / Math.sqrt(D)], [`${b}.self_attn.norm_q`, [D], 0.05]);
    if (cfg.crossAttnNorm) diffs.push([`${b}.norm3`, [D], 0.05]);
    biases.push([`${b}.self_attn.o`, D], [`${b}.cross_attn.v`, D], [`${b}.ffn.0`, F]);
    if (cfg.crossAttnNorm) biases.push([`${b}.norm3`, D]);
  }
  const tensors: TensorMap = new Map();
  const put = (key: string, shape: number[], std: number) =>
    tensors.set(`diffusion_model.${key}`, { shape, data: seededRandom(seed, key).normals(sizeOf(shape), std) });
  // up's spread: strength · alpha/rank · up · down lands at 0.3/√fan_in, a third of a weight's
  const upStd = (0.3 * Math.sqrt(rank)) / (strength * alpha);
  for (const [module, out, inner] of pairs) {
    put(`${module}.lora_down.weight`, [rank, ...inner], 1 / Math.sqrt(sizeOf(inner)));
    // a convolution's up is [out, rank, 1, 1, 1]: one 1 for each kernel axis
    put(`${module}.lora_up.weight`, [out, rank, ...inner.slice(1).map(() => 1)], upStd);
    tensors.set(`diffusion_model.${module}.alpha`, { shape: [], data: Float32Array.of(alpha) });
  }
  for (const [module, shape, std] of diffs) put(`${module}.diff`, shape, std);
  for (const [module, size] of biases) put(`${module}.diff_b`, [size], 0.02);
  return tensors;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: MAKE_LORA_OPTIONS,
  });
  if (!values.model || !values.out) {
    console.error(
      'usage: npm run make-lora -- --model DIR --out FILE [--rank 16] [--alpha 8] [--strength 1] [--seed lora]',
    );
    process.exit(2);
  }
  const config = parseWanConfig(await readJson(folderFiles(values.model), TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
  const [rank, alpha, strength] = [values.rank, values.alpha, values.strength].map(Number);
  if (!(Number.isInteger(rank) && rank >= 1 && alpha > 0 && strength !== 0)) {
    console.error('--rank is a whole number ≥ 1, --alpha > 0, --strength not 0');
    process.exit(2);
  }
  const lora = randomWanLora(config, { rank, alpha, strength, seed: values.seed });
  writeFileSync(values.out, writeSafetensors(lora));
  const values_ = [...lora.values()].reduce((n, t) => n + t.data.length, 0);
  console.log(`make-lora: wrote ${values.out}: ${lora.size} tensors, ${values_} values, rank ${rank}, alpha ${alpha}`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
