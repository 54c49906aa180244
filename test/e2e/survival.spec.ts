import { expect, test, type Browser, type Page } from '@playwright/test';
import type { JobOverrides, JobResult } from '../../app/automation.ts';
import type { LossPhase } from '../../coordinator/placer.ts';
import { defined } from '../../core/defined.ts';
import type { WorkerMethod } from '../../core/worker-api.ts';
import { FULL_LAYOUT_MODEL_PATH } from './global-setup.ts';
import { CI, appOrigin, maxAbsDiff, openTestSwarm, runJob, TEST_MODEL, workerId } from './swarm-page.ts';

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

test.describe('a lost worker costs one step, not the job', () => {
  // the tab lost is the one sent the middle executeModel request of the uninterrupted run (counted over all tabs):
  // it is harmed as that request reaches it, so the job always has steps left to lose it in, however loaded the machine
  let uninterrupted: Awaited<ReturnType<typeof runJob>>;
  let middleRequest = 0;
  test.beforeAll(async ({ browser, baseURL }) => {
    const swarm = await swarmClosingOn(browser, baseURL, 3, 'executeModel', Infinity);
    uninterrupted = await runJob(swarm.dashboard, { ...job, workers: 3 });
    middleRequest = Math.ceil(swarm.requests() / 2);
    await swarm.close();
  });

  for (const harm of ['closed', 'crashed'] as const) {
    test(
      `3 worker tabs, one ${harm} mid-job: the job completes with the uninterrupted latent`,
      harm === 'crashed' ? CI : {},
      async ({ browser, baseURL }) => {
        const swarm = await swarmClosingOn(browser, baseURL, 3, 'executeModel', middleRequest, harm);
        try {
          const run = await runJob(swarm.dashboard, { ...job, workers: 3 });
          const lost = defined(swarm.closed.id, `a tab ${harm} mid-job`);
          const failures = run.report.failures;
          expect(failures.length).toBeGreaterThanOrEqual(1);
          expect(failures[0]).toMatchObject({ phase: 'denoising', degreeBefore: 3, degreeAfter: 2 });
          expect(failures[0].lost.map((l) => l.worker)).toEqual([lost]);
          const detectionMs = failures[0].detectedAt - swarm.closed.at;
          const stepsMs = (r: JobResult['report']) => r.steps.reduce((t, s) => t + s.ms, 0);
          const extraMs = stepsMs(run.report) - stepsMs(uninterrupted.report);
          console.log(
            `${harm}: detected after ${detectionMs} ms (${failures[0].lost[0].cause}: ${failures[0].lost[0].evidence}), re-plan ${failures[0].replanMs.toFixed(0)} ms, extra ${extraMs.toFixed(0)} ms`,
          );
          // README: about 4 s (3 s of silence, then the server says the page is gone; a closed page's channel
          // may stay open for ICE's 30 s consent timeout). Without heartbeats the 30 s silence bound or the RPC
          // timeout would notice; the margin is for a silence limit grown on a loaded machine
          expect(detectionMs).toBeLessThan(10_000);
          const diff = maxAbsDiff(run.latent, uninterrupted.latent);
          console.log(`${harm}: max-abs vs uninterrupted ${diff.toExponential(2)}`);
          expect(diff).toBe(0); // README: sampling is seeded, so the video is the same
        } finally {
          await swarm.close();
        }
      },
    );
  }
});

test("a tab holding a pipeline stage, closed mid-job, costs that stage's re-placement on the tab left over, and the job keeps the uninterrupted latent (issue 35)", async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(360_000);
  // two stages of one tab each, and a third tab to take a lost stage over
  const staged = { ...job, workers: 1, stages: 2 } satisfies JobOverrides;
  const counted = await swarmClosingOn(browser, baseURL, 3, 'executeModel', Infinity);
  const uninterrupted = await runJob(counted.dashboard, staged);
  const middle = Math.ceil(counted.requests() / 2);
  await counted.close();
  const swarm = await swarmClosingOn(browser, baseURL, 3, 'executeModel', middle);
  try {
    const run = await runJob(swarm.dashboard, staged);
    const lost = defined(swarm.closed.id, 'a stage tab closed mid-job');
    const [failure] = run.report.failures;
    expect(failure).toMatchObject({ phase: 'denoising', degreeBefore: 2, degreeAfter: 2 });
    expect(failure.lost.map((l) => l.worker)).toEqual([lost]);
    const stages = run.report.placement.stages ?? [];
    expect(stages.map((s) => s.blocks)).toEqual(uninterrupted.report.placement.stages?.map((s) => s.blocks));
    expect(stages.flatMap((s) => s.workers)).not.toContain(lost);
    const diff = maxAbsDiff(run.latent, uninterrupted.latent);
    console.log(
      `staged: lost ${lost} at step ${failure.step}, re-placed on ${stages.map((s) => s.workers).join(' / ')}; max-abs ${diff}`,
    );
    expect(diff).toBe(0);
  } finally {
    await swarm.close();
  }
});

test('two stages of two tabs each, a tab closed mid-job while the stages hand on: re-placed on the tab left over, the uninterrupted latent (issue 65)', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(480_000);
  const staged = { ...job, steps: 3, workers: 2, stages: 2 } satisfies JobOverrides;
  const counted = await swarmClosingOn(browser, baseURL, 5, 'executeModel', Infinity);
  const uninterrupted = await runJob(counted.dashboard, staged);
  const middle = Math.ceil(counted.requests() / 2);
  await counted.close();
  expect(uninterrupted.report.placement.layout).toMatchObject({ world: 4, ulyssesDegree: 2, stages: 2 });
  const swarm = await swarmClosingOn(browser, baseURL, 5, 'executeModel', middle);
  try {
    const run = await runJob(swarm.dashboard, staged);
    const lost = defined(swarm.closed.id, 'a tab closed mid-job');
    expect(run.report.failures.map((f) => f.lost.map((l) => l.worker))).toEqual([[lost]]);
    expect(run.report.placement.stages?.flatMap((s) => s.workers)).not.toContain(lost);
    const diff = maxAbsDiff(run.latent, uninterrupted.latent);
    console.log(`2 stages × 2 tabs: lost ${lost} at step ${run.report.failures[0].step}; max-abs ${diff}`);
    expect(diff).toBeLessThanOrEqual(1e-5);
  } finally {
    await swarm.close();
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

/**
 * Run on every page of a context before its scripts: a worker page that receives a request for `method` over its
 * data channels asks the test to close it (a synchronous request, so the page does nothing more meanwhile) before it
 * handles the request. The request is in the first bytes of its message: the rpc body's JSON comes before its tensors.
 */
function closeOnRequest(method: string): void {
  if (!location.pathname.includes('worker')) return;
  const marker = `"method":"${method}"`;
  const latin1 = new TextDecoder('latin1');
  const seen = new WeakSet<Event>();
  const carries = (e: MessageEvent) =>
    e.data instanceof ArrayBuffer &&
    latin1.decode(new Uint8Array(e.data, 0, Math.min(e.data.byteLength, 4096))).includes(marker);
  const wrap = (listener: (e: MessageEvent) => unknown) =>
    function (this: RTCDataChannel, e: MessageEvent) {
      if (!seen.has(e) && carries(e)) {
        seen.add(e);
        const ask = new XMLHttpRequest();
        ask.open('POST', '/__survival/requested', false);
        try {
          ask.send(method);
        } catch {
          // the page is closing
        }
      }
      return listener.call(this, e);
    };
  const proto = RTCDataChannel.prototype;
  // called with the channel as `this` below
  // eslint-disable-next-line @typescript-eslint/unbound-method
  const addListener = proto.addEventListener;
  proto.addEventListener = function (this: RTCDataChannel, type: string, listener: unknown, options?: unknown) {
    const wrapped = type === 'message' && typeof listener === 'function' ? wrap(listener as never) : listener;
    addListener.call(this, type, wrapped as EventListener, options as AddEventListenerOptions);
  } as typeof proto.addEventListener;
  const onmessage = Object.getOwnPropertyDescriptor(proto, 'onmessage');
  if (onmessage?.set)
    Object.defineProperty(proto, 'onmessage', {
      ...onmessage,
      set(this: RTCDataChannel, listener: unknown) {
        onmessage.set?.call(this, typeof listener === 'function' ? wrap(listener as never) : listener);
      },
    });
}

/**
 * A swarm of `workers` tabs whose `nth` request for `method` (counted over all tabs) closes the tab it reached before
 * that tab handles it, or crashes it as it starts to; which tab that was and when, once it happened, and how many
 * such requests were made.
 */
async function swarmClosingOn(
  browser: Browser,
  baseURL: string | undefined,
  workers: number,
  method: WorkerMethod,
  nth: number,
  harm: 'closed' | 'crashed' = 'closed',
) {
  const context = await browser.newContext();
  await context.addInitScript(closeOnRequest, method);
  const ids = new Map<Page, string>();
  let requests = 0;
  const closed: { id: string | null; at: number } = { id: null, at: 0 };
  await context.route('**/__survival/requested', async (route) => {
    const page = route.request().frame().page();
    if (++requests !== nth) return route.fulfill({ body: '' });
    closed.id = defined(ids.get(page), 'the peer id of the tab harmed');
    closed.at = Date.now();
    if (harm === 'closed') return page.close();
    // the page is blocked in its synchronous request, so it must be let go before it can take the crash
    await route.fulfill({ body: '' });
    void page.goto('chrome://crash').catch(() => {});
  });
  const dashboard = await context.newPage();
  await dashboard.goto(`${appOrigin(baseURL)}/`);
  const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
  for (let i = 0; i < workers; i++) {
    const page = await context.newPage();
    await page.goto(joinUrl);
    await expect.poll(() => page.evaluate(() => window.ditswarmWorker?.peerId ?? null)).not.toBeNull();
    ids.set(page, await workerId(page));
  }
  await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 60_000 }).toBe(workers);
  return { dashboard, closed, requests: () => requests, close: () => context.close() };
}

test.describe('a worker closed in any phase costs a re-placement, not the job (issue 34)', () => {
  // umT5's 3 layers and AutoencoderKLWan's tiles run on the workers: every phase has calls to lose a worker in
  const everyPhase = {
    prompt: 'a red ball moving right',
    negativePrompt: 'a blue square',
    frames: 1,
    height: 32,
    width: 32,
    steps: 2,
    guidance: 4,
    seed: 5,
    backend: 'swarm',
    workers: 2,
    ep: 'wasm',
    model: FULL_LAYOUT_MODEL_PATH,
  } satisfies JobOverrides;
  let uninterrupted: Awaited<ReturnType<typeof runJob>>;
  test.beforeAll(async ({ browser, baseURL }) => {
    test.setTimeout(360_000);
    const swarm = await openTestSwarm(browser, baseURL, 3);
    uninterrupted = await runJob(swarm.dashboard, everyPhase);
    await swarm.close();
    expect(uninterrupted.report.failures).toEqual([]);
  });

  for (const [phase, method, nth, why] of [
    ['placing', 'prepareJob', 1, 'the first rank asked to prepare the job'],
    // the second call: a check of the first run of layers (passed over) or the second run, after which its own fails
    ['encoding', 'encodeText', 2, 'the tab asked for the second text encoder call'],
    ['decoding', 'decodeTile', 1, 'the first tab asked to decode a tile'],
  ] as const satisfies readonly (readonly [LossPhase, WorkerMethod, number, string])[]) {
    test(`3 worker tabs, ${why} closes in ${method}: the job goes on with the uninterrupted latent`, async ({
      browser,
      baseURL,
    }) => {
      test.setTimeout(360_000);
      const swarm = await swarmClosingOn(browser, baseURL, 3, method, nth);
      try {
        const run = await runJob(swarm.dashboard, everyPhase);
        const closed = defined(swarm.closed.id, `a tab closed in ${method}`);
        const { failures } = run.report;
        console.log(`closed in ${method}: ${JSON.stringify(failures)}`);
        // the closed tab is the loss (its link closed, or its heartbeats stopped first), in the phase it closed in
        expect(failures.map((f) => [f.phase, f.lost.map((l) => l.worker)])).toEqual([[phase, [closed]]]);
        // before the steps, the job is placed without the closed tab; a tile's loss comes after them
        if (phase !== 'decoding') {
          expect(run.report.workers.map((w) => w.id)).not.toContain(closed);
          expect(run.report.workers).toHaveLength(2);
        }
        if (phase === 'encoding')
          expect(run.report.encoding.prompt.layers.map((l) => [l.from, l.to])).toEqual([
            [0, 1],
            [1, 2],
            [2, 3],
          ]);
        if (phase === 'decoding') {
          const decoding = defined(run.report.decoding, 'the decoding report');
          expect(decoding.retried).toBeGreaterThanOrEqual(1);
          expect(decoding.ranks.find((r) => r.worker === closed)?.tiles ?? 0).toBe(0);
          expect(decoding.ranks.reduce((n, r) => n + r.tiles, 0)).toBe(decoding.tiles);
        }
        expect(maxAbsDiff(run.latent, uninterrupted.latent)).toBe(0);
      } finally {
        await swarm.close();
      }
    });
  }
});
