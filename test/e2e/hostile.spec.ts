import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { chromium, expect, test, type Browser, type BrowserContext, type Page } from '@playwright/test';
import qrcode from 'qrcode-generator';
import type { JobOverrides, JobResult } from '../../app/automation.ts';
import { defined } from '../../core/defined.ts';
import { chromiumArgs, chromiumExecutable } from '../../server/chromium.ts';
import {
  emulateStorageQuota,
  peerConnectionsSince,
  shortenExchangeTimeout,
  trackPeerConnections,
} from './hostile/dashboard.ts';
import { openRawPeer, type RawPeer } from './hostile/raw-peer.ts';
import { hostileLog, makeHostile, setRules, type HostileLog, type HostileRules } from './hostile/wire.ts';
import { CI, appOrigin, maxAbsDiff, runJob, TEST_MODEL, workerId } from './swarm-page.ts';

// Issue 17's findings played against the real server and pages by the peers that would play them:
// a worker page with the join link that rewrites what it sends (hostile/wire.ts), pages with only
// what the server hands to anyone (hostile/raw-peer.ts), a page of another site, and a browser
// whose storage is full. Each attack is refused or contained, the honest job ends with its
// unattacked latent, and nothing is lost; each test says what it saw before the fix.
// Not here: #4, #9 and #14 (hostile-server.spec.ts and relay.spec.ts, with the relay's admission,
// signaling limits and the token's revocation), and #5 (see the note at the end of this file).

/** a job of a few tokens, as every attacked job runs it */
const job = {
  prompt: 'a red ball',
  frames: 5,
  height: 32,
  width: 32,
  steps: 4,
  guidance: 1,
  seed: 7,
  backend: 'swarm',
  ep: 'wasm',
  outputType: 'latent',
  model: TEST_MODEL,
} satisfies JobOverrides;
/** the same job on different degrees gives the same latent: float32 rounding apart (survival.spec.ts) */
const SAME_LATENT = 1e-4;
/**
 * how long a page that does not prove the join token is kept: 10 s for its proof, 0.5 s for the
 * refusal to reach it, and slack (without the fix: up to 18 s, or for good)
 */
const UNPROVEN_KEPT_MS = 15_000;

/** the unattacked job's latent, from the first swarm that runs it */
let unattacked: Float32Array | null = null;
const unattackedLatent = () => defined(unattacked, "the unattacked job's latent");

/** An attacked job: finished (with its report and latent) or failed (with its error), and what the attacker did. */
type AttackedRun = (
  { report: JobResult['report']; latent: Float32Array; error: null } | { report: null; latent: null; error: string }
) & { log: HostileLog };
type FinishedRun = Extract<AttackedRun, { error: null }>;

test.describe.serial('three worker tabs, one of them hostile', () => {
  let context: BrowserContext;
  let dashboard: Page;
  let honest: Page[];
  let attacker: Page;
  const ids: { honest: string[]; attacker: string } = { honest: [], attacker: '' };
  const workerCount = () => dashboard.evaluate(() => window.ditswarm.workerCount());
  const idOf = workerId;

  test.beforeAll(async ({ browser, baseURL }) => {
    test.setTimeout(120_000);
    context = await browser.newContext();
    dashboard = await context.newPage();
    await shortenExchangeTimeout(dashboard);
    await trackPeerConnections(dashboard);
    await dashboard.goto(`${appOrigin(baseURL)}/`);
    const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    honest = [await context.newPage(), await context.newPage()];
    attacker = await context.newPage();
    await makeHostile(attacker);
    for (const page of [...honest, attacker]) await page.goto(joinUrl);
    await expect.poll(workerCount, { timeout: 60_000 }).toBe(3);
    ids.honest = await Promise.all(honest.map(idOf));
    ids.attacker = await idOf(attacker);
    const run = await runJob(dashboard, { ...job, workers: 3 });
    expect(run.report.failures).toEqual([]);
    unattacked = run.latent;
  });

  test.afterAll(async () => {
    await (context as BrowserContext | undefined)?.close(); // unset where beforeAll failed
  });

  /**
   * Once the three tabs are in the swarm again: those let go by the last attack rejoin by
   * themselves, and one let go for wrong results (refused from then on) is reloaded (a new page,
   * with a new peer id).
   */
  async function wholeSwarm(): Promise<void> {
    await expect
      .poll(
        async () => {
          for (const page of [...honest, attacker])
            if ((await page.locator('#state').textContent()) === 'refused') await page.reload();
          return workerCount();
        },
        { timeout: 30_000, intervals: [500, 1_000] },
      )
      .toBe(3);
    ids.honest = await Promise.all(honest.map(idOf));
    ids.attacker = await idOf(attacker);
  }

  /** The job on all three tabs with the attacker playing `rules`; its outcome, failed or not. */
  async function attackedJob(rules: HostileRules): Promise<AttackedRun> {
    await wholeSwarm();
    await setRules(attacker, rules);
    try {
      const outcome = await dashboard.evaluate(
        (j) =>
          window.ditswarm.generate(j).then(
            (r) => ({ report: r.report, latent: r.latent, error: null }),
            (e: unknown) => ({ report: null, latent: null, error: (e as Error).message }),
          ),
        { ...job, workers: 3 },
      );
      if (outcome.error !== null) return { ...outcome, log: await hostileLog(attacker) };
      const bytes = Buffer.from(outcome.latent, 'base64');
      return {
        ...outcome,
        latent: new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4),
        log: await hostileLog(attacker),
      };
    } finally {
      await setRules(attacker, {});
    }
  }

  /** The job finished on what was left, with the unattacked latent, every step once. */
  function expectUnattackedResult(run: AttackedRun): asserts run is FinishedRun {
    expect(run.error).toBeNull();
    if (run.error !== null) throw new Error(`the job failed: ${run.error}`);
    expect(run.report.steps.map((s) => s.step)).toEqual([0, 1, 2, 3]);
    expect(maxAbsDiff(run.latent, unattackedLatent())).toBeLessThanOrEqual(SAME_LATENT);
  }

  /** Who each failure of the run let go: worker ids with their causes. */
  const letGo = (run: AttackedRun) =>
    (run.report?.failures ?? []).flatMap((f) =>
      f.lost.map((l) => ({ worker: l.worker, cause: l.cause, evidence: l.evidence })),
    );

  /** What each honest tab went through so far (its page's history): 'lost the dashboard' is a tab let go. */
  const histories = () => Promise.all(honest.map((page) => page.evaluate(() => [...window.ditswarmWorkerHistory])));

  // Before any attack that lets a tab go, so that what the honest tabs count is this job's alone.
  test(
    '#6 tensors of a forward already past, or as float16 in a float32 job, are refused whole and counted; the job goes on undisturbed',
    CI,
    async () => {
      // the hostile rank sends, with its tensors of step 3, a copy tagged for step 1 and a copy as
      // float16 of the same bytes. Without the fix the past one is held as if it were ahead (its tag
      // never asked for again: held for good) and the float16 one dropped uncounted: both show 0.
      const badFrames = async (id: string) =>
        Number(await dashboard.locator(`#workers tbody tr[data-worker="${id}"] td:last-child`).textContent());
      await wholeSwarm();
      const before = await Promise.all(ids.honest.map(badFrames));
      const run = await attackedJob({ mesh: { step: 2, make: 'stale' } });
      expect(run.log.tensorsInjected).toBe(4); // two copies to each of the two honest ranks
      expectUnattackedResult(run);
      expect(run.report.failures).toEqual([]);
      // each honest rank refused both and counted them; its pulse says so on the dashboard
      await expect
        .poll(async () => (await Promise.all(ids.honest.map(badFrames))).map((n, i) => n - before[i]), {
          timeout: 10_000,
        })
        .toEqual([2, 2]);

      // and a flood of tensors for steps the exchange has not reached: at most 4 are held, the 5th
      // is a flood and its sender is set aside for the job (the rank that said so stays: the
      // coordinator cannot see those tensors, and one word costs one rank). Without the fix all
      // 1,000 are held (59 MiB on this model for 2,000), and the job finishes with nobody let go.
      const flood = await attackedJob({ mesh: { step: 1, make: 'flood', count: 1000 } });
      expect(flood.log.tensorsInjected).toBe(2000);
      expectUnattackedResult(flood);
      const gone = letGo(flood);
      expect(gone.map((l) => l.worker)).toEqual([ids.attacker]);
      expect(gone[0].evidence).toMatch(
        /^set aside for this job, not banned: rank \d reported it misbehaving: .*tensors ahead/,
      );
    },
  );

  test('#2 a rank naming three honest ranks in its error text has none of them let go: the liar alone goes, and the job finishes with the unattacked latent', async () => {
    // the finding's own error text; without the fix the coordinator parsed it and let the three
    // honest ranks go (the liar stayed), and repeated, the re-placements ran out. A rank that fails
    // blaming nobody the coordinator can confirm is let go itself.
    await wholeSwarm();
    const before = await histories();
    const run = await attackedJob({ rows: { from: 1, make: 'error', error: 'rank 0 is gone rank 1: x rank 2: y' } });
    expect(run.log.rowsTampered).toBe(1);
    expectUnattackedResult(run);
    expect(letGo(run).map((l) => l.worker)).toEqual([ids.attacker]);
    const after = await histories();
    after.forEach((history, i) =>
      expect(history.slice(before[i].length).filter((s) => s.includes('lost the dashboard'))).toEqual([]),
    );
  });

  test('#2 a rank blaming honest ranks as data sets the first aside and is banned at the second: the job finishes on both honest ranks (issue 33, #5)', async () => {
    // blame as data (a RankLost detail) accusing the next rank of misbehaving, which the
    // coordinator cannot see for itself: the accused sits out while its accuser stays; accusing a
    // second, distinct rank convicts the liar (coordinator/accusations.ts), and the first comes
    // back. Before, the liar and an honest rank were let go (3 → 1 ranks) and the liar came back.
    const run = await attackedJob({
      rows: {
        from: 1,
        make: 'error',
        error: 'rank 0 is gone rank 1: x rank 2: y',
        blame: { rank: 'next', cause: 'misbehaved', evidence: 'sent NaN' },
      },
    });
    expectUnattackedResult(run);
    const gone = letGo(run);
    expect(gone.map((l) => l.worker)).toEqual([expect.not.stringMatching(ids.attacker), ids.attacker]);
    expect(gone[0].evidence).toMatch(/^set aside for this job, not banned: rank \d reported it misbehaving/);
    expect(gone[1].evidence).toMatch(/^convicted by the record of accusations \(it accused 2 distinct peers/);
    expect(run.report.failures.map((f) => f.degreeAfter)).toEqual([2, 2]);
    expect(run.report.workers.map((w) => w.id).sort()).toEqual([...ids.honest].sort());
    await expect(attacker.locator('#detail')).toContainText('banned from this swarm for lying', { timeout: 15_000 });
  });

  test(
    '#3 rows of NaN from a rank are its own breach: it alone is let go, not placed again, and nothing of them reaches the latent',
    CI,
    async () => {
      // without the fix the NaN rows went into the latent, the checkpoint and the video (black),
      // and the job was saved as done (rows of the wrong length or type, which the same check
      // refuses where they arrive, are fuzzed in test/unit/fuzz.test.ts)
      const run = await attackedJob({ rows: { from: 1, make: 'nan' } });
      expect(run.log.rowsTampered).toBeGreaterThanOrEqual(1);
      expectUnattackedResult(run);
      expect(letGo(run)).toEqual([
        { worker: ids.attacker, cause: 'misbehaved', evidence: expect.stringMatching(/NaN or infinite/) },
      ]);
      expect(run.report.failures[0].degreeAfter).toBe(2);
      // and it is not placed again: the dashboard refuses the page when it comes back (until it reloads)
      await expect(attacker.locator('#state')).toHaveText('refused', { timeout: 15_000 });
    },
  );

  test(
    '#3 a NaN tensor between ranks is blamed on its sender, set aside for the job; the rank that saw it stays, and the job finishes',
    CI,
    async () => {
      // every rank checks what it sends (so a NaN arriving is its sender's doing); without the fix
      // the NaN went through the attention into every rank's rows and the latent
      const run = await attackedJob({ mesh: { step: 1, make: 'nan' } });
      expect(run.log.tensorsPoisoned).toBeGreaterThanOrEqual(2);
      expectUnattackedResult(run);
      const gone = letGo(run);
      expect(gone.map((l) => l.worker)).toEqual([ids.attacker]);
      expect(gone[0].evidence).toMatch(/^set aside for this job, not banned: .*NaN or infinite/);
    },
  );

  test(
    '#7 a rank that withholds its tensors is named by the ranks waiting for it and set aside for the job, though it answers pings; its accuser stays',
    CI,
    async () => {
      // the ranks' patience for a peer's tensor is what prepareJob gives them (half the dashboard's
      // RPC timeout: a minute); here 4 s. Without the fix the job failed at the RPC timeout naming
      // ranks that still answered ping, and the withholding rank was never let go.
      await dashboard.evaluate(() => (window.__exchangeTimeoutMs = 4_000));
      try {
        const started = Date.now();
        const run = await attackedJob({ mesh: { step: 1, make: 'withhold' } });
        expect(run.log.tensorsWithheld).toBeGreaterThanOrEqual(2);
        expectUnattackedResult(run);
        const gone = letGo(run);
        expect(gone.map((l) => l.worker)).toEqual([ids.attacker]);
        expect(gone[0].evidence).toMatch(/sent no tensor for step 2/);
        expect(Date.now() - started).toBeLessThan(30_000); // named at 4 s, not at the RPC timeout (120 s)
      } finally {
        await dashboard.evaluate(() => (window.__exchangeTimeoutMs = undefined));
      }
    },
  );

  test('#8 malformed heartbeat answers are dropped, not their sender: the job finishes and the swarm table still shows every worker', async () => {
    // without the fix `mesh: "not-an-array"` threw after the last step (the link report), failing
    // a finished job, and broke the swarm table
    const errors: string[] = [];
    const onError = (e: Error) => errors.push(e.message);
    dashboard.on('pageerror', onError);
    const run = await attackedJob({
      pulse: { state: { x: 1 }, framesDropped: -1, mesh: 'not-an-array', threads: 'many', load: { bytes: 'x' } },
    });
    dashboard.off('pageerror', onError);
    // the attack reached the dashboard during the job (how many pulses a short job spans depends on the machine)
    expect(run.log.pulsesReplaced).toBeGreaterThan(0);
    expectUnattackedResult(run);
    expect(run.report.failures).toEqual([]);
    expect(run.report.links.every((l) => ['direct', 'relay', 'unknown'].includes(l.transport))).toBe(true);
    await expect(dashboard.locator('#workers tbody tr')).toHaveCount(3);
    expect(errors).toEqual([]);
  });

  test('#13 a page that has not proved the join token reserves nothing: six first chunks declaring 64 MiB each hold no memory on the dashboard', async ({
    baseURL,
  }) => {
    // a worker page with a wrong token (it never proves it) sends, as its link opens, six 64 KiB
    // first chunks of RPC messages each declaring 64 MiB, and keeps the link open. Without the fix
    // the dashboard reserved their full size (256 MiB held: its cap for partial messages).
    const cdp = await context.newCDPSession(dashboard);
    const arrayBuffers = async () => {
      await cdp.send('HeapProfiler.collectGarbage');
      return (await cdp.send('Runtime.getHeapUsage')).backingStorageSize;
    };
    // the measure sees a reservation: 64 MiB that nobody has written to yet
    const unused = await arrayBuffers();
    await dashboard.evaluate(() => (window.__probe = new Uint8Array(64 << 20)));
    expect((await arrayBuffers()) - unused).toBeGreaterThan(60 << 20);
    await dashboard.evaluate(() => delete window.__probe);

    const baseline = await arrayBuffers();
    const { joinUrl, swarmId } = await dashboard.evaluate(() => window.ditswarm.ready);
    const stranger = await context.newPage();
    await makeHostile(stranger, { join: { bigChunks: 6, neverClose: true, coordinator: swarmId } });
    await stranger.goto(wrongToken(joinUrl, appOrigin(baseURL)));
    try {
      // it dialed; its dial carries no proof of the token, so the dashboard closes it at once (since
      // issue 33: before, its channel opened and its chunks arrived), and no channel of it stays open
      await expect
        .poll(async () => (await hostileLog(stranger)).channels.length, { timeout: 20_000 })
        .toBeGreaterThan(0);
      await new Promise((r) => setTimeout(r, 1_000)); // any chunks it could send have arrived
      expect((await arrayBuffers()) - baseline).toBeLessThan(16 << 20);
      await expect
        .poll(
          async () => (await hostileLog(stranger)).channels.every((c) => c.openedAt === null || c.closedAt !== null),
          { timeout: UNPROVEN_KEPT_MS },
        )
        .toBe(true);
      expect(await workerCount()).toBe(3);
      // the honest job runs beside it as if it were not there
      expectUnattackedResult(await attackedJob({}));
    } finally {
      await stranger.close();
    }
  });

  /** what the #12 test left for the two after it to judge, once as long has passed */
  let strangers: { raw: RawPeer; dialedAt: number } | null = null;

  test('#12 a page that never proves the join token is let go by the dashboard within 10 s, wherever it came from; the honest job runs meanwhile', async ({
    baseURL,
  }) => {
    // a worker page with a wrong token that keeps its link open, and a page with only PeerJS that
    // dials the dashboard with join metadata (today's, and the token-in-metadata of old links).
    // Without the fix they were kept up to 18 s (a refused page's channel), or without end.
    const { joinUrl, swarmId } = await dashboard.evaluate(() => window.ditswarm.ready);
    const stranger = await context.newPage();
    await makeHostile(stranger, { join: { neverClose: true, coordinator: swarmId } });
    await stranger.goto(wrongToken(joinUrl, appOrigin(baseURL)));
    const raw = await openRawPeer(context, appOrigin(baseURL));
    await raw.dial(swarmId, { role: 'worker', nonce: '0'.repeat(32) });
    await raw.dial(swarmId, { role: 'worker', token: 'a-guess' });
    // for the two tests after this one: offers to the dashboard whose channel never opens, and
    // connections to the workers that say they are a rank of a job none of them is in
    const dialedAt = Date.now();
    for (let i = 0; i < 3; i++) await raw.offerOnly(swarmId, { role: 'worker', nonce: `${i}`.repeat(32) });
    for (const id of ids.honest)
      for (let i = 0; i < 3; i++) await raw.dial(id, { role: 'rank', session: `not-a-job-${i}`, rank: 0 });
    strangers = { raw, dialedAt };

    expectUnattackedResult(await attackedJob({}));

    // how long each was kept once its channel opened: the stranger's links and the raw dials. A dial
    // without a proof of the token is closed before its channel opens (issue 33), so most never open
    const links = async () => [
      ...(await hostileLog(stranger)).channels,
      ...(await raw.connections()).filter((c) => c.peer === swarmId),
    ];
    await expect.poll(async () => (await links()).length, { timeout: 20_000 }).toBeGreaterThanOrEqual(3);
    await expect
      .poll(async () => (await links()).every((c) => c.openedAt === null || c.closedAt !== null), { timeout: 30_000 })
      .toBe(true);
    for (const c of await links())
      if (c.openedAt !== null && c.closedAt !== null) expect(c.closedAt - c.openedAt).toBeLessThan(UNPROVEN_KEPT_MS);
    await stranger.close();
  });

  // The dashboard lets go an offer whose channel never opens after JOIN_STEP_TIMEOUT_MS (a worker
  // whose channel is slow dials through the relay too), and holds at most MAX_JOINING such pages.
  test('#12 …and the dashboard lets go within as long the offers of a page whose channel never opens', async () => {
    const { dialedAt } = defined(strangers, 'what the #12 test left');
    await new Promise((r) => setTimeout(r, Math.max(0, dialedAt + UNPROVEN_KEPT_MS - Date.now())));
    // the three, and any earlier dial whose offer came late
    const offered = await peerConnectionsSince(dashboard, dialedAt);
    expect(offered.length).toBeGreaterThanOrEqual(3);
    for (const c of offered) expect(c.closedAt).not.toBeNull();
  });

  // A worker page keeps a connection for a mesh it is not in for EARLY_CANDIDATE_MS (its rank's
  // initWorker may come after a peer's dial), and at most 16 of them.
  test('#12 …and a worker lets go connections that name a job it is not in within as long', async () => {
    const { raw, dialedAt } = defined(strangers, 'what the #12 test left');
    await new Promise((r) => setTimeout(r, Math.max(0, dialedAt + UNPROVEN_KEPT_MS - Date.now())));
    const toWorkers = (await raw.connections()).filter((c) => ids.honest.includes(c.peer));
    expect(toWorkers).toHaveLength(6);
    for (const c of toWorkers) expect(c.closedAt).not.toBeNull();
  });

  test('#15 the dashboard opened at localhost shares its link at the LAN address: a tab opened from it elsewhere joins', async ({
    browser,
    baseURL,
  }) => {
    // without the fix the link and its QR code pointed at localhost: useless on another machine
    const signaling = (await (await dashboard.request.get(`${appOrigin(baseURL)}/signaling.json`)).json()) as {
      lanOrigins: string[];
    };
    const lan = signaling.lanOrigins;
    test.skip(lan.length === 0, 'this machine has no LAN address to share');
    const { lanJoinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    expect(new URL(lanJoinUrl).origin).toBe(lan[0]);
    await expect(dashboard.locator('#join-link')).toHaveText(lanJoinUrl);
    // the QR code is that link's: its modules are those of the link's code
    const qr = qrcode(0, 'M');
    qr.addData(lanJoinUrl);
    qr.make();
    const modules = (svg: string) => /\bd="([^"]+)"/.exec(svg)?.[1];
    const shown = await dashboard.locator('#join-qr path').getAttribute('d');
    expect(
      shown !== null && shown === modules(qr.createSvgTag({ cellSize: 3, margin: 2, scalable: true })),
      'the QR code shown encodes the LAN link',
    ).toBe(true);
    // another machine's browser (its own profile) opens it at the LAN address and joins
    const elsewhere = await browser.newContext();
    try {
      const worker = await elsewhere.newPage();
      await worker.goto(lanJoinUrl);
      await expect.poll(workerCount, { timeout: 45_000 }).toBe(4);
      await expect(worker.locator('#state')).toHaveText(/idle|ready/);
    } finally {
      await elsewhere.close();
    }
  });
});

test.describe.serial('a dashboard and one worker tab', () => {
  let context: BrowserContext;
  let dashboard: Page;
  let worker: Page;
  let joinUrl: string;
  let swarmId: string;
  const workerCount = () => dashboard.evaluate(() => window.ditswarm.workerCount());

  /** Opens the dashboard of this context (the same identity after a reload or a reopen), watching its status line. */
  async function openDashboard(baseURL: string): Promise<Page> {
    const page = await context.newPage();
    await emulateStorageQuota(page);
    await page.addInitScript(() => {
      const seen: string[] = (window.__statuses = []);
      new MutationObserver(() => {
        const text = document.getElementById('status')?.textContent ?? '';
        if (seen.at(-1) !== text) seen.push(text);
      }).observe(document, { subtree: true, childList: true, characterData: true });
    });
    await page.goto(`${baseURL}/`);
    ({ joinUrl, swarmId } = await page.evaluate(() => window.ditswarm.ready));
    return page;
  }

  test.beforeAll(async ({ browser, baseURL }) => {
    test.setTimeout(90_000);
    context = await browser.newContext();
    dashboard = await openDashboard(appOrigin(baseURL));
    worker = await context.newPage();
    await worker.goto(joinUrl);
    await expect.poll(workerCount, { timeout: 60_000 }).toBe(1);
    unattacked ??= (await runJob(dashboard, { ...job, workers: 1 })).latent;
  });

  test.afterAll(async () => {
    await (context as BrowserContext | undefined)?.close(); // unset where beforeAll failed
  });

  test("#1 a page holding the dashboard's id once it closed learns nothing from the worker and is served nothing; the dashboard comes back under a fresh id, which its worker finds", async ({
    browser,
    baseURL,
  }) => {
    test.setTimeout(120_000);
    const secret = defined(new URLSearchParams(new URL(joinUrl).hash.slice(1)).get('token'), 'the join token');
    const origin = appOrigin(baseURL);
    const fetched: string[] = [];
    worker.on('request', (r) => fetched.push(r.url()));
    const attackerContext = await browser.newContext();
    try {
      // no peer discovery: the list of ids that told the attacker which one to take is gone, and the
      // server tells a dashboard's id to no page without the token
      const { key } = (await (await attackerContext.request.get(`${origin}/signaling.json`)).json()) as { key: string };
      for (const k of [key, 'any-key'])
        expect((await attackerContext.request.get(`${origin}/peerjs/${k}/peers`)).ok()).toBe(false);
      const room = secret.split('.')[0];
      expect(
        (
          await attackerContext.request.post(`${origin}/swarms/find`, {
            data: { room, peer: 'ditswarm-w-000000000000', proof: 'f'.repeat(64) },
          })
        ).status(),
      ).toBe(403);

      // the dashboard closes while its worker stays; the attacker registers its id. The server names
      // an id only while its dashboard's page holds it: the worker waits for its dashboard and never
      // dials the impostor (before, it redialled the id from its link and met the impostor, whose
      // challenge it refused: core/net/join.ts, join.test.ts)
      const closedId = swarmId;
      await dashboard.close();
      const impostor = await openRawPeer(attackerContext, origin, closedId);
      await expect(worker.locator('#detail')).toContainText('waiting for the dashboard', { timeout: 20_000 });
      await new Promise((r) => setTimeout(r, 5_000)); // two more rounds of its asking
      expect(await impostor.connections()).toEqual([]);
      expect(fetched.filter((url) => url.includes('evil.example'))).toEqual([]);

      // the real dashboard comes back under a fresh id while the impostor still holds the old one
      // (it used to reuse its id, and gave up while the impostor held it): the server sends its
      // worker there, and the job is the unattacked one
      dashboard = await openDashboard(origin);
      expect(swarmId).not.toBe(closedId);
      await expect.poll(workerCount, { timeout: 45_000 }).toBe(1);
      const run = await runJob(dashboard, { ...job, workers: 1 });
      expect(maxAbsDiff(run.latent, unattackedLatent())).toBeLessThanOrEqual(SAME_LATENT);
      await impostor.destroy();
    } finally {
      await attackerContext.close();
    }
  });

  /** the job that made room for itself, and the one too large to keep even alone */
  const storage: { madeRoom: number | null; tooLarge: number | null } = { madeRoom: null, tooLarge: null };

  test('#10 storage that refuses a write loses no work: the job is done in memory and in storage, older results make room, and a job that keeps ending its page is given up', async () => {
    // a browser whose storage holds half a video more than it holds now. Without the fix the final
    // write threw: the job was done in memory but running in storage, settled() (and so generate)
    // never resolved, no done event, and after a reload it ran again
    const generate = async (overrides: JobOverrides) => {
      const outcome = await dashboard.evaluate(
        (j) =>
          Promise.race([
            window.ditswarm
              .submit(j)
              .then((id) =>
                window.ditswarm.result(id).then((r) => ({ id, sha: r.report.latentSha256, video: r.video !== null })),
              ),
            new Promise<string>((r) => setTimeout(() => r('settled() did not resolve'), 30_000)),
          ]),
        { ...job, workers: 1, outputType: 'video', ...overrides } satisfies JobOverrides,
      );
      if (typeof outcome === 'string') throw new Error(outcome);
      return outcome;
    };
    const first = await generate({});
    const stored = () => dashboard.evaluate(() => window.__storedResultBytes);
    const firstBytes = (await stored())[first.id];
    expect(firstBytes).toBeGreaterThan(1_000); // its video and latent
    const total = Object.values(await stored()).reduce((a, b) => a + b, 0);
    await dashboard.evaluate((bytes) => (window.__quotaBytes = bytes), total + Math.round(firstBytes / 2));
    const statuses = () => dashboard.evaluate(() => window.__statuses);

    const second = await generate({ seed: 8 });
    expect(second).toMatchObject({ video: true });
    expect(await dashboard.evaluate(() => window.__refusedPuts)).toBeGreaterThan(0);
    expect(
      (await statuses()).some((s) => /was kept in this browser after removing the video and latent of job \d+/.test(s)),
    ).toBe(true);
    expect((await stored())[second.id]).toBeGreaterThan(1_000); // stored with its own
    storage.madeRoom = second.id;

    // a job that cannot be kept even alone: done in memory, stored without its video and latent, and
    // the page says to download it
    await dashboard.evaluate(() => (window.__quotaBytes = 1));
    const third = await generate({ seed: 9 });
    expect(third).toMatchObject({ video: true });
    expect((await statuses()).some((s) => /download the video before closing this page/.test(s))).toBe(true);
    storage.tooLarge = third.id;

    // after a reload every job is done in storage too, none runs again
    await dashboard.evaluate(() => (window.__quotaBytes = undefined));
    await dashboard.reload();
    await dashboard.evaluate(() => window.ditswarm.ready);
    const jobs = await dashboard.evaluate(() => window.ditswarm.jobs());
    expect(jobs.map((j) => j.id)).toContain(third.id);
    expect(jobs.map((j) => j.status)).toEqual(jobs.map(() => 'done'));
    const kept = await dashboard.evaluate(
      (id) => window.ditswarm.result(id).then((r) => r.report.latentSha256),
      third.id,
    );
    expect(kept).toBe(third.sha);

    // a job that ends its page before its first step, three times (here: reloads while it waits
    // for a second worker that never comes) is failed, not started a fourth time
    const waiting = await dashboard.evaluate((j) => window.ditswarm.submit(j), { ...job, workers: 2 });
    for (let start = 1; start <= 3; start++) {
      await expect
        .poll(() => dashboard.evaluate((id) => window.ditswarm.jobs().find((j) => j.id === id)?.status, waiting))
        .toBe('running');
      await dashboard.reload();
      await dashboard.evaluate(() => window.ditswarm.ready);
    }
    const given = await dashboard.evaluate((id) => window.ditswarm.jobs().find((j) => j.id === id), waiting);
    expect(given).toMatchObject({ status: 'failed', error: expect.stringMatching(/interrupted 3 times/) });
  });

  // Before the fix, the queue stripped the older jobs of their video and latent to make room for a
  // job that then did not fit even alone, and put them back; but a disk whose quota is below what
  // is already stored refuses them back. The browser's estimate now tells beforehand.
  test('#10 …and a job too large to keep costs no older job its video', async () => {
    expect(storage.madeRoom).not.toBeNull();
    const video = await dashboard.evaluate(
      (id) => window.ditswarm.result(id).then((r) => r.video !== null),
      defined(storage.madeRoom, 'the job that made room'),
    );
    expect(video).toBe(true);
  });
});

test('#11 a page of another site reads nothing of the server and opens no socket to it; a name the server does not own (DNS rebinding) is refused', async ({
  baseURL,
}) => {
  // a browser in which evil.example is this machine, as a rebinding attacker's DNS makes it, and
  // the attacker's page at evil.example (on a port of its own)
  const origin = appOrigin(baseURL);
  const port = new URL(origin).port;
  const site = http.createServer((_request, response) =>
    response.writeHead(200, { 'content-type': 'text/html' }).end('<title>evil</title>'),
  );
  await new Promise<void>((resolve) => site.listen(0, '127.0.0.1', resolve));
  const browser = await chromium.launch({
    executablePath: chromiumExecutable(),
    args: [...chromiumArgs, '--host-resolver-rules=MAP evil.example 127.0.0.1'],
  });
  try {
    const page = await browser.newPage();
    // rebinding: the server under a name it does not own. Without the fix: 200, and the key
    const { key } = (await (await fetch(`${origin}/signaling.json`)).json()) as { key: string };
    for (const path of ['/signaling.json', '/', '/worker.html']) {
      const response = await page.goto(`http://evil.example:${port}${path}`);
      expect(response?.status()).toBe(421);
      expect(await response?.text()).not.toContain(key);
    }
    // another site's page, with the key (as if it had leaked anyway): CORS and websockets for the
    // server's own origins only. Without the fix: the id read (any Origin reflected), both sockets opened
    await page.goto(`http://evil.example:${(site.address() as AddressInfo).port}/`);
    const seen = await page.evaluate(
      async ({ key, port }) => {
        const cors = await fetch(`http://localhost:${port}/peerjs/${key}/id`).then(
          (r) => `read ${r.status}`,
          (e: unknown) => `blocked: ${(e as Error).name}`,
        );
        const socket = (path: string) =>
          new Promise<string>((resolve) => {
            const ws = new WebSocket(`ws://localhost:${port}${path}`);
            ws.onopen = () => {
              resolve('opened');
              ws.close();
            };
            ws.onerror = () => resolve('refused');
            setTimeout(() => resolve('no answer'), 5_000);
          });
        return {
          cors,
          signaling: await socket(`/peerjs/peerjs?key=${key}&id=evil-${Date.now()}&token=t`),
          relay: await socket('/relay?peer=evil&auth=x&token=y&role=coordinator'),
        };
      },
      { key, port },
    );
    expect(seen).toEqual({ cors: 'blocked: TypeError', signaling: 'refused', relay: 'refused' });
  } finally {
    await browser.close();
    site.close();
  }
});

// Issue 33, findings 2 and 5: a liar in a browser of its own beside worker tabs of the dashboard's
// own browser (this machine's: trusted). Its lies about its peers convict it, not them; the ban
// holds when its page joins again under a new peer id (its browser's id is banned), and the page
// is told it was banned.
test.describe.serial('a liar in a browser of its own beside tabs of this machine', () => {
  let context: BrowserContext;
  let dashboard: Page;
  const honest: Page[] = [];
  const workerCount = () => dashboard.evaluate(() => window.ditswarm.workerCount());
  /** the job of finding 2: every forward of eight steps spot-checked, on two ranks */
  const checkedJob = { ...job, steps: 8, workers: 2, spotCheckRate: 1 } satisfies JobOverrides;
  const unattacked: { checked: Float32Array | null; plain: Float32Array | null } = { checked: null, plain: null };

  test.beforeAll(async ({ browser, baseURL }) => {
    test.setTimeout(120_000);
    context = await browser.newContext();
    dashboard = await context.newPage();
    // ranks waiting for a liar's tensors that never come name it within 4 s, not a minute
    await shortenExchangeTimeout(dashboard);
    await dashboard.goto(`${appOrigin(baseURL)}/`);
    await dashboard.evaluate(() => (window.__exchangeTimeoutMs = 4_000));
    const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    honest.push(await context.newPage());
    await honest[0].goto(joinUrl);
    await expect.poll(workerCount, { timeout: 60_000 }).toBe(1);
    unattacked.checked = (await runJob(dashboard, { ...checkedJob, workers: 1 })).latent;
    unattacked.plain = (await runJob(dashboard, { ...job, workers: 1 })).latent;
  });

  test.afterAll(async () => {
    await (context as BrowserContext | undefined)?.close();
  });

  /** A hostile worker page in a browser of its own (its own browser id), joined: the swarm counts `count`. */
  async function liarJoins(browser: Browser, count: number): Promise<{ page: Page; own: BrowserContext }> {
    const own = await browser.newContext();
    const page = await own.newPage();
    await makeHostile(page);
    await page.goto((await dashboard.evaluate(() => window.ditswarm.ready)).joinUrl);
    await expect.poll(workerCount, { timeout: 60_000 }).toBe(count);
    return { page, own };
  }

  /** One more tab of this machine joins as an honest worker: the swarm then counts `count`. */
  async function honestJoins(count: number): Promise<void> {
    const page = await context.newPage();
    honest.push(page);
    await page.goto((await dashboard.evaluate(() => window.ditswarm.ready)).joinUrl);
    await expect.poll(workerCount, { timeout: 60_000 }).toBe(count);
  }

  /** What each honest tab's page has been through so far (expectHonestKept's `before`). */
  const honestHistories = () =>
    Promise.all(honest.map((page) => page.evaluate(() => [...window.ditswarmWorkerHistory])));

  /** The liar was banned and its page told so, and a reload (a new peer id, the same browser) is refused too. */
  async function expectBanned(liar: Page): Promise<void> {
    await expect(liar.locator('#state')).toHaveText('refused', { timeout: 20_000 });
    await expect(liar.locator('#detail')).toContainText('banned from this swarm for lying');
    const before = await workerId(liar);
    await liar.reload();
    await expect(liar.locator('#state')).toHaveText('refused', { timeout: 30_000 });
    await expect(liar.locator('#detail')).toContainText('banned from this swarm for lying');
    expect(await workerId(liar)).not.toBe(before);
  }

  /** No honest tab was let go (lost its dashboard) or refused since `before` (their histories then). */
  async function expectHonestKept(before: string[][]): Promise<void> {
    const after = await Promise.all(honest.map((page) => page.evaluate(() => [...window.ditswarmWorkerHistory])));
    after.forEach((history, i) =>
      expect(history.slice(before[i].length).filter((s) => /lost the dashboard|refused/.test(s))).toEqual([]),
    );
    for (const page of honest) await expect(page.locator('#state')).not.toHaveText('refused');
  }

  test('#2 a liar picked to recompute a spot check between two ranks moves the other rank’s rows: the liar is banned, the honest rank of this machine finishes the job', async ({
    browser,
  }) => {
    // before: both were convicted, only the honest rank was banned (its page told only that the
    // dashboard did not answer the join handshake), and the liar rejoined and ran the job alone
    test.setTimeout(180_000);
    const { page: liar, own } = await liarJoins(browser, 2);
    try {
      const before = await honestHistories();
      const liarId = await workerId(liar);
      await setRules(liar, { recompute: { by: 1 } });
      const run = await runJob(dashboard, checkedJob);
      const log = await hostileLog(liar);
      // picked as the checker at least once in sixteen checks (each a coin toss between the two)
      expect(log.recomputesTampered).toBeGreaterThanOrEqual(1);
      const caught = run.report.spotChecks.filter((c) => c.verdict !== 'agreed');
      expect(caught.length).toBe(1);
      expect(run.report.failures.flatMap((f) => f.lost.map((l) => l.worker))).toEqual([liarId]);
      expect(run.report.steps.map((s) => s.step)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
      expect(maxAbsDiff(run.latent, defined(unattacked.checked, 'the unattacked latent'))).toBeLessThanOrEqual(
        SAME_LATENT,
      );
      await expectBanned(liar);
      await expectHonestKept(before);
      expect(await workerCount()).toBe(1);
    } finally {
      await own.close();
    }
  });

  test('#5 a liar blaming an honest rank of this machine as data is banned; no honest rank is let go, and the ban holds when its page joins again', async ({
    browser,
  }) => {
    // before: the liar and one honest rank were let go (3 → 1 ranks), and the liar was back within 6 s
    test.setTimeout(180_000);
    await honestJoins(2);
    const { page: liar, own } = await liarJoins(browser, 3);
    try {
      const before = await honestHistories();
      const liarId = await workerId(liar);
      await setRules(liar, {
        rows: {
          from: 0,
          make: 'error',
          error: 'a peer misbehaved',
          blame: { rank: 'next', cause: 'misbehaved', evidence: 'sent NaN' },
        },
      });
      const run = await runJob(dashboard, { ...job, workers: 3 });
      expect((await hostileLog(liar)).rowsTampered).toBeGreaterThanOrEqual(1);
      expect(run.report.failures.flatMap((f) => f.lost.map((l) => l.worker))).toEqual([liarId]);
      expect(run.report.failures[0].lost[0].evidence).toMatch(/its word was against a trusted worker/);
      expect(run.report.failures[0].degreeAfter).toBe(2);
      expect(maxAbsDiff(run.latent, defined(unattacked.plain, 'the unattacked latent'))).toBeLessThanOrEqual(
        SAME_LATENT,
      );
      await expectBanned(liar);
      await expectHonestKept(before);
      expect(await workerCount()).toBe(2);
    } finally {
      await own.close();
    }
  });

  test('a liar holding a pipeline stage, its tokens (or rows) moved within every bound, is convicted by a spot check of its stage that a tab holding the stage recomputes; the job ends on the honest tabs with the unattacked latent', async ({
    browser,
  }) => {
    // before: pipeline stages were never spot-checked, so what a stage handed on went into the video as sent
    test.setTimeout(240_000);
    await honestJoins(3);
    const { page: liar, own } = await liarJoins(browser, 4);
    try {
      const before = await honestHistories();
      const liarId = await workerId(liar);
      await setRules(liar, { rows: { from: 0, step: 1, make: 'shift', by: 1 } });
      // two stages of two Ulysses tabs: each stage's blocks held by two tabs, the liar and an honest one
      const run = await runJob(dashboard, { ...job, workers: 2, stages: 2, spotCheckRate: 1 });
      expect((await hostileLog(liar)).rowsTampered).toBeGreaterThanOrEqual(1);
      expect(run.report.failures.flatMap((f) => f.lost.map((l) => l.worker))).toEqual([liarId]);
      const [conviction] = run.report.spotChecks.filter((c) => c.verdict !== 'agreed');
      expect(conviction.stage).toBeDefined();
      expect((conviction.verdict as { why: string }).why).toMatch(
        /its (outputs of pipeline stage 1|rows of the pass) differ from a recomputation/,
      );
      console.log(`staged liar: ${(conviction.verdict as { why: string }).why}`);
      expect(maxAbsDiff(run.latent, defined(unattacked.plain, 'the unattacked latent'))).toBeLessThanOrEqual(
        SAME_LATENT,
      );
      await expectBanned(liar);
      await expectHonestKept(before);
      expect(await workerCount()).toBe(3);
    } finally {
      await own.close();
    }
  });
});

/** The join link with a token of the swarm's room under a made-up seal: well-formed, not the swarm's. */
function wrongToken(joinUrl: string, baseURL: string): string {
  const url = new URL(joinUrl, baseURL);
  const room = defined(new URLSearchParams(url.hash.slice(1)).get('token'), 'the join token').split('.')[0];
  url.hash = `token=${room}.${'0'.repeat(32)}`;
  return url.href;
}

// #5 (one slow relay receiver stalled all of a sender's relayed links) is not played here: the
// relay paused a sender only once more than 16 MiB were queued for one receiver, and an honest
// Link keeps at most 4 MiB in flight per connection (a blocked page's socket absorbs about 4 MiB
// more), so only five or more honest senders each with more than 4 MiB in flight to one rank
// (a job of ~50k tokens on this model) could reach it: no e2e job here can fail on the old relay.
// test/unit/relay.test.ts plays it against the relay's sockets.

declare global {
  interface Window {
    /** every text the dashboard's status line showed, in order (openDashboard's observer) */
    __statuses: string[];
    /** an allocation of 64 MiB, to show the heap measure sees one */
    __probe?: Uint8Array;
  }
}
