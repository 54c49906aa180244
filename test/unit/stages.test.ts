import { beforeAll, describe, expect, it } from 'vitest';
import type { WanModel } from '../../core/model/reference.ts';
import { patchify, ropeTables, tokenGrid, unpatchify } from '../../core/model/tokens.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { planUlysses, keyPaddingBias } from '../../core/parallel.ts';
import { SeededRandom } from '../../core/random.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import { hostValues, referenceStages, type StageRunner } from '../../rank/stages.ts';
import { tinyModelFiles } from './fixtures.ts';

/** The ONNX graphs against the TypeScript reference, stage by stage and whole. */
let m: WanModel;
let onnx: StageRunner;
let ref: StageRunner;
const random = new SeededRandom(7);
const latent: Tensor = { shape: [16, 3, 8, 12], data: random.normals(16 * 3 * 8 * 12) }; // 72 tokens
const timestep = 873.5;
let text: Float32Array;

beforeAll(async () => {
  m = await loadTransformer(tinyModelFiles);
  onnx = await onnxStages(m, 'wasm');
  ref = referenceStages(m);
  text = random.normals(16 * m.config.textDim);
});

describe('ONNX stage graphs equal the TypeScript reference (max-abs ≤ 1e-4)', () => {
  it('embed, pre-attention, attention, post-attention and head', async () => {
    const patches = patchify(m.config, latent).data;
    const [a, b] = [await onnx.embed(patches, timestep, text), await ref.embed(patches, timestep, text)];
    for (const key of ['x', 'temb', 'tproj', 'context'] as const) expect(maxAbsDiff(hostValues(a[key]), hostValues(b[key])), key).toBeLessThan(1e-4);

    const grid = tokenGrid(m.config, latent.shape);
    const { cos, sin } = ropeTables(m.config, grid, 0, grid.count);
    const [qa, qb] = [await onnx.preAttention(1, b.x, b.tproj, cos, sin), await ref.preAttention(1, b.x, b.tproj, cos, sin)];
    for (const key of ['q', 'k', 'v'] as const) expect(maxAbsDiff(qa[key], qb[key]), key).toBeLessThan(1e-4);

    // four heads only, and the last 5 keys masked as padding
    const width = 4 * m.config.headDim;
    const heads = { q: random.normals(grid.count * width), k: random.normals(grid.count * width), v: random.normals(grid.count * width) };
    const bias = keyPaddingBias({ ...planUlysses(m.config, grid.count - 5, 1), paddedTokens: grid.count });
    expect(maxAbsDiff(await onnx.attention(heads, bias), await ref.attention(heads, bias))).toBeLessThan(1e-4);

    const o = random.normals(grid.count * m.config.dim);
    const [pa, pb] = [await onnx.postAttention(0, b.x, o, b.tproj, b.context), await ref.postAttention(0, b.x, o, b.tproj, b.context)];
    expect(maxAbsDiff(hostValues(pa), hostValues(pb))).toBeLessThan(1e-4);
    expect(maxAbsDiff(await onnx.head(b.x, b.temb), await ref.head(b.x, b.temb))).toBeLessThan(1e-4);
  });

  it('patchify and unpatchify follow diffusers (Conv3d order in, (pt, ph, pw, C) order out)', () => {
    const rows = patchify(m.config, latent);
    expect(rows.shape).toEqual([72, 64]);
    // token 7 = frame 0, row 1, col 1 (6 columns); its vector element (c=2, kh=1, kw=0) is latent[2, 0, 3, 2]
    expect(rows.data[7 * 64 + 2 * 4 + 1 * 2 + 0]).toBe(latent.data[((2 * 3 + 0) * 8 + 3) * 12 + 2]);
    // out rows are ordered (kh, kw, c): rearranging the patch vectors round-trips
    const perm = new Float32Array(rows.data.length);
    for (let s = 0; s < 72; s++) for (let c = 0; c < 16; c++) for (let k = 0; k < 4; k++) perm[s * 64 + k * 16 + c] = rows.data[s * 64 + c * 4 + k];
    expect(maxAbsDiff(unpatchify(m.config, perm, latent.shape).data, latent.data)).toBe(0);
  });
});

