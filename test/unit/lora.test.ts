// LoRA adapters (core/model/lora.ts): one random adapter written in each of the three forms Wan LoRAs
// are published in lands on the same weights, which equal W + s·(alpha/rank)·up·down computed here in
// float64; a key that names nothing, or a part that does not fit, is refused naming the key; a
// pipeline stage reads only its own modules' changes. The key names below are written out by hand
// for each form (not derived from the loader's table), so that a wrong entry in that table shows.
// The forward of a merged model is held to diffusers' reading in wan-transformer-reference.test.ts.
import { describe, expect, it } from 'vitest';
import { holdsTensor } from '../../core/model/blocks.ts';
import { expectedWeightShapes, parseWanConfig } from '../../core/model/config.ts';
import { applyLoras, checkLoras, parseLoraFlag, splitFileUrl, type LoraRef } from '../../core/model/lora.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { SeededRandom } from '../../core/random.ts';
import { writeSafetensors, type ByteRanges, type TensorMap } from '../../core/safetensors.ts';
import { sizeOf, type Tensor } from '../../core/tensor.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';

const cfg = parseWanConfig(
  { ...WAN21_T2V_1_3B.transformer, attention_head_dim: 8, ffn_dim: 40, num_layers: 2, text_dim: 16 },
  'a small 1.3B layout',
);
const D = cfg.dim;
const RANK = 3;
const ALPHA = 1.5;
const STRENGTH = 0.8;

/** A module the adapter changes, by its name in each form, and its weight's [out, in]. */
interface Changed {
  wan: string;
  diffusers: string;
  kohya: string;
  out: number;
  in: number;
}
const CHANGED: Changed[] = [
  { wan: 'blocks.0.self_attn.q', diffusers: 'blocks.0.attn1.to_q', kohya: 'blocks_0_self_attn_q', out: D, in: D },
  {
    wan: 'blocks.1.cross_attn.o',
    diffusers: 'blocks.1.attn2.to_out.0',
    kohya: 'blocks_1_cross_attn_o',
    out: D,
    in: D,
  },
  { wan: 'blocks.0.ffn.0', diffusers: 'blocks.0.ffn.net.0.proj', kohya: 'blocks_0_ffn_0', out: 40, in: D },
  { wan: 'blocks.1.ffn.2', diffusers: 'blocks.1.ffn.net.2', kohya: 'blocks_1_ffn_2', out: D, in: 40 },
  {
    wan: 'time_projection.1',
    diffusers: 'condition_embedder.time_proj',
    kohya: 'time_projection_1',
    out: 6 * D,
    in: D,
  },
  { wan: 'head.head', diffusers: 'proj_out', kohya: 'head_head', out: 64, in: D },
];

const random = new SeededRandom(11);
const pairs = CHANGED.map((m) => ({
  ...m,
  down: random.normals(RANK * m.in, 0.3),
  up: random.normals(m.out * RANK, 0.3),
}));

function model(blocks?: { from: number; to: number }): WanModel {
  const weights: TensorMap = new Map();
  const seeded = new SeededRandom(3);
  for (const [name, shape] of expectedWeightShapes(cfg)) {
    const data = seeded.normals(sizeOf(shape), 0.1);
    if (!blocks || holdsTensor(cfg, blocks, name)) weights.set(name, { shape, data });
  }
  return { config: cfg, weights, ...(blocks && { blocks }) };
}

type Form = 'wan' | 'diffusers' | 'kohya';
/** The adapter as each form names and stores it: diffusers' converter folds alpha/rank into lora_A. */
function written(form: Form): Uint8Array {
  const tensors: TensorMap = new Map();
  const put = (key: string, shape: number[], data: Float32Array) => tensors.set(key, { shape, data });
  for (const p of pairs) {
    const shapes = { down: [RANK, p.in], up: [p.out, RANK] };
    if (form === 'diffusers') {
      put(
        `transformer.${p.diffusers}.lora_A.weight`,
        shapes.down,
        p.down.map((v) => (v * ALPHA) / RANK),
      );
      put(`transformer.${p.diffusers}.lora_B.weight`, shapes.up, p.up);
      continue;
    }
    const name = form === 'wan' ? `diffusion_model.${p.wan}` : `lora_unet_${p.kohya}`;
    put(`${name}.lora_down.weight`, shapes.down, p.down);
    put(`${name}.lora_up.weight`, shapes.up, p.up);
    put(`${name}.alpha`, [], Float32Array.of(ALPHA));
  }
  return writeSafetensors(tensors);
}

const inMemory = (bytes: Uint8Array): ByteRanges => ({
  readRange: (_path, begin, end) => Promise.resolve(bytes.slice(begin, end)),
});

async function merged(bytes: Uint8Array, into = model(), strength = STRENGTH): Promise<WanModel> {
  await applyLoras(into, [{ url: 'adapter.safetensors', strength }], () => ({
    files: inMemory(bytes),
    path: 'adapter.safetensors',
  }));
  return into;
}

/** W + s·(alpha/rank)·up·down in float64, from the weights before the merge. */
function expectedWeight(p: (typeof pairs)[number], before: Tensor): Float64Array {
  const out = new Float64Array(before.data);
  for (let o = 0; o < p.out; o++)
    for (let i = 0; i < p.in; i++) {
      let sum = 0;
      for (let r = 0; r < RANK; r++) sum += p.up[o * RANK + r] * p.down[r * p.in + i];
      out[o * p.in + i] += ((STRENGTH * ALPHA) / RANK) * sum;
    }
  return out;
}

function largestRelative(actual: Float32Array, expected: Float64Array): number {
  let [diff, scale] = [0, 0];
  expected.forEach((v, i) => {
    diff = Math.max(diff, Math.abs(actual[i] - v));
    scale = Math.max(scale, Math.abs(v - 0));
  });
  return diff / scale;
}

describe('LoRA adapters', () => {
  it("one adapter in Wan's own keys, diffusers / PEFT and kohya lands on the same weights: W + s·(alpha/rank)·up·down", async () => {
    const before = model();
    for (const form of ['wan', 'diffusers', 'kohya'] as const) {
      const after = await merged(written(form));
      for (const p of pairs) {
        const name = `${p.diffusers}.weight`;
        const expected = expectedWeight(p, before.weights.get(name) as Tensor);
        const moved = largestRelative((before.weights.get(name) as Tensor).data, expected);
        expect(moved, `${form}: the adapter moves ${name}`).toBeGreaterThan(1e-2);
        expect(largestRelative((after.weights.get(name) as Tensor).data, expected), `${form}: ${name}`).toBeLessThan(
          1e-6,
        );
      }
      // nothing else changed
      for (const [name, t] of after.weights)
        if (!pairs.some((p) => `${p.diffusers}.weight` === name))
          expect(t.data, `${form}: ${name}`).toEqual((before.weights.get(name) as Tensor).data);
    }
  });

  it("whole-tensor diffs and bias diffs land at the strength (Wan's norm3 is diffusers' norm2, modulation its scale_shift_table)", async () => {
    const diff = new SeededRandom(5).normals(D, 0.1);
    const diffB = new SeededRandom(6).normals(D, 0.1);
    const modulation = new SeededRandom(7).normals(6 * D, 0.1);
    const bytes = writeSafetensors(
      new Map([
        ['diffusion_model.blocks.1.norm3.diff', { shape: [D], data: diff }],
        ['diffusion_model.blocks.1.norm3.diff_b', { shape: [D], data: diffB }],
        ['diffusion_model.blocks.0.modulation.diff', { shape: [1, 6, D], data: modulation }],
      ]),
    );
    const before = model();
    const after = await merged(bytes, model(), 0.5);
    const moved = (name: string) => {
      const a = (after.weights.get(name) as Tensor).data;
      const b = (before.weights.get(name) as Tensor).data;
      return Float32Array.from(a, (v, i) => v - b[i]);
    };
    const close = (actual: Float32Array, expected: Float32Array) =>
      actual.forEach((v, i) => expect(v).toBeCloseTo(0.5 * expected[i], 6));
    close(moved('blocks.1.norm2.weight'), diff);
    close(moved('blocks.1.norm2.bias'), diffB);
    close(moved('blocks.0.scale_shift_table'), modulation);
  });

  it('a key that names no module, or no part of one, is refused naming the key; so is a change that does not fit', async () => {
    const refused = (tensors: [string, number[]][]) =>
      merged(
        writeSafetensors(new Map(tensors.map(([k, shape]) => [k, { shape, data: new Float32Array(sizeOf(shape)) }]))),
      );
    await expect(
      refused([
        ['diffusion_model.blocks.2.self_attn.q.lora_down.weight', [RANK, D]],
        ['diffusion_model.blocks.2.self_attn.q.lora_up.weight', [D, RANK]],
      ]),
    ).rejects.toThrow(
      'LoRA adapter.safetensors: "diffusion_model.blocks.2.self_attn.q.lora_down.weight" names no module of this ' +
        'transformer (2 blocks, width 96): is it a LoRA for another model?',
    );
    await expect(refused([['transformer.blocks.0.attn1.to_q.lora_dwn.weight', [RANK, D]]])).rejects.toThrow(
      '"transformer.blocks.0.attn1.to_q.lora_dwn.weight" is no part of a LoRA',
    );
    await expect(refused([['diffusion_model.blocks.0.self_attn.q.lora_down.weight', [RANK, D]]])).rejects.toThrow(
      '"diffusion_model.blocks.0.self_attn.q.lora_down.weight" [3,96] has no up matrix beside it',
    );
    await expect(
      refused([
        ['lora_unet_blocks_0_ffn_0.lora_down.weight', [RANK, D]],
        ['lora_unet_blocks_0_ffn_0.lora_up.weight', [D, RANK]],
      ]),
    ).rejects.toThrow(
      /"lora_unet_blocks_0_ffn_0.lora_down.weight" \[3,96\] and .* do not make blocks.0.ffn.net.0.proj's \[40,96\]/,
    );
    await expect(refused([['diffusion_model.blocks.0.self_attn.o.diff_b', [D + 1]]])).rejects.toThrow(
      '"diffusion_model.blocks.0.self_attn.o.diff_b" [97] does not fit blocks.0.attn1.to_out.0\'s bias [96]',
    );
  });

  it("a pipeline stage reads and merges only its own blocks' changes", async () => {
    const bytes = written('wan');
    let reads = 0;
    const counting: ByteRanges = {
      readRange: (_path, begin, end) => (reads++, Promise.resolve(bytes.slice(begin, end))),
    };
    const stage = model({ from: 1, to: 2 });
    const refs: LoraRef[] = [{ url: 'a.safetensors', strength: STRENGTH }];
    await applyLoras(stage, refs, () => ({ files: counting, path: 'a.safetensors' }));
    // the header (two reads and its last byte), then down, up and alpha of block 1's two modules and the head's
    // (the last stage's)
    expect(reads).toBe(3 + 3 * 3);
    for (const p of pairs.filter((p) => p.diffusers.startsWith('blocks.1.') || p.diffusers === 'proj_out')) {
      const name = `${p.diffusers}.weight`;
      const expected = expectedWeight(p, model().weights.get(name) as Tensor);
      expect(largestRelative((stage.weights.get(name) as Tensor).data, expected)).toBeLessThan(1e-6);
    }
  });

  it("an adapter's folder and name, as its files are read", () => {
    expect(splitFileUrl('http://h/loras/x/a.safetensors')).toEqual({
      folder: 'http://h/loras/x',
      name: 'a.safetensors',
    });
    expect(splitFileUrl('/a.safetensors')).toEqual({ folder: '/', name: 'a.safetensors' });
    expect(splitFileUrl('a.safetensors')).toEqual({ folder: '.', name: 'a.safetensors' });
  });

  it("FILE[:STRENGTH] on a command line, and a job's adapters checked before any worker fetches one", () => {
    expect(parseLoraFlag('/x/a.safetensors:0.8')).toEqual({ url: '/x/a.safetensors', strength: 0.8 });
    expect(parseLoraFlag('/x/a.safetensors')).toEqual({ url: '/x/a.safetensors', strength: 1 });
    expect(parseLoraFlag('http://h:8080/a.safetensors')).toEqual({ url: 'http://h:8080/a.safetensors', strength: 1 });
    expect(parseLoraFlag('http://h:8080/a.safetensors:-1.5')).toEqual({
      url: 'http://h:8080/a.safetensors',
      strength: -1.5,
    });
    expect(() => parseLoraFlag('/x/a.safetensors:11')).toThrow(
      'lora /x/a.safetensors: its strength is a number from -10 to 10, got 11',
    );
    expect(checkLoras(undefined)).toEqual([]);
    expect(() => checkLoras([{ url: '/a', strength: NaN }])).toThrow(
      'its strength is a number from -10 to 10, got null',
    );
    expect(() => checkLoras([{ url: '', strength: 1 }])).toThrow('lora 1 has no url of its file');
    expect(() => checkLoras(Array.from({ length: 9 }, () => ({ url: '/a', strength: 1 })))).toThrow(
      /at most 8 adapters/,
    );
  });
});
