import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, test, type Page } from '@playwright/test';
import WebSocket from 'ws';
import type { AutomationProgress, JobOverrides } from '../../app/automation.ts';
import { MAX_SILENT_MS } from '../../core/net/heartbeat.ts';
import { chromiumArgs, chromiumExecutable } from '../../server/chromium.ts';
import { appOrigin, maxAbsDiff, runJob, TEST_MODEL } from './swarm-page.ts';

// What a browser's own throttling does to worker tabs (issue 34): a tab sent to the background
// keeps computing, and a tab its browser freezes is placed elsewhere. The worker tabs run in a
// Chromium of their own, launched as a user's is (without the switches that turn background
// throttling off for the other tests) and driven over the DevTools protocol alone:
// Page.setWebLifecycleState 'frozen' hides and freezes a tab as Chrome does a background tab it
// freezes, and 'active' then leaves it hidden and running, as a background tab is. Playwright's own
// pages cannot be hidden so (its focus emulation keeps them awake and visible), hence the raw protocol.

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

/** what switches the other tests' browsers take to keep background tabs running, and a user's browser has not */
const UNTHROTTLED = [
  '--disable-background-timer-throttling',
  '--disable-renderer-backgrounding',
  '--disable-backgrounding-occluded-windows',
];

/** One tab of the worker browser, over its own DevTools socket. */
class Tab {
  private nextId = 1;
  private readonly waiting = new Map<number, (reply: { result?: unknown; error?: { message: string } }) => void>();
  private constructor(private readonly socket: WebSocket) {
    socket.on('message', (data: Buffer) => {
      const reply = JSON.parse(data.toString()) as { id?: number; result?: unknown; error?: { message: string } };
      if (reply.id !== undefined) this.waiting.get(reply.id)?.(reply);
    });
  }

  static async open(socketUrl: string): Promise<Tab> {
    const socket = new WebSocket(socketUrl);
    await new Promise((resolve, reject) => socket.once('open', resolve).once('error', reject));
    return new Tab(socket);
  }

  async send(method: string, params: object = {}): Promise<unknown> {
    const id = this.nextId++;
    const reply = await new Promise<{ result?: unknown; error?: { message: string } }>((resolve) => {
      this.waiting.set(id, resolve);
      this.socket.send(JSON.stringify({ id, method, params }));
    });
    this.waiting.delete(id);
    if (reply.error) throw new Error(`${method}: ${reply.error.message}`);
    return reply.result;
  }

  /** the value of `expression` in the page (JSON-serialisable) */
  async read<T>(expression: string): Promise<T> {
    const result = (await this.send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true })) as {
      result: { value: T };
    };
    return result.result.value;
  }

  close(): void {
    this.socket.close();
  }
}

/** A Chromium of the worker tabs, with its DevTools port. */
async function workerBrowser(): Promise<{ open(url: string): Promise<Tab>; close(): Promise<void> }> {
  const profile = mkdtempSync(join(tmpdir(), 'ditswarm-throttling-'));
  const args = chromiumArgs.filter((a) => !UNTHROTTLED.includes(a));
  const browser: ChildProcess = spawn(
    chromiumExecutable(),
    [...args, '--headless', '--remote-debugging-port=0', `--user-data-dir=${profile}`, 'about:blank'],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  const [port, browserSocket] = await new Promise<[string, string]>((resolve, reject) => {
    let said = '';
    browser.stderr?.on('data', (chunk: Buffer) => {
      said += chunk.toString();
      const found = /DevTools listening on (ws:\/\/[^:]+:(\d+)\/\S+)/.exec(said);
      if (found) resolve([found[2], found[1]]);
    });
    browser.once('exit', (code) => reject(new Error(`the worker browser exited (${code}): ${said.slice(-500)}`)));
  });
  const tabs: Tab[] = [];
  const control = await Tab.open(browserSocket);
  return {
    async open(url) {
      // each in a window of its own: a tab behind another in one window is hidden already
      const { targetId } = (await control.send('Target.createTarget', { url, newWindow: true })) as {
        targetId: string;
      };
      const tab = await Tab.open(`ws://127.0.0.1:${port}/devtools/page/${targetId}`);
      tabs.push(tab);
      return tab;
    },
    async close() {
      for (const tab of [...tabs, control]) tab.close();
      // its profile is free to go once the browser has exited (its last writes land as it exits)
      const exited = new Promise((resolve) => browser.once('exit', resolve));
      if (browser.exitCode === null && browser.signalCode === null) {
        browser.kill();
        await exited;
      }
      // its helper processes may outlive it a moment, writing: a profile left in the temp folder harms nothing
      try {
        rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 });
      } catch (e) {
        console.warn(`left the worker browser's profile ${profile}: ${(e as Error).message}`);
      }
    },
  };
}

/** A dashboard (a Playwright page) and `count` worker tabs of the worker browser, all joined. */
async function swarmOf(dashboard: Page, origin: string, count: number) {
  await dashboard.goto(`${origin}/`);
  const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
  const browser = await workerBrowser();
  const tabs: Tab[] = [];
  for (let i = 0; i < count; i++) tabs.push(await browser.open(joinUrl));
  await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 60_000 }).toBe(count);
  const peerOf = (tab: Tab) => tab.read<string | undefined>('window.ditswarmWorker?.peerId');
  // read once, before any job: mid-job a tab's page answers only between its computations, so
  // asking each tab then could outlast the job it is asked about
  const tabOfPeer = new Map<string | undefined, Tab>();
  for (const tab of tabs) tabOfPeer.set(await peerOf(tab), tab);
  /** the tab of rank `rank` of the job running now */
  const tabOfRank = async (rank: number) => {
    const ranks = await dashboard.evaluate(() => window.ditswarm.ranks());
    const tab = tabOfPeer.get(ranks[rank]);
    if (!tab) throw new Error(`no worker tab is rank ${rank} (ranks: ${ranks.join(', ')})`);
    return tab;
  };
  return { browser, tabs, peerOf, tabOfRank };
}

const visibility = (tab: Tab) => tab.read<string>('document.visibilityState');

test.describe('browsers throttle and freeze worker tabs (issue 34)', () => {
  test.setTimeout(300_000);

  test('a worker tab sent to the background keeps computing: the job is the one of the tabs in front, and no worker is let go', async ({
    page,
    baseURL,
  }) => {
    const swarm = await swarmOf(page, appOrigin(baseURL), 2);
    try {
      const inFront = await runJob(page, { ...job, workers: 2 });
      expect(await Promise.all(swarm.tabs.map(visibility))).toEqual(['visible', 'visible']);

      // its window minimized: hidden, and running as a background tab runs (not frozen: that is the next test)
      const background = swarm.tabs[1];
      const { windowId } = (await background.send('Browser.getWindowForTarget')) as { windowId: number };
      await background.send('Browser.setWindowBounds', { windowId, bounds: { windowState: 'minimized' } });
      expect(await visibility(background)).toBe('hidden');
      const stepsBefore = await background.read<number>('window.ditswarmWorker.totals.steps');

      const behind = await runJob(page, { ...job, workers: 2 });
      expect(await visibility(background)).toBe('hidden'); // it stayed in the background all along
      expect(await background.read<number>('window.ditswarmWorker.totals.steps')).toBeGreaterThan(stepsBefore);
      expect(behind.report.failures).toEqual([]);
      expect(behind.report.workers.map((w) => w.id).sort()).toEqual(
        (await Promise.all(swarm.tabs.map(swarm.peerOf))).sort(),
      );
      expect(maxAbsDiff(behind.latent, inFront.latent)).toBe(0);
      expect(await page.evaluate(() => window.ditswarm.workerCount())).toBe(2);
    } finally {
      await swarm.browser.close();
    }
  });

  test(`a worker tab its browser freezes mid-job is let go as frozen and its work placed on the others, within ${MAX_SILENT_MS / 1000} s; the job completes with the uninterrupted latent`, async ({
    page,
    baseURL,
  }) => {
    const swarm = await swarmOf(page, appOrigin(baseURL), 3);
    try {
      const uninterrupted = await runJob(page, { ...job, workers: 3 });
      const frozen: { tab?: Tab; at?: number; error?: string } = {};
      await page.exposeFunction('ditswarmProgress', async (p: AutomationProgress) => {
        if (!('step' in p) || p.step !== 2 || frozen.tab || frozen.error) return;
        try {
          const tab = await swarm.tabOfRank(1);
          frozen.at = Date.now();
          frozen.tab = tab;
          await tab.send('Page.setWebLifecycleState', { state: 'frozen' });
        } catch (e) {
          frozen.error = (e as Error).message; // the page does not await this callback: say it in the test
        }
      });
      const run = await runJob(page, { ...job, workers: 3 });
      const { tab, at = 0 } = frozen;
      expect(tab, `rank 1 was frozen at step 2 (${frozen.error ?? 'no step 2 came'})`).toBeDefined();

      const [failure] = run.report.failures;
      expect(failure).toMatchObject({ degreeBefore: 3, degreeAfter: 2 });
      expect(failure.lost.map((l) => [l.rank, l.cause])).toEqual([[1, 'disconnected']]);
      expect(failure.lost[0].evidence).toContain('its browser froze its page');
      const detectionMs = failure.detectedAt - at;
      console.log(`frozen: let go after ${detectionMs} ms (${failure.lost[0].evidence})`);
      expect(detectionMs).toBeLessThan(MAX_SILENT_MS);
      expect(maxAbsDiff(run.latent, uninterrupted.latent)).toBeLessThanOrEqual(1e-4);

      // the tab was frozen indeed: made active again, it says its browser froze it, and joins again
      if (tab) {
        await tab.send('Page.setWebLifecycleState', { state: 'active' });
        expect(await tab.read<string>("document.getElementById('background').textContent")).toContain('froze');
        await expect.poll(() => page.evaluate(() => window.ditswarm.workerCount()), { timeout: 60_000 }).toBe(3);
      }
    } finally {
      await swarm.browser.close();
    }
  });
});
