import { expect, test } from '@playwright/test';
import type { JobOverrides } from '../../app/automation.ts';
import { maxAbsDiff, openTestSwarm, runJob, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// A worker tab computes on its share of its machine's cores: all of them alone, an equal part when
// other worker tabs of the same browser run beside it; the share follows tabs coming and going,
// and a tab takes a new share up between jobs, never in the middle of one.
test('worker tabs of one browser share the cores: one tab alone takes them all, two take one each, and the latent does not change', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(240_000);
  const swarm = await openTestSwarm(browser, baseURL, 1);
  try {
    const [first] = swarm.workers;
    const cores: number = await first.evaluate(() => navigator.hardwareConcurrency);
    test.skip(cores < 2, `this machine has ${cores} core: nothing to share`);
    const half = Math.floor(cores / 2);
    const job = {
      prompt: 'a red ball',
      frames: 5,
      height: 32,
      width: 32,
      steps: 2,
      guidance: 5,
      seed: 7,
      ep: 'wasm',
      backend: 'swarm',
      workers: 1,
    } satisfies JobOverrides;

    await expect(first.locator('#threads')).toHaveText(
      `${cores} of ${cores} cores (1 worker tab in this browser share them)`,
    );
    const alone = await runJob(swarm.dashboard, job);
    expect(alone.report.workers.map((w) => w.threads)).toEqual([cores]);

    // a second tab: the first, still placed, takes its new share at the next job
    const second = await first.context().newPage();
    await second.goto(await swarm.dashboard.evaluate(() => window.ditswarm.ready.then((r) => r.joinUrl)));
    await expect(second.locator('#threads')).toHaveText(
      `${half} of ${cores} cores (2 worker tabs in this browser share them)`,
    );
    await expect(first.locator('#threads')).toHaveText(
      `${cores} of ${cores} cores (2 worker tabs in this browser share them); ${half} from the next job`,
    );
    // the dashboard hears of the new shares from the pages' heartbeats
    await expect(
      swarm.dashboard.locator('#workers tbody tr', { hasText: `${half} thread${half === 1 ? '' : 's'} ·` }),
    ).toHaveCount(2, { timeout: 20_000 });
    const shared = await runJob(swarm.dashboard, { ...job, workers: 2 });
    expect(shared.report.workers.map((w) => w.threads)).toEqual([half, half]);
    for (const page of [first, second])
      await expect(page.locator('#threads')).toHaveText(
        `${half} of ${cores} cores (2 worker tabs in this browser share them)`,
      );
    const diff = maxAbsDiff(shared.latent, alone.latent);
    console.log(
      `${cores} threads alone vs ${half} each on 2 tabs: max-abs ${diff.toExponential(2)}; step ms ${alone.report.steps.map((s) => s.ms.toFixed(0)).join(',')} vs ${shared.report.steps.map((s) => s.ms.toFixed(0)).join(',')}`,
    );
    expect(diff).toBeLessThanOrEqual(1e-4);

    // the second tab closes: the first gets every core back from its next job
    await second.close();
    await expect(first.locator('#threads')).toContainText('(1 worker tab in this browser share them)', {
      timeout: 20_000,
    });
    const again = await runJob(swarm.dashboard, job);
    expect(again.report.workers.map((w) => w.threads)).toEqual([cores]);
    await expect(first.locator('#threads')).toHaveText(
      `${cores} of ${cores} cores (1 worker tab in this browser share them)`,
    );
  } finally {
    await swarm.close();
  }
});
