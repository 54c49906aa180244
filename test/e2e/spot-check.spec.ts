import { expect, test } from '@playwright/test';
import type { JobOverrides } from '../../app/automation.ts';
import { defined } from '../../core/defined.ts';
import { maxAbsDiff, openTestSwarm, runJob, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// Spot checks over real tabs (issue 18): a worker tab scripted to perturb the rows it returns —
// right size, finite, plausible (one float of each reply off by about 1.6%) — is caught by the
// default rate within a job of 20 steps, let go and not admitted again; the steps it took part in
// run again, so the job ends with the honest latent.

/**
 * The cheat, as a page script: in the last frame of every RPC reply of rows this page sends (those
 * of executeModel and recompute, its only replies past 2 KiB: tensors come last), each of the last
 * 64 floats (a token's row) has, at random, a mantissa bit flipped: each off by 1.6% or not at all.
 */
function perturbRows(): void {
  // eslint-disable-next-line @typescript-eslint/unbound-method -- called on its channel below
  const send = RTCDataChannel.prototype.send;
  RTCDataChannel.prototype.send = function (this: RTCDataChannel, data: unknown) {
    if (data instanceof ArrayBuffer && data.byteLength > 64) {
      const view = new DataView(data);
      const rpc = view.getUint16(0, true) === 0x5744 && view.getUint8(3) === 1 && view.getUint8(5) !== 255;
      const last = view.getUint32(12, true) === view.getUint32(16, true) - 1;
      if (rpc && last && view.getUint32(24, true) > 2048)
        for (let k = 1; k <= 64; k++)
          if (Math.random() < 0.5) new Uint8Array(data)[data.byteLength - 4 * k + 2] ^= 0x02;
    }
    Reflect.apply(send, this, [data]);
  };
}

test('a worker returning slightly wrong rows is caught by spot checks within 20 steps, let go, kept out, and the job ends with the honest latent', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(240_000);
  const swarm = await openTestSwarm(browser, baseURL, 2);
  try {
    const job = {
      prompt: 'a red ball',
      frames: 1,
      height: 112,
      width: 80,
      steps: 20,
      guidance: 5,
      seed: 11,
      backend: 'swarm',
      ep: 'wasm',
    } satisfies JobOverrides;
    const honest = await runJob(swarm.dashboard, { ...job, workers: 1 });
    expect(honest.report.spotChecks).toEqual([]); // one rank: nobody to check it

    const cheater = await swarm.dashboard.context().newPage();
    await cheater.addInitScript(perturbRows);
    const { joinUrl } = await swarm.dashboard.evaluate(() => window.ditswarm.ready);
    await cheater.goto(joinUrl);
    await expect.poll(() => swarm.dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 60_000 }).toBe(3);
    const cheaterId = await cheater.evaluate(() => window.ditswarmWorker?.peerId);

    const run = await runJob(swarm.dashboard, { ...job, workers: 3, shares: 'even' });
    const caught = run.report.spotChecks.flatMap((c) =>
      c.verdict === 'agreed' ? [] : [{ step: c.step, why: c.verdict.why }],
    );
    const failures = run.report.failures.map((f) => ({
      step: f.step,
      rerunFrom: f.rerunFromStep,
      lost: f.lost.map((l) => l.worker),
    }));
    const fromOne = (step: number | undefined) => (step ?? NaN) + 1;
    console.log(
      `spot checks: ${run.report.spotChecks.length} in ${run.report.steps.length} steps (the first at step ${fromOne(run.report.spotChecks.at(0)?.step)}), ` +
        `caught at step ${fromOne(caught.at(0)?.step)}: ${caught.at(0)?.why ?? 'nothing'}; failures ${JSON.stringify(failures)}; ` +
        `spot-check ms ${run.report.spotChecks.map((c) => Math.round(c.ms)).join('/')}`,
    );
    expect(caught.length).toBeGreaterThanOrEqual(1);
    const lost = run.report.failures.flatMap((f) => f.lost.map((l) => l.worker));
    expect(lost).toContain(cheaterId);
    const itsFailure = run.report.failures.find((f) => f.lost.some((l) => l.worker === cheaterId));
    expect(defined(itsFailure, "the cheater's failure").rerunFromStep).toBe(0);
    // the steps it took part in ran again without it: the honest latent
    expect(maxAbsDiff(run.latent, honest.latent)).toBeLessThanOrEqual(1e-4);
    // and it stays out: its page is refused when it dials again
    await expect.poll(() => swarm.dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 }).toBe(2);
    // the dashboard said why it let the page go, then why it refuses its dials; the page is told it was banned
    await expect(swarm.dashboard.locator('#swarm-events')).toContainText(
      /returning wrong results|banned from this swarm for lying/,
      { timeout: 30_000 },
    );
    await expect(cheater.locator('#detail')).toContainText('banned from this swarm for lying', { timeout: 30_000 });
  } finally {
    await swarm.close();
  }
});
