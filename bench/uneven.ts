// Three worker tabs of unequal speed (issue 18), each in a Chromium of its own given a share of one
// core by the kernel's CPU bandwidth control (a cgroup's CFS quota: what a container or a cloud VM's
// vCPU share is) and pinned to it: two tabs get `fastShare` of a core each, the third `slowShare`
// (0.75 and 0.4: the third measured 4.1× slower here, 8.4× at 0.25), and each browser sees one core. The dashboard has a
// Chromium of its own beside the first tab. (DevTools CPU throttling does not reach a page's Web
// Workers, where onnxruntime computes; busy processes beside a tab made its speed depend on who
// else was computing.) The same job on one tab, on the three with even shares, and on the three
// with shares by speed; each rank's compute time in the even run is its measured speed. Writes
// bench/out/uneven.json; `meets` says whether the figures hold.
//
//   npm run bench -- uneven [--fastShare 0.75 --slowShare 0.4 --frames 9 --height 256 --width 256 --steps 3]
//
// Needs a writable cpu cgroup (root; cgroup v1's cpu controller or v2's cpu.max).

import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium, type BrowserContext } from '@playwright/test';
import { latentShape } from '../core/job.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { chromiumArgs, chromiumExecutable } from '../server/chromium.ts';
import { startServer } from '../server/serve.ts';
import { DEFAULT_SPOT_CHECK_RATE } from '../coordinator/spot-check.ts';
import { APP_MODEL_PATH, buildBenchPages, ensureBenchModel, isMain, log, machine, median, round, serveBenchFiles, versions, writeReport } from './lib.ts';

/** the uneven plan's step must beat the even plan's by this much (issue 18) */
const MIN_GAIN = 1.3;
const PARITY = 1e-4;

export interface UnevenOptions {
  /** of one core: the two fast tabs' and the slow tab's */
  fastShare: number;
  slowShare: number;
  /** forwards spot-checked in the run that measures their cost (1: every one) */
  spotCheckRate: number;
  frames: number;
  height: number;
  width: number;
  steps: number;
}

export const DEFAULT_UNEVEN: UnevenOptions = { spotCheckRate: 1, fastShare: 0.75, slowShare: 0.4, frames: 9, height: 256, width: 256, steps: 3 };
/** the CFS period: short, so a tab out of its quota waits at most a few ms to answer a peer */
const PERIOD_US = 10_000;

interface Report {
  steps: { ms: number; ranks: { rank: number; worker: string; computeMs: number }[] }[];
  spotChecks: { step: number; ms: number; verdict: unknown }[];
  medianStepMs: number;
  plan: { heads: number[] | null; predictedStepMs: number | null; by: string } | null;
  config: { ulyssesDegree: number };
}

/** A cpu cgroup holding `share` of one core (null: unlimited), as cgroup v1 or v2 offers it; its directory. */
function cpuGroup(name: string, share: number): string {
  const v1 = '/sys/fs/cgroup/cpu';
  const v2 = '/sys/fs/cgroup';
  const quota = String(Math.round(share * PERIOD_US));
  if (existsSync(join(v1, 'cpu.cfs_quota_us'))) {
    const dir = join(v1, name);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'cpu.cfs_period_us'), String(PERIOD_US));
    writeFileSync(join(dir, 'cpu.cfs_quota_us'), quota);
    return dir;
  }
  if (existsSync(join(v2, 'cgroup.controllers')) && readFileSync(join(v2, 'cgroup.controllers'), 'utf8').includes('cpu')) {
    writeFileSync(join(v2, 'cgroup.subtree_control'), '+cpu');
    const dir = join(v2, name);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'cpu.max'), `${quota} ${PERIOD_US}`);
    return dir;
  }
  throw new Error('bench uneven gives its tabs unequal CPU through a cpu cgroup, and this machine has none writable: run it as root where cgroup v1 (cpu) or v2 (cpu.max) is mounted');
}

/**
 * A Chromium pinned to one core (taskset) and, with `group`, inside that cpu cgroup (every process
 * it starts inherits both), its pages told they have one core, as a one-core machine's would.
 */
async function pinnedBrowser(name: string, core: number, group: string | null, dir: string): Promise<BrowserContext> {
  const wrapper = join(dir, `chromium-${name}.sh`);
  const enter = group ? `echo $$ > ${join(group, 'cgroup.procs')}\n` : '';
  writeFileSync(wrapper, `#!/bin/sh\n${enter}exec taskset -c ${core} ${chromiumExecutable()} "$@"\n`);
  chmodSync(wrapper, 0o755);
  const context = await chromium.launchPersistentContext(join(dir, `profile-${name}`), { executablePath: wrapper, args: [...chromiumArgs] });
  await context.addInitScript(() => Object.defineProperty(Navigator.prototype, 'hardwareConcurrency', { get: () => 1 }));
  return context;
}

export async function runUneven(options: Partial<UnevenOptions> = {}) {
  const o = { ...DEFAULT_UNEVEN, ...options };
  const model = ensureBenchModel();
  await buildBenchPages();
  const tokens = tokenGrid(model, latentShape(o, model.inChannels)).count;
  log(`uneven: bench-wan (D ${model.dim}, ${model.numLayers} blocks, ${model.numHeads} heads), ${tokens} tokens, ${o.steps} steps; tabs on ${o.fastShare}, ${o.fastShare} and ${o.slowShare} of a core`);
  const dir = mkdtempSync(join(tmpdir(), 'ditswarm-uneven-'));
  const server = await startServer({ port: 0, quiet: true });
  const groups: string[] = [];
  const contexts: BrowserContext[] = [];
  const started = Date.now();
  try {
    // core 0: the dashboard and a fast tab; core 1: the other fast tab and the slow one
    const tabs = [
      { name: 'fast-a', core: 0, share: o.fastShare },
      { name: 'fast-b', core: 1, share: o.fastShare },
      { name: 'slow', core: 1, share: o.slowShare },
    ];
    const dashboardBrowser = await pinnedBrowser('dashboard', 0, null, dir);
    contexts.push(dashboardBrowser);
    for (const tab of tabs) {
      groups.push(cpuGroup(`ditswarm-bench-${tab.name}`, tab.share));
      contexts.push(await pinnedBrowser(tab.name, tab.core, groups.at(-1)!, dir));
      // the wrapper's write into the group does not stop the browser if it fails: see that it did not
      if (!readFileSync(join(groups.at(-1)!, 'cgroup.procs'), 'utf8').trim()) throw new Error(`the ${tab.name} tab's Chromium is not in its cpu cgroup ${groups.at(-1)}: this machine does not let it be limited`);
    }
    for (const context of contexts) await serveBenchFiles(context);
    const dashboard = await dashboardBrowser.newPage();
    await dashboard.goto(`${server.url}/`);
    const { joinUrl } = await dashboard.evaluate(() => (window as any).ditswarm.ready);
    // the fast tabs join first: ranks 0 and 1, and one rank alone runs on the first of them
    for (const [i, context] of contexts.slice(1).entries()) {
      await (await context.newPage()).goto(joinUrl);
      await dashboard.waitForFunction((n) => (window as any).ditswarm.workerCount() >= n, i + 1, { timeout: 60_000 });
    }

    // no spot checks but in the run that measures them: they would blur the comparison of shares
    const job = { prompt: 'a red ball bouncing on a wooden floor', frames: o.frames, height: o.height, width: o.width, steps: o.steps, guidance: 1, seed: 7, backend: 'swarm', ep: 'wasm', model: APP_MODEL_PATH, spotCheckRate: 0 };
    const run = async (label: string, placement: Record<string, unknown>) => {
      log(`${label}: generating…`);
      const { report, latent } = (await dashboard.evaluate((j) => (window as any).ditswarm.generate(j), { ...job, ...placement })) as { report: Report; latent: string };
      const bytes = Buffer.from(latent, 'base64');
      const values = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
      const ranks = report.steps[0].ranks.map((r) => r.rank);
      const computeMs = ranks.map((rank) => round(median(report.steps.map((s) => s.ranks.find((r) => r.rank === rank)!.computeMs)), 1));
      const result = {
        stepMs: round(report.medianStepMs, 1),
        stepsMs: report.steps.map((s) => round(s.ms, 1)),
        degree: report.config.ulyssesDegree,
        heads: report.plan?.heads ?? null,
        predictedStepMs: report.plan?.predictedStepMs == null ? null : round(report.plan.predictedStepMs, 1),
        /** each rank's compute in a step (the median step), rank order */
        rankComputeMs: computeMs,
        /** forwards recomputed to spot-check the ranks (the default rate), their time, and its share of the steps' */
        spotChecks: {
          count: report.spotChecks.length,
          ms: round(report.spotChecks.reduce((t, c) => t + c.ms, 0), 1),
          shareOfSteps: round(report.spotChecks.reduce((t, c) => t + c.ms, 0) / report.steps.reduce((t, s) => t + s.ms, 0)),
        },
      };
      log(`${label}: ${JSON.stringify(result)}`);
      return { result, values };
    };
    const one = await run('one fast tab', { workers: 1 });
    const even = await run('three tabs, even shares', { workers: 3, shares: 'even' });
    const bySpeed = await run('three tabs, shares by speed', { workers: 3, shares: 'speed' });
    const auto = await run("three tabs, 'auto'", { workers: 'auto' });
    const checked = await run(`three tabs, shares by speed, spot checks at rate ${o.spotCheckRate}`, { workers: 3, shares: 'speed', spotCheckRate: o.spotCheckRate });
    const maxAbs = (a: Float32Array) => a.reduce((m, v, i) => Math.max(m, Math.abs(v - one.values[i])), 0);
    // with even shares every rank does the same work: its compute time is its speed
    const [r0, r1, r2] = even.result.rankComputeMs;
    const slowdown = round(r2 / ((r0 + r1) / 2), 2);
    const gain = round(even.result.stepMs / bySpeed.result.stepMs, 2);
    const parity = { even: maxAbs(even.values), bySpeed: maxAbs(bySpeed.values), auto: maxAbs(auto.values), checked: maxAbs(checked.values) };
    return {
      benchmark: 'uneven',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: {
        model: { path: 'bench/out/models/bench-wan', ...model },
        tokens,
        ...o,
        guidance: 1,
        ep: 'wasm',
        slowdownBy: `each worker tab in a Chromium of its own pinned to one core (taskset) in a cpu cgroup with a CFS quota of ${o.fastShare}, ${o.fastShare} and ${o.slowShare} of a core (period ${PERIOD_US / 1000} ms): cores 0, 1 and 1; the dashboard's Chromium on core 0 unlimited; each browser told it has one core`,
      },
      machine: machine(contexts[0].browser()?.version()),
      versions: versions(),
      /** the slow tab's compute over the fast tabs' in the even run */
      measuredSlowdown: slowdown,
      runs: { one: one.result, even: even.result, bySpeed: bySpeed.result, auto: auto.result, checked: checked.result },
      /** what spot checks cost: a check's time, and the step's growth at the checked run's rate, over the same plan unchecked */
      spotCheckCost: {
        rate: o.spotCheckRate,
        msPerCheck: checked.result.spotChecks.count ? round(checked.result.spotChecks.ms / checked.result.spotChecks.count, 1) : null,
        stepGrowth: round(checked.result.stepMs / bySpeed.result.stepMs - 1),
        atDefaultRate: round((checked.result.stepMs / bySpeed.result.stepMs - 1) * (DEFAULT_SPOT_CHECK_RATE / Math.max(o.spotCheckRate, 1e-9))),
      },
      /** the even plan's step over the uneven plan's */
      gain,
      parityMaxAbs: parity,
      meets: {
        [`shares by speed at least ${MIN_GAIN}× faster than even`]: gain >= MIN_GAIN,
        [`latents equal one tab's within ${PARITY}`]: Object.values(parity).every((d) => d <= PARITY),
      },
    };
  } finally {
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
  }
}

export function parseUnevenArgs(args: string[]): Partial<UnevenOptions> {
  const { values } = parseArgs({ args, options: Object.fromEntries(Object.keys(DEFAULT_UNEVEN).map((k) => [k, { type: 'string' as const }])) });
  const out: Partial<UnevenOptions> = {};
  for (const [k, v] of Object.entries(values)) {
    const n = Number(v);
    const fraction = k === 'spotCheckRate' || k === 'fastShare' || k === 'slowShare';
    if (fraction ? !(n >= 0 && n <= 1) || (k !== 'spotCheckRate' && n === 0) : !Number.isInteger(n) || n < 0) throw new Error(`--${k} takes ${fraction ? 'a fraction from 0 to 1' : 'a whole number'}, got ${v}`);
    out[k as keyof UnevenOptions] = n;
  }
  return out;
}

if (isMain(import.meta)) {
  const report = await runUneven(parseUnevenArgs(process.argv.slice(2)));
  writeReport('uneven.json', report);
  console.log(JSON.stringify({ measuredSlowdown: report.measuredSlowdown, runs: report.runs, gain: report.gain, parity: report.parityMaxAbs, meets: report.meets }, null, 2));
}
