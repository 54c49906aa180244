// The API's coordinator: the dashboard's own code in a headless Chromium page this server starts and supervises
// (a page that crashes or closes is opened again, and the job it was running is handed back to be run again),
// with `localWorkers` worker tabs beside it on this machine. Jobs go in through the dashboard's automation API
// (app/automation.ts), one at a time: the server's job queue (video-jobs.ts) decides which.

import type { BrowserContext, Page } from 'playwright-core';
import type { AutomationProgress, JobOverrides, JobResult, JoinLinks, WorkerSummary } from '../../app/automation.ts';
import { launchBrowser, pageError } from '../cli/browser-swarm.ts';

/** The swarm the API's jobs run on, as `GET /v1/swarm` shows it. */
export interface SwarmState extends JoinLinks {
  /** 'starting' until its page is up; 'restarting' after it crashed, until the new one is */
  coordinator: 'starting' | 'ready' | 'restarting';
  /** times its page was opened again after it crashed or closed */
  restarts: number;
  workers: WorkerSummary[];
}

/** The job's coordinator page went away while it ran: the job did not fail, and runs again on the next page. */
export class CoordinatorLost extends Error {
  override name = 'CoordinatorLost';
}

export interface RunHooks {
  onProgress: (progress: AutomationProgress) => void;
  signal: AbortSignal;
  /** the page's id for an earlier run of the job: where the page still holds it, the run goes on from its checkpoint */
  resume: number | null;
  /** the page's id for this run, once it has one: what a later run resumes */
  onPageJob: (pageJob: number) => void;
}

/** What runs the API's jobs: this host, or a stand-in in unit tests. */
export interface Coordinator {
  swarm(): Promise<SwarmState>;
  /** runs one job to its end; rejects with CoordinatorLost where its page went away, else with the job's error */
  run(overrides: JobOverrides, hooks: RunHooks): Promise<JobResult>;
  /**
   * Revokes the worker link (it went where it should not), as the dashboard's Revoke button does: the workers that
   * joined with it leave, and swarm() names the new one. Rejects, saying why, where the page could not.
   */
  revokeJoinLink(): Promise<void>;
}

export interface CoordinatorHost extends Coordinator {
  close(): Promise<void>;
}

export interface HostOptions {
  serverUrl: string;
  /** the browser's profile: the weights its worker tabs fetched, the swarm's identity (its join link) */
  profileDir: string;
  localWorkers: number;
  log: (line: string) => void;
}

/** how long after a page went away it is opened again: a page that crashes at once does not spin */
const REOPEN_AFTER_MS = 1000;

export async function hostCoordinator({
  serverUrl,
  profileDir,
  localWorkers,
  log,
}: HostOptions): Promise<CoordinatorHost> {
  const browser = await launchBrowser(profileDir, log);
  const { context } = browser;
  let closing = false;
  let restarts = 0;
  let state: SwarmState['coordinator'] = 'starting';
  let dashboard: Page | null = null;
  let links: JoinLinks = { joinUrl: '', lanJoinUrl: '' };
  /** the job on the page now: its progress goes to its listener, and its run fails when the page goes */
  let current: {
    pageJob: number | null;
    onProgress: (p: AutomationProgress) => void;
    lost: (e: Error) => void;
  } | null = null;

  const forward = (page: Page, who: string) =>
    page.on('console', (m) => (m.type() === 'error' || m.type() === 'warning') && log(`[${who}] ${m.text()}`));

  async function openDashboard(): Promise<void> {
    const page = await context.newPage();
    forward(page, 'coordinator');
    await page.exposeFunction('ditswarmProgress', (p: AutomationProgress) => {
      if (current && 'job' in p && p.job === current.pageJob) current.onProgress(p);
    });
    const gone = (why: string) => () => {
      if (closing || page !== dashboard) return;
      dashboard = null;
      state = 'restarting';
      restarts++;
      log(`api: the coordinator page ${why}; opening it again`);
      current?.lost(new CoordinatorLost(`the coordinator page ${why} while the job ran`));
      void page.close().catch(() => {});
      ready = reopen();
    };
    page.on('crash', gone('crashed'));
    page.on('close', gone('closed'));
    await page.goto(`${serverUrl}/index.html`); // `/` is the API's page (api.html) on an API server
    links = await page.evaluate(() =>
      window.ditswarm.ready.then(({ joinUrl, lanJoinUrl }) => ({ joinUrl, lanJoinUrl })),
    );
    dashboard = page;
    state = 'ready';
  }
  async function reopen(): Promise<void> {
    for (;;) {
      await new Promise((r) => setTimeout(r, REOPEN_AFTER_MS));
      if (closing) return;
      try {
        await openDashboard();
        return;
      } catch (e) {
        log(`api: could not open the coordinator page: ${pageError(e)}`);
      }
    }
  }
  /** this machine's worker tabs: a revoked link's are sent to the new one */
  const workerPages = new Set<Page>();
  let ready: Promise<void> = openDashboard();
  try {
    await ready;
    for (let i = 0; i < localWorkers; i++) await openWorker(context, links, i);
  } catch (e) {
    await browser.close();
    throw e;
  }

  /** A worker tab of this machine, opened again whenever it crashes or closes. */
  async function openWorker(context: BrowserContext, { joinUrl }: JoinLinks, n: number): Promise<void> {
    const page = await context.newPage();
    workerPages.add(page);
    forward(page, `worker ${n}`);
    const again = (why: string) => () => {
      workerPages.delete(page);
      if (closing) return;
      log(`api: local worker ${n} ${why}; opening it again`);
      void page.close().catch(() => {});
      setTimeout(
        () => void openWorker(context, links, n).catch((e: unknown) => log(`api: worker ${n}: ${pageError(e)}`)),
        REOPEN_AFTER_MS,
      );
    };
    page.on('crash', again('crashed'));
    page.on('close', again('closed'));
    await page.goto(joinUrl);
  }

  async function page(): Promise<Page> {
    for (;;) {
      await ready;
      if (dashboard) return dashboard;
    }
  }

  /**
   * The page's job for this run: the earlier run's, where the page still holds it (it goes on from its checkpoint,
   * or is already done), else a new one. The page holds no other job: the server's database holds the API's jobs,
   * and a page job it does not know of (submitted just before a kill wrote its id) would run before this one.
   */
  async function pageJobFor(on: Page, overrides: JobOverrides, resume: number | null): Promise<number> {
    const held = await on.evaluate(() => window.ditswarm.jobs().map(({ id, status }) => ({ id, status })));
    // a run the kill of the server failed (its browser closed its worker tabs as it went down) is run again, not
    // resumed: its failure is the kill's, not the job's
    const kept = held.find((j) => j.id === resume && j.status !== 'failed' && j.status !== 'cancelled')?.id;
    for (const { id } of held) if (id !== kept) await on.evaluate((job) => window.ditswarm.discard(job), id);
    if (resume !== null && kept === resume) {
      log(`api: resuming the coordinator page's job ${resume}`);
      return resume;
    }
    return on.evaluate((o) => window.ditswarm.submit(o), overrides);
  }

  return {
    async swarm() {
      const workers = dashboard ? await dashboard.evaluate(() => window.ditswarm.workers()).catch(() => []) : [];
      return { ...links, coordinator: state, restarts, workers };
    },
    async run(overrides, { onProgress, signal, resume, onPageJob }) {
      const on = await page();
      let lost: (e: Error) => void = () => {};
      const whenLost = new Promise<never>((_, reject) => (lost = reject));
      current = { pageJob: null, onProgress, lost };
      try {
        const id = await Promise.race([pageJobFor(on, overrides, resume), whenLost]);
        current.pageJob = id;
        onPageJob(id);
        const cancel = () => void on.evaluate((job) => window.ditswarm.cancel(job), id).catch(() => {});
        if (signal.aborted) cancel();
        signal.addEventListener('abort', cancel, { once: true });
        try {
          return await Promise.race([on.evaluate((job) => window.ditswarm.result(job), id), whenLost]);
        } finally {
          signal.removeEventListener('abort', cancel);
        }
      } catch (e) {
        if (e instanceof CoordinatorLost) throw e;
        // the page went while Playwright waited on it, before its crash event told us
        if (on.isClosed() || /Target crashed|has been closed|Execution context was destroyed/.test(String(e)))
          throw new CoordinatorLost(`the coordinator page went away while the job ran: ${pageError(e)}`, { cause: e });
        throw new Error(pageError(e), { cause: e });
      } finally {
        current = null;
      }
    },
    async revokeJoinLink() {
      const on = await page();
      const fresh = await on.evaluate(() => window.ditswarm.revokeJoinLink());
      if (!fresh) {
        const why = await on.evaluate(() => document.getElementById('swarm-events')?.textContent ?? '');
        throw new Error(why || 'the coordinator page could not revoke it');
      }
      links = fresh;
      log('api: the worker link was revoked; its workers left, and the new one is in GET /v1/swarm');
      for (const worker of workerPages)
        void worker.goto(fresh.joinUrl).catch((e: unknown) => log(`api: a local worker: ${pageError(e)}`));
    },
    async close() {
      closing = true;
      await browser.close();
    },
  };
}
