// Wan2.2 TI2V in real tabs (issue 67): a job given an image as a PNG file, as `npm run generate -- --image` and the
// API's input_reference give it, on a folder of TI2V-5B's layout at a tiny width. The dashboard decodes the file, a
// worker encodes it with Wan2.2's VAE, and the ranks denoise with that frame held at timestep 0: 1, 2 and 3 tabs end
// on the same latent, whose first frame is the image as Node's encoder makes it.
import { expect, test } from '@playwright/test';
import { encodeImageCondition, type ImageEncodingHost } from '../../coordinator/image-encoding.ts';
import { defined } from '../../core/defined.ts';
import type { RgbaImage } from '../../core/model/image-condition.ts';
import { vaeImages } from '../../rank/vae-images.ts';
import { unkeptModelFiles } from '../../rank/weight-cache.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { decodePng, encodePng } from '../../server/png.ts';
import { TINY_TI2V_MODEL_PATH } from './global-setup.ts';
import { CI, maxAbsDiff, runJob, suiteSwarm } from './swarm-page.ts';

test.describe.configure({ mode: 'serial' });
const swarm = suiteSwarm(3);

/** 40×24 of colour ramps: stretched to the job's 64×64 as diffusers' pipeline does */
const IMAGE: RgbaImage = {
  width: 40,
  height: 24,
  data: Uint8ClampedArray.from({ length: 40 * 24 * 4 }, (_, i) => {
    const [pixel, channel] = [Math.floor(i / 4), i % 4];
    const [x, y] = [pixel % 40, Math.floor(pixel / 40)];
    return channel === 3 ? 255 : [6 * x, 10 * y, 3 * (x + y)][channel];
  }),
};
const PNG = encodePng(IMAGE);
const JOB = {
  model: TINY_TI2V_MODEL_PATH,
  prompt: 'a red ball',
  frames: 5,
  height: 64,
  width: 64,
  steps: 2,
  guidance: 5,
  seed: 3,
  backend: 'swarm',
  ep: 'wasm',
  image: { type: 'image/png', base64: Buffer.from(PNG).toString('base64') },
} as const;

test(
  'an image given as a PNG starts the video: 1, 2 and 3 tabs end on the same latent within 1e-5, its first frame the image as Node encodes it',
  CI,
  async () => {
    test.setTimeout(240_000);
    const outcomes = [];
    for (const workers of [1, 2, 3]) outcomes.push(await runJob(swarm.dashboard, { ...JOB, workers }));
    const [one, ...more] = outcomes;
    expect(one.report.config).toMatchObject({ family: 'Wan2.2 TI2V', latentShape: [48, 2, 4, 4], fps: 24 });
    for (const outcome of more) expect(maxAbsDiff(outcome.latent, one.latent)).toBeLessThanOrEqual(1e-5);

    // the first latent frame, held at every step, is the image's latent as a worker in Node encodes it
    const dir = defined(process.env.DITSWARM_TI2V_DIR, "global-setup's TI2V folder");
    const images = vaeImages(() => unkeptModelFiles(folderFiles(dir)));
    const host: ImageEncodingHost = {
      id: 'node',
      pulse: null,
      api: { encodeImage: (args) => images.encode({ ...args, ep: 'wasm' }) },
    };
    const { latent } = await encodeImageCondition({
      host,
      modelUrl: TINY_TI2V_MODEL_PATH,
      files: folderFiles(dir),
      image: decodePng(PNG, 'the test image'),
      height: JOB.height,
      width: JOB.width,
      ep: 'wasm',
      timeoutMs: 60_000,
    });
    const [C, T, H, W] = [48, 2, 4, 4];
    const firstFrame = new Float32Array(C * H * W);
    for (let c = 0; c < C; c++) firstFrame.set(one.latent.subarray(c * T * H * W, c * T * H * W + H * W), c * H * W);
    expect(maxAbsDiff(firstFrame, latent.data)).toBeLessThanOrEqual(1e-5);
    expect(swarm.failures()).toEqual([]);
  },
);
