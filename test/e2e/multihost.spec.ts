import { chromium, expect, test, type Browser, type Page } from '@playwright/test';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { JobOverrides } from '../../app/automation.ts';
import { defined } from '../../core/defined.ts';
import { chromiumArgs, chromiumExecutable } from '../../server/chromium.ts';
import { exchangeFloatsPerBlock, planUlysses } from '../../core/parallel.ts';
import { canCreateNamespaces, createTestNetwork, type TestHost, type TestNetwork } from './netns.ts';
import { serverCaFile, trustingHome } from './trusted-ca.ts';
import { maxAbsDiff, runJob, SMALL_WASM_JOB, type JobOutcome } from './swarm-page.ts';

// The swarm on separate hosts: the server in h0, the dashboard's Chromium in h1 and one Chromium
// per worker in h2…h4, each host a network namespace with its own address on a private test
// subnet. Workers share no loopback, storage or BroadcastChannel; every byte between them
// crosses the test bridge, whose port counters show who sent what.
const SERVER_PORT = 8000;
const STUN_PORT = 3478;
const WORKERS = 3;
const DIM = 288;
const LAYERS = 2;
const TOKENS = 72;
const job = { ...SMALL_WASM_JOB, shares: 'even' } satisfies JobOverrides;

const support = canCreateNamespaces();

test.describe.serial('Ulysses across hosts', () => {
  test.skip(!support.ok, `multi-host test skipped: ${support.ok ? '' : support.reason}`);

  let network: TestNetwork | undefined;
  const net = () => defined(network, 'the test network beforeAll makes');
  const browsers: Browser[] = [];
  let dashboard: Page;
  let serverHost: TestHost;
  let workerHosts: TestHost[];
  let dashboardHost: TestHost;
  /** hosts whose pages sent a STUN Binding request to the server published in /signaling.json */
  const stunClients = new Set<string>();
  const { serverHome, trusting, removeHomes } = homes();

  test.beforeAll(async () => {
    test.setTimeout(120_000);
    network = createTestNetwork(2 + WORKERS);
    const [h0, h1, ...rest] = network.hosts;
    [serverHost, dashboardHost, workerHosts] = [h0, h1, rest];
    const origin = `https://${h0.address}:${SERVER_PORT}`;
    const stun = network.spawnIn(h0, process.execPath, [
      '--import',
      'tsx',
      'test/e2e/stun-server.ts',
      String(STUN_PORT),
    ]);
    await linePrinted(stun, 'stun listening', 'the STUN server');
    defined(stun.stdout, "the STUN server's output").on('data', (chunk: Buffer) => {
      for (const [, address] of chunk.toString().matchAll(/^binding (\S+)$/gm)) stunClients.add(address);
    });
    const env = {
      ...process.env,
      HOME: serverHome,
      DITSWARM_ICE_SERVERS: `stun:${h0.address}:${STUN_PORT}`,
    };
    const server = network.spawnIn(
      h0,
      process.execPath,
      ['--import', 'tsx', 'server/main.ts', '--port', String(SERVER_PORT)],
      { env },
    );
    const dashboardUrl = await dashboardLink(server, origin);
    // every other host trusts the server's CA, as its owner would once: its pages are https, secure contexts
    trustingHome(trusting, serverCaFile(serverHome));

    const dashboardBrowser = await launchIn(network, h1, []);
    dashboard = await dashboardBrowser.newPage();
    await dashboard.goto(dashboardUrl); // another machine than the server's: the owner's link
    expect(await dashboard.evaluate(() => [isSecureContext, crossOriginIsolated])).toEqual([true, true]);
    const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    expect(joinUrl).toContain(origin);

    for (const host of workerHosts) {
      const page = await (await launchIn(network, host, [])).newPage();
      await page.goto(joinUrl);
      // the https link: WebGPU, threads and WebCodecs on every other host, not on the server's alone
      expect(await page.evaluate(() => [isSecureContext, crossOriginIsolated])).toEqual([true, true]);
    }
    await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 60_000 }).toBe(WORKERS);
  });

  test.afterAll(async () => {
    await Promise.allSettled(browsers.map((b) => b.close()));
    network?.cleanup();
    removeHomes();
  });

  test('P = 2 and P = 3 on separate hosts equal P = 1 within 1e-4; the exchange goes host to host, not through the server', async () => {
    test.setTimeout(150_000);
    const single = await runJob(dashboard, { ...job, workers: 1 });
    console.log(`P=1 step ms ${stepTimes(single.report)}`);
    for (const P of [2, 3]) {
      const before = workerHosts.map((h) => net().trafficOf(h).fromHost);
      const serverBefore = net().trafficOf(serverHost);
      const run = await runJob(dashboard, { ...job, workers: P });
      const sentOnWire = workerHosts.map((h, i) => net().trafficOf(h).fromHost - before[i]);
      const serverAfter = net().trafficOf(serverHost);
      // What reached the server: HTTP requests and signaling (the model it serves flows the other way).
      const serverBytes = serverAfter.toHost - serverBefore.toHost;

      const diff = maxAbsDiff(run.latent, single.latent);
      const exchanged = run.report.steps.map((s) => s.ranks.map((r) => r.bytesSent));
      const perRank = Array.from({ length: P }, (_, r) => exchanged.reduce((sum, step) => sum + step[r], 0));
      console.log(
        `P=${P}: max-abs vs P=1 ${diff.toExponential(2)}, step ms ${stepTimes(run.report)}; ` +
          `exchange bytes per rank ${perRank.join('/')}, bytes leaving each worker host ${sentOnWire.join('/')}, bytes reaching the server host ${serverBytes}`,
      );
      expect(run.report.placement.layout.ulyssesDegree).toBe(P);
      expect(diff, `P=${P}`).toBeLessThanOrEqual(1e-4);
      // two passes a step, each rank its share's q, k, v out and attention output back (about
      // 4·(S/P)·D·(P−1)/P floats a block)
      const plan = planUlysses({ numHeads: 12, headDim: DIM / 12 }, TOKENS, P);
      for (const step of exchanged)
        expect(step).toEqual(plan.heads.map((_, r) => 2 * 4 * exchangeFloatsPerBlock(plan, r) * LAYERS));
      // The P busiest worker hosts each put at least their rank's exchange on the bridge ...
      const busiest = [...sentOnWire].sort((a, b) => b - a).slice(0, P);
      for (const bytes of busiest) expect(bytes).toBeGreaterThanOrEqual(perRank[0]);
      // ... and none of it went through the server's host (a relay would receive every frame).
      expect(serverBytes).toBeLessThan(perRank[0] / 2);
    }
  });

  test('the STUN server given to the ditswarm server reaches the dashboard and every worker', async () => {
    // Each page gathers ICE candidates for its links; with the published STUN server it asks it
    // for its address. No request from a host means that page ignored /signaling.json's iceServers.
    await expect
      .poll(() => [...stunClients].sort(), { timeout: 10_000 })
      .toEqual([dashboardHost, ...workerHosts].map((h) => h.address).sort());
  });

  async function launchIn(net: TestNetwork, host: TestHost, extraArgs: string[]): Promise<Browser> {
    const browser = await chromium.launch({
      executablePath: net.chromiumIn(host, chromiumExecutable()),
      args: [...chromiumArgs, ...extraArgs],
      env: { ...process.env, HOME: trusting },
    });
    browsers.push(browser);
    return browser;
  }
});

// A worker host on a network that blocks UDP: its data channels cannot open, so its links fall
// back to the relay through the server after RELAY_FALLBACK_MS, and the job runs anyway.
test.describe.serial('relay fallback across hosts', () => {
  test.skip(!support.ok, `multi-host test skipped: ${support.ok ? '' : support.reason}`);

  let network: TestNetwork | undefined;
  const net = () => defined(network, 'the test network beforeAll makes');
  const browsers: Browser[] = [];
  let dashboard: Page;
  let serverHost: TestHost;
  let open: TestHost;
  let spare: TestHost;
  let blocked: TestHost;
  let joinUrl: string;
  const { serverHome, trusting, removeHomes } = homes();

  test.beforeAll(async () => {
    test.setTimeout(120_000);
    network = createTestNetwork(5);
    const [h0, h1, ...rest] = network.hosts;
    [serverHost, open, spare, blocked] = [h0, ...rest];
    network.blockUdp(blocked);
    const origin = `https://${h0.address}:${SERVER_PORT}`;
    const server = network.spawnIn(
      h0,
      process.execPath,
      ['--import', 'tsx', 'server/main.ts', '--port', String(SERVER_PORT)],
      { env: { ...process.env, HOME: serverHome, DITSWARM_RELAY: 'fallback' } },
    );
    const dashboardUrl = await dashboardLink(server, origin);
    trustingHome(trusting, serverCaFile(serverHome));
    dashboard = await (await launch(h1)).newPage();
    await dashboard.goto(dashboardUrl);
    ({ joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready));
  });

  test.afterAll(async () => {
    await Promise.allSettled(browsers.map((b) => b.close()));
    network?.cleanup();
    removeHomes();
  });

  async function launch(host: TestHost): Promise<Browser> {
    const browser = await chromium.launch({
      executablePath: net().chromiumIn(host, chromiumExecutable()),
      args: [...chromiumArgs],
      env: { ...process.env, HOME: trusting },
    });
    browsers.push(browser);
    return browser;
  }

  async function join(host: TestHost): Promise<{ browser: Browser; page: Page }> {
    const browser = await launch(host);
    const page = await browser.newPage();
    await page.goto(joinUrl);
    await expect
      .poll(() => page.evaluate(() => window.ditswarmWorker?.connected ?? false), { timeout: 60_000 })
      .toBe(true);
    return { browser, page };
  }

  test('a worker whose host blocks UDP joins and runs a P = 2 job through the relay; latent equals the direct run within 1e-4', async () => {
    test.setTimeout(300_000);
    // direct: two hosts that can open data channels
    await join(open);
    const { browser: spareBrowser } = await join(spare);
    await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 60_000 }).toBe(2);
    await runJob(dashboard, { ...job, workers: 2 }); // warms both workers up: the timed runs below are second runs
    const direct = await runJob(dashboard, { ...job, workers: 2 });

    // the spare leaves; the blocked host takes its rank
    await spareBrowser.close();
    await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 }).toBe(1);
    const joinStarted = Date.now();
    const { page: blockedPage } = await join(blocked);
    const joinMs = Date.now() - joinStarted;
    expect(await blockedPage.evaluate(() => window.ditswarmWorker?.transport)).toBe('relay');
    await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 }).toBe(2);

    await runJob(dashboard, { ...job, workers: 2 });
    const serverBefore = net().trafficOf(serverHost);
    const relayed = await runJob(dashboard, { ...job, workers: 2 });
    const serverBytes = net().trafficOf(serverHost).toHost - serverBefore.toHost;

    const diff = maxAbsDiff(relayed.latent, direct.latent);
    const perRank = [0, 1].map((r) => relayed.report.steps.reduce((t, s) => t + s.ranks[r].bytesSent, 0));
    const links = (r: JobOutcome) => r.report.links.map((l) => `${l.from}->${l.to}:${l.transport}`).sort();
    console.log(
      `UDP-blocked worker joined through the relay in ${joinMs} ms; P=2 step ms direct ${stepTimes(direct.report)}, relayed ${stepTimes(relayed.report)}; ` +
        `max-abs ${diff.toExponential(2)}; links ${links(relayed).join(', ')}; exchange bytes per rank ${perRank.join('/')}, bytes reaching the server host ${serverBytes}`,
    );
    expect(diff).toBeLessThanOrEqual(1e-4);
    expect(links(direct)).toEqual(['1->0:direct', 'coordinator->0:direct', 'coordinator->1:direct']);
    const blockedId = await blockedPage.evaluate(() => window.ditswarmWorker?.peerId);
    const blockedRank = relayed.report.workers.findIndex((w) => w.id === blockedId);
    expect(blockedRank).toBeGreaterThanOrEqual(0); // ranks go fastest first: either rank may be the blocked one
    // every link of the blocked worker is relayed; the open worker's own link stays direct
    expect(links(relayed)).toEqual(
      ['1->0:relay', `coordinator->${blockedRank}:relay`, `coordinator->${1 - blockedRank}:direct`].sort(),
    );
    // both ranks' halves of the all-to-all crossed the server's host
    expect(serverBytes).toBeGreaterThanOrEqual(perRank[0] + perRank[1]);
  });
});

/**
 * The server host's home (its state folder, its CA among it, of the test's own) and the home every other host's browser
 * runs with, whose NSS database trusts that CA once the server made it.
 */
function homes(): { serverHome: string; trusting: string; removeHomes: () => void } {
  const scratch = mkdtempSync(join(tmpdir(), 'ditswarm-hosts-'));
  return {
    serverHome: join(scratch, 'server'),
    trusting: join(scratch, 'trusting'),
    removeHomes: () => rmSync(scratch, { recursive: true, force: true }),
  };
}

/** The dashboard's link for other machines than the server's, as `npm start` printed it (its owner key in it). */
async function dashboardLink(server: ChildProcess, origin: string): Promise<string> {
  const printed = await linePrinted(server, '#owner=', 'the ditswarm server');
  return `${origin}/#owner=${defined(/#owner=([0-9a-f]+)/.exec(printed), 'the owner key printed')[1]}`;
}

/** What `child` printed, once it printed `line`. */
function linePrinted(child: ChildProcess, line: string, what: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let output = '';
    const timer = setTimeout(
      () => reject(new Error(`${what} in the test host did not start within 60 s:\n${output}`)),
      60_000,
    );
    const read = (chunk: Buffer) => {
      if (output.includes(line)) return;
      output += chunk.toString();
      if (output.includes(line)) {
        clearTimeout(timer);
        resolve(output);
      }
    };
    defined(child.stdout, `the output of ${what}`).on('data', read);
    defined(child.stderr, `the errors of ${what}`).on('data', read);
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} in the test host exited with ${code}:\n${output}`));
    });
  });
}

function stepTimes(report: JobOutcome['report']): string {
  return report.steps.map((s) => s.ms.toFixed(0)).join('/');
}
