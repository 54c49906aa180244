import { expect, test } from '@playwright/test';
import type { JobOverrides } from '../../app/automation.ts';
import { defined } from '../../core/defined.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';
import { appOrigin, CI, maxAbsDiff, openTestSwarm, runJob, type JobOutcome, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// The relay, forced: a server started like `npm start -- --force-relay` (what `npm run generate
// -- --force-relay` runs) sends every link through itself. The job must not notice: same
// latent as over data channels, and the report says which links went where.
const job = {
  prompt: 'a red ball',
  frames: 5,
  height: 96,
  width: 96,
  steps: 3,
  guidance: 5,
  seed: 3,
  backend: 'swarm',
  ep: 'wasm',
  workers: 2,
  shares: 'even',
} satisfies JobOverrides;

let forced: RunningServer;

test.beforeAll(async () => {
  forced = await startServer({ port: 0, quiet: true, relay: 'force' });
});

test.afterAll(async () => {
  await (forced as RunningServer | undefined)?.close(); // unset where beforeAll failed
});

test('a P = 2 job with every link relayed gives the direct latent within 1e-4, and the report says the links were relayed', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(240_000);
  /** A run, and what the forced relay forwarded during it. */
  const runOn = async (url: string): Promise<{ outcome: JobOutcome; relayBytes: number }> => {
    const swarm = await openTestSwarm(browser, url, 2);
    try {
      const before = forced.relay.stats().bytesForwarded;
      const outcome = await runJob(swarm.dashboard, job);
      return { outcome, relayBytes: forced.relay.stats().bytesForwarded - before };
    } finally {
      await swarm.close();
    }
  };
  const { outcome: direct } = await runOn(appOrigin(baseURL));
  const { outcome: relayed, relayBytes } = await runOn(forced.url);

  const diff = maxAbsDiff(relayed.latent, direct.latent);
  const steps = (r: JobOutcome) => r.report.steps.map((s) => s.ms.toFixed(0)).join('/');
  const exchanged = relayed.report.steps.reduce((t, s) => t + s.ranks.reduce((u, r) => u + r.bytesSent, 0), 0);
  console.log(
    `P=2 step ms direct ${steps(direct)}, relayed ${steps(relayed)}; max-abs ${diff.toExponential(2)}; the relay forwarded ${relayBytes} B (exchange ${exchanged} B)`,
  );

  expect(diff).toBeLessThanOrEqual(1e-4);
  const byLink = (r: JobOutcome) => r.report.links.map((l) => `${l.from}->${l.to}:${l.transport}`).sort();
  expect(byLink(direct)).toEqual(['1->0:direct', 'coordinator->0:direct', 'coordinator->1:direct']);
  expect(byLink(relayed)).toEqual(['1->0:relay', 'coordinator->0:relay', 'coordinator->1:relay']);
  // every byte of the all-to-all crossed the server, and so did the patches out and rows back (2 passes
  // a step, each S tokens of 16·1·2·2 values out and as many back, fp32): with the ranks' own link
  // direct, the relay would forward the patches and rows alone, a ninth of this
  const [, frames, height, width] = relayed.report.latentShape;
  const tokens = frames * (height / 2) * (width / 2);
  const patchesAndRows = job.steps * 2 * tokens * 2 * 64 * 4;
  expect(exchanged).toBe(job.steps * 2 * 2 * (4 * (tokens / 2) * 288 * (1 / 2) * 4 * 2)); // P 2, D 288, 2 blocks
  expect(relayBytes).toBeGreaterThanOrEqual(exchanged + patchesAndRows);
});

test('with the relay forced, a worker page without the join token is told nothing by the server, reaches neither the relay nor the dashboard, and says why', async ({
  browser,
}) => {
  const swarm = await openTestSwarm(browser, forced.url, 1);
  try {
    const { joinUrl } = await swarm.dashboard.evaluate(() => window.ditswarm.ready);
    const token = defined(new URLSearchParams(new URL(joinUrl).hash.slice(1)).get('token'), 'the join token');
    const room = token.split('.')[0];
    const relayRefusals = forced.relay.stats().refused.length;
    const stranger = await swarm.dashboard.context().newPage();
    await stranger.goto(joinUrl.replace(/token=[^&]+/, `token=${room}.${'0'.repeat(32)}`)); // the swarm's room, a made-up seal
    await expect(stranger.locator('#state')).toHaveText('refused', { timeout: 20_000 });
    await expect(stranger.locator('#detail')).toContainText('no proof of a join token this server stands by');
    expect(forced.relay.stats().refused.length).toBe(relayRefusals);
    expect(await swarm.dashboard.evaluate(() => window.ditswarm.workerCount())).toBe(1);
  } finally {
    await swarm.close();
  }
});

test('revoking the join link lets its workers go, the old link opens nothing, the new one joins, and a reload keeps the new one (issue 17, findings 4 and 14)', async ({
  browser,
}) => {
  const swarm = await openTestSwarm(browser, forced.url, 1);
  try {
    const { joinUrl: oldUrl } = await swarm.dashboard.evaluate(() => window.ditswarm.ready);
    const revoked = await swarm.dashboard.evaluate(() => window.ditswarm.revokeJoinLink());
    const { joinUrl, lanJoinUrl } = defined(revoked, 'the links after revoking (null: refused)');
    expect(joinUrl).not.toBe(oldUrl);
    await expect(swarm.dashboard.locator('#join-link')).toHaveAttribute('href', lanJoinUrl);
    await expect.poll(() => swarm.dashboard.evaluate(() => window.ditswarm.workerCount())).toBe(0);
    // the revoked link's page stays out: the server tells it nothing, and the relay refuses the
    // socket it opens again with the revoked token
    await expect(swarm.workers[0].locator('#state')).toHaveText('refused', { timeout: 20_000 });
    await expect(swarm.workers[0].locator('#detail')).toContainText(/refused this link|join token/);
    await expect
      .poll(() => forced.relay.stats().refused.at(-1)?.reason, { timeout: 15_000 })
      .toMatch(/does not hold a join token this server stands by/);
    const fresh = await swarm.dashboard.context().newPage();
    await fresh.goto(joinUrl);
    await expect.poll(() => swarm.dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 }).toBe(1);
    await swarm.dashboard.reload();
    expect((await swarm.dashboard.evaluate(() => window.ditswarm.ready)).joinUrl).toBe(joinUrl);
  } finally {
    await swarm.close();
  }
});

test(
  'two pipeline stages with every link relayed, the hand-off between them too, give the direct latent to the bit (issue 65)',
  CI,
  async ({ browser, baseURL }) => {
    test.setTimeout(240_000);
    const staged = { ...job, workers: 1, stages: 2 } satisfies JobOverrides;
    const runOn = async (url: string): Promise<{ outcome: JobOutcome; relayBytes: number }> => {
      const swarm = await openTestSwarm(browser, url, 2);
      try {
        const before = forced.relay.stats().bytesForwarded;
        const outcome = await runJob(swarm.dashboard, staged);
        return { outcome, relayBytes: forced.relay.stats().bytesForwarded - before };
      } finally {
        await swarm.close();
      }
    };
    const { outcome: direct } = await runOn(appOrigin(baseURL));
    const { outcome: relayed, relayBytes } = await runOn(forced.url);
    const byLink = (r: JobOutcome) => r.report.links.map((l) => `${l.from}->${l.to}:${l.transport}`).sort();
    expect(byLink(relayed)).toEqual(['coordinator->0:relay', 'coordinator->1:relay']);
    // each step's two passes handed from stage to stage: as many bytes relayed or not, all of them across the relay
    const handedOn = (r: JobOutcome) => r.report.steps.map((s) => s.handOffs.map((h) => h.bytes));
    expect(handedOn(relayed)).toEqual(handedOn(direct));
    const handOffBytes = relayed.report.steps.reduce((n, s) => n + s.handOffs.reduce((m, h) => m + h.bytes, 0), 0);
    expect(handOffBytes).toBeGreaterThan(0);
    expect(relayBytes).toBeGreaterThan(handOffBytes);
    console.log(`staged, relayed: ${handOffBytes} B handed on between the stages, ${relayBytes} B through the relay`);
    expect(maxAbsDiff(relayed.latent, direct.latent)).toBe(0);
  },
);
