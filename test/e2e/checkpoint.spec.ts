import { expect, test } from '@playwright/test';
import { SHARDED_MODEL_PATH, TRUNCATED_MODEL_PATH } from './global-setup.ts';
import { maxAbsDiff, openTestSwarm, runJob, TEST_MODEL } from './swarm-page.ts';

// A checkpoint as diffusers publishes a large one — shards and their index — read by a worker tab
// tensor by tensor over HTTP Range requests; a broken download fails its job with the file and the
// tensor named, and the swarm runs the next job.
test('a sharded checkpoint loads in a worker tab to the same latent; a truncated shard fails its job by name, and the next job runs', async ({ browser, baseURL }) => {
  const swarm = await openTestSwarm(browser, baseURL!, 1);
  try {
    const job = { prompt: 'a red ball', frames: 5, height: 32, width: 32, steps: 2, guidance: 1, seed: 3, backend: 'swarm', workers: 1, ep: 'wasm', outputType: 'latent' };
    const single = await runJob(swarm.dashboard, job);
    const sharded = await runJob(swarm.dashboard, { ...job, model: SHARDED_MODEL_PATH });
    expect(maxAbsDiff(sharded.latent, single.latent)).toBe(0);

    const failed = await swarm.dashboard.evaluate((j) => (window as any).ditswarm.generate(j).then(() => 'ran', (e: Error) => e.message), { ...job, model: TRUNCATED_MODEL_PATH });
    expect(failed).toMatch(/failed in (loadModel|rehearse): transformer\/diffusion_pytorch_model-\d{5}-of-\d{5}\.safetensors: tensor ".+" needs bytes \[\d+, \d+\) but the file holds \d+ of them: truncated\? fetch it again/);

    const after = await runJob(swarm.dashboard, { ...job, model: TEST_MODEL });
    expect(maxAbsDiff(after.latent, single.latent)).toBe(0);
  } finally {
    await swarm.close();
  }
});
