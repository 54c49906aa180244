// Writes test/unit/wan-vae.fixture.json (Wan2.1's VAE, decode), wan-vae-encode.fixture.json (its
// encode) and wan22-vae.fixture.json (Wan2.2's, decode and encode): what diffusers' AutoencoderKLWan
// gives for a tiny seeded VAE, by a line-by-line numpy transcription of the upstream Python
// (wan_vae_numpy.py), so core/model/wan-vae-reference.ts is held to diffusers' code and not to a
// reading of it.
//
//   npx tsx test/reference/make-wan-vae-fixture.ts [wan2.1] [wan2.1-encode] [wan2.2]   (all when none is named)
//
// It writes the VAE folder as published (vae/config.json, vae/diffusion_pytorch_model.safetensors
// with the encoder's and the decoder's tensors, seeded) and the seeded latents or videos to a
// temporary folder, runs the numpy model on each case (Wan2.2's in float64), and keeps for each the
// output's shape, sum, sum of squares, per-(frame, channel) sums and SAMPLES values at seeded
// positions. The tests (test/unit/wan-vae-reference.test.ts, wan22-vae-reference.test.ts) make the
// same weights and inputs with the functions exported here, without Python.

import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  decoderWeightShapes,
  parseWanVaeConfig,
  VAE_CONFIG,
  wanVaeWeightShapes,
  type WanVaeConfig,
} from '../../core/model/wan-vae.ts';
import type { TensorMap } from '../../core/safetensors.ts';
import { sizeOf, type Tensor } from '../../core/tensor.ts';
import { seededRandom, seededVaeWeight, TINY_WAN22_VAE, writeCheckpoint } from '../../server/model-folder.ts';

export const FIXTURE_PATH = join(import.meta.dirname, '../unit/wan-vae.fixture.json');
export const FIXTURE22_PATH = join(import.meta.dirname, '../unit/wan22-vae.fixture.json');
export const ENCODE_FIXTURE_PATH = join(import.meta.dirname, '../unit/wan-vae-encode.fixture.json');
const SCRIPT = join(import.meta.dirname, 'wan_vae_numpy.py');

/** The published vae/config.json of Wan2.1-T2V-1.3B-Diffusers, but 8 channels wide instead of 96. */
export const TINY_VAE_CONFIG = {
  _class_name: 'AutoencoderKLWan',
  _diffusers_version: '0.33.0.dev0',
  attn_scales: [],
  base_dim: 8,
  dim_mult: [1, 2, 4, 4],
  dropout: 0.0,
  latents_mean: [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517, -0.3632, -0.1922,
    -0.9497, 0.2503, -0.2921,
  ],
  latents_std: [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253,
    2.8251, 1.916,
  ],
  num_res_blocks: 2,
  temperal_downsample: [false, true, true],
  z_dim: 16,
};
/**
 * The published vae/config.json of Wan2.2-TI2V-5B-Diffusers (z_dim 48, is_residual, 2×2 patches,
 * its latents_mean and latents_std), but 8 channels wide in the encoder and 12 in the decoder
 * instead of 160 and 256.
 */
export const TINY_VAE22_CONFIG = TINY_WAN22_VAE;
export const SEED = 'wan-vae-fixture';
export const SAMPLES = 200;

/** How a tensor's seeded values are made (written into the fixture as text too). */
export const INIT =
  'seededRandom(seed, name).normals(n, std): *.gamma 1 + N(0, 0.05²); *.bias N(0, 0.02²); weights N(0, 1/fan_in) with fan_in = n / shape[0]; ' +
  'latent seededRandom(seed, `latent:${shape}`).normals(n, 1); sampled positions floor(uniform · size) of seededRandom(seed, `positions:${case}`)';
/** How an encoded case's video is made (Wan2.2's fixture). */
export const VIDEO_INIT = 'video 2·uniform − 1 of seededRandom(seed, `video:${shape}`)';

export const seededWeight = seededVaeWeight;

/** post_quant_conv's and the decoder's tensors, as the fixture's folder holds them. */
export function seededDecoderTensors(cfg: WanVaeConfig, seed: string): TensorMap {
  return new Map(
    [...decoderWeightShapes(cfg)].map(([name, shape]) => [name, { shape, data: seededWeight(seed, name, shape) }]),
  );
}

/** Every tensor of the fixture's folder, encoder's and decoder's. */
export function seededVaeTensors(cfg: WanVaeConfig, seed: string): TensorMap {
  return new Map(
    [...wanVaeWeightShapes(cfg)].map(([name, shape]) => [name, { shape, data: seededWeight(seed, name, shape) }]),
  );
}

export function seededLatent(seed: string, shape: number[]): Tensor {
  return { shape, data: seededRandom(seed, `latent:${shape.join('x')}`).normals(sizeOf(shape), 1) };
}

/** A video [3, F, H, W] in [−1, 1], as the pipeline hands the VAE an image or frames. */
export function seededVideo(seed: string, shape: number[]): Tensor {
  const random = seededRandom(seed, `video:${shape.join('x')}`);
  return { shape, data: Float32Array.from({ length: sizeOf(shape) }, () => 2 * random.uniform() - 1) };
}

export interface FixtureCase {
  name: string;
  /** [z_dim, T, h, w], decoded */
  latentShape?: number[];
  /** [3, F, H, W], encoded */
  videoShape?: number[];
  /** enable_tiling's tile_sample_min and tile_sample_stride (pixels), or null for _decode untiled */
  tiling: { tile: number; stride: number } | null;
}

export const CASES: FixtureCase[] = [
  { name: 'one frame', latentShape: [16, 1, 2, 3], tiling: null },
  { name: 'three frames', latentShape: [16, 3, 3, 2], tiling: null },
  { name: 'tiled 2×2', latentShape: [16, 2, 5, 6], tiling: { tile: 32, stride: 24 } },
];

export const CASES22: FixtureCase[] = [
  { name: 'one frame', latentShape: [48, 1, 2, 3], tiling: null },
  { name: 'three frames', latentShape: [48, 3, 3, 2], tiling: null },
  { name: 'tiled 2×2', latentShape: [48, 2, 5, 6], tiling: { tile: 64, stride: 48 } },
  { name: 'an image', videoShape: [3, 1, 32, 48], tiling: null },
  { name: 'nine frames', videoShape: [3, 9, 32, 32], tiling: null },
];

/** Wan2.1's encoder (its own fixture, so that the decoder's stays as it was made). */
export const ENCODE_CASES: FixtureCase[] = [
  { name: 'an image', videoShape: [3, 1, 16, 24], tiling: null },
  { name: 'nine frames', videoShape: [3, 9, 16, 16], tiling: null },
];

/** What the fixture keeps of a video [3, F, H, W] or a latent [z_dim, T, h, w]. */
export function summarise(name: string, seed: string, shape: number[], data: ArrayLike<number>) {
  let sum = 0;
  let sumOfSquares = 0;
  for (let i = 0; i < data.length; i++) {
    sum += data[i];
    sumOfSquares += data[i] ** 2;
  }
  const [C, F] = shape;
  const plane = shape[2] * shape[3];
  const frameChannelSums: number[][] = [];
  for (let t = 0; t < F; t++) {
    frameChannelSums.push([]);
    for (let c = 0; c < C; c++) {
      let s = 0;
      for (let p = 0; p < plane; p++) s += data[(c * F + t) * plane + p];
      frameChannelSums[t].push(s);
    }
  }
  const random = seededRandom(seed, `positions:${name}`);
  const positions = Array.from({ length: Math.min(SAMPLES, data.length) }, () =>
    Math.floor(random.uniform() * data.length),
  );
  return { shape, sum, sumOfSquares, frameChannelSums, positions, values: positions.map((i) => data[i]) };
}

interface FixtureSpec {
  path: string;
  config: Record<string, unknown>;
  cases: FixtureCase[];
  float64: boolean;
  init: string;
  about: string;
}

const FIXTURES: Record<string, FixtureSpec> = {
  'wan2.1': {
    path: FIXTURE_PATH,
    config: TINY_VAE_CONFIG,
    cases: CASES,
    float64: false,
    init: INIT,
    about:
      "diffusers' AutoencoderKLWan decode (autoencoder_kl_wan.py, WanPipeline's un-normalisation first) by test/reference/wan_vae_numpy.py, " +
      'a line-by-line numpy float32 transcription; made by test/reference/make-wan-vae-fixture.ts',
  },
  'wan2.1-encode': {
    path: ENCODE_FIXTURE_PATH,
    config: TINY_VAE_CONFIG,
    cases: ENCODE_CASES,
    float64: true,
    init: `${INIT}; ${VIDEO_INIT}`,
    about:
      "diffusers' AutoencoderKLWan encode, Wan2.1's VAE (autoencoder_kl_wan.py: _encode, the posterior's mode, WanImageToVideoPipeline's " +
      'normalisation after) by test/reference/wan_vae_numpy.py, a line-by-line numpy transcription run in float64; ' +
      'made by test/reference/make-wan-vae-fixture.ts',
  },
  'wan2.2': {
    path: FIXTURE22_PATH,
    config: TINY_VAE22_CONFIG,
    cases: CASES22,
    float64: true,
    init: `${INIT}; ${VIDEO_INIT}`,
    about:
      "diffusers' AutoencoderKLWan, Wan2.2's z48 residual VAE (autoencoder_kl_wan.py): decode with WanPipeline's un-normalisation first, " +
      "encode (_encode, the posterior's mode) with WanImageToVideoPipeline's normalisation after, by test/reference/wan_vae_numpy.py, " +
      'a line-by-line numpy transcription run in float64; made by test/reference/make-wan-vae-fixture.ts',
  },
};

async function writeFixture(spec: FixtureSpec): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'wan-vae-fixture-'));
  try {
    const cfg = parseWanVaeConfig(spec.config, 'the fixture config');
    const specs = [...wanVaeWeightShapes(cfg)].map(([name, shape]) => ({ name, shape }));
    await writeCheckpoint(join(dir, 'vae'), 'diffusion_pytorch_model', specs, ({ name, shape }) =>
      seededWeight(SEED, name, shape),
    );
    writeFileSync(join(dir, VAE_CONFIG), JSON.stringify(spec.config, null, 2) + '\n');
    const cases = [];
    for (const c of spec.cases) {
      const input = c.latentShape ? seededLatent(SEED, c.latentShape) : seededVideo(SEED, c.videoShape ?? []);
      const inputFile = join(dir, 'input.f32');
      const outFile = join(dir, 'output.raw');
      writeFileSync(inputFile, new Uint8Array(input.data.buffer));
      const args = [SCRIPT, '--vae', join(dir, 'vae'), c.latentShape ? '--latent' : '--video', inputFile];
      args.push('--shape', input.shape.join(','), '--out', outFile);
      if (c.tiling) args.push('--tile', String(c.tiling.tile), '--stride', String(c.tiling.stride));
      if (spec.float64) args.push('--float64');
      const run = spawnSync('python3', args, {
        encoding: 'utf8',
        env: { ...process.env, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' },
      });
      if (run.status !== 0) throw new Error(`${c.name}: python failed\n${run.stderr}`);
      const summary = JSON.parse(run.stdout) as { shape: number[]; tiles: number };
      const bytes = readFileSync(outFile);
      const output = spec.float64
        ? new Float64Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 8).slice()
        : new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4).slice();
      if (c.tiling && summary.tiles < 2)
        throw new Error(`${c.name}: diffusers decoded ${summary.tiles} tile(s); the case is meant to tile`);
      let clamped = 0;
      for (const v of output) if (c.latentShape && Math.abs(v) === 1) clamped++;
      console.log(
        `${c.name}: output [${summary.shape.join(',')}], ${summary.tiles} tiles, ${clamped}/${output.length} values at the clamp`,
      );
      cases.push({ ...c, tiles: summary.tiles, clamped, ...summarise(c.name, SEED, summary.shape, output) });
    }
    const fixture = { about: spec.about, config: spec.config, seed: SEED, init: spec.init, cases };
    writeFileSync(spec.path, JSON.stringify(fixture) + '\n');
    console.log(`wrote ${spec.path}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const names = process.argv.slice(2);
  for (const name of names)
    if (!(name in FIXTURES)) throw new Error(`no fixture "${name}"; name ${Object.keys(FIXTURES).join(', ')}`);
  for (const name of names.length ? names : Object.keys(FIXTURES)) await writeFixture(FIXTURES[name]);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((e: unknown) => {
    console.error(e);
    process.exit(1);
  });
}
