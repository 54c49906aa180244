import { expect, test, type Browser } from '@playwright/test';

type PlaywrightArgs = { browser: Browser; baseURL: string | undefined };
import { appOrigin, openTestSwarm, runJob, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER);

// Weights before the first job (issue 36): a worker tab that joins loads the dashboard's model once it is measured,
// so the first job placed on it finds the model in its engine. The test server preloads large models only (its tests
// submit jobs of their own, as npm start's users do not): the dashboard is told to preload from 0 bytes. The preload
// warms the engine up, which the first job's rehearsal would do otherwise (seconds of forwards on a real model).
test('a worker that joins loads the form’s model before any job; the first job finds it loaded, not read again', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(120_000);
  const context = await browser.newContext();
  try {
    const dashboard = await context.newPage();
    await dashboard.goto(`${appOrigin(baseURL)}/`);
    const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    await dashboard.evaluate(() => window.ditswarm.preloadFrom(0));
    const worker = await context.newPage();
    await worker.goto(joinUrl);
    const model = await dashboard.locator('[name="model"]').inputValue();
    // loading, then ready, before anything was asked of it: the swarm table shows the load as it goes
    await expect
      .poll(() => worker.evaluate(() => window.ditswarmWorkerHistory.join('\n')), { timeout: 60_000 })
      .toMatch(new RegExp(`loading [^\\n]*${model.replace(/[/.-]/g, '\\$&')}`));
    await expect
      .poll(() => worker.evaluate(() => window.ditswarmWorkerHistory.join('\n')), { timeout: 60_000 })
      .toMatch(/model preloaded on wasm/);
    const history = await worker.evaluate(() => [...window.ditswarmWorkerHistory]);
    const before = history.length;
    // and its engine warmed up then, after the weights and before it said the model is in
    const warmed = history.findIndex((s) => /warming up its engine \(wasm on \d+ threads?\) for the first job/.test(s));
    expect(warmed).toBeGreaterThan(-1);
    expect(history.findIndex((s) => /model preloaded on wasm/.test(s))).toBeGreaterThan(warmed);

    const run = await runJob(dashboard, { model, steps: 2, backend: 'swarm', workers: 1, outputType: 'latent' });
    expect(run.report.workers.map((w) => w.inMemory)).toEqual([true]);
    const during = await worker.evaluate((n) => window.ditswarmWorkerHistory.slice(n), before);
    // no weight was read for it: the load found the model in the engine at once, with no MB-of-MB progress
    expect(during.filter((s) => / MB of /.test(s))).toEqual([]);
    // nor did its rehearsal warm the engine up again: the job's placing does not wait for that
    expect(during.filter((s) => /warming up/.test(s))).toEqual([]);
  } finally {
    await context.close();
  }
});

// Measurements by browser (issue 66): a worker tab that reloads joins again under a new peer id, but its browser's
// compute probe and its rehearsed forwards are still the dashboard's (and a reloaded dashboard's, from its storage), so
// the next job's placement rehearses nothing: a rehearsal on the reloaded tab's cold engine says it warms up before
// timing the job's forwards.
const rehearsedOnReload =
  (reloadDashboard: boolean) =>
  async ({ browser, baseURL }: PlaywrightArgs) => {
    test.setTimeout(180_000);
    const swarm = await openTestSwarm(browser, baseURL, 1);
    try {
      const [worker] = swarm.workers;
      const job = { steps: 1, backend: 'swarm', workers: 1, ep: 'wasm', outputType: 'latent' } as const;
      const rehearsals = () =>
        worker.evaluate(() => window.ditswarmWorkerHistory.filter((s) => /before timing the job's forwards/.test(s)));
      const workerIds = () => swarm.dashboard.evaluate(() => window.ditswarm.workers().map((w) => w.id));
      await runJob(swarm.dashboard, job);
      expect(await rehearsals()).not.toEqual([]);
      if (reloadDashboard) {
        await swarm.dashboard.reload();
        await swarm.dashboard.evaluate(() => window.ditswarm.ready);
        await expect.poll(workerIds, { timeout: 60_000 }).toHaveLength(1);
      }
      const [before] = await workerIds();
      await worker.reload();
      await expect.poll(workerIds, { timeout: 60_000 }).toEqual([expect.not.stringMatching(before)]);
      await runJob(swarm.dashboard, job);
      expect(await rehearsals()).toEqual([]);
    } finally {
      await swarm.close();
    }
  };

test('a worker tab reloaded between two jobs is not rehearsed again for the second', rehearsedOnReload(false));

test('after the dashboard and then a worker tab reload, the second job rehearses nothing', rehearsedOnReload(true));
