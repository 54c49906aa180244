// Writes test/unit/wan-vae.fixture.json: what diffusers' AutoencoderKLWan decode gives for a tiny
// seeded VAE, by a line-by-line numpy transcription of the upstream Python (wan_vae_numpy.py), so
// core/model/wan-vae-reference.ts is held to diffusers' code and not to a reading of it.
//
//   npx tsx test/reference/make-wan-vae-fixture.ts
//
// It writes the VAE folder as published (vae/config.json, vae/diffusion_pytorch_model.safetensors
// with the encoder's and the decoder's tensors, seeded) and the seeded latents to a temporary
// folder, runs the numpy decoder on each case, and keeps for each the output's shape, sum, sum of
// squares, per-(frame, channel) sums and SAMPLES values at seeded positions. The test
// (test/unit/wan-vae-reference.test.ts) makes the same weights and latents with the functions
// exported here, without Python.

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
import { seededRandom, writeCheckpoint } from '../../server/model-folder.ts';

export const FIXTURE_PATH = join(import.meta.dirname, '../unit/wan-vae.fixture.json');
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
export const SEED = 'wan-vae-fixture';
export const SAMPLES = 200;

/** How a tensor's seeded values are made (written into the fixture as text too). */
export const INIT =
  'seededRandom(seed, name).normals(n, std): *.gamma 1 + N(0, 0.05²); *.bias N(0, 0.02²); weights N(0, 1/fan_in) with fan_in = n / shape[0]; ' +
  'latent seededRandom(seed, `latent:${shape}`).normals(n, 1); sampled positions floor(uniform · size) of seededRandom(seed, `positions:${case}`)';

export function seededWeight(seed: string, name: string, shape: number[]): Float32Array {
  const random = seededRandom(seed, name);
  const n = sizeOf(shape);
  if (name.endsWith('.gamma')) return random.normals(n, 0.05).map((v) => 1 + v);
  if (name.endsWith('.bias')) return random.normals(n, 0.02);
  return random.normals(n, 1 / Math.sqrt(n / shape[0]));
}

/** post_quant_conv's and the decoder's tensors, as the fixture's folder holds them. */
export function seededDecoderTensors(cfg: WanVaeConfig, seed: string): TensorMap {
  return new Map(
    [...decoderWeightShapes(cfg)].map(([name, shape]) => [name, { shape, data: seededWeight(seed, name, shape) }]),
  );
}

export function seededLatent(seed: string, shape: number[]): Tensor {
  return { shape, data: seededRandom(seed, `latent:${shape.join('x')}`).normals(sizeOf(shape), 1) };
}

export interface FixtureCase {
  name: string;
  /** [16, T, h, w] */
  latentShape: number[];
  /** enable_tiling's tile_sample_min and tile_sample_stride (pixels), or null for _decode untiled */
  tiling: { tile: number; stride: number } | null;
}

export const CASES: FixtureCase[] = [
  { name: 'one frame', latentShape: [16, 1, 2, 3], tiling: null },
  { name: 'three frames', latentShape: [16, 3, 3, 2], tiling: null },
  { name: 'tiled 2×2', latentShape: [16, 2, 5, 6], tiling: { tile: 32, stride: 24 } },
];

/** What the fixture keeps of a video [3, F, H, W]. */
export function summarise(name: string, seed: string, shape: number[], data: Float32Array) {
  let sum = 0;
  let sumOfSquares = 0;
  for (const v of data) {
    sum += v;
    sumOfSquares += v * v;
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

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'wan-vae-fixture-'));
  try {
    const cfg = parseWanVaeConfig(TINY_VAE_CONFIG, 'TINY_VAE_CONFIG');
    const specs = [...wanVaeWeightShapes(cfg)].map(([name, shape]) => ({ name, shape }));
    await writeCheckpoint(join(dir, 'vae'), 'diffusion_pytorch_model', specs, ({ name, shape }) =>
      seededWeight(SEED, name, shape),
    );
    writeFileSync(join(dir, VAE_CONFIG), JSON.stringify(TINY_VAE_CONFIG, null, 2) + '\n');
    const cases = [];
    for (const c of CASES) {
      const latent = seededLatent(SEED, c.latentShape);
      const latentFile = join(dir, 'latent.f32');
      const outFile = join(dir, 'video.f32');
      writeFileSync(latentFile, new Uint8Array(latent.data.buffer));
      const args = [
        SCRIPT,
        '--vae',
        join(dir, 'vae'),
        '--latent',
        latentFile,
        '--shape',
        c.latentShape.join(','),
        '--out',
        outFile,
      ];
      if (c.tiling) args.push('--tile', String(c.tiling.tile), '--stride', String(c.tiling.stride));
      const run = spawnSync('python3', args, {
        encoding: 'utf8',
        env: { ...process.env, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' },
      });
      if (run.status !== 0) throw new Error(`${c.name}: python failed\n${run.stderr}`);
      const summary = JSON.parse(run.stdout) as { shape: number[]; tiles: number };
      const bytes = readFileSync(outFile);
      const video = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4).slice();
      if (c.tiling && summary.tiles < 2)
        throw new Error(`${c.name}: diffusers decoded ${summary.tiles} tile(s); the case is meant to tile`);
      let clamped = 0;
      for (const v of video) if (Math.abs(v) === 1) clamped++;
      console.log(
        `${c.name}: video [${summary.shape.join(',')}], ${summary.tiles} tiles, ${clamped}/${video.length} values at the clamp`,
      );
      cases.push({ ...c, tiles: summary.tiles, clamped, ...summarise(c.name, SEED, summary.shape, video) });
    }
    const fixture = {
      about:
        "diffusers' AutoencoderKLWan decode (autoencoder_kl_wan.py, WanPipeline's un-normalisation first) by test/reference/wan_vae_numpy.py, " +
        'a line-by-line numpy float32 transcription; made by test/reference/make-wan-vae-fixture.ts',
      config: TINY_VAE_CONFIG,
      seed: SEED,
      init: INIT,
      cases,
    };
    writeFileSync(FIXTURE_PATH, JSON.stringify(fixture) + '\n');
    console.log(`wrote ${FIXTURE_PATH}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((e: unknown) => {
    console.error(e);
    process.exit(1);
  });
}
