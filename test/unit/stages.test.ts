import { beforeAll, describe, expect, it } from 'vitest';
import type { WanModel } from '../../core/model/reference.ts';
import { patchify, ropeTables, tokenGrid, unpatchify } from '../../core/model/tokens.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { SeededRandom } from '../../core/random.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import { onnxStages, type OnnxStages } from '../../rank/onnx-stages.ts';
import { hostValues, referenceStages, type StageRunner } from '../../rank/stages.ts';
import { tinyModelFiles } from './fixtures.ts';
import { stagedModel, wholeModelBytes } from '../../coordinator/stage-plan.ts';

/** The ONNX graphs against the TypeScript reference, stage by stage and whole. */
let m: WanModel;
let onnx: OnnxStages;
let ref: StageRunner;
const random = new SeededRandom(7);
const latent: Tensor = { shape: [16, 3, 8, 12], data: random.normals(16 * 3 * 8 * 12) }; // 72 tokens
// three timesteps, each token's by its index (core/model/timesteps.ts): the per-token gathers are checked too
const timesteps = Float32Array.of(873.5, 0, 412.25);
const levels = Int32Array.from({ length: 72 }, (_, token) => token % 3);
let text: Float32Array;

beforeAll(async () => {
  m = await loadTransformer(tinyModelFiles);
  onnx = await onnxStages(m, 'wasm');
  ref = referenceStages(m);
  text = random.normals(16 * m.config.textDim);
});

/** Each stage of `runner` against `expected`'s (the reference's unless given) on the same inputs, within 1e-4. */
async function expectStagesEqualReference(runner: StageRunner, expected: StageRunner = ref): Promise<void> {
  const ref = expected;
  const patches = patchify(m.config, latent).data;
  const [a, b] = [await runner.embed(patches, timesteps, text), await ref.embed(patches, timesteps, text)];
  for (const key of ['x', 'temb', 'tproj', 'context'] as const)
    expect(maxAbsDiff(hostValues(a[key]), hostValues(b[key])), key).toBeLessThan(1e-4);

  const grid = tokenGrid(m.config, latent.shape);
  const { cos, sin } = ropeTables(m.config, grid, 0, grid.count);
  const [qa, qb] = [
    await runner.preAttention(1, b.x, b.tproj, levels, cos, sin),
    await ref.preAttention(1, b.x, b.tproj, levels, cos, sin),
  ];
  for (const key of ['q', 'k', 'v'] as const) expect(maxAbsDiff(qa[key], qb[key]), key).toBeLessThan(1e-4);

  // four heads only
  const width = 4 * m.config.headDim;
  const heads = {
    q: random.normals(grid.count * width),
    k: random.normals(grid.count * width),
    v: random.normals(grid.count * width),
  };
  expect(maxAbsDiff(await runner.attention(heads, width), await ref.attention(heads, width))).toBeLessThan(1e-4);

  const o = random.normals(grid.count * m.config.dim);
  const [pa, pb] = [
    await runner.postAttention(0, b.x, o, b.tproj, levels, b.context),
    await ref.postAttention(0, b.x, o, b.tproj, levels, b.context),
  ];
  expect(maxAbsDiff(hostValues(pa), hostValues(pb))).toBeLessThan(1e-4);
  expect(maxAbsDiff(await runner.head(b.x, b.temb, levels), await ref.head(b.x, b.temb, levels))).toBeLessThan(1e-4);
}

describe('ONNX stage graphs equal the TypeScript reference (max-abs ≤ 1e-4)', () => {
  it('embed, pre-attention, attention, post-attention and head', async () => {
    await expectStagesEqualReference(onnx);
  });

  it('cut to a buffer budget (rows for the row-wise stages, heads for attention) give the same numbers', async () => {
    // two heads of 72 tokens per buffer: pre-attention 12 rows at a time, post-attention 3, attention 2 of 4 heads
    await expectStagesEqualReference(await onnxStages(m, 'wasm', { maxBufferBytes: 4 * 72 * 2 * m.config.headDim }));
    // a budget below one head of the sequence is refused, saying what it would take
    const tooSmall = await onnxStages(m, 'wasm', { maxBufferBytes: 4 * 71 * m.config.headDim });
    const heads = {
      q: new Float32Array(72 * 4 * m.config.headDim),
      k: new Float32Array(72 * 4 * m.config.headDim),
      v: new Float32Array(72 * 4 * m.config.headDim),
    };
    await expect(tooSmall.attention(heads, 4 * m.config.headDim)).rejects.toThrow(
      `attention over 72 tokens needs ${4 * 72 * m.config.headDim} bytes per head, more than one buffer of this worker holds`,
    );
  });

  it("with the weights stored as float16 (WebGPU with shader-f16) the embedders, a block and the head stay within float16's rounding of the reference", async () => {
    const half = await onnxStages(m, 'wasm', { weightType: 'float16' });
    expect(half.weightType).toBe('float16');
    const patches = patchify(m.config, latent).data;
    const b = await ref.embed(patches, timesteps, text);
    const o = random.normals(tokenGrid(m.config, latent.shape).count * m.config.dim);
    /** each runner's output of one stage: half's within 2e-3 of the reference's scale, and its weights were float16 */
    const expectHalved = (what: string, [halfOut, fullOut, exact]: Float32Array[]) => {
      const scale = exact.reduce((s, v) => Math.max(s, Math.abs(v)), 0);
      expect(maxAbsDiff(halfOut, exact) / scale, what).toBeLessThan(2e-3);
      // the float32 graph is closer
      expect(maxAbsDiff(halfOut, exact), what).toBeGreaterThan(10 * maxAbsDiff(fullOut, exact));
    };
    const runners = [half, onnx, ref];
    const embedded = await Promise.all(runners.map((r) => r.embed(patches, timesteps, text)));
    for (const key of ['x', 'temb', 'context'] as const)
      expectHalved(
        `embed's ${key}`,
        embedded.map((e) => hostValues(e[key])),
      );
    expectHalved(
      'a block',
      await Promise.all(
        runners.map(async (r) => hostValues(await r.postAttention(0, b.x, o, b.tproj, levels, b.context))),
      ),
    );
    expectHalved('the head', await Promise.all(runners.map((r) => r.head(b.x, b.temb, levels))));
  });

  it("taking a model's weights, a runner holding them as float16 drops their float32 arrays from the model as it copies them (a load holds a block twice, never the model); one holding float32 on WASM shares them and drops none", async () => {
    const patches = patchify(m.config, latent).data;
    const b = await ref.embed(patches, timesteps, text);
    const o = random.normals(tokenGrid(m.config, latent.shape).count * m.config.dim);
    const ownCopy = (): WanModel => ({ ...m, weights: new Map(m.weights) });
    const names = (model: WanModel) => [...model.weights.keys()];
    const taken = ownCopy();
    const half = await onnxStages(taken, 'wasm', { weightType: 'float16', takesWeights: true });
    expect(names(taken)).toEqual([]); // the embedders' and the head's too
    expect(hostValues((await half.embed(patches, timesteps, text)).x)).toEqual(
      hostValues((await (await onnxStages(m, 'wasm', { weightType: 'float16' })).embed(patches, timesteps, text)).x),
    );
    const kept = await onnxStages(m, 'wasm', { weightType: 'float16' });
    expect(names(m)).toContain('blocks.1.ffn.net.2.weight');
    expect(hostValues(await half.postAttention(1, b.x, o, b.tproj, levels, b.context))).toEqual(
      hostValues(await kept.postAttention(1, b.x, o, b.tproj, levels, b.context)),
    );

    const shared = ownCopy();
    await onnxStages(shared, 'wasm', { takesWeights: true });
    expect(names(shared)).toEqual(names(m));
  });

  it("with int8 weights, the runner computes what float32 computes on the weights as an independent reading stores them (each linear matrix's row rounded to 255 levels of its largest |w|, the rest float32), and holds the bytes the planner cuts stages by", async () => {
    const int8 = await onnxStages(m, 'wasm', { weightType: 'int8' });
    expect(int8.weightType).toBe('int8');
    // the same model with its weights as int8 stores them, read back as float32
    const stored = new Map(
      [...m.weights].map(([name, t]) => {
        const matrix = name.endsWith('.weight') && t.shape.length >= 2;
        if (!matrix) return [name, t];
        const rowLength = t.data.length / t.shape[0];
        const data = new Float32Array(t.data.length);
        for (let row = 0; row < t.shape[0]; row++) {
          const values = t.data.subarray(row * rowLength, (row + 1) * rowLength);
          const step = Math.max(...values.map(Math.abs)) / 127;
          values.forEach((w, i) => (data[row * rowLength + i] = step && Math.round(w / step) * step));
        }
        return [name, { ...t, data }];
      }),
    );
    const storedRef = referenceStages({ ...m, weights: stored });
    await expectStagesEqualReference(int8, storedRef);
    // and off float32 by the rounding: more than float16's, within 3e-2 of each output's scale
    const patches = patchify(m.config, latent).data;
    const [x8, x32] = await Promise.all(
      [int8, ref].map(async (r) => hostValues((await r.embed(patches, timesteps, text)).x)),
    );
    const scale = Math.max(...x32.map(Math.abs));
    expect(maxAbsDiff(x8, x32) / scale).toBeLessThan(3e-2);
    expect(maxAbsDiff(x8, x32) / scale).toBeGreaterThan(1e-3);

    // every weight held once, as stored: the bytes the planner weighs a stage by
    const half = await onnxStages(m, 'wasm', { weightType: 'float16' });
    const float32Bytes = [...m.weights.values()].reduce((n, t) => n + t.data.byteLength, 0);
    expect([onnx, half, int8].map((r) => r.heldWeightBytes)).toEqual(
      (['float32', 'float16', 'int8'] as const).map((type) => wholeModelBytes(stagedModel(m.config, type))),
    );
    expect([onnx.heldWeightBytes, half.heldWeightBytes]).toEqual([float32Bytes, float32Bytes / 2]);
    expect(int8.heldWeightBytes).toBeLessThan(0.3 * float32Bytes);
  });

  it('patchify and unpatchify follow diffusers (Conv3d order in, (pt, ph, pw, C) order out)', () => {
    const rows = patchify(m.config, latent);
    expect(rows.shape).toEqual([72, 64]);
    // token 7 = frame 0, row 1, col 1 (6 columns); its vector element (c=2, kh=1, kw=0) is latent[2, 0, 3, 2]
    expect(rows.data[7 * 64 + 2 * 4 + 1 * 2 + 0]).toBe(latent.data[((2 * 3 + 0) * 8 + 3) * 12 + 2]);
    // out rows are ordered (kh, kw, c): rearranging the patch vectors round-trips
    const perm = new Float32Array(rows.data.length);
    for (let s = 0; s < 72; s++)
      for (let c = 0; c < 16; c++)
        for (let k = 0; k < 4; k++) perm[s * 64 + k * 16 + c] = rows.data[s * 64 + c * 4 + k];
    expect(maxAbsDiff(unpatchify(m.config, perm, latent.shape).data, latent.data)).toBe(0);
  });
});
