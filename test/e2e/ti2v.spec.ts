// Wan2.2 TI2V in real tabs (issue 67): a job given an image as a PNG file, as `npm run generate -- --image` and the
// API's input_reference give it, on a folder of TI2V-5B's layout at a tiny width. The dashboard decodes the file, a
// worker encodes it with Wan2.2's VAE, and the ranks denoise with that frame held at timestep 0: 1, 2 and 3 tabs end
// on the same latent, whose first frame is the image as Node's encoder makes it.
import { join } from 'node:path';
import { expect, test } from '@playwright/test';
import type { RgbaImage } from '../../core/model/image-condition.ts';
import { encodePng } from '../../server/png.ts';
import { firstFrameOf, nodeEncodedImage } from './image-condition.ts';
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

/** what every step holds as frame one: the image's latent as Node encodes it */
const nodeEncoded = () => nodeEncodedImage(PNG, JOB);

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
    expect(maxAbsDiff(firstFrameOf(one.latent, [48, 2, 4, 4]), await nodeEncoded())).toBeLessThanOrEqual(1e-5);
    expect(swarm.failures()).toEqual([]);
  },
);

test(
  "the dashboard's image field: a file set on it is previewed stretched to the job's size as the model sees it, and the form's job starts from it",
  CI,
  async () => {
    test.setTimeout(120_000);
    const { dashboard } = swarm;
    const form = dashboard.locator('#job-form');
    await form.locator('[name=model]').fill(TINY_TI2V_MODEL_PATH);
    await form.locator('[name=model]').press('Tab'); // as a user leaves the field: the form reads the model
    // the size presets are the family's: Wan2.2 TI2V's 704×1280 each way, not Wan2.1's 480p and 720p
    await expect(form.locator('[name=size] option')).toHaveText([
      '720p · 704×1280',
      '720p portrait · 1280×704',
      'custom',
    ]);
    await form.locator('[name=height]').fill(String(JOB.height));
    await form.locator('[name=width]').fill(String(JOB.width));
    await dashboard
      .locator('#image')
      .setInputFiles({ name: 'first.png', mimeType: 'image/png', buffer: Buffer.from(PNG) });
    await expect(dashboard.locator('#image-preview')).toBeVisible();
    await expect(dashboard.locator('#image-note')).toHaveText('what the model sees: 40×24 stretched to 64×64');
    const canvasSize = await dashboard.locator('#image-canvas').evaluate((c: HTMLCanvasElement) => [c.width, c.height]);
    expect(canvasSize).toEqual([64, 64]);
    // a size the image cannot be stretched to says so beside it
    await form.locator('[name=width]').fill('0');
    await expect(dashboard.locator('#image-note')).not.toContainText('what the model sees');
    await form.locator('[name=width]').fill(String(JOB.width));
    await expect(dashboard.locator('#image-note')).toHaveText('what the model sees: 40×24 stretched to 64×64');
    await form.screenshot({ path: join(import.meta.dirname, 'screenshots', 'dashboard-image-field.png') });

    const { image: _, ...fromForm } = JOB; // the form's image, not one the automation API gives
    const outcome = await runJob(dashboard, { ...fromForm, workers: 2 });
    expect(maxAbsDiff(firstFrameOf(outcome.latent, [48, 2, 4, 4]), await nodeEncoded())).toBeLessThanOrEqual(1e-5);

    await dashboard.locator('#image-clear').click();
    await expect(dashboard.locator('#image-preview')).toBeHidden();
    expect(swarm.failures()).toEqual([]);
  },
);
