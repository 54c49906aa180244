import { chromium, type Browser, type Page } from '@playwright/test';
import { chromiumArgs, chromiumExecutable } from '../chromium.ts';
import type { RelayMode } from '../../core/net/peer-link.ts';
import { startServer, type RunningServer } from '../serve.ts';

/**
 * A whole ditswarm on this machine, for the command line and benchmarks: the server, headless
 * Chromium, one dashboard page and N worker pages joined to it.
 */
export interface LocalSwarm {
  server: RunningServer;
  browser: Browser;
  dashboard: Page;
  workers: Page[];
  addWorker(): Promise<Page>;
  close(): Promise<void>;
}

export async function startLocalSwarm({ workers = 0, port = 0, relay = 'fallback' as RelayMode, modelFolders = {} as Record<string, string> | undefined, log = (_: string) => {} } = {}): Promise<LocalSwarm> {
  const server = await startServer({ port, quiet: true, relay, modelFolders });
  const browser = await chromium.launch({ executablePath: chromiumExecutable(), args: [...chromiumArgs] });
  try {
    const context = await browser.newContext();
    const dashboard = await context.newPage();
    const forward = (page: Page, who: string) =>
      page.on('console', (m) => (m.type() === 'error' || m.type() === 'warning') && log(`[${who}] ${m.text()}`));
    forward(dashboard, 'dashboard');
    await dashboard.goto(`${server.url}/`);
    const { joinUrl } = await dashboard.evaluate(() => (window as any).ditswarm.ready);
    const pages: Page[] = [];
    const addWorker = async () => {
      const page = await context.newPage();
      forward(page, `worker ${pages.length}`);
      await page.goto(joinUrl);
      pages.push(page);
      return page;
    };
    for (let i = 0; i < workers; i++) await addWorker();
    if (workers) await dashboard.waitForFunction((n) => (window as any).ditswarm.workerCount() >= n, workers, { timeout: 60_000 });
    return {
      server,
      browser,
      dashboard,
      workers: pages,
      addWorker,
      async close() {
        await browser.close();
        await server.close();
      },
    };
  } catch (e) {
    await browser.close();
    await server.close();
    throw e;
  }
}
