// Machines of their own on this one: each worker tab in a Chromium of its own, pinned to a core
// (taskset) and given a share of it by the kernel's CPU bandwidth control (a cgroup's CFS quota:
// what a container or a cloud VM's vCPU share is), its pages told they have one core, as a
// one-core machine's would. DevTools CPU throttling does not reach a page's Web Workers, where
// onnxruntime computes, and tabs of one browser slow each other as no two machines do. The
// dashboard has a Chromium of its own, unlimited. Used by bench uneven (tabs of unequal speed) and
// bench slow-link (equal machines over a paced LAN).
//
// Needs a writable cpu cgroup (root; cgroup v1's cpu controller or v2's cpu.max).

import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from '@playwright/test';
import { chromiumArgs, chromiumExecutable } from '../server/chromium.ts';
import { startServer } from '../server/serve.ts';
import { serveBenchPages, type BenchModel } from './lib.ts';

/** the CFS period: short, so a tab out of its quota waits at most a few ms to answer a peer (unless a bench sets it) */
export const PERIOD_US = 10_000;
/** the kernel refuses a CFS quota under 1 ms */
const MIN_QUOTA_US = 1_000;

export interface Machine {
  name: string;
  /** the core its Chromium is pinned to */
  core: number;
  /** of that core */
  share: number;
}

export interface Machines {
  dashboard: Page;
  browserVersion: string;
  close(): Promise<void>;
}

/** A cpu cgroup holding `share` of one core, as cgroup v1 or v2 offers it; its directory. */
function cpuGroup(name: string, share: number, periodUs: number): string {
  const v1 = '/sys/fs/cgroup/cpu';
  const v2 = '/sys/fs/cgroup';
  const quota = String(Math.round(share * periodUs));
  if (Number(quota) < MIN_QUOTA_US)
    throw new Error(
      `${share} of a core in a ${periodUs / 1000} ms period is a quota of ${Number(quota) / 1000} ms, ` +
        `under the kernel's least (${MIN_QUOTA_US / 1000} ms): take a longer period or a larger share`,
    );
  if (existsSync(join(v1, 'cpu.cfs_quota_us'))) {
    const dir = join(v1, name);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'cpu.cfs_period_us'), String(periodUs));
    writeFileSync(join(dir, 'cpu.cfs_quota_us'), quota);
    return dir;
  }
  if (
    existsSync(join(v2, 'cgroup.controllers')) &&
    readFileSync(join(v2, 'cgroup.controllers'), 'utf8').includes('cpu')
  ) {
    writeFileSync(join(v2, 'cgroup.subtree_control'), '+cpu');
    const dir = join(v2, name);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'cpu.max'), `${quota} ${periodUs}`);
    return dir;
  }
  throw new Error(
    'emulated machines take their CPU shares from a cpu cgroup, and this machine has none writable: ' +
      'run the bench as root where cgroup v1 (cpu) or v2 (cpu.max) is mounted',
  );
}

/**
 * A Chromium pinned to `core` and, with `group`, inside that cpu cgroup (every process it starts
 * inherits both), its pages told they have one core.
 */
async function pinnedBrowser(name: string, core: number, group: string | null, dir: string): Promise<BrowserContext> {
  const wrapper = join(dir, `chromium-${name}.sh`);
  const enter = group ? `echo $$ > ${join(group, 'cgroup.procs')}\n` : '';
  writeFileSync(wrapper, `#!/bin/sh\n${enter}exec taskset -c ${core} ${chromiumExecutable()} "$@"\n`);
  chmodSync(wrapper, 0o755);
  const context = await chromium.launchPersistentContext(join(dir, `profile-${name}`), {
    executablePath: wrapper,
    args: [...chromiumArgs],
  });
  await context.addInitScript(() =>
    Object.defineProperty(Navigator.prototype, 'hardwareConcurrency', { get: () => 1 }),
  );
  return context;
}

/**
 * The server, a dashboard on `dashboardCore` and one worker tab on each machine, joined in order
 * (rank order, and a job on fewer workers takes the first), every page served `model`.
 */
export async function startMachines(
  machines: Machine[],
  { model, dashboardCore = 0, periodUs = PERIOD_US }: { model: BenchModel; dashboardCore?: number; periodUs?: number },
): Promise<Machines> {
  const dir = mkdtempSync(join(tmpdir(), 'ditswarm-machines-'));
  const server = await startServer({ port: 0, quiet: true, modelFolders: model.modelFolders });
  const groups: string[] = [];
  const contexts: BrowserContext[] = [];
  const close = async () => {
    for (const c of contexts) await c.close().catch(() => {});
    for (const group of groups) {
      try {
        rmdirSync(group); // empty once its browser is gone
      } catch (e) {
        console.warn(`could not remove the cgroup ${group}: ${(e as Error).message}`);
      }
    }
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const dashboardBrowser = await pinnedBrowser('dashboard', dashboardCore, null, dir);
    contexts.push(dashboardBrowser);
    for (const m of machines) {
      const group = cpuGroup(`ditswarm-bench-${m.name}`, m.share, periodUs);
      groups.push(group);
      contexts.push(await pinnedBrowser(m.name, m.core, group, dir));
      // the wrapper's write into the group does not stop the browser if it fails: see that it did not
      if (!readFileSync(join(group, 'cgroup.procs'), 'utf8').trim())
        throw new Error(
          `the ${m.name} tab's Chromium is not in its cpu cgroup ${group}: this machine does not let it be limited`,
        );
    }
    for (const context of contexts) await serveBenchPages(context);
    const dashboard = await dashboardBrowser.newPage();
    await dashboard.goto(`${server.url}/`);
    const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    for (const [i, context] of contexts.slice(1).entries()) {
      await (await context.newPage()).goto(joinUrl);
      await dashboard.waitForFunction((n) => window.ditswarm.workerCount() >= n, i + 1, { timeout: 60_000 });
    }
    return { dashboard, browserVersion: dashboardBrowser.browser()?.version() ?? 'unknown', close };
  } catch (e) {
    await close();
    throw e;
  }
}
