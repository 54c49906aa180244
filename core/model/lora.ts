// LoRA adapters for the transformer, in the three forms Wan LoRAs are published in: the original
// Wan / ComfyUI keys (`diffusion_model.blocks.0.self_attn.q.lora_down.weight`, `lora_up.weight`,
// `alpha`, and whole-tensor `diff` / bias `diff_b` changes), diffusers / PEFT
// (`transformer.blocks.0.attn1.to_q.lora_A.weight`, `lora_B.weight`) and kohya / musubi-tuner
// (`lora_unet_blocks_0_self_attn_q.lora_down.weight`). Each is applied as ComfyUI and diffusers apply
// it, merged into the weights once at load: W′ = W + s·(alpha/rank)·up·down, b′ = b + s·diff_b,
// w′ = w + s·diff (alpha absent: alpha/rank = 1, as PEFT's default). A file is checked whole, from its
// header alone, before a weight is read: a key that names no module of the model, a down without its
// up, a shape that does not fit its module is an error that names the key. A rank holding a pipeline
// stage reads and merges only its own modules' changes.
import { readSafetensorsHeader, readTensor, type ByteRanges, type TensorEntry } from '../safetensors.ts';
import { sizeOf, type Tensor } from '../tensor.ts';
import { allBlocks, holdsTensor } from './blocks.ts';
import { expectedWeightShapes, type WanConfig } from './config.ts';
import type { WanModel } from './reference.ts';

/** An adapter file (a URL in a page, a path in Node) and the strength it is applied at. */
export interface LoraRef {
  url: string;
  strength: number;
}

export const LORA_LIMITS = { adapters: 8, strength: { min: -10, max: 10 } };

export class LoraError extends Error {
  override name = 'LoraError';
}

/** What one file changes of one module (by diffusers' name): where each part's bytes are. */
export interface ModuleChange {
  down?: TensorEntry;
  up?: TensorEntry;
  alpha?: TensorEntry;
  diff?: TensorEntry;
  diffBias?: TensorEntry;
}

/** An adapter file checked against a model's config: the modules it changes. */
export interface LoraFile {
  source: string;
  modules: Map<string, ModuleChange>;
}

/** The original Wan names of a block's modules, and diffusers' (scripts/convert_wan_to_diffusers.py). */
const BLOCK_MODULES: [original: string, diffusers: string][] = [
  ...(['self_attn', 'cross_attn'] as const).flatMap((attention, a): [string, string][] => [
    [`${attention}.q`, `attn${a + 1}.to_q`],
    [`${attention}.k`, `attn${a + 1}.to_k`],
    [`${attention}.v`, `attn${a + 1}.to_v`],
    [`${attention}.o`, `attn${a + 1}.to_out.0`],
    [`${attention}.norm_q`, `attn${a + 1}.norm_q`],
    [`${attention}.norm_k`, `attn${a + 1}.norm_k`],
  ]),
  ['ffn.0', 'ffn.net.0.proj'],
  ['ffn.2', 'ffn.net.2'],
  // the original calls its norms norm1, norm3 (cross-attention's, affine), norm2; diffusers renumbers them in order
  ['norm3', 'norm2'],
  ['modulation', 'scale_shift_table'],
];
const TOP_MODULES: [original: string, diffusers: string][] = [
  ['patch_embedding', 'patch_embedding'],
  ['text_embedding.0', 'condition_embedder.text_embedder.linear_1'],
  ['text_embedding.2', 'condition_embedder.text_embedder.linear_2'],
  ['time_embedding.0', 'condition_embedder.time_embedder.linear_1'],
  ['time_embedding.2', 'condition_embedder.time_embedder.linear_2'],
  ['time_projection.1', 'condition_embedder.time_proj'],
  ['head.head', 'proj_out'],
  ['head.modulation', 'scale_shift_table'],
];

type Part = keyof ModuleChange;
/** each key's last part: what of its module it holds */
const PARTS: [suffix: string, part: Part][] = [
  ['.lora_down.weight', 'down'],
  ['.lora_A.weight', 'down'],
  ['.lora_up.weight', 'up'],
  ['.lora_B.weight', 'up'],
  ['.lora_B.bias', 'diffBias'],
  ['.diff_b', 'diffBias'],
  ['.diff', 'diff'],
  ['.alpha', 'alpha'],
];

/** How a file's key prefix names modules. */
type Naming = 'original' | 'diffusers' | 'kohya' | 'either';
const PREFIXES: [prefix: string, naming: Naming][] = [
  ['diffusion_model.', 'original'],
  ['transformer.', 'diffusers'],
  ['base_model.model.', 'diffusers'],
  ['lora_unet_', 'kohya'],
];

/** The model's modules under each naming: a name → diffusers' name of the module. */
function moduleNames(cfg: WanConfig): Record<Exclude<Naming, 'either'>, Map<string, string>> {
  const diffusers = new Map<string, string>();
  for (const key of expectedWeightShapes(cfg).keys()) {
    const module = key.replace(/\.(weight|bias)$/, '');
    diffusers.set(module, module);
  }
  const original = new Map<string, string>(TOP_MODULES);
  for (let i = 0; i < cfg.numLayers; i++)
    for (const [o, d] of BLOCK_MODULES) original.set(`blocks.${i}.${o}`, `blocks.${i}.${d}`);
  // only the modules this config has (a model without cross_attn_norm has no norm2 to change)
  for (const [o, d] of original) if (!diffusers.has(d)) original.delete(o);
  const kohya = new Map([...original].map(([o, d]) => [o.replaceAll('.', '_'), d]));
  return { original, diffusers, kohya };
}

/** The tensor a module's change lands on: its weight, or the module itself where a parameter (scale_shift_table). */
function targetOf(shapes: Map<string, number[]>, module: string, part: Part): string {
  if (part === 'diffBias') return `${module}.bias`;
  return shapes.has(`${module}.weight`) ? `${module}.weight` : module;
}

/**
 * The modules an adapter file changes, checked against `cfg` from the file's header alone: every key
 * names a module and part, every low-rank pair is whole and fits its module's weight.
 */
export async function openLora(files: ByteRanges, path: string, cfg: WanConfig, source = path): Promise<LoraFile> {
  const entries = await readSafetensorsHeader(files, path);
  const fail = (what: string) => new LoraError(`LoRA ${source}: ${what}`);
  const names = moduleNames(cfg);
  const shapes = expectedWeightShapes(cfg);
  const modules = new Map<string, ModuleChange>();
  for (const entry of entries) {
    const [suffix, part] = PARTS.find(([s]) => entry.name.endsWith(s)) ?? [];
    if (!suffix || !part)
      throw fail(`"${entry.name}" is no part of a LoRA (${PARTS.map(([s]) => s.slice(1)).join(', ')})`);
    const [prefix, naming] = PREFIXES.find(([p]) => entry.name.startsWith(p)) ?? ['', 'either'];
    const name = entry.name.slice(prefix.length, -suffix.length);
    const module =
      naming === 'either' ? (names.original.get(name) ?? names.diffusers.get(name)) : names[naming].get(name);
    if (!module)
      throw fail(
        `"${entry.name}" names no module of this transformer (${cfg.numLayers} blocks, width ${cfg.dim}): ` +
          'is it a LoRA for another model?',
      );
    const change = modules.get(module) ?? {};
    if (change[part]) throw fail(`"${entry.name}" gives the ${part} of ${module} a second time`);
    change[part] = entry;
    modules.set(module, change);
  }
  for (const [module, change] of modules) checkFits(module, change, shapes, fail);
  return { source, modules };
}

function checkFits(
  module: string,
  { down, up, alpha, diff, diffBias }: ModuleChange,
  shapes: Map<string, number[]>,
  fail: (what: string) => LoraError,
): void {
  const show = (e: TensorEntry) => `"${e.name}" [${e.shape.join(',')}]`;
  if (!down !== !up) throw fail(`${show((down ?? up) as TensorEntry)} has no ${down ? 'up' : 'down'} matrix beside it`);
  if (alpha && !down) throw fail(`${show(alpha)} scales no low-rank pair`);
  if (alpha && sizeOf(alpha.shape) !== 1) throw fail(`${show(alpha)} must be one number`);
  const weight = shapes.get(targetOf(shapes, module, 'down'));
  if (!weight) throw fail(`${module} has no weight to change`);
  if (down && up) {
    const [rank, ...inner] = down.shape;
    const inputs = sizeOf(weight.slice(1));
    if (!(rank > 0) || sizeOf(inner) !== inputs || up.shape[0] !== weight[0] || sizeOf(up.shape.slice(1)) !== rank)
      throw fail(
        `${show(down)} and ${show(up)} do not make ${module}'s [${weight.join(',')}] ` +
          `(down must be [rank, ${inputs}], up [${weight[0]}, rank])`,
      );
  }
  if (diff && sizeOf(diff.shape) !== sizeOf(weight))
    throw fail(`${show(diff)} does not fit ${module}'s [${weight.join(',')}]`);
  if (diffBias) {
    const bias = shapes.get(targetOf(shapes, module, 'diffBias'));
    if (!bias || sizeOf(diffBias.shape) !== sizeOf(bias))
      throw fail(`${show(diffBias)} does not fit ${module}'s bias${bias ? ` [${bias.join(',')}]` : ' (it has none)'}`);
  }
}

/**
 * Merges `lora` at `strength` into the weights `model` holds (a stage's alone: the changes of modules it does not
 * hold are never read). Each changed tensor is a new array: the loaded ones may be views of bytes a file cache keeps.
 */
export async function mergeLora(model: WanModel, files: ByteRanges, lora: LoraFile, strength: number): Promise<void> {
  const cfg = model.config;
  const held = model.blocks ?? allBlocks(cfg);
  const shapes = expectedWeightShapes(cfg);
  const read = async (entry: TensorEntry | undefined): Promise<Float32Array | null> =>
    entry ? (await readTensor(files, entry)).data : null;
  for (const [module, change] of lora.modules) {
    const weightName = targetOf(shapes, module, 'down');
    if (!holdsTensor(cfg, held, weightName)) continue;
    const weight = changed(model, weightName);
    const [down, up, alpha, diff, diffBias] = await Promise.all(
      [change.down, change.up, change.alpha, change.diff, change.diffBias].map(read),
    );
    if (down && up) {
      const rank = up.length / weight.shape[0];
      addLowRank(weight, up, down, rank, (strength * (alpha ? alpha[0] : rank)) / rank);
    }
    if (diff) for (let i = 0; i < diff.length; i++) weight.data[i] += strength * diff[i];
    if (diffBias) {
      const bias = changed(model, targetOf(shapes, module, 'diffBias'));
      for (let i = 0; i < diffBias.length; i++) bias.data[i] += strength * diffBias[i];
    }
  }
}

/** `name`'s tensor, copied into the model so that changing it changes nothing else. */
function changed(model: WanModel, name: string): Tensor {
  const t = model.weights.get(name);
  if (!t) throw new LoraError(`the model holds no ${name} to merge a LoRA into`);
  const copy = { shape: t.shape, data: new Float32Array(t.data) };
  model.weights.set(name, copy);
  return copy;
}

/** weight [out, in] += scale · up [out, rank] · down [rank, in], each row summed in float64 before it is added. */
function addLowRank(weight: Tensor, up: Float32Array, down: Float32Array, rank: number, scale: number): void {
  const out = weight.shape[0];
  const inputs = weight.data.length / out;
  const row = new Float64Array(inputs);
  for (let o = 0; o < out; o++) {
    row.fill(0);
    for (let r = 0; r < rank; r++) {
      const u = up[o * rank + r];
      if (u === 0) continue;
      const d = r * inputs;
      for (let i = 0; i < inputs; i++) row[i] += u * down[d + i];
    }
    const w = o * inputs;
    for (let i = 0; i < inputs; i++) weight.data[w + i] += scale * row[i];
  }
}

/** An adapter file's folder and its name there: files are read through their folder, as a model's are. */
export function splitFileUrl(url: string): { folder: string; name: string } {
  const at = url.lastIndexOf('/');
  return { folder: at < 0 ? '.' : url.slice(0, at) || '/', name: url.slice(at + 1) };
}

/** Where an adapter's bytes are read from: its folder's files, and its name among them. */
export type LoraFiles = (url: string) => { files: ByteRanges; path: string; close?: () => Promise<void> };

/** Merges each adapter of `refs` into `model`, in order, each checked whole before any of its weights is read. */
export async function applyLoras(model: WanModel, refs: readonly LoraRef[], filesOf: LoraFiles): Promise<void> {
  for (const { url, strength } of refs) {
    const { files, path, close } = filesOf(url);
    try {
      await mergeLora(model, files, await openLora(files, path, model.config, url), strength);
    } finally {
      await close?.();
    }
  }
}

/** Adapters as a job asks for them, checked: at most LORA_LIMITS.adapters, each a URL and a strength in range. */
export function checkLoras(loras: unknown): LoraRef[] {
  if (loras === undefined) return [];
  if (!Array.isArray(loras) || loras.length > LORA_LIMITS.adapters)
    throw new LoraError(`loras is a list of at most ${LORA_LIMITS.adapters} adapters, got ${JSON.stringify(loras)}`);
  const { min, max } = LORA_LIMITS.strength;
  return loras.map((lora: Partial<LoraRef> | null, i) => {
    const { url, strength } = lora ?? {};
    if (typeof url !== 'string' || !url.trim()) throw new LoraError(`lora ${i + 1} has no url of its file`);
    if (typeof strength !== 'number' || !(strength >= min && strength <= max))
      throw new LoraError(
        `lora ${url}: its strength is a number from ${min} to ${max}, got ${JSON.stringify(strength)}`,
      );
    return { url, strength };
  });
}

/** `FILE[:STRENGTH]` as a command line gives an adapter (strength 1 where it is left out). */
export function parseLoraFlag(flag: string): LoraRef {
  const at = flag.lastIndexOf(':');
  const strength = at > 0 && /^[-+.\d]+(e[-+]?\d+)?$/i.test(flag.slice(at + 1)) ? flag.slice(at + 1) : null;
  const [url] = checkLoras([{ url: strength ? flag.slice(0, at) : flag, strength: strength ? Number(strength) : 1 }]);
  return url;
}
