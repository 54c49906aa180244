import { expect, test, type Browser, type BrowserContext, type Page } from '@playwright/test';
import type { JobOverrides } from '../../app/automation.ts';
import { defined } from '../../core/defined.ts';
import { hostileLog, makeHostile, setRules, type HostileLog, type HostileRules } from './hostile/wire.ts';
import { appOrigin, maxAbsDiff, runJob, TEST_MODEL, workerId } from './swarm-page.ts';

// Issue 33's attacks on what a job computes, replayed across placements: huge finite activations
// sent to the liar's peers (#1), tensors nudged within their bounds (their signatures then do not
// match: core/net/signing.ts), attention outputs halved within them and signed again with the liar's
// own key (its receipts convict it: float32 alone), and a lie on the last step's forward alone (#4), each on 2, 3 and
// 4 ranks of Ulysses over float32 and int8, and of displaced mode over float32 and int4. Every
// case ends with the honest latent (within its exchange's tolerance of the unattacked run), the
// liar banned (its page told so), and no honest worker let go or refused; and the liar's page
// really rewrote what it sent (its wire counts it).
// The honest workers are tabs of the dashboard's browser (this machine's: trusted); each liar is a
// page in a browser context of its own, a fresh one per case, since a ban covers its browser.
// The swarm holds exactly the job's ranks (the planner places the fastest first, so a liar among
// more workers might be left out): the cases run from 4 ranks down, closing an honest tab between.
// CI runs a cut of the matrix, one case per exchange (the attacks alternating, the rank counts moving along the
// diagonal: LIAR_CASES); DITSWARM_FULL_HOSTILE=1 runs all 39 cases.

const STEPS = 4;
/** the job every case runs: a few tokens, a few steps, the default spot-check rate */
const job = {
  prompt: 'a red ball',
  frames: 5,
  height: 32,
  width: 32,
  steps: STEPS,
  guidance: 1,
  seed: 7,
  backend: 'swarm',
  ep: 'wasm',
  outputType: 'latent',
  model: TEST_MODEL,
  shares: 'even',
} satisfies JobOverrides;

interface Exchange {
  name: string;
  placement: Pick<JobOverrides, 'parallel' | 'dtype' | 'warmupSteps'>;
  /**
   * How far a job that lost a rank midway may be from the unattacked job on the ranks it finished
   * on, at a latent's `scale`: its first steps ran on a rank more, whose exchange rounded (or went
   * stale) otherwise. float32: rounding (survival.spec.ts); int8: test/unit/ulysses.test.ts's bound;
   * displaced: displaced.spec.ts's.
   */
  midJobTolerance: (scale: number) => number;
}

/** the same job on different degrees gives the same latent: float32 rounding apart */
const SAME_LATENT = 1e-4;
const EXCHANGES: Exchange[] = [
  { name: 'float32', placement: { parallel: 'ulysses', dtype: 'f32' }, midJobTolerance: () => SAME_LATENT },
  { name: 'int8', placement: { parallel: 'ulysses', dtype: 'i8' }, midJobTolerance: () => 3e-2 },
  {
    name: 'displaced float32',
    placement: { parallel: 'displaced', dtype: 'f32', warmupSteps: 1 },
    midJobTolerance: (scale) => 0.1 * scale,
  },
  {
    name: 'displaced int4',
    placement: { parallel: 'displaced', dtype: 'i4', warmupSteps: 1 },
    midJobTolerance: (scale) => 0.1 * scale,
  },
];

interface Attack {
  name: string;
  rules: HostileRules;
  /** how many times the liar's page rewrote what it sent */
  tampered: (log: HostileLog) => number;
  /** the evidence the liar was let go with */
  evidence: RegExp;
  /**
   * the step the job ran again from once the liar was caught (null: only the interrupted one), so
   * 0: the whole job ran on the ranks left, as the unattacked job on them does
   */
  rerunFromStep: number | null;
  /** the exchanges it is made for, by name; all where absent */
  exchanges?: string[];
}

const ATTACKS: Attack[] = [
  {
    name: "attention outputs halved within their bounds on the last step, signed with the liar's own key",
    rules: { mesh: { step: STEPS - 1, make: 'resign' } },
    tampered: (log) => log.tensorsPoisoned,
    evidence: /sent its peers block \d+'s attention output other than its group's recomputed exchanges give/,
    rerunFromStep: 0,
    // its receipts are exact only where ranks compute alike; the wire rewrites float32 values alone
    exchanges: ['float32'],
  },
  {
    name: 'huge finite activations from step 3 (#1)',
    rules: { mesh: { step: 2, make: 'huge' } },
    tampered: (log) => log.tensorsPoisoned,
    evidence: /beyond the \S+ its layer can produce/,
    rerunFromStep: null,
  },
  {
    name: 'tensors nudged within their bounds from step 3, their signatures left as they were',
    rules: { mesh: { step: 2, make: 'nudge' } },
    tampered: (log) => log.tensorsPoisoned,
    evidence: /its signature does not match/,
    rerunFromStep: null,
  },
  {
    name: "a lie on the last step's forward alone (#4)",
    rules: { rows: { from: 0, step: STEPS - 1, make: 'shift', by: 1 } },
    tampered: (log) => log.rowsTampered,
    evidence: /spot check|differ from a recomputation/,
    rerunFromStep: 0,
  },
];

interface LiarCase {
  world: number;
  exchange: Exchange;
  attack: Attack;
}

const WORLDS = [4, 3, 2];
const FULL = process.env.DITSWARM_FULL_HOSTILE === '1';
/** every case when FULL; else each exchange once, the attacks taking turns, on a rank count that moves along */
const LIAR_CASES: LiarCase[] = WORLDS.flatMap((world, w) =>
  EXCHANGES.flatMap((exchange, e) =>
    ATTACKS.filter(
      (attack, a) =>
        (attack.exchanges ?? [exchange.name]).includes(exchange.name) &&
        (FULL || (a === e % ATTACKS.length && w === e % WORLDS.length)),
    ).map((attack) => ({
      world,
      exchange,
      attack,
    })),
  ),
);

test.describe('one liar among 1 to 3 honest tabs of this machine, on every exchange', () => {
  let context: BrowserContext;
  let dashboard: Page;
  const honest: Page[] = [];
  let joinUrl = '';
  /** the unattacked job's latent on honest tabs, by exchange and rank count */
  const unattacked = new Map<string, Float32Array>();
  const workerCount = () => dashboard.evaluate(() => window.ditswarm.workerCount());

  test.beforeAll(async ({ browser, baseURL }) => {
    test.setTimeout(180_000);
    context = await browser.newContext();
    dashboard = await context.newPage();
    await dashboard.goto(`${appOrigin(baseURL)}/`);
    joinUrl = (await dashboard.evaluate(() => window.ditswarm.ready)).joinUrl;
    await honestTabs(Math.max(...LIAR_CASES.map((c) => c.world)) - 1);
  });

  test.afterAll(async () => {
    await (context as BrowserContext | undefined)?.close(); // unset where beforeAll failed
  });

  /** Exactly `count` honest tabs in the swarm: extra ones closed, missing ones opened. */
  async function honestTabs(count: number): Promise<void> {
    while (honest.length > count) await defined(honest.pop(), 'an honest tab').close();
    while (honest.length < count) {
      const page = await context.newPage();
      await page.goto(joinUrl);
      honest.push(page);
    }
    await expect.poll(workerCount, { timeout: 60_000 }).toBe(count);
  }

  /** A hostile worker page in a browser context of its own, joined: the swarm counts `count`. */
  async function liarJoins(browser: Browser, count: number): Promise<{ liar: Page; own: BrowserContext }> {
    const own = await browser.newContext();
    const liar = await own.newPage();
    await makeHostile(liar);
    await liar.goto(joinUrl);
    await expect.poll(workerCount, { timeout: 60_000 }).toBe(count);
    return { liar, own };
  }

  /** The unattacked job over `exchange` on `world` honest tabs (all the swarm holds then), run once. */
  async function unattackedLatent(exchange: Exchange, world: number): Promise<Float32Array> {
    const key = `${exchange.name} on ${world}`;
    const known = unattacked.get(key);
    if (known) return known;
    const run = await runJob(dashboard, { ...job, ...exchange.placement, workers: world });
    expect(run.report.failures).toEqual([]);
    unattacked.set(key, run.latent);
    return run.latent;
  }

  const histories = () => Promise.all(honest.map((page) => page.evaluate(() => [...window.ditswarmWorkerHistory])));

  for (const { world, exchange, attack } of LIAR_CASES)
    test(`${attack.name} on ${world} ranks over ${exchange.name}: the liar is banned, no honest tab let go, the latent the unattacked one`, async ({
      browser,
    }) => {
      test.setTimeout(180_000);
      await honestTabs(world - 1);
      const started = Date.now();
      const { liar, own } = await liarJoins(browser, world);
      const joined = Date.now();
      try {
        const before = await histories();
        const liarId = await workerId(liar);
        await setRules(liar, attack.rules);
        const run = await runJob(dashboard, { ...job, ...exchange.placement, workers: world });
        const log = await hostileLog(liar);
        console.log(
          `joined in ${joined - started} ms, the job took ${Date.now() - joined} ms; ` +
            JSON.stringify(run.report.failures.map((f) => ({ step: f.step, lost: f.lost, after: f.degreeAfter }))) +
            `; receipts: ${JSON.stringify(run.report.spotChecks.flatMap((c) => c.receipts ?? []))}` +
            `; threads: ${run.report.workers.map((w) => w.threads).join('/')}`,
        );
        expect(log.world).toBe(world); // it was one of the job's ranks
        expect(attack.tampered(log)).toBeGreaterThanOrEqual(1);
        expect(run.report.placement.settings).toMatchObject({
          parallel: exchange.placement.parallel,
          dtype: exchange.placement.dtype,
        });

        const lost = run.report.failures.flatMap((f) => f.lost);
        expect(lost.map((l) => l.worker)).toEqual([liarId]);
        expect(lost[0].evidence).toMatch(attack.evidence);
        expect(run.report.failures.map((f) => [f.degreeAfter, f.rerunFromStep])).toEqual([
          [world - 1, attack.rerunFromStep],
        ]);
        expect(run.report.steps.map((s) => s.step)).toEqual([0, 1, 2, 3]);
        await expect(liar.locator('#state')).toHaveText('refused', { timeout: 20_000 });
        await expect(liar.locator('#detail')).toContainText('banned from this swarm for lying');
        const after = await histories();
        after.forEach((history, i) =>
          expect(history.slice(before[i].length).filter((s) => /lost the dashboard|refused/.test(s))).toEqual([]),
        );
        expect(await workerCount()).toBe(world - 1);

        // the honest video: the unattacked job on the honest tabs left
        const honestLatent = await unattackedLatent(exchange, world - 1);
        const scale = Math.max(...honestLatent.map(Math.abs));
        const tolerance = attack.rerunFromStep === 0 ? SAME_LATENT : exchange.midJobTolerance(scale);
        const deviation = maxAbsDiff(run.latent, honestLatent);
        console.log(
          `${attack.name}, ${world} ranks, ${exchange.name}: latent ${deviation.toExponential(2)} from the unattacked ` +
            `(tolerance ${tolerance.toExponential(1)})`,
        );
        expect(deviation).toBeLessThanOrEqual(tolerance);
      } finally {
        await own.close();
      }
    });
});
