import { expect, test } from '@playwright/test';
import { readdirSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
import type { JobOverrides } from '../../app/automation.ts';
import { SHARDED_MODEL_PATH, TRUNCATED_MODEL_PATH } from './global-setup.ts';
import { maxAbsDiff, openTestSwarm, runJob, TEST_MODEL, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// A checkpoint as diffusers publishes a large one — shards and their index — read by a worker tab
// tensor by tensor over HTTP Range requests; a broken download fails its job with the file named,
// before any worker loads it, and the swarm runs the next job.
test('a sharded checkpoint loads in a worker tab to the same latent; a truncated shard fails its job by name, and the next job runs', async ({
  browser,
  baseURL,
}) => {
  const swarm = await openTestSwarm(browser, baseURL, 1);
  try {
    const job = {
      prompt: 'a red ball',
      frames: 5,
      height: 32,
      width: 32,
      steps: 2,
      guidance: 1,
      seed: 3,
      backend: 'swarm',
      workers: 1,
      ep: 'wasm',
      outputType: 'latent',
    } satisfies JobOverrides;
    const single = await runJob(swarm.dashboard, job);
    const sharded = await runJob(swarm.dashboard, { ...job, model: SHARDED_MODEL_PATH });
    expect(maxAbsDiff(sharded.latent, single.latent)).toBe(0);

    const failed = await swarm.dashboard.evaluate(
      (j) =>
        window.ditswarm.generate(j).then(
          () => 'ran',
          (e: unknown) => (e as Error).message,
        ),
      { ...job, model: TRUNCATED_MODEL_PATH },
    );
    // refused by the coordinator before a worker loads it: the worker is not blamed for the folder
    expect(failed).toMatch(
      new RegExp(
        String.raw`^transformer/diffusion_pytorch_model-\d{5}-of-\d{5}\.safetensors: ` +
          String.raw`its tensors need \d+ bytes but the file ends before: truncated\? fetch it again$`,
      ),
    );
    expect(await swarm.dashboard.evaluate(() => window.ditswarm.workerCount())).toBe(1);

    const after = await runJob(swarm.dashboard, { ...job, model: TEST_MODEL });
    expect(maxAbsDiff(after.latent, single.latent)).toBe(0);
  } finally {
    await swarm.close();
  }
});

// Weights cross the network once per browser: a worker tab keeps what it fetched (OPFS), so after a
// reload its next job reads them from disk; a file that changed on the server is fetched again.
test('a reloaded worker tab loads the weights from its browser cache; a changed shard comes from the network again', async ({
  browser,
  baseURL,
}) => {
  const shardedDir = process.env.DITSWARM_SHARDED_DIR ?? '';
  test.skip(!shardedDir, 'needs the sharded model folder of global-setup.ts (DITSWARM_URL was given)');
  const swarm = await openTestSwarm(browser, baseURL, 1);
  const reloadWorker = async () => {
    await swarm.workers[0].reload();
    await expect.poll(() => swarm.dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 60_000 }).toBe(1);
  };
  try {
    const job = {
      prompt: 'a red ball',
      frames: 5,
      height: 32,
      width: 32,
      steps: 1,
      guidance: 1,
      seed: 3,
      backend: 'swarm',
      workers: 1,
      ep: 'wasm',
      outputType: 'latent',
      model: SHARDED_MODEL_PATH,
    } satisfies JobOverrides;
    const first = await runJob(swarm.dashboard, job);
    const fetched = first.report.workers[0].weights;
    expect(fetched).toMatchObject({ cacheBytes: 0, note: '' });
    expect(fetched.networkBytes).toBeGreaterThan(1e6);

    await reloadWorker();
    const second = await runJob(swarm.dashboard, job);
    expect(second.report.workers[0].weights).toEqual({ networkBytes: 0, cacheBytes: fetched.networkBytes, note: '' });
    expect(maxAbsDiff(second.latent, first.latent)).toBe(0);

    // the same bytes with a new modification time: a new validator (ETag), as a re-uploaded file has
    const shard = readdirSync(join(shardedDir, 'transformer'))
      .filter((f) => f.endsWith('.safetensors'))
      .sort()[0];
    utimesSync(join(shardedDir, 'transformer', shard), new Date(), new Date(Date.now() + 60_000));
    await reloadWorker();
    const third = (await runJob(swarm.dashboard, job)).report.workers[0].weights;
    expect(third.networkBytes).toBeGreaterThan(0);
    expect(third.cacheBytes).toBeGreaterThan(0);
    expect(third.networkBytes + third.cacheBytes).toBe(fetched.networkBytes);
  } finally {
    await swarm.close();
  }
});
