// An image-to-video job's image encoded on a worker (rank/vae-images.ts, as a page's engine runs it,
// in this process on wasm) and judged by the coordinator (coordinator/image-encoding.ts), held to
// diffusers: image-condition.fixture.json's latent is what the float64 numpy reading of
// autoencoder_kl_wan.py makes of the numpy reading of the pipeline's preprocessing of the same
// seeded image, with the tiny seeded Wan2.2 VAE (z48, is_residual, 2×2 patches).

import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  encodeImageCondition,
  ImageEncodingBreach,
  type ImageConditionOptions,
  type ImageEncodingHost,
} from '../../coordinator/image-encoding.ts';
import type { RgbaImage } from '../../core/model/image-condition.ts';
import { encodedLatentBound, encoderHeadNames, openWanVae, type WanVaeConfig } from '../../core/model/wan-vae.ts';
import { ContractError } from '../../core/net/check.ts';
import { maxAbsDiff } from '../../core/tensor.ts';
import { WORKER_CONTRACT, type EncodedImage, type EncodeImageArgs } from '../../core/worker-api.ts';
import { vaeImages } from '../../rank/vae-images.ts';
import { unkeptModelFiles } from '../../rank/weight-cache.ts';
import { folderFiles, writeWanVaeFolder } from '../../server/model-folder.ts';
import { IMAGE_FIXTURE_PATH, seededImage } from '../reference/make-image-condition-fixture.ts';
import { SEED, TINY_VAE22_CONFIG } from '../reference/make-wan-vae-fixture.ts';

interface EncodedCase {
  name: string;
  image: { width: number; height: number };
  video: { width: number; height: number };
  latent: { shape: number[]; values: number[] } | null;
}
const fixture = JSON.parse(readFileSync(IMAGE_FIXTURE_PATH, 'utf8')) as { seed: string; cases: EncodedCase[] };
const encoded = fixture.cases.find((c) => c.latent);
if (!encoded?.latent) throw new Error('image-condition.fixture.json holds no encoded case');
const { latent: expected, video: size } = encoded;
const image = seededImage(fixture.seed, encoded.image.width, encoded.image.height);

/** As wan22-vae-graphs.test.ts's: ten times the float32 rounding the encoder's graphs carry against float64. */
const TOLERANCE = 2e-5;

let dir: string;
let cfg: WanVaeConfig;
/** the workers' calls one at a time: in this process they share one onnxruntime wasm instance */
let runtime: Promise<unknown> = Promise.resolve();

/** A worker encoding images as a page's engine does; `harm` rewrites its reply. */
function worker(id: string, harm?: (reply: EncodedImage) => EncodedImage): ImageEncodingHost & { calls: number } {
  const images = vaeImages(() => unkeptModelFiles(folderFiles(dir)));
  const host = {
    id,
    pulse: null,
    calls: 0,
    api: {
      encodeImage(args: EncodeImageArgs) {
        host.calls++;
        const turn = runtime.then(async () => {
          const reply = await images.encode({ ...args, ep: 'wasm' });
          return harm ? harm(reply) : reply;
        });
        runtime = turn.catch(() => {});
        return turn;
      },
    },
  };
  return host;
}

const encode = (host: ImageEncodingHost, o: Partial<ImageConditionOptions> = {}) =>
  encodeImageCondition({
    host,
    modelUrl: 'test',
    files: folderFiles(dir),
    image,
    height: size.height,
    width: size.width,
    ep: 'wasm',
    timeoutMs: 60_000,
    ...o,
  });

describe("an image-to-video job's image, encoded on a worker", () => {
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ditswarm-image-encoding-'));
    await writeWanVaeFolder(dir, TINY_VAE22_CONFIG, { seed: SEED });
    cfg = (await openWanVae(folderFiles(dir))).config;
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  let honest: Float32Array;
  it("equals diffusers' normalised posterior mean of the preprocessed image (numpy, float64), [48, 1, 2, 3]", async () => {
    const { latent, report } = await encode(worker('a'));
    expect(latent.shape).toEqual([48, 1, size.height / 16, size.width / 16]);
    expect(latent.shape).toEqual(expected.shape);
    const reference = Float32Array.from(expected.values);
    expect(maxAbsDiff(latent.data, reference)).toBeLessThan(TOLERANCE);
    expect(report).toMatchObject({ worker: 'a' });
    expect(report.weightBytes).toBeGreaterThan(0);
    honest = latent.data;
  });

  it('misses the reference by far more than the tolerance where a plausible bug is made', async () => {
    const reference = Float32Array.from(expected.values);
    const plane = (size.height / 16) * (size.width / 16);
    // latents_mean and latents_std not applied: the posterior's mean as the VAE gives it
    const unnormalised = honest.map(
      (v, i) => v * cfg.latentsStd[Math.floor(i / plane)] + cfg.latentsMean[Math.floor(i / plane)],
    );
    expect(maxAbsDiff(unnormalised, reference)).toBeGreaterThan(10 * TOLERANCE);
    // the image read as BGR
    const bgr: RgbaImage = { ...image, data: image.data.slice() };
    for (let p = 0; p < image.width * image.height; p++) {
      bgr.data[4 * p] = image.data[4 * p + 2];
      bgr.data[4 * p + 2] = image.data[4 * p];
    }
    const swapped = await encode(worker('a'), { image: bgr });
    expect(maxAbsDiff(swapped.latent.data, reference)).toBeGreaterThan(10 * TOLERANCE);
    // a transposed latent, [48, 1, 3, 2] read as [48, 1, 2, 3]
    const transposed = honest.map((_, i) => {
      const [c, y, x] = [Math.floor(i / plane), Math.floor((i % plane) / 3), i % 3];
      return honest[c * plane + (x * 2 + y)];
    });
    expect(maxAbsDiff(transposed, reference)).toBeGreaterThan(10 * TOLERANCE);
  });

  it("keeps every honest value within the encoder's bound, which is finite in each of its 48 channels", async () => {
    const vae = await openWanVae(folderFiles(dir));
    const bound = encodedLatentBound(cfg, await vae.encoderTensors(undefined, encoderHeadNames(cfg)));
    expect(bound).toHaveLength(48);
    const plane = honest.length / 48;
    honest.forEach((v, i) => expect(Math.abs(v)).toBeLessThanOrEqual(bound[Math.floor(i / plane)]));
    for (const b of bound) expect(Number.isFinite(b)).toBe(true);
  });

  const harms: [string, (r: EncodedImage) => EncodedImage, RegExp][] = [
    [
      'a value short',
      (r) => ({ ...r, latent: r.latent.slice(1) }),
      /^worker bad's encoded image came as \[48,1,2,3\] with 287 values, not the \[48,1,2,3\] of a 48×32 image/,
    ],
    [
      'the latent of another size',
      (r) => ({ ...r, shape: [48, 1, 3, 2] }),
      /came as \[48,1,3,2\] with 288 values, not the \[48,1,2,3\]/,
    ],
    [
      'NaN',
      (r) => {
        r.latent[100] = NaN;
        return r;
      },
      /came with NaN in channel 16/,
    ],
    [
      'a value past what the encoder can make',
      (r) => {
        r.latent[287] = -1e30;
        return r;
      },
      /came with -1\.00e\+30 in channel 47, beyond the ±\S+ the encoder can produce/,
    ],
  ];
  for (const [what, harm, why] of harms)
    it(`refuses a reply with ${what}, naming its worker`, async () => {
      const failure = await encode(worker('bad', harm)).catch((e: unknown) => e);
      expect(failure).toBeInstanceOf(ImageEncodingBreach);
      expect(failure).toMatchObject({ worker: 'bad' });
      expect((failure as Error).message).toMatch(why);
    });

  it("refuses NaN and infinities at the contract too, where a worker's reply arrives", () => {
    const reply = { latent: new Float32Array(4), shape: [1, 1, 2, 2], computeMs: 1, weightBytes: 1 };
    expect(WORKER_CONTRACT.encodeImage.reply(reply, 'reply')).toEqual(reply);
    reply.latent[3] = Infinity;
    expect(() => WORKER_CONTRACT.encodeImage.reply(reply, 'reply')).toThrow(
      new ContractError('reply.latent[3]: expected a finite number, got number Infinity'),
    );
    const args = { modelUrl: 'm', ep: 'wasm', shape: [3, 1, 1, 1], video: Float32Array.from([0, 1, 1.5]) };
    expect(() => WORKER_CONTRACT.encodeImage.args(args, 'args')).toThrow(
      'args.video[2]: expected a finite number within ±1',
    );
  });

  it('refuses a video size the VAE cannot take, and an image that is not its size, before any worker is asked', async () => {
    const host = worker('a');
    await expect(encode(host, { height: 40 })).rejects.toThrow(
      "this VAE encodes an image into latent pixels of 16×16: the video's 48×40 must be multiples of 16 each way",
    );
    await expect(encode(host, { image: { ...image, width: image.width + 1 } })).rejects.toThrow(/^an RGBA image of/);
    expect(host.calls).toBe(0);
  });
});
