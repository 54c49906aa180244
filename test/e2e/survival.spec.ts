import { expect, test, type Page } from '@playwright/test';
import type { AutomationProgress, JobOverrides, JobResult } from '../../app/automation.ts';
import { maxAbsDiff, openTestSwarm, runJob, TEST_MODEL, type TestSwarm } from './swarm-page.ts';

// A swarm that survives: lost workers, a reloaded dashboard and strangers lose nothing.
const job = {
  prompt: 'a red ball',
  frames: 9,
  height: 64,
  width: 64,
  steps: 6,
  guidance: 5,
  seed: 11,
  backend: 'swarm',
  ep: 'wasm',
  model: TEST_MODEL,
} satisfies JobOverrides;

/** Runs `job` on 3 ranks and does `harm` to rank 1's page once step 2 has completed. */
async function runAndHarm(swarm: TestSwarm, harm: (page: Page) => Promise<void>) {
  let harmedAt = 0;
  await swarm.dashboard.exposeFunction('ditswarmProgress', async (p: AutomationProgress) => {
    if (!('step' in p) || p.step !== 2 || harmedAt) return;
    const ranks = await swarm.dashboard.evaluate(() => window.ditswarm.ranks());
    for (const page of swarm.workers) {
      const id = await page.evaluate(() => window.ditswarmWorker?.peerId);
      if (id !== ranks[1]) continue;
      harmedAt = Date.now();
      await harm(page);
    }
  });
  const run = await runJob(swarm.dashboard, { ...job, workers: 3 });
  return { ...run, harmedAt };
}

test.describe('a lost worker costs one step, not the job', () => {
  let uninterrupted: Awaited<ReturnType<typeof runJob>>;
  test.beforeAll(async ({ browser, baseURL }) => {
    const swarm = await openTestSwarm(browser, baseURL, 3);
    uninterrupted = await runJob(swarm.dashboard, { ...job, workers: 3 });
    await swarm.close();
  });

  for (const [name, harm] of [
    ['closed', (page: Page) => page.close()],
    [
      'crashed',
      (page: Page) =>
        page.goto('chrome://crash').then(
          () => {},
          () => {},
        ),
    ],
  ] as const) {
    test(`3 worker tabs, one ${name} mid-job: the job completes with the uninterrupted latent`, async ({
      browser,
      baseURL,
    }) => {
      const swarm = await openTestSwarm(browser, baseURL, 3);
      try {
        const run = await runAndHarm(swarm, harm);
        expect(run.harmedAt).toBeGreaterThan(0);
        const failures = run.report.failures;
        expect(failures.length).toBeGreaterThanOrEqual(1);
        expect(failures[0].degreeBefore).toBe(3);
        expect(failures[0].degreeAfter).toBe(2);
        expect(failures[0].lost.map((l) => l.rank)).toEqual([1]);
        const detectionMs = failures[0].detectedAt - run.harmedAt;
        const stepsMs = (r: JobResult['report']) => r.steps.reduce((t, s) => t + s.ms, 0);
        const extraMs = stepsMs(run.report) - stepsMs(uninterrupted.report);
        console.log(
          `${name}: detected after ${detectionMs} ms (${failures[0].lost[0].cause}: ${failures[0].lost[0].evidence}), re-plan ${failures[0].replanMs.toFixed(0)} ms, extra ${extraMs.toFixed(0)} ms`,
        );
        // a closed tab is noticed at once, a crashed one by heartbeats after ~3.5 s of silence; without
        // them only the 60 s RPC timeout would notice (a wide margin for a loaded machine)
        expect(detectionMs).toBeLessThan(20_000);
        const diff = maxAbsDiff(run.latent, uninterrupted.latent);
        console.log(`${name}: max-abs vs uninterrupted ${diff.toExponential(2)}`);
        expect(diff).toBeLessThanOrEqual(1e-4);
      } finally {
        await swarm.close();
      }
    });
  }
});

test('a dashboard reloaded mid-job finishes the job after the reload, and its video stays playable', async ({
  browser,
  baseURL,
}) => {
  const swarm = await openTestSwarm(browser, baseURL, 1);
  try {
    const params = { ...job, steps: 8, workers: 1 };
    const reference = await runJob(swarm.dashboard, { ...params, seed: 12 });
    const dashboard = swarm.dashboard;
    const id: number = await dashboard.evaluate((p) => window.ditswarm.submit(p), { ...params, seed: 12 });
    await expect
      .poll(() => dashboard.evaluate((i) => window.ditswarm.jobs().find((j) => j.id === i)?.step ?? 0, id), {
        timeout: 60_000,
        intervals: [50],
      })
      .toBeGreaterThanOrEqual(2);
    await dashboard.reload();
    await dashboard.evaluate(() => window.ditswarm.ready);
    const resumed = await dashboard.evaluate((i) => window.ditswarm.jobs().find((j) => j.id === i), id);
    expect(resumed, 'the interrupted job is still there after the reload').toBeTruthy();
    const { report, latent } = await dashboard.evaluate((i) => window.ditswarm.result(i), id);
    expect(report.resumedFromStep).toBeGreaterThanOrEqual(1);
    const bytes = Buffer.from(latent, 'base64');
    const diff = maxAbsDiff(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4), reference.latent);
    console.log(
      `reload: resumed from step ${report.resumedFromStep}, max-abs vs uninterrupted ${diff.toExponential(2)}`,
    );
    expect(diff).toBeLessThanOrEqual(1e-4);
    expect((await dashboard.evaluate(() => window.ditswarm.jobs())).filter((j) => j.id === id)).toHaveLength(1);

    await dashboard.reload();
    await dashboard.evaluate(() => window.ditswarm.ready);
    const video = await dashboard.evaluate(() => window.ditswarm.inspectVideo());
    expect(video.duration).toBeGreaterThan(0);
    expect(video.file.frameCount).toBe(9);
    await expect(dashboard.locator('#gallery li')).toHaveCount(2);
  } finally {
    await swarm.close();
  }
});

test('20 jobs submitted at once run in order, none lost or repeated, with distinct outputs', async ({
  browser,
  baseURL,
}) => {
  const swarm = await openTestSwarm(browser, baseURL, 1);
  try {
    const tiny = {
      prompt: 'a dot',
      frames: 1,
      height: 16,
      width: 16,
      steps: 1,
      guidance: 1,
      backend: 'swarm',
      workers: 1,
      ep: 'wasm',
    } satisfies JobOverrides;
    // every phase and step the queue announces, in the order it announces them
    await swarm.dashboard.evaluate(() => {
      const events: number[] = (window.queueEvents = []);
      window.ditswarmProgress = (p) => 'job' in p && events.push(p.job);
    });
    const ids: number[] = await swarm.dashboard.evaluate(
      (t) => Promise.all(Array.from({ length: 20 }, (_, i) => window.ditswarm.submit({ ...t, seed: 100 + i }))),
      tiny,
    );
    expect(new Set(ids).size).toBe(20);
    // the page stays responsive while the queue runs: it answers while jobs still wait (and well within 10 s)
    const started = Date.now();
    const waiting: number = await swarm.dashboard.evaluate(
      () => window.ditswarm.jobs().filter((j) => j.status === 'queued').length,
    );
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(waiting).toBeGreaterThan(0);
    const results = await swarm.dashboard.evaluate(
      (all) => Promise.all(all.map((id: number) => window.ditswarm.result(id))),
      ids,
    );
    const hashes = results.map((r) => r.report.latentSha256);
    expect(new Set(hashes).size).toBe(20);
    const jobs = await swarm.dashboard.evaluate(() => window.ditswarm.jobs());
    expect(jobs.map((j) => j.id)).toEqual([...ids].sort((a, b) => a - b));
    expect(jobs.every((j) => j.status === 'done')).toBe(true);
    expect(results.map((r) => r.report.config.seed)).toEqual(ids.map((_, i) => 100 + i));
    // one at a time in order: all of a job's announcements come before any of the next job's
    const events = await swarm.dashboard.evaluate(() => window.queueEvents);
    const runs = events.filter((job, i) => job !== events[i - 1]);
    expect(runs).toEqual([...ids].sort((a, b) => a - b));
  } finally {
    await swarm.close();
  }
});

declare global {
  interface Window {
    /** the job of every progress event the dashboard announced, in order (set by the queue test) */
    queueEvents: number[];
  }
}
