import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { chromiumArgs, chromiumExecutable } from '../chromium.ts';
import type { IceTransportPolicy, RelayMode } from '../../core/net/peer-link.ts';
import type { TurnServer } from '../turn-credentials.ts';
import { JOB_DATABASE } from '../../coordinator/job-store.ts';
import { PRELOAD_LARGE_ONLY } from '../../coordinator/preload.ts';
import { startServer, type RunningServer } from '../serve.ts';

/**
 * A whole ditswarm on this machine, for the command line and benchmarks: the server, headless
 * Chromium, one dashboard page and N worker pages joined to it, and K worker processes (`npm run worker`).
 */
export interface LocalSwarm {
  server: RunningServer;
  browserVersion: string;
  dashboard: Page;
  workers: Page[];
  nodeWorkers: ChildProcess[];
  addWorker(): Promise<Page>;
  close(): Promise<void>;
}

export interface LocalSwarmOptions {
  /** worker tabs */
  workers?: number;
  /** worker processes, each on `nodeThreads` threads (1 unless told) */
  nodeWorkers?: number;
  nodeThreads?: number;
  port?: number;
  relay?: RelayMode;
  /** a TURN server the server gives its pages credentials for, and whether every link must use it */
  turn?: TurnServer;
  iceTransportPolicy?: IceTransportPolicy;
  modelFolders?: Record<string, string>;
  /** the model the dashboard's form starts with, which joining workers preload (the demo model without it) */
  defaultModel?: string;
  /** the smallest model joining workers preload: PRELOAD_LARGE_ONLY unless given, as the jobs here are the caller's */
  preloadFromBytes?: number;
  loraFiles?: Record<string, string>;
  /**
   * The browser's profile: where its worker tabs keep the weights they fetched (rank/weight-cache.ts)
   * and the dashboard its encoded prompts, so that the next run with the same profile and port (the
   * browser keeps them per origin) finds them. Without it, or while another run holds it, a new
   * profile that is deleted at close.
   */
  profileDir?: string;
  /** Chromium flags beyond chromiumArgs (a benchmark's) */
  browserArgs?: string[];
  log?: (line: string) => void;
}

export async function startLocalSwarm({
  workers = 0,
  nodeWorkers = 0,
  nodeThreads = 1,
  port = 0,
  relay = 'fallback',
  turn,
  iceTransportPolicy,
  modelFolders,
  defaultModel,
  preloadFromBytes = PRELOAD_LARGE_ONLY,
  loraFiles,
  profileDir,
  browserArgs = [],
  log = () => {},
}: LocalSwarmOptions = {}): Promise<LocalSwarm> {
  const server = await startServer({
    port,
    quiet: true,
    relay,
    turn,
    iceTransportPolicy,
    modelFolders,
    defaultModel,
    preloadFromBytes,
    loraFiles,
  });
  const { context, kept, close: closeBrowser } = await launchBrowser(profileDir, log, browserArgs);
  const processes: ChildProcess[] = [];
  const closeProcesses = () => Promise.all(processes.map(stopProcess));
  try {
    const dashboard = await context.newPage();
    if (kept) await forgetDashboardJobs(dashboard, server.url);
    const forward = (page: Page, who: string) =>
      page.on('console', (m) => (m.type() === 'error' || m.type() === 'warning') && log(`[${who}] ${m.text()}`));
    forward(dashboard, 'dashboard');
    await dashboard.goto(`${server.url}/`);
    const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    const pages: Page[] = [];
    const addWorker = async () => {
      const page = await context.newPage();
      forward(page, `worker ${pages.length}`);
      await page.goto(joinUrl);
      pages.push(page);
      return page;
    };
    for (let i = 0; i < workers; i++) await addWorker();
    for (let i = 0; i < nodeWorkers; i++)
      processes.push(startNodeWorker(joinUrl, nodeThreads, `node worker ${i}`, log));
    if (workers + nodeWorkers)
      await dashboard.waitForFunction((n) => window.ditswarm.workerCount() >= n, workers + nodeWorkers, {
        timeout: 60_000,
      });
    return {
      server,
      browserVersion: context.browser()?.version() ?? 'unknown',
      dashboard,
      workers: pages,
      nodeWorkers: processes,
      addWorker,
      async close() {
        await closeProcesses();
        await closeBrowser();
        await server.close();
      },
    };
  } catch (e) {
    await closeProcesses();
    await closeBrowser();
    await server.close();
    throw e;
  }
}

/** `npm run worker -- LINK` on `threads` threads with `flags`, its lines to `log` under `who`. */
export function startNodeWorker(
  link: string,
  threads: number,
  who: string,
  log: (line: string) => void,
  flags: string[] = [],
  env: NodeJS.ProcessEnv = {},
): ChildProcess {
  // a URL of this form is what the package's build (build-lib.ts) points at its built JavaScript
  const main = fileURLToPath(new URL('../../worker/node/main.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', main, link, '--threads', String(threads), ...flags], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  });
  for (const stream of [child.stdout, child.stderr])
    stream.on('data', (data: Buffer) => {
      for (const line of data.toString().split('\n')) if (line) log(`[${who}] ${line}`);
    });
  return child;
}

/** Ends a worker process as its user would (SIGTERM: it leaves the swarm), or kills it if it does not end. */
async function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const ended = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
  await ended;
  clearTimeout(timer);
}

/** Chromium on a profile of its own: `profileDir` if no other browser has it open, else a new one gone at close. */
export async function launchBrowser(
  profileDir: string | undefined,
  log: (line: string) => void,
  browserArgs: readonly string[] = [],
): Promise<{ context: BrowserContext; kept: boolean; close: () => Promise<void> }> {
  const launch = (dir: string) =>
    chromium.launchPersistentContext(dir, {
      executablePath: chromiumExecutable(),
      args: [...chromiumArgs, ...browserArgs],
    });
  if (profileDir) {
    try {
      const context = await launch(profileDir);
      return { context, kept: true, close: () => context.close() };
    } catch (e) {
      log(
        `the browser profile ${profileDir} could not be opened (another run may have it), ` +
          `so this run keeps no weights for the next: ${(e as Error).message.split('\n')[0]}`,
      );
    }
  }
  const dir = mkdtempSync(join(tmpdir(), 'ditswarm-browser-'));
  const context = await launch(dir);
  return {
    context,
    kept: false,
    close: async () => {
      await context.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Deletes the job queue a dashboard of `serverUrl` kept in this browser's profile. A kept profile keeps the weights
 * and encoded prompts for the next run, not the last run's jobs: a dashboard restores its queue at start, and the
 * last run's would run before this one's. Leaves `page` on a page of the origin, not the dashboard.
 */
export async function forgetDashboardJobs(page: Page, serverUrl: string): Promise<void> {
  await page.goto(`${serverUrl}/models.json`);
  await page.evaluate(
    (name) =>
      new Promise((done) =>
        Object.assign(indexedDB.deleteDatabase(name), { onsuccess: done, onerror: done, onblocked: done }),
      ),
    JOB_DATABASE,
  );
}

/** What a page's own error said, from Playwright's wrapping of it: its first line, as the page worded it. */
export function pageError(e: unknown): string {
  const message = (typeof e === 'object' && e !== null && 'message' in e ? e.message : undefined) ?? e;
  return String(message)
    .replace(/^page\.evaluate: (Error: )?/, '')
    .split('\n')[0];
}
