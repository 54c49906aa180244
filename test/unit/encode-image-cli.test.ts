// `npm run encode-image` as a user runs it: a PNG through the tiny seeded Wan2.2 VAE equals
// image-condition.fixture.json's latent (diffusers' preprocessing and encode, numpy float64), and
// bad input is refused before any weight is read, saying what was expected. The PNGs are made here
// with each of PNG's five scanline filters (server/png.ts undoes them), and at the depths and
// colour types PIL opens.

import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { crc32, deflateSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readSafetensors } from '../../core/safetensors.ts';
import { maxAbsDiff } from '../../core/tensor.ts';
import { writeWanVaeFolder } from '../../server/model-folder.ts';
import { decodePng, PngError } from '../../server/png.ts';
import { IMAGE_FIXTURE_PATH, seededImage } from '../reference/make-image-condition-fixture.ts';
import { SEED, TINY_VAE22_CONFIG } from '../reference/make-wan-vae-fixture.ts';

const ROOT = join(import.meta.dirname, '../..');
let dir: string;

/**
 * A PNG of `lines` (each line's samples packed at `depth` bits), line y filtered with filter y mod 5,
 * as an encoder chooses filters; `header` overrides IHDR's depth, colour type and interlacing bytes.
 */
function png(
  width: number,
  height: number,
  colour: number,
  depth: number,
  lines: Uint8Array[],
  { palette, interlace = 0 }: { palette?: number[]; interlace?: number } = {},
): Uint8Array {
  const stride = lines[0].length;
  const step = Math.max(1, ((colour === 6 ? 4 : colour === 2 ? 3 : colour === 4 ? 2 : 1) * depth) / 8);
  const filtered = new Uint8Array(height * (stride + 1));
  lines.forEach((line, y) => {
    const filter = y % 5;
    const up = y > 0 ? lines[y - 1] : new Uint8Array(stride);
    filtered[y * (stride + 1)] = filter;
    for (let x = 0; x < stride; x++) {
      const [a, b, c] = [x >= step ? line[x - step] : 0, up[x], x >= step ? up[x - step] : 0];
      const p = a + b - c;
      const paeth =
        Math.abs(p - a) <= Math.abs(p - b) && Math.abs(p - a) <= Math.abs(p - c)
          ? a
          : Math.abs(p - b) <= Math.abs(p - c)
            ? b
            : c;
      const predicted = [0, a, b, (a + b) >> 1, paeth][filter];
      filtered[y * (stride + 1) + 1 + x] = (line[x] - predicted) & 0xff;
    }
  });
  const chunk = (type: string, body: Uint8Array) => {
    const out = Buffer.alloc(12 + body.length);
    out.writeUInt32BE(body.length, 0);
    out.write(type, 4, 'latin1');
    out.set(body, 8);
    out.writeUInt32BE(crc32(out.subarray(4, 8 + body.length)), 8 + body.length);
    return out;
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr.set([depth, colour, 0, 0, interlace], 8);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    ...(palette ? [chunk('PLTE', Uint8Array.from(palette))] : []),
    // two IDAT chunks: the data is one stream across them
    chunk('IDAT', deflateSync(filtered).subarray(0, 10)),
    chunk('IDAT', deflateSync(filtered).subarray(10)),
    chunk('IEND', new Uint8Array(0)),
  ]);
}

/** An RGBA image's rows as an 8-bit RGBA PNG's lines. */
const rgbaLines = (data: Uint8ClampedArray | Uint8Array, width: number, height: number) =>
  Array.from({ length: height }, (_, y) => Uint8Array.from(data.subarray(4 * width * y, 4 * width * (y + 1))));

async function encodeImage(...args: string[]) {
  return promisify(execFile)('npx', ['tsx', 'server/cli/encode-image.ts', ...args], { cwd: ROOT });
}

/** What `npm run encode-image` says as it refuses `args`: it exits 1, prints nothing to stdout and no stack trace. */
async function refusal(...args: string[]): Promise<string> {
  try {
    await encodeImage(...args);
  } catch (e) {
    const error = e as { code?: number; stdout?: string; stderr?: string };
    expect(error.code).toBe(1);
    expect(error.stdout).toBe('');
    expect(error.stderr).not.toMatch(/\n\s+at /);
    return error.stderr ?? '';
  }
  throw new Error(`npm run encode-image ${args.join(' ')} did not refuse`);
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'ditswarm-encode-image-cli-'));
  await writeWanVaeFolder(join(dir, 'wan22'), TINY_VAE22_CONFIG, { seed: SEED });
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('a PNG read as RGBA', () => {
  it('undoes each of the five filters of an 8-bit RGBA image, the data split over two IDAT chunks', () => {
    const image = seededImage('png', 9, 11);
    const got = decodePng(png(9, 11, 6, 8, rgbaLines(image.data, 9, 11)), 'rgba.png');
    expect([got.width, got.height]).toEqual([9, 11]);
    expect(got.data).toEqual(image.data);
  });

  it('reads RGB, grey with alpha, 2-bit grey (scaled to 0…255) and a 4-bit palette as PIL makes them RGB', () => {
    const rgb = decodePng(png(2, 1, 2, 8, [Uint8Array.from([1, 2, 3, 4, 5, 6])]), 'rgb.png');
    expect([...rgb.data]).toEqual([1, 2, 3, 255, 4, 5, 6, 255]);
    const greyAlpha = decodePng(png(2, 1, 4, 8, [Uint8Array.from([7, 100, 8, 200])]), 'la.png');
    expect([...greyAlpha.data]).toEqual([7, 7, 7, 100, 8, 8, 8, 200]);
    // 0b00011011: grey levels 0, 1, 2, 3 of 3
    const grey2 = decodePng(png(4, 1, 0, 2, [Uint8Array.from([0b00011011])]), 'grey2.png');
    expect([...grey2.data].filter((_, i) => i % 4 === 0)).toEqual([0, 85, 170, 255]);
    const palette = decodePng(
      png(3, 1, 3, 4, [Uint8Array.from([0x10, 0x20])], { palette: [9, 8, 7, 6, 5, 4, 3, 2, 1] }),
      'p.png',
    );
    expect([...palette.data]).toEqual([6, 5, 4, 255, 9, 8, 7, 255, 3, 2, 1, 255]);
  });

  it('refuses what it cannot read, saying what to give instead', () => {
    const refused = (bytes: Uint8Array) => {
      try {
        decodePng(bytes, 'x.png');
      } catch (e) {
        expect(e).toBeInstanceOf(PngError);
        return (e as Error).message;
      }
      throw new Error('decodePng did not refuse');
    };
    expect(refused(Uint8Array.from([0xff, 0xd8, 0xff, 0xe0, 0, 0, 0, 0, 0]))).toBe(
      'x.png: is not a PNG file (its first bytes are not the PNG signature): give an image as a PNG',
    );
    expect(refused(png(1, 1, 2, 16, [new Uint8Array(6)]))).toBe('x.png: has 16 bits a sample: save it with 8');
    expect(refused(png(1, 1, 2, 8, [new Uint8Array(3)], { interlace: 1 }))).toBe(
      'x.png: is interlaced (Adam7): save it without interlacing',
    );
  });
});

describe('npm run encode-image', () => {
  it("writes the latent diffusers' pipeline conditions on, for a PNG of the fixture's image, and the VAE's input", async () => {
    const fixture = JSON.parse(await readFile(IMAGE_FIXTURE_PATH, 'utf8')) as {
      cases: {
        image: { width: number; height: number };
        video: { width: number; height: number };
        latent: { shape: number[]; values: number[] } | null;
      }[];
    };
    const c = fixture.cases.find((k) => k.latent);
    if (!c?.latent) throw new Error('the fixture holds no encoded case');
    const image = seededImage(SEED, c.image.width, c.image.height);
    const file = join(dir, 'image.png');
    await writeFile(file, png(image.width, image.height, 6, 8, rgbaLines(image.data, image.width, image.height)));
    const output = join(dir, 'out', 'latent.safetensors');
    const { stdout } = await encodeImage(
      '--model',
      join(dir, 'wan22'),
      '--image',
      file,
      '--height',
      String(c.video.height),
      '--width',
      String(c.video.width),
      '--output',
      output,
    );
    expect(stdout).toMatch(/^encode-image: 61×23 → 48×32 → latent \[1, 48, 1, 2, 3\] in \d+ ms/);
    const written = readSafetensors(new Uint8Array(await readFile(output)), output);
    const latent = written.get('latent');
    expect(latent?.shape).toEqual([1, 48, 1, 2, 3]);
    expect(maxAbsDiff(latent?.data ?? new Float32Array(), Float32Array.from(c.latent.values))).toBeLessThan(2e-5);
    expect(written.get('video')?.shape).toEqual([1, 3, 1, 32, 48]);
  });

  it('refuses a size the VAE cannot take, missing flags and a file that is no PNG, before reading any weight', async () => {
    const model = join(dir, 'wan22');
    const notPng = join(dir, 'image.jpg');
    await writeFile(notPng, Uint8Array.from([0xff, 0xd8, 0xff, 0xe0, 1, 2, 3, 4]));
    const out = join(dir, 'x.safetensors');
    const [size, missing, jpeg, zero] = await Promise.all([
      refusal('--model', model, '--image', notPng, '--height', '40', '--width', '48', '--output', out),
      refusal('--model', model, '--image', notPng, '--width', '48', '--output', out),
      refusal('--model', model, '--image', notPng, '--height', '32', '--width', '48', '--output', out),
      refusal('--model', model, '--image', notPng, '--height', '0', '--width', '48', '--output', out),
    ]);
    expect(size).toMatch(
      /--height 40 --width 48: .*'s VAE encodes 16×16 pixels into a latent pixel; give multiples of 16/,
    );
    expect(missing).toMatch(/^encode-image: --height is required: the video's height in pixels\nusage:/);
    expect(jpeg).toMatch(/image\.jpg: is not a PNG file .*give an image as a PNG/);
    expect(zero).toMatch(/--height must be a whole number of pixels from 1 to 16384, got 0/);
  });
});
