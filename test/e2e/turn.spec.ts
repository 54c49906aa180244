import { expect, test } from '@playwright/test';
import type { JobOverrides } from '../../app/automation.ts';
import { startCoturn, type Coturn } from '../../server/coturn.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';
import {
  appOrigin,
  CI,
  maxAbsDiff,
  openTestSwarm,
  runJob,
  SMALL_WASM_JOB,
  WASM_ONLY_BROWSER,
  workerId,
  type JobOutcome,
} from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs compute on WASM

// TURN as the standard relay (issue 63, item 4): a real coturn, sharing its secret with a server
// started like `npm start -- --turn-secret S --turn-url turn:127.0.0.1:PORT --ice-policy relay`,
// which gives the pages of its swarm credentials and has every RTCPeerConnection use TURN
// candidates only. The job must not notice: the latent of the same job over direct data channels,
// and the report says each link went through TURN.
const job = { ...SMALL_WASM_JOB, workers: 2, shares: 'even' } satisfies JobOverrides;

let coturn: Coturn;
let forced: RunningServer;

test.beforeAll(async () => {
  coturn = await startCoturn();
  forced = await startServer({ port: 0, quiet: true, turn: coturn.turn, iceTransportPolicy: 'relay' });
});

test.afterAll(async () => {
  // unset where beforeAll failed
  await (forced as RunningServer | undefined)?.close();
  await (coturn as Coturn | undefined)?.stop();
});

test(
  'a P = 2 job with every link forced through a real coturn gives the direct latent, and the report says turn',
  CI,
  async ({ browser, baseURL }) => {
    test.setTimeout(120_000);
    const byLink = (r: JobOutcome) => r.report.links.map((l) => `${l.from}->${l.to}:${l.transport}`).sort();
    const direct = await (async () => {
      const swarm = await openTestSwarm(browser, appOrigin(baseURL), 2);
      try {
        return await runJob(swarm.dashboard, job);
      } finally {
        await swarm.close();
      }
    })();
    const relayedBefore = forced.relay.stats().bytesForwarded;
    const swarm = await openTestSwarm(browser, forced.url, 2);
    let turned: JobOutcome;
    let ids: string[];
    try {
      turned = await runJob(swarm.dashboard, job);
      ids = [
        (await swarm.dashboard.evaluate(() => window.ditswarm.ready)).swarmId,
        ...(await Promise.all(swarm.workers.map(workerId))),
      ];
    } finally {
      // the pages' peer connections close with their pages: each releases its allocation, and coturn logs its bytes
      await swarm.close();
    }

    const diff = maxAbsDiff(turned.latent, direct.latent);
    const exchanged = turned.report.steps.reduce((t, s) => t + s.ranks.reduce((u, r) => u + r.bytesSent, 0), 0);
    await expect.poll(() => coturn.peerBytes().allocations, { timeout: 15_000 }).toBeGreaterThanOrEqual(6);
    const relayed = coturn.peerBytes();
    const steps = (r: JobOutcome) => r.report.steps.map((s) => s.ms.toFixed(0)).join('/');
    console.log(
      `P=2 step ms direct ${steps(direct)}, TURN ${steps(turned)}; max-abs ${diff.toExponential(2)}; ` +
        `coturn relayed ${relayed.received} B in, ${relayed.sent} B out over ${relayed.allocations} allocations ` +
        `(exchange ${exchanged} B)`,
    );

    expect(diff).toBe(0);
    expect(byLink(direct)).toEqual(['1->0:direct', 'coordinator->0:direct', 'coordinator->1:direct']);
    expect(byLink(turned)).toEqual(['1->0:turn', 'coordinator->0:turn', 'coordinator->1:turn']);
    // coturn gave allocations to the pages' own ids (the usernames the server made for them), and relayed at least
    // the whole all-to-all; the server's own relay carried nothing
    for (const id of ids)
      expect(coturn.log()).toMatch(new RegExp(`user <\\d+:${id}>: incoming packet ALLOCATE processed, success`));
    expect(relayed.received).toBeGreaterThanOrEqual(exchanged);
    expect(forced.relay.stats().bytesForwarded).toBe(relayedBefore);
  },
);
