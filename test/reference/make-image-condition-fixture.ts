// Writes test/unit/image-condition.fixture.json: what diffusers' WanImageToVideoPipeline makes of
// seeded images before and after its VAE, by numpy transcriptions of the upstream code and not by
// core/model/image-condition.ts: image_condition_numpy.py (load_image's convert("RGB"), PIL's
// resize(LANCZOS) from Pillow's Resample.c, VaeImageProcessor.preprocess's normalisation) for each
// case's video, then wan_vae_numpy.py in float64 (AutoencoderKLWan's _encode, the posterior's mode,
// prepare_latents' (latent − latents_mean) / latents_std) for the encoded case, with the tiny
// seeded Wan2.2 VAE (TINY_VAE22_CONFIG) of make-wan-vae-fixture.ts.
//
//   npx tsx test/reference/make-image-condition-fixture.ts
//
// The tests (test/unit/image-condition.test.ts) make the same images and weights without Python.

import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { RgbaImage } from '../../core/model/image-condition.ts';
import { seededRandom, writeWanVaeFolder } from '../../server/model-folder.ts';
import { SEED, TINY_VAE22_CONFIG } from './make-wan-vae-fixture.ts';

export const IMAGE_FIXTURE_PATH = join(import.meta.dirname, '../unit/image-condition.fixture.json');
const PREPROCESS = join(import.meta.dirname, 'image_condition_numpy.py');
const VAE = join(import.meta.dirname, 'wan_vae_numpy.py');

/** How a case's image is made (written into the fixture as text too). */
export const IMAGE_INIT =
  'RGBA bytes of seededRandom(seed, `image:${w}x${h}`): per byte u = uniform(); 0 where u < 0.15, 255 where u < 0.3, ' +
  'else floor(256 · uniform()) — flat black and white among noise, so that the filter overshoots and clamps';

export function seededImage(seed: string, width: number, height: number): RgbaImage {
  const random = seededRandom(seed, `image:${width}x${height}`);
  const data = new Uint8ClampedArray(4 * width * height);
  for (let i = 0; i < data.length; i++) {
    const u = random.uniform();
    data[i] = u < 0.15 ? 0 : u < 0.3 ? 255 : Math.floor(256 * random.uniform());
  }
  return { data, width, height };
}

export interface ImageCase {
  name: string;
  image: { width: number; height: number };
  /** the job's video size the image is stretched to */
  video: { width: number; height: number };
  /** whether the fixture holds its latent too */
  encoded: boolean;
}

export const IMAGE_CASES: ImageCase[] = [
  {
    name: 'narrower, and taller',
    image: { width: 61, height: 23 },
    video: { width: 48, height: 32 },
    encoded: true,
  },
  {
    name: 'four and three times smaller',
    image: { width: 190, height: 97 },
    video: { width: 48, height: 32 },
    encoded: false,
  },
  { name: 'a few pixels, enlarged', image: { width: 7, height: 5 }, video: { width: 48, height: 32 }, encoded: false },
  { name: 'the same size', image: { width: 48, height: 32 }, video: { width: 48, height: 32 }, encoded: false },
  // Image.resize takes the height first for an image over 100 times taller than wide
  {
    name: 'a strip, taller than wide',
    image: { width: 3, height: 320 },
    video: { width: 48, height: 32 },
    encoded: false,
  },
];

/** A file's bytes alone (a small Buffer is a view into a shared pool). */
const bytesOf = (b: Buffer) => b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
const base64 = (a: ArrayBufferView) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('base64');

function run(args: string[]): string {
  const r = spawnSync('python3', args, {
    encoding: 'utf8',
    env: { ...process.env, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' },
  });
  if (r.status !== 0) throw new Error(`python3 ${args.join(' ')} failed\n${r.stderr}`);
  return r.stdout;
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'image-condition-fixture-'));
  try {
    await writeWanVaeFolder(dir, TINY_VAE22_CONFIG, { seed: SEED });
    const cases = [];
    for (const c of IMAGE_CASES) {
      const image = seededImage(SEED, c.image.width, c.image.height);
      const [imageFile, videoFile, latentFile] = ['image.rgba', 'video.f32', 'latent.f64'].map((f) => join(dir, f));
      writeFileSync(imageFile, image.data);
      run([
        PREPROCESS,
        '--image',
        imageFile,
        '--size',
        `${c.image.width},${c.image.height}`,
        '--height',
        String(c.video.height),
        '--width',
        String(c.video.width),
        '--out',
        videoFile,
      ]);
      const video = new Float32Array(bytesOf(readFileSync(videoFile)));
      let latent: { shape: number[]; values: number[] } | null = null;
      if (c.encoded) {
        const shape = [3, 1, c.video.height, c.video.width].join(',');
        const out = JSON.parse(
          run([
            VAE,
            '--vae',
            join(dir, 'vae'),
            '--video',
            videoFile,
            '--shape',
            shape,
            '--out',
            latentFile,
            '--float64',
          ]),
        ) as { shape: number[] };
        latent = { shape: out.shape, values: [...new Float64Array(bytesOf(readFileSync(latentFile)))] };
      }
      console.log(
        `${c.name}: video [3, 1, ${c.video.height}, ${c.video.width}]${latent ? `, latent [${latent.shape.join(',')}]` : ''}`,
      );
      cases.push({ ...c, video32: base64(video), latent });
    }
    const fixture = {
      about:
        'diffusers\' WanImageToVideoPipeline before its VAE (load_image\'s convert("RGB"), VaeImageProcessor.preprocess: ' +
        "PIL's resize(LANCZOS), bytes / 255, 2x − 1) by test/reference/image_condition_numpy.py, a numpy transcription of " +
        "diffusers' image_processor.py and Pillow's Resample.c; the video as float32 (base64). The encoded case's latent " +
        "(AutoencoderKLWan's _encode, the posterior's mode, prepare_latents' (latent − latents_mean) / latents_std) by " +
        'test/reference/wan_vae_numpy.py in float64, with the tiny seeded Wan2.2 VAE of make-wan-vae-fixture.ts; ' +
        'made by test/reference/make-image-condition-fixture.ts',
      config: TINY_VAE22_CONFIG,
      seed: SEED,
      init: IMAGE_INIT,
      cases,
    };
    writeFileSync(IMAGE_FIXTURE_PATH, JSON.stringify(fixture) + '\n');
    console.log(`wrote ${IMAGE_FIXTURE_PATH}`);
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
