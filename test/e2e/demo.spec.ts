import { join } from 'node:path';
import { expect, test } from '@playwright/test';
import { detect } from '../../demo/detector.ts';
import { DEMO_SAMPLING } from '../../demo/world.ts';
import { loadVaeDecoder } from '../../core/model/vae-decoder.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { maxAbsDiff, openTestSwarm, runJob, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// The trained demo model through the real thing: dashboard + 2 worker tabs, Ulysses P = 2 over
// WebRTC. What comes back must be a red shape whose centroid moves right.
const MODEL_URL = '/models/tiny-wan-demo';
const MODEL_DIR = join(import.meta.dirname, '../../public', MODEL_URL);
const JOB = { prompt: 'a red square moving right', ...DEMO_SAMPLING, seed: 42 };

test('"a red square moving right" on 2 worker tabs decodes to a red foreground moving right', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(300_000);
  const swarm = await openTestSwarm(browser, baseURL, 2);
  try {
    // no model named: the dashboard's default must be the demo model
    const run = await runJob(swarm.dashboard, { ...JOB, backend: 'swarm', workers: 2, ep: 'wasm', model: undefined });
    expect(run.report.placement.layout.ulyssesDegree).toBe(2);
    expect(run.report.config.model, 'the dashboard ran the demo model').toMatch(/\/models\/tiny-wan-demo\/?$/);
    expect(run.report.latentShape).toEqual([16, 3, 8, 8]);

    const decode = await loadVaeDecoder(folderFiles(MODEL_DIR));
    const seen = detect(decode({ shape: run.report.latentShape, data: run.latent }));
    console.log(
      `demo: ${JOB.prompt} → ${seen.colour} ${seen.direction} (dx ${seen.dx.toFixed(1)} px, dy ${seen.dy.toFixed(1)} px, area ${seen.area.toFixed(0)} px)`,
    );
    expect(seen.colour).toBe('red');
    expect(seen.direction).toBe('right');
    expect(seen.dx, 'at least half the 32 px a moving shape travels in 9 frames').toBeGreaterThan(16);

    // the same job sampled in Node through the same stage graphs lands on the same latent
    const { loadModel, sampleVideo } = await import('../../demo/generate.ts');
    const local = await sampleVideo(await loadModel(folderFiles(MODEL_DIR)), { ...JOB, negativePrompt: '', ranks: 2 });
    expect(maxAbsDiff(run.latent, local.latent.data)).toBeLessThanOrEqual(1e-3);
  } finally {
    await swarm.close();
  }
});
