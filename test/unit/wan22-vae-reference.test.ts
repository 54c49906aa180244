// core/model/wan-vae-reference.ts's plain TypeScript encoder and decoder held to diffusers'
// AutoencoderKLWan for Wan2.2's z48 residual VAE (is_residual, 2×2 patches) as the upstream Python
// runs it: wan22-vae.fixture.json is what test/reference/wan_vae_numpy.py (a line-by-line numpy
// transcription of autoencoder_kl_wan.py, run in float64) gives for a tiny seeded VAE in the
// published layout. Regenerate it with `npx tsx test/reference/make-wan-vae-fixture.ts wan2.2`; this
// test makes the same weights and inputs without Python.

import { describe, expect, it } from 'vitest';
import {
  decoderWeightShapes,
  encoderWeightShapes,
  parseWanVaeConfig,
  patchify,
  spatialScale,
  unpatchify,
  wanVaeWeightShapes,
} from '../../core/model/wan-vae.ts';
import type { TensorMap } from '../../core/safetensors.ts';
import { safetensorsHeader } from '../../core/safetensors.ts';
import { blendTiles, tilesOf } from '../../core/model/wan-vae-tiling.ts';
import { sizeOf } from '../../core/tensor.ts';
import {
  FIXTURE22_PATH,
  INIT,
  seededVaeTensors,
  TINY_VAE22_CONFIG,
  VIDEO_INIT,
} from '../reference/make-wan-vae-fixture.ts';
import { expectCase, readVaeFixture, runCase, worstSample, type VaeFixtureCase } from './vae-fixture-check.ts';

const fixture = readVaeFixture(FIXTURE22_PATH);
const cfg = parseWanVaeConfig(fixture.config, 'wan22-vae.fixture.json');
const tensors = seededVaeTensors(cfg, fixture.seed);

/**
 * The fixture is float64; the reference holds activations in float32 (its sums in float64), so each
 * value carries float32 rounding through every layer: this is ten times the worst of that. The
 * narrowest plausible bug, two norms' γ (1 ± 5%) read the wrong way round in one block, misses it by
 * far more than ten times (checked below, at the blocks nearest the output and the input).
 */
const TOLERANCE = 2e-5;

const run = (c: VaeFixtureCase, weights: TensorMap = tensors) => runCase(cfg, weights, fixture.seed, c);

const swapped = (a: string, b: string): TensorMap => {
  const out = new Map(tensors);
  const [ta, tb] = [tensors.get(a), tensors.get(b)];
  if (!ta || !tb) throw new Error(`no ${a} or ${b}`);
  return out.set(a, tb).set(b, ta);
};

describe("wan-vae-reference.ts against diffusers' AutoencoderKLWan, Wan2.2's z48 residual VAE (numpy, float64)", () => {
  it('uses the fixture as it was made', () => {
    expect(fixture.config).toEqual(TINY_VAE22_CONFIG);
    expect(fixture.init).toBe(`${INIT}; ${VIDEO_INIT}`);
    expect(fixture.cases.map((c) => c.name)).toEqual([
      'one frame',
      'three frames',
      'tiled 2×2',
      'an image',
      'nine frames',
    ]);
    expect([cfg.isResidual, cfg.patchSize, cfg.zDim, spatialScale(cfg)]).toEqual([true, 2, 48, 16]);
  });

  for (const c of fixture.cases) {
    const what = c.videoShape
      ? `encodes ${c.name}: video [${c.videoShape.join(',')}] → the normalised posterior mean`
      : `decodes ${c.name}: latent [${(c.latentShape ?? []).join(',')}]` +
        (c.tiling ? `, tiles of ${c.tiling.tile} px every ${c.tiling.stride} px` : ', untiled');
    it(what, () => {
      const { out, tiles } = run(c);
      expect(tiles).toBe(c.tiles);
      expectCase(c, fixture.seed, out, TOLERANCE);
    });
  }

  // the narrowest plausible bugs: a block's two norms' γ read the wrong way round
  for (const [name, a, b] of [
    ['one frame', 'decoder.up_blocks.3.resnets.2.norm1.gamma', 'decoder.up_blocks.3.resnets.2.norm2.gamma'],
    ['an image', 'encoder.down_blocks.0.resnets.1.norm1.gamma', 'encoder.down_blocks.0.resnets.1.norm2.gamma'],
  ] as const)
    it(`misses ${name} by at least 10× the tolerance with ${a.replace(/norm1.gamma$/, 'norm{1,2}.gamma')} swapped`, () => {
      const c = fixture.cases.find((k) => k.name === name);
      if (!c) throw new Error(`no case ${name}`);
      expect(worstSample(c, fixture.seed, run(c, swapped(a, b)).out).worst).toBeGreaterThan(10 * TOLERANCE);
    });
});

describe("wan-vae.ts's layout of the published Wan2.2 VAE", () => {
  // Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json: the fixture's config at 160 and 256 channels
  const published = parseWanVaeConfig(
    { ...TINY_VAE22_CONFIG, base_dim: 160, decoder_base_dim: 256 },
    'published vae/config.json',
  );
  const shapes = wanVaeWeightShapes(published);

  it('has 196 tensors, 110 of them the decoder’s, and the residual blocks’ names', () => {
    expect([shapes.size, decoderWeightShapes(published).size, encoderWeightShapes(published).size]).toEqual([
      196, 110, 86,
    ]);
    expect(shapes.get('encoder.conv_in.weight')).toEqual([160, 12, 3, 3, 3]);
    expect(shapes.get('encoder.down_blocks.1.downsampler.time_conv.weight')).toEqual([320, 320, 3, 1, 1]);
    expect(shapes.get('encoder.conv_out.weight')).toEqual([96, 640, 3, 3, 3]);
    expect(shapes.get('quant_conv.weight')).toEqual([96, 96, 1, 1, 1]);
    expect(shapes.get('decoder.conv_in.weight')).toEqual([1024, 48, 3, 3, 3]);
    expect(shapes.get('decoder.up_blocks.0.upsampler.time_conv.weight')).toEqual([2048, 1024, 3, 1, 1]);
    expect(shapes.get('decoder.up_blocks.2.upsampler.resample.1.weight')).toEqual([512, 512, 3, 3]);
    expect(shapes.get('decoder.up_blocks.3.resnets.0.conv_shortcut.weight')).toEqual([256, 512, 1, 1, 1]);
    expect(shapes.get('decoder.conv_out.weight')).toEqual([12, 256, 3, 3, 3]);
  });

  it('makes a safetensors file of the published 2.82 GB', () => {
    const specs = [...shapes].map(([name, shape]) => ({ name, shape }));
    const params = specs.reduce((n, t) => n + sizeOf(t.shape), 0);
    const { head } = safetensorsHeader(specs, { format: 'pt' });
    expect(params).toBe(704_688_668);
    expect((head.length + 4 * params) / 1e9).toBeCloseTo(2.82, 2);
  });
});

describe("parseWanVaeConfig: Wan2.2's VAE beside Wan2.1's, and the mixes it refuses", () => {
  const refused = (change: Record<string, unknown>) => () =>
    parseWanVaeConfig({ ...TINY_VAE22_CONFIG, ...change }, 'v.json');

  it('reads is_residual, patch_size and the 16× scale; clip_output, not an argument of diffusers’ class, is left alone', () => {
    expect(cfg).toMatchObject({ isResidual: true, patchSize: 2, zDim: 48, baseDim: 8, decoderBaseDim: 12 });
    const { clip_output, ...without } = TINY_VAE22_CONFIG;
    expect(clip_output).toBe(false);
    expect(parseWanVaeConfig(without, 'v.json')).toEqual(cfg);
  });

  it('refuses Wan2.2 fields that are not Wan2.2’s, naming the field, what came and what Wan2.2 has', () => {
    expect(refused({ patch_size: null })).toThrow(
      "v.json: is_residual is true (Wan2.2's VAE): patch_size is null; Wan2.2's VAE has 2",
    );
    expect(refused({ in_channels: undefined })).toThrow("in_channels is 3; Wan2.2's VAE has 12");
    expect(refused({ out_channels: 3 })).toThrow("out_channels is 3; Wan2.2's VAE has 12");
    expect(refused({ scale_factor_spatial: 8 })).toThrow("scale_factor_spatial is 8; Wan2.2's VAE has 16");
    expect(refused({ is_residual: false })).toThrow("v.json: patch_size 2 (Wan2.2's VAE) without is_residual true");
  });

  it('refuses widths its AvgDown3D and DupUp3D shortcuts cannot map', () => {
    expect(refused({ dim_mult: [1, 2, 4, 8] })).toThrow(
      "v.json: encoder.down_blocks.3's shortcut maps 32 channels to 64 by 1×1×1: 32·1 does not divide by 64",
    );
  });
});

describe("patchify and unpatchify: diffusers' 2×2 patches, the column offset first", () => {
  // one channel, one frame, 2×4 pixels numbered by place: row y, column x is 10·y + x
  const video = { shape: [1, 1, 2, 4], data: Float32Array.from([0, 1, 2, 3, 10, 11, 12, 13]) };

  it('puts the pixel at row offset b, column offset a of each patch in channel 2a + b', () => {
    const frames = patchify(video, 2);
    expect([frames.frames, frames.channels, frames.height, frames.width]).toEqual([1, 4, 1, 2]);
    // channels (a, b) = (0,0), (0,1), (1,0), (1,1), each over the two patches
    expect([...frames.data]).toEqual([0, 2, 10, 12, 1, 3, 11, 13]);
  });

  it("refuses to blend Wan2.2's 12 patch channels as if they were RGB", () => {
    const frames = patchify({ shape: [3, 1, 16, 16], data: new Float32Array(3 * 16 * 16) }, 2);
    const tiling = { tile: 16, stride: 16 };
    expect(() => blendTiles(tilesOf(1, 1, tiling), [frames], 1, 1, tiling)).toThrow(
      "decoded tiles of 12 channels are not RGB in 1×1 patches (3 channels): blend them with the VAE's patch_size (2)",
    );
    expect(blendTiles(tilesOf(1, 1, tiling, 2), [frames], 1, 1, tiling, 2).shape).toEqual([3, 1, 16, 16]);
  });

  it('unpatchify undoes it', () => {
    const frames = patchify(video, 2);
    const back = unpatchify({ shape: [4, 1, 1, 2], data: frames.data }, 2);
    expect(back).toEqual(video);
    expect(unpatchify(video, 1)).toBe(video);
    expect(() => patchify({ shape: [1, 1, 3, 4], data: new Float32Array(12) }, 2)).toThrow(
      'a video of 3×4 pixels does not cut into 2×2 patches',
    );
  });
});
