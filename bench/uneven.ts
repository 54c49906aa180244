// Three worker tabs of unequal speed (issue 18): two in one Chromium pinned to core 0, one in another
// Chromium pinned to core 1 beside `--burners` busy processes pinned there too (a competing load,
// the real means: DevTools CPU throttling does not reach a page's Web Workers, where onnxruntime
// computes). The same job on one tab, on the three with even shares, and on the three with shares
// by speed; each rank's compute time in the even run is its measured speed. Writes
// bench/out/uneven.json; `meets` says whether the figures hold.
//
//   npm run bench -- uneven [--burners 10 --frames 9 --height 256 --width 256 --steps 3]

import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
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
  burners: number;
  /** forwards spot-checked in the run that measures their cost (1: every one) */
  spotCheckRate: number;
  frames: number;
  height: number;
  width: number;
  steps: number;
}

export const DEFAULT_UNEVEN: UnevenOptions = { spotCheckRate: 1, burners: 10, frames: 9, height: 256, width: 256, steps: 3 };

interface Report {
  steps: { ms: number; ranks: { rank: number; worker: string; computeMs: number }[] }[];
  spotChecks: { step: number; ms: number; verdict: unknown }[];
  medianStepMs: number;
  plan: { heads: number[] | null; predictedStepMs: number | null; by: string } | null;
  config: { ulyssesDegree: number };
}

/** Chromium pinned to one core (taskset through a wrapper: every process it starts inherits the pinning). */
async function pinnedBrowser(core: number, dir: string): Promise<BrowserContext> {
  const wrapper = join(dir, `chromium-core-${core}.sh`);
  writeFileSync(wrapper, `#!/bin/sh\nexec taskset -c ${core} ${chromiumExecutable()} "$@"\n`);
  chmodSync(wrapper, 0o755);
  return chromium.launchPersistentContext(join(dir, `profile-${core}`), { executablePath: wrapper, args: [...chromiumArgs] });
}

export async function runUneven(options: Partial<UnevenOptions> = {}) {
  const o = { ...DEFAULT_UNEVEN, ...options };
  const model = ensureBenchModel();
  await buildBenchPages();
  const tokens = tokenGrid(model, latentShape(o, model.inChannels)).count;
  log(`uneven: bench-wan (D ${model.dim}, ${model.numLayers} blocks, ${model.numHeads} heads), ${tokens} tokens, ${o.steps} steps; the third tab beside ${o.burners} busy processes`);
  const dir = mkdtempSync(join(tmpdir(), 'ditswarm-uneven-'));
  const server = await startServer({ port: 0, quiet: true });
  const burners: ChildProcess[] = [];
  const contexts: BrowserContext[] = [];
  const started = Date.now();
  try {
    const fast = await pinnedBrowser(0, dir);
    const slow = await pinnedBrowser(1, dir);
    contexts.push(fast, slow);
    for (const context of contexts) await serveBenchFiles(context);
    const dashboard = await fast.newPage();
    await dashboard.goto(`${server.url}/`);
    const { joinUrl } = await dashboard.evaluate(() => (window as any).ditswarm.ready);
    // the fast tabs join first: ranks 0 and 1, and one rank alone runs on the first of them
    for (const [i, context] of [fast, fast, slow].entries()) {
      await (await context.newPage()).goto(joinUrl);
      await dashboard.waitForFunction((n) => (window as any).ditswarm.workerCount() >= n, i + 1, { timeout: 60_000 });
    }
    for (let i = 0; i < o.burners; i++) burners.push(spawn('taskset', ['-c', '1', process.execPath, '-e', 'for (;;);'], { stdio: 'ignore' }));

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
        slowdownBy: `the third worker's Chromium pinned to core 1 (taskset) beside ${o.burners} busy Node processes pinned there; the other two tabs share core 0`,
      },
      machine: machine(fast.browser()?.version()),
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
    for (const b of burners) b.kill('SIGKILL');
    for (const c of contexts) await c.close().catch(() => {});
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

export function parseUnevenArgs(args: string[]): Partial<UnevenOptions> {
  const { values } = parseArgs({ args, options: Object.fromEntries(Object.keys(DEFAULT_UNEVEN).map((k) => [k, { type: 'string' as const }])) });
  const out: Partial<UnevenOptions> = {};
  for (const [k, v] of Object.entries(values)) {
    const n = Number(v);
    if (k === 'spotCheckRate' ? !(n >= 0 && n <= 1) : !Number.isInteger(n) || n < 0) throw new Error(`--${k} takes ${k === 'spotCheckRate' ? 'a rate from 0 to 1' : 'a whole number'}, got ${v}`);
    out[k as keyof UnevenOptions] = n;
  }
  return out;
}

if (isMain(import.meta)) {
  const report = await runUneven(parseUnevenArgs(process.argv.slice(2)));
  writeReport('uneven.json', report);
  console.log(JSON.stringify({ measuredSlowdown: report.measuredSlowdown, runs: report.runs, gain: report.gain, parity: report.parityMaxAbs, meets: report.meets }, null, 2));
}
