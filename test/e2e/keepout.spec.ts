// The join token in the worker page's address bar (issue 33, finding 7), on the real server and
// pages: an old `?token=` link is refused, and a `#token=` link's token leaves the address bar once
// the page has joined (a reload of the tab still joins).
import { expect, test } from '@playwright/test';
import { OLD_TOKEN_LINK } from '../../app/worker-link.ts';
import { CI, appOrigin, workerId } from './swarm-page.ts';

test(
  'a ?token= link is refused with the way to the #token= link; a #token= link joins, and its token leaves the address bar',
  CI,
  async ({ browser, baseURL }) => {
    const context = await browser.newContext();
    try {
      const dashboard = await context.newPage();
      await dashboard.goto(`${appOrigin(baseURL)}/`);
      const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
      const token = new URLSearchParams(new URL(joinUrl).hash.slice(1)).get('token') ?? '';
      expect(token).toMatch(/^[0-9a-f]{24}\.[0-9a-f]{32}$/);
      const workerCount = () => dashboard.evaluate(() => window.ditswarm.workerCount());

      // the old form: refused, told where to go, its token out of the address bar at once, nobody joined
      const old = await context.newPage();
      await old.goto(`${appOrigin(baseURL)}/worker.html?token=${encodeURIComponent(token)}`);
      await expect(old.locator('#state')).toHaveText('refused');
      await expect(old.locator('#detail')).toHaveText(OLD_TOKEN_LINK);
      expect(old.url()).not.toContain(token);

      const worker = await context.newPage();
      await worker.goto(joinUrl);
      await expect.poll(workerCount, { timeout: 60_000 }).toBe(1);
      await expect.poll(() => worker.url()).toBe(`${appOrigin(baseURL)}/worker.html`);
      expect(await old.evaluate(() => window.ditswarmWorker ?? null)).toBeNull(); // the refused page never joined

      // the tab keeps its token for a reload: it joins again (a new page, a new id)
      const before = await workerId(worker);
      await worker.reload();
      const connectedAs = () =>
        worker.evaluate(() => (window.ditswarmWorker?.connected ? window.ditswarmWorker.peerId : null));
      await expect.poll(connectedAs, { timeout: 60_000 }).toMatch(/^ditswarm-w-/);
      expect(await connectedAs()).not.toBe(before);
      expect(worker.url()).not.toContain(token);
    } finally {
      await context.close();
    }
  },
);
