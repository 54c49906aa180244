// The video API's limits that need its real server (issue 64): its worker link revoked through POST /v1/swarm/revoke
// on the coordinator page in the server's own Chromium, a worker process of that link let go and stopped, the join
// links' secret kept in the data folder, and that folder its owner's alone.

import type { ChildProcess } from 'node:child_process';
import { existsSync, lstatSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, test } from '@playwright/test';
import { spawnApiServer } from '../../server/api/api-process.ts';
import type { SwarmState } from '../../server/api/coordinator-host.ts';
import { startNodeWorker } from '../../server/cli/browser-swarm.ts';
import { CI } from './swarm-page.ts';

/** Every file and folder under `dir` with its mode, links and sockets aside (a browser's lock is a link). */
function modes(dir: string): [string, number][] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    const stat = lstatSync(path);
    if (!stat.isFile() && !stat.isDirectory()) return [];
    return [[path, stat.mode & 0o777] as [string, number], ...(stat.isDirectory() ? modes(path) : [])];
  });
}

test(
  "the API's worker link revoked with the key: its worker process is let go and stops with exit 2, saying why; the API's page revokes it too; the link's secret and all the data are the owner's alone",
  CI,
  async ({ page }) => {
    test.setTimeout(240_000);
    const dataDir = mkdtempSync(join(tmpdir(), 'ditswarm-api-limits-'));
    const api = await spawnApiServer(dataDir, ['--local-workers', '0']);
    const lines: string[] = [];
    let worker: ChildProcess | undefined;
    try {
      // the join links' secret is the data folder's, not the user's cache
      expect(existsSync(join(dataDir, 'server', 'join-secret'))).toBe(true);

      const before = await api.json<SwarmState>('/v1/swarm');
      const child = startNodeWorker(before.joinUrl, 1, 'node worker', (line) => lines.push(line), [
        '--device',
        'wasm',
        '--cache',
        '',
      ]);
      worker = child;
      const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
      await expect
        .poll(async () => (await api.json<SwarmState>('/v1/swarm')).workers.length, {
          timeout: 90_000,
          message: `the worker process joined:\n${lines.join('\n')}`,
        })
        .toBe(1);

      expect((await fetch(`${api.url}/v1/swarm/revoke`, { method: 'POST' })).status).toBe(401);
      const revoked = await api.call('/v1/swarm/revoke', { method: 'POST' });
      expect(revoked.status).toBe(200);
      const after = (await revoked.json()) as SwarmState;
      expect(after.joinUrl).not.toBe(before.joinUrl);
      expect(new URL(after.joinUrl).origin).toBe(new URL(before.joinUrl).origin);

      // let go by the coordinator, refused by the server when it asks again: it stops, and says why (a process that
      // asked again every REFUSED_RETRY_MS for ever would still run)
      const stillRunning = new Promise((resolve) => setTimeout(() => resolve('still running'), 60_000));
      expect(await Promise.race([exited, stillRunning]), lines.join('\n')).toBe(2);
      expect(lines.join('\n')).toMatch(/the link was revoked/);
      expect(lines.join('\n')).toMatch(/Stopping: ask the dashboard for its worker link now/);
      expect((await api.json<SwarmState>('/v1/swarm')).workers).toEqual([]);

      // the API's page revokes it too, asking first as the dashboard does
      await page.goto(`${api.url}/api.html#key=${api.key}`);
      const shown = page.locator('#join-link');
      await expect(shown).toHaveText(after.lanJoinUrl || after.joinUrl);
      page.once('dialog', (dialog) => void dialog.accept());
      await page.locator('#revoke-link').click();
      await expect(page.locator('#swarm-events')).toHaveText('The old worker link is revoked: share the new one.');
      const third = await api.json<SwarmState>('/v1/swarm');
      expect(third.joinUrl).not.toBe(after.joinUrl);
      await expect(shown).toHaveText(third.lanJoinUrl || third.joinUrl);

      expect(lstatSync(dataDir).mode & 0o777).toBe(0o700);
      const written = modes(dataDir);
      expect(written.map(([path]) => path)).toEqual(
        expect.arrayContaining([join(dataDir, 'api-key'), join(dataDir, 'jobs.sqlite'), join(dataDir, 'server')]),
      );
      const open = written.filter(([, mode]) => mode & 0o077).map(([path, mode]) => `${path} ${mode.toString(8)}`);
      expect(open).toEqual([]);
    } finally {
      worker?.kill('SIGKILL');
      await api.stop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  },
);
