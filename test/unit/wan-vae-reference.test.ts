// core/model/wan-vae-reference.ts's plain TypeScript decoder held to diffusers' AutoencoderKLWan as the
// upstream Python runs it: wan-vae.fixture.json is what test/reference/wan_vae_numpy.py (a
// line-by-line numpy float32 transcription of autoencoder_kl_wan.py's decoder, _decode and
// tiled_decode, with WanPipeline's un-normalisation first) gives for a tiny seeded VAE in the
// published layout. Regenerate it with `npx tsx test/reference/make-wan-vae-fixture.ts`; this test
// makes the same weights and latents without Python.

import { describe, expect, it } from 'vitest';
import {
  cacheBytes,
  decoderHeadNames,
  decoderOutputBound,
  decoderPlan,
  emptyCaches,
  framesOfChunk,
  parseWanVaeConfig,
  videoFrames,
  wanVaeWeightShapes,
} from '../../core/model/wan-vae.ts';
import { safetensorsHeader } from '../../core/safetensors.ts';
import { sizeOf, type Tensor } from '../../core/tensor.ts';
import { FIXTURE_PATH, INIT, seededDecoderTensors, TINY_VAE_CONFIG } from '../reference/make-wan-vae-fixture.ts';
import { expectCase, readVaeFixture, runCase } from './vae-fixture-check.ts';

const fixture = readVaeFixture(FIXTURE_PATH);
const cfg = parseWanVaeConfig(fixture.config, 'wan-vae.fixture.json');
const tensors = seededDecoderTensors(cfg, fixture.seed);

/** float32 accumulation order differs (numpy's BLAS against the reference's loops) */
const TOLERANCE = 1e-4;

describe("wan-vae-reference.ts's reference decoder against diffusers' AutoencoderKLWan (numpy transcription)", () => {
  it('uses the fixture as it was made', () => {
    expect(fixture.config).toEqual(TINY_VAE_CONFIG);
    expect(fixture.init).toBe(INIT);
    expect(fixture.cases.map((c) => c.name)).toEqual(['one frame', 'three frames', 'tiled 2×2']);
  });

  for (const c of fixture.cases) {
    it(`decodes ${c.name}: latent [${(c.latentShape ?? []).join(',')}]${c.tiling ? `, tiles of ${c.tiling.tile} px every ${c.tiling.stride} px` : ', untiled'}`, () => {
      const { out, tiles } = runCase(cfg, tensors, fixture.seed, c);
      expect(tiles).toBe(c.tiles);
      expectCase(c, fixture.seed, out, TOLERANCE);
    });
  }
});

describe("wan-vae.ts's layout of the published Wan2.1 VAE", () => {
  // Wan-AI/Wan2.1-T2V-1.3B-Diffusers vae/config.json: the fixture's config at 96 channels
  const published = parseWanVaeConfig({ ...TINY_VAE_CONFIG, base_dim: 96 }, 'published vae/config.json');
  const shapes = wanVaeWeightShapes(published);

  it('has 194 tensors, 108 of them the decoder’s (decoder.* and post_quant_conv.*)', () => {
    expect(shapes.size).toBe(194);
    expect(
      [...shapes.keys()].filter((name) => name.startsWith('decoder.') || name.startsWith('post_quant_conv.')).length,
    ).toBe(108);
  });

  it('makes a safetensors file of exactly the published size, 507,591,892 bytes', () => {
    const specs = [...shapes].map(([name, shape]) => ({ name, shape }));
    const params = specs.reduce((n, t) => n + sizeOf(t.shape), 0);
    // save_pretrained writes metadata {"format": "pt"}; `head` is the 8-byte length and the JSON
    const { head } = safetensorsHeader(specs, { format: 'pt' });
    expect(head.length + 4 * params).toBe(507_591_892);
    expect(params).toBe(126_892_531);
  });
});

describe("parseWanVaeConfig: Wan2.1's AutoencoderKLWan config, and what it refuses", () => {
  const published = { ...TINY_VAE_CONFIG, base_dim: 96 };
  const refused = (change: Record<string, unknown>) => () => parseWanVaeConfig({ ...published, ...change }, 'v.json');

  it("reads the published config, and takes diffusers' defaults where a field is absent", () => {
    const cfg = parseWanVaeConfig(published, 'v.json');
    expect(cfg).toMatchObject({
      baseDim: 96,
      decoderBaseDim: 96,
      zDim: 16,
      dimMult: [1, 2, 4, 4],
      numResBlocks: 2,
      temporalDownsample: [false, true, true],
    });
    expect([cfg.latentsMean.length, cfg.latentsStd.length]).toEqual([16, 16]);
    const { base_dim, z_dim, dim_mult, num_res_blocks, temperal_downsample, ...bare } = published;
    expect([base_dim, z_dim, dim_mult, num_res_blocks, temperal_downsample]).toEqual([
      96,
      16,
      [1, 2, 4, 4],
      2,
      [false, true, true],
    ]);
    expect(parseWanVaeConfig(bare, 'v.json')).toEqual(cfg);
    expect(parseWanVaeConfig({ ...published, decoder_base_dim: 48 }, 'v.json').decoderBaseDim).toBe(48);
    // Wan2.1's values, or null, where a field is given
    const wan21 = { scale_factor_temporal: 4, scale_factor_spatial: 8, in_channels: 3, out_channels: 3 };
    expect(parseWanVaeConfig({ ...published, ...wan21, is_residual: false, patch_size: null }, 'v.json')).toEqual(cfg);
    const nulls = Object.fromEntries([...Object.keys(wan21), 'decoder_base_dim'].map((key) => [key, null]));
    expect(parseWanVaeConfig({ ...published, ...nulls }, 'v.json')).toEqual(cfg);
    // the smallest whole numbers where they are read, not the defaults
    const narrow = { num_res_blocks: 1, z_dim: 8, latents_mean: Array(8).fill(0), latents_std: Array(8).fill(1) };
    expect(parseWanVaeConfig({ ...published, ...narrow }, 'v.json')).toMatchObject({ numResBlocks: 1, zDim: 8 });
  });

  it('refuses a config it cannot decode, naming the file, the field and what Wan2.1 has', () => {
    expect(refused({ is_residual: true })).toThrow("v.json: is_residual is true (Wan2.2's VAE)");
    expect(refused({ patch_size: 2 })).toThrow("v.json: patch_size 2 (Wan2.2's VAE)");
    expect(refused({ scale_factor_temporal: 8 })).toThrow("v.json: scale_factor_temporal is 8; Wan2.1's VAE has 4");
    expect(refused({ scale_factor_spatial: 16 })).toThrow("v.json: scale_factor_spatial is 16; Wan2.1's VAE has 8");
    expect(refused({ in_channels: 4 })).toThrow("v.json: in_channels is 4; Wan2.1's VAE has 3");
    expect(refused({ out_channels: 1 })).toThrow("v.json: out_channels is 1; Wan2.1's VAE has 3");
    for (const bad of [0, 1.5, '96'])
      expect(refused({ base_dim: bad })).toThrow(
        `v.json: base_dim must be a whole number ≥ 1, got ${JSON.stringify(bad)}`,
      );
    expect(refused({ base_dim: 95 })).toThrow('v.json: base widths must be even');
    expect(refused({ decoder_base_dim: 47 })).toThrow('got 47');
    for (const bad of [[1, 2, 4], [1, 2, 0, 4], 'x'])
      expect(refused({ dim_mult: bad })).toThrow(`v.json: dim_mult must be 4 whole numbers ≥ 1`);
    expect(refused({ attn_scales: [1] })).toThrow("v.json: attn_scales [1]: Wan2.1's VAE has no attention");
    expect(refused({ temperal_downsample: [true, true] })).toThrow(
      'v.json: temperal_downsample must be 3 booleans (one per downsampling block), got [true,true]',
    );
    expect(refused({ temperal_downsample: [true, 1, true] })).toThrow('v.json: temperal_downsample must be 3 booleans');
    expect(refused({ temperal_downsample: [true, true, true] })).toThrow('halves time 3 times');
    expect(refused({ temperal_downsample: [true, false, false] })).toThrow(
      "v.json: temperal_downsample [true,false,false] halves time 1 times; Wan2.1's VAE (4 frames a latent) halves it twice",
    );
    expect(refused({ latents_mean: Array(15).fill(0) })).toThrow('v.json: latents_mean must be 16 numbers');
    expect(refused({ latents_std: [...new Array<number>(15).fill(1), Infinity] })).toThrow(
      'v.json: latents_std must be 16 numbers',
    );
    expect(refused({ latents_std: [...new Array<number>(15).fill(1), 0] })).toThrow(
      'v.json: latents_std must be positive',
    );
    expect(() => parseWanVaeConfig(null, 'v.json')).toThrow('v.json: latents_std must be 16 numbers');
  });
});

describe("the published VAE's frames and caches", () => {
  const published = parseWanVaeConfig({ ...TINY_VAE_CONFIG, base_dim: 96 }, 'published vae/config.json');

  it('decodes 1 frame from the first latent frame and 4 from each after: 21 latent frames are 81', () => {
    expect([framesOfChunk(published, true), framesOfChunk(published, false)]).toEqual([1, 4]);
    expect([1, 2, 21].map((t) => videoFrames(published, t))).toEqual([1, 5, 81]);
  });

  it("counts a tile's causal caches at the bytes emptyCaches allocates", () => {
    const plan = decoderPlan(published);
    for (const [h, w] of [
      [1, 1],
      [4, 7],
      [60, 104],
    ]) {
      const allocated = emptyCaches(plan, h, w).reduce((n, f) => n + f.data.byteLength, 0);
      expect(cacheBytes(plan, h, w)).toBe(allocated);
    }
    // more than one cache of the mid-block's 384 channels (2 frames at the latent's size, float32)
    expect(cacheBytes(plan, 60, 104)).toBeGreaterThan(2 * 384 * 60 * 104 * 4);
  });
});

describe("decoderOutputBound: the most the decoder's head can write, from its tensors alone", () => {
  const cfg = parseWanVaeConfig(TINY_VAE_CONFIG, 'v.json');
  const [gammaName, weightName, biasName] = decoderHeadNames(cfg);
  // two channels, 27 taps each, every tap of output o weighing (o+1)·[3, 1] against γ = [2, 0.5]
  const C = 2;
  const head = new Map<string, Tensor>([
    [gammaName, { shape: [C, 1, 1, 1], data: Float32Array.of(2, 0.5) }],
    [
      weightName,
      {
        shape: [3, C, 3, 3, 3],
        data: Float32Array.from(
          { length: 3 * C * 27 },
          (_, i) => (Math.floor(i / (C * 27)) + 1) * [3, 1][Math.floor(i / 27) % C],
        ),
      },
    ],
    [biasName, { shape: [3], data: Float32Array.of(-1, 0, 3) }],
  ]);

  it('is |b[o]| plus, for each tap, √C·‖W[o, :, tap]·γ‖', () => {
    // each tap of output o: √(2·((o+1)²·(3·2)² + (o+1)²·(1·0.5)²)) = (o+1)·√72.5
    const expected = [1 + 27 * Math.sqrt(72.5), 2 * 27 * Math.sqrt(72.5), 3 + 3 * 27 * Math.sqrt(72.5)];
    decoderOutputBound(cfg, head).forEach((b, o) => expect(b).toBeCloseTo(expected[o], 3));
  });

  it('names a head tensor it was not given', () => {
    for (const name of [gammaName, weightName, biasName]) {
      const without = new Map([...head].filter(([n]) => n !== name));
      expect(() => decoderOutputBound(cfg, without)).toThrow(`the decoder's output bound needs ${name}`);
    }
  });
});
