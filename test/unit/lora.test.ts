// LoRA adapters (core/model/lora.ts): one random adapter written in each of the three forms Wan LoRAs
// are published in lands on the same weights, which equal W + s·(alpha/rank)·up·down computed here in
// float64; a key that names nothing, or a part that does not fit, is refused naming the key; a
// pipeline stage reads only its own modules' changes. The key names below are written out by hand
// for each form (not derived from the loader's table), so that a wrong entry in that table shows.
// The forward of a merged model is held to diffusers' reading in wan-transformer-reference.test.ts.
import { describe, expect, it } from 'vitest';
import { holdsTensor } from '../../core/model/blocks.ts';
import { expectedWeightShapes, parseWanConfig } from '../../core/model/config.ts';
import {
  applyLoras,
  checkLoras,
  LoraError,
  openLora,
  parseLoraFlag,
  splitFileUrl,
  type LoraRef,
} from '../../core/model/lora.ts';
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

describe("a LoRA file's keys", () => {
  // every module a Wan LoRA may change, by its original name (ComfyUI's), written out by hand, and diffusers' name
  const ORIGINAL_TO_DIFFUSERS: [string, string][] = [
    ['patch_embedding', 'patch_embedding'],
    ['text_embedding.0', 'condition_embedder.text_embedder.linear_1'],
    ['text_embedding.2', 'condition_embedder.text_embedder.linear_2'],
    ['time_embedding.0', 'condition_embedder.time_embedder.linear_1'],
    ['time_embedding.2', 'condition_embedder.time_embedder.linear_2'],
    ['time_projection.1', 'condition_embedder.time_proj'],
    ['head.head', 'proj_out'],
    ['head.modulation', 'scale_shift_table'],
    ...[0, 1].flatMap((b): [string, string][] => [
      [`blocks.${b}.self_attn.q`, `blocks.${b}.attn1.to_q`],
      [`blocks.${b}.self_attn.k`, `blocks.${b}.attn1.to_k`],
      [`blocks.${b}.self_attn.v`, `blocks.${b}.attn1.to_v`],
      [`blocks.${b}.self_attn.o`, `blocks.${b}.attn1.to_out.0`],
      [`blocks.${b}.self_attn.norm_q`, `blocks.${b}.attn1.norm_q`],
      [`blocks.${b}.self_attn.norm_k`, `blocks.${b}.attn1.norm_k`],
      [`blocks.${b}.cross_attn.q`, `blocks.${b}.attn2.to_q`],
      [`blocks.${b}.cross_attn.k`, `blocks.${b}.attn2.to_k`],
      [`blocks.${b}.cross_attn.v`, `blocks.${b}.attn2.to_v`],
      [`blocks.${b}.cross_attn.o`, `blocks.${b}.attn2.to_out.0`],
      [`blocks.${b}.cross_attn.norm_q`, `blocks.${b}.attn2.norm_q`],
      [`blocks.${b}.cross_attn.norm_k`, `blocks.${b}.attn2.norm_k`],
      [`blocks.${b}.ffn.0`, `blocks.${b}.ffn.net.0.proj`],
      [`blocks.${b}.ffn.2`, `blocks.${b}.ffn.net.2`],
      [`blocks.${b}.norm3`, `blocks.${b}.norm2`],
      [`blocks.${b}.modulation`, `blocks.${b}.scale_shift_table`],
    ]),
  ];
  const shapes = expectedWeightShapes(cfg);
  const weightOf = (module: string) => shapes.get(`${module}.weight`) ?? shapes.get(module) ?? [];
  /** the modules a file of whole-tensor diffs of `keys` changes, by diffusers' name */
  const opened = async (keys: [key: string, module: string][]) =>
    [
      ...(
        await openLora(
          inMemory(
            writeSafetensors(
              new Map(
                keys.map(([key, module]) => {
                  const shape = weightOf(module);
                  return [key, { shape, data: new Float32Array(sizeOf(shape)) }];
                }),
              ),
            ),
          ),
          'a.safetensors',
          cfg,
        )
      ).modules.keys(),
    ].sort();
  const diffusersNames = ORIGINAL_TO_DIFFUSERS.map(([, d]) => d).sort();

  it("name every module of the model in Wan's, kohya's and diffusers' forms, with or without their prefix", async () => {
    expect(await opened(ORIGINAL_TO_DIFFUSERS.map(([o, d]) => [`diffusion_model.${o}.diff`, d]))).toEqual(
      diffusersNames,
    );
    expect(
      await opened(ORIGINAL_TO_DIFFUSERS.map(([o, d]) => [`lora_unet_${o.replaceAll('.', '_')}.diff`, d])),
    ).toEqual(diffusersNames);
    expect(await opened(ORIGINAL_TO_DIFFUSERS.map(([o, d]) => [`${o}.diff`, d]))).toEqual(diffusersNames);
    for (const prefix of ['transformer.', 'base_model.model.', ''])
      expect(await opened(ORIGINAL_TO_DIFFUSERS.map(([, d]) => [`${prefix}${d}.diff`, d]))).toEqual(diffusersNames);
    // a form's prefix names modules in that form only
    await expect(opened([['transformer.blocks.0.self_attn.q.diff', 'blocks.0.attn1.to_q']])).rejects.toThrow(
      /names no module/,
    );
    await expect(opened([['diffusion_model.blocks.0.attn1.to_q.diff', 'blocks.0.attn1.to_q']])).rejects.toThrow(
      /names no module/,
    );
    await expect(opened([['lora_unet_blocks.0.self_attn.q.diff', 'blocks.0.attn1.to_q']])).rejects.toThrow(
      /names no module/,
    );
  });

  it('name no norm2 where the model has no cross-attention norm', async () => {
    const plain = parseWanConfig(
      {
        ...WAN21_T2V_1_3B.transformer,
        attention_head_dim: 8,
        ffn_dim: 40,
        num_layers: 2,
        text_dim: 16,
        cross_attn_norm: false,
      },
      'no cross-attention norm',
    );
    const bytes = writeSafetensors(
      new Map([['diffusion_model.blocks.0.norm3.diff', { shape: [D], data: new Float32Array(D) }]]),
    );
    await expect(openLora(inMemory(bytes), 'a.safetensors', plain)).rejects.toThrow(
      'LoRA a.safetensors: "diffusion_model.blocks.0.norm3.diff" names no module of this transformer',
    );
  });

  /** `tensors` as a file, opened; the error it is refused with */
  const refusal = async (tensors: [string, number[]][]) => {
    const bytes = writeSafetensors(
      new Map(tensors.map(([k, shape]) => [k, { shape, data: new Float32Array(sizeOf(shape)) }])),
    );
    const error = await openLora(inMemory(bytes), 'a.safetensors', cfg, 'http://h/a.safetensors').then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(LoraError);
    return (error as LoraError).message;
  };
  const q = 'diffusion_model.blocks.0.self_attn.q';

  it('refuse each part that cannot be merged, naming its key, its shape and what it lacks', async () => {
    expect(await refusal([[`${q}.lora_up.weight`, [D, RANK]]])).toBe(
      `LoRA http://h/a.safetensors: "${q}.lora_up.weight" [96,3] has no down matrix beside it`,
    );
    expect(await refusal([[`${q}.alpha`, []]])).toBe(
      `LoRA http://h/a.safetensors: "${q}.alpha" [] scales no low-rank pair`,
    );
    expect(
      await refusal([
        [`${q}.lora_down.weight`, [RANK, D]],
        [`${q}.lora_up.weight`, [D, RANK]],
        [`${q}.alpha`, [2]],
      ]),
    ).toBe(`LoRA http://h/a.safetensors: "${q}.alpha" [2] must be one number`);
    expect(
      await refusal([
        [`${q}.lora_down.weight`, [RANK, D]],
        [`transformer.blocks.0.attn1.to_q.lora_A.weight`, [RANK, D]],
      ]),
    ).toMatch(/" gives the down of blocks\.0\.attn1\.to_q a second time$/);
    for (const [down, up] of [
      [
        [RANK, D],
        [D + 1, RANK],
      ],
      [
        [RANK, D],
        [D, RANK + 1],
      ],
      [
        [RANK, D - 1],
        [D, RANK],
      ],
      [
        [0, D],
        [D, 0],
      ],
    ])
      expect(
        await refusal([
          [`${q}.lora_down.weight`, down],
          [`${q}.lora_up.weight`, up],
        ]),
      ).toBe(
        `LoRA http://h/a.safetensors: "${q}.lora_down.weight" [${down.join(',')}] and "${q}.lora_up.weight" ` +
          `[${up.join(',')}] do not make blocks.0.attn1.to_q's [96,96] (down must be [rank, 96], up [96, rank])`,
      );
    expect(await refusal([[`${q}.diff`, [D, D - 1]]])).toBe(
      `LoRA http://h/a.safetensors: "${q}.diff" [96,95] does not fit blocks.0.attn1.to_q's [96,96]`,
    );
    expect(await refusal([['diffusion_model.blocks.0.self_attn.norm_q.diff_b', [D]]])).toBe(
      'LoRA http://h/a.safetensors: "diffusion_model.blocks.0.self_attn.norm_q.diff_b" [96] does not fit ' +
        "blocks.0.attn1.norm_q's bias (it has none)",
    );
    expect(await refusal([['diffusion_model.blocks.0.self_attn.q.lora_mid.weight', [D]]])).toBe(
      'LoRA http://h/a.safetensors: "diffusion_model.blocks.0.self_attn.q.lora_mid.weight" is no part of a LoRA ' +
        '(lora_down.weight, lora_A.weight, lora_up.weight, lora_B.weight, lora_B.bias, diff_b, diff, alpha)',
    );
  });

  it("take PEFT's lora_B.bias as a change of the bias, and a pair at its own rank without alpha", async () => {
    const bias = new SeededRandom(8).normals(D, 0.1);
    const [down, up] = [new SeededRandom(9).normals(2 * D, 0.1), new SeededRandom(10).normals(D * 2, 0.1)];
    const bytes = writeSafetensors(
      new Map([
        ['transformer.blocks.0.attn1.to_q.lora_A.weight', { shape: [2, D], data: down }],
        ['transformer.blocks.0.attn1.to_q.lora_B.weight', { shape: [D, 2], data: up }],
        ['transformer.blocks.0.attn1.to_q.lora_B.bias', { shape: [D], data: bias }],
      ]),
    );
    const before = model();
    const after = await merged(bytes, model(), 2);
    const b0 = (before.weights.get('blocks.0.attn1.to_q.bias') as Tensor).data;
    const b1 = (after.weights.get('blocks.0.attn1.to_q.bias') as Tensor).data;
    b1.forEach((v, i) => expect(v - b0[i]).toBeCloseTo(2 * bias[i], 6));
    const w0 = (before.weights.get('blocks.0.attn1.to_q.weight') as Tensor).data;
    const w1 = (after.weights.get('blocks.0.attn1.to_q.weight') as Tensor).data;
    for (const [o, i] of [
      [0, 0],
      [5, 17],
      [D - 1, D - 1],
    ])
      expect(w1[o * D + i] - w0[o * D + i]).toBeCloseTo(2 * (up[o * 2] * down[i] + up[o * 2 + 1] * down[D + i]), 6);
  });
});

describe('applying adapters', () => {
  /** an adapter that moves blocks.0's q bias by normals of `seed` */
  const diffOf = (seed: number) =>
    writeSafetensors(
      new Map([
        ['diffusion_model.blocks.0.self_attn.q.diff_b', { shape: [D], data: new SeededRandom(seed).normals(D) }],
      ]),
    );

  it('merges each adapter in turn at its own strength, closing each file it opened, also where one is refused', async () => {
    const files = new Map([
      ['one.safetensors', diffOf(1)],
      ['two.safetensors', diffOf(2)],
    ]);
    const closed: string[] = [];
    const filesOf = (url: string) => ({
      files: inMemory(files.get(url) ?? new Uint8Array(8)),
      path: url,
      close: () => (closed.push(url), Promise.resolve()),
    });
    const before = model();
    const after = model();
    await applyLoras(
      after,
      [
        { url: 'one.safetensors', strength: 0.5 },
        { url: 'two.safetensors', strength: -2 },
      ],
      filesOf,
    );
    expect(closed).toEqual(['one.safetensors', 'two.safetensors']);
    const [b0, b1] = [before, after].map((m) => (m.weights.get('blocks.0.attn1.to_q.bias') as Tensor).data);
    const [d1, d2] = [new SeededRandom(1).normals(D), new SeededRandom(2).normals(D)];
    b1.forEach((v, i) => expect(v - b0[i]).toBeCloseTo(0.5 * d1[i] - 2 * d2[i], 5));
    closed.length = 0;
    await expect(applyLoras(model(), [{ url: 'broken.safetensors', strength: 1 }], filesOf)).rejects.toThrow();
    expect(closed).toEqual(['broken.safetensors']);
  });

  it('refuses a change to a weight the model does not hold, naming it', async () => {
    const holed = model();
    holed.weights.delete('blocks.0.attn1.to_q.weight');
    await expect(merged(written('wan'), holed)).rejects.toThrow(
      'the model holds no blocks.0.attn1.to_q.weight to merge a LoRA into',
    );
  });

  it('leaves the tensors it was given as they were: a merged weight is a new array', async () => {
    const before = model();
    const kept = (before.weights.get('proj_out.weight') as Tensor).data;
    const copy = kept.slice();
    await merged(written('kohya'), before);
    expect(kept).toEqual(copy);
    expect((before.weights.get('proj_out.weight') as Tensor).data).not.toBe(kept);
  });
});

describe("a job's adapters", () => {
  it('take up to 8, at strengths from -10 to 10 inclusive, each with a url', () => {
    const eight = Array.from({ length: 8 }, (_, i) => ({ url: `/a${i}`, strength: i % 2 ? 10 : -10 }));
    expect(checkLoras(eight)).toEqual(eight);
    expect(checkLoras([{ url: '/a', strength: 1, extra: true }])).toEqual([{ url: '/a', strength: 1 }]);
    expect(() => checkLoras({ url: '/a', strength: 1 })).toThrow(
      'loras is a list of at most 8 adapters, got {"url":"/a","strength":1}',
    );
    expect(() => checkLoras([null])).toThrow('lora 1 has no url of its file');
    expect(() =>
      checkLoras([
        { url: '/a', strength: 1 },
        { url: '  ', strength: 1 },
      ]),
    ).toThrow('lora 2 has no url of its file');
    expect(() => checkLoras([{ url: '/a', strength: '1' }])).toThrow(
      'lora /a: its strength is a number from -10 to 10, got "1"',
    );
    expect(() => checkLoras([{ url: '/a', strength: -10.5 }])).toThrow(/got -10.5/);
  });

  it('read a strength only where one follows the last colon', () => {
    expect(parseLoraFlag('a.safetensors:1e-1')).toEqual({ url: 'a.safetensors', strength: 0.1 });
    expect(parseLoraFlag('a.safetensors:+2.5E+0')).toEqual({ url: 'a.safetensors', strength: 2.5 });
    // an exponent's sign may be left out, and it may have more than one digit
    expect(parseLoraFlag('a.safetensors:2e0')).toEqual({ url: 'a.safetensors', strength: 2 });
    expect(parseLoraFlag('a.safetensors:50e-02')).toEqual({ url: 'a.safetensors', strength: 0.5 });
    expect(parseLoraFlag(':0.5')).toEqual({ url: ':0.5', strength: 1 });
    expect(parseLoraFlag('a:b.safetensors')).toEqual({ url: 'a:b.safetensors', strength: 1 });
    expect(parseLoraFlag('a.safetensors:0.5x')).toEqual({ url: 'a.safetensors:0.5x', strength: 1 });
    expect(parseLoraFlag('a.safetensors:x0.5')).toEqual({ url: 'a.safetensors:x0.5', strength: 1 });
  });
});
