// Three worker tabs of unequal speed (issue 18), each a machine of its own (bench/machines.ts: a
// Chromium pinned to a core and given a share of it): two tabs get `fastShare` of a core each, the
// third `slowShare` (0.75 and 0.4: the third measured 4.1× slower here, 8.4× at 0.25). The
// dashboard has a Chromium of its own beside the first tab. The same job on one tab, on the three
// with even shares, and on the three with shares by speed; each rank's compute time in the even run
// is its measured speed. Writes bench/out/uneven.json; `meets` says whether the figures hold.
//
//   npm run bench -- uneven [--fastShare 0.75 --slowShare 0.4 --frames 9 --height 256 --width 256 --steps 3]
//
// Needs a writable cpu cgroup (root; cgroup v1's cpu controller or v2's cpu.max).

import { parseArgs } from 'node:util';
import type { JobOverrides } from '../app/automation.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { DEFAULT_SPOT_CHECK_RATE } from '../coordinator/spot-check.ts';
import {
  BENCH_MODEL_PATH,
  buildBenchPages,
  benchModel,
  SMOKE_MODEL_DIR,
  type OnModel,
  isMain,
  log,
  machine,
  median,
  NO_SPOT_CHECKS,
  round,
  versions,
  writeReport,
} from './lib.ts';
import { PERIOD_US, startMachines } from './machines.ts';
import { defined } from '../core/defined.ts';

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

export const DEFAULT_UNEVEN: UnevenOptions = {
  spotCheckRate: 1,
  fastShare: 0.75,
  slowShare: 0.4,
  frames: 9,
  height: 256,
  width: 256,
  steps: 3,
};

/** `npm run bench -- --smoke`: the same runs at 16 tokens, two steps each, on tabs of a whole core and a half */
export const SMOKE_UNEVEN: Partial<UnevenOptions> & OnModel = {
  model: SMOKE_MODEL_DIR,
  fastShare: 1,
  slowShare: 0.5,
  frames: 1,
  height: 32,
  width: 32,
  steps: 2,
};

export async function runUneven(options: Partial<UnevenOptions> & OnModel = {}) {
  const o = { ...DEFAULT_UNEVEN, ...options };
  const folder = await benchModel(options.model);
  const model = folder.config;
  await buildBenchPages();
  const tokens = tokenGrid(model, latentShape(o, wan21Latent(model.inChannels))).count;
  log(
    `uneven: ${folder.path} (D ${model.dim}, ${model.numLayers} blocks, ${model.numHeads} heads), ${tokens} tokens, ` +
      `${o.steps} steps; tabs on ${o.fastShare}, ${o.fastShare} and ${o.slowShare} of a core`,
  );
  const started = Date.now();
  // core 0: the dashboard and a fast tab; core 1: the other fast tab and the slow one. The fast
  // tabs join first: ranks 0 and 1, and one rank alone runs on the first of them
  const machines = await startMachines(
    [
      { name: 'fast-a', core: 0, share: o.fastShare },
      { name: 'fast-b', core: 1, share: o.fastShare },
      { name: 'slow', core: 1, share: o.slowShare },
    ],
    { model: folder },
  );
  const { dashboard } = machines;
  try {
    // no spot checks but in the run that measures them: they would blur the comparison of shares
    const job: JobOverrides = {
      prompt: 'a red ball bouncing on a wooden floor',
      frames: o.frames,
      height: o.height,
      width: o.width,
      steps: o.steps,
      guidance: 1,
      seed: 7,
      backend: 'swarm',
      ep: 'wasm',
      model: BENCH_MODEL_PATH,
      spotCheckRate: NO_SPOT_CHECKS,
    };
    const run = async (label: string, placement: JobOverrides) => {
      log(`${label}: generating…`);
      const { report, latent } = await dashboard.evaluate((j) => window.ditswarm.generate(j), {
        ...job,
        ...placement,
      });
      const bytes = Buffer.from(latent, 'base64');
      const values = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
      const ranks = report.steps[0].ranks.map((r) => r.rank);
      const computeMs = ranks.map((rank) =>
        round(
          median(
            report.steps.map(
              (s) =>
                defined(
                  s.ranks.find((r) => r.rank === rank),
                  `rank ${rank}`,
                ).computeMs,
            ),
          ),
          1,
        ),
      );
      const result = {
        stepMs: round(report.medianStepMs, 1),
        stepsMs: report.steps.map((s) => round(s.ms, 1)),
        degree: report.placement.layout.ulyssesDegree,
        heads: report.placement.layout.heads?.[0] ?? null,
        predictedStepMs: report.placement.prediction ? round(report.placement.prediction.predictedStepMs, 1) : null,
        /** each rank's compute in a step (the median step), rank order */
        rankComputeMs: computeMs,
        /** forwards recomputed to spot-check the ranks (the default rate), their time, and its share of the steps' */
        spotChecks: {
          count: report.spotChecks.length,
          ms: round(
            report.spotChecks.reduce((t, c) => t + c.ms, 0),
            1,
          ),
          shareOfSteps: round(
            report.spotChecks.reduce((t, c) => t + c.ms, 0) / report.steps.reduce((t, s) => t + s.ms, 0),
          ),
        },
      };
      log(`${label}: ${JSON.stringify(result)}`);
      return { result, values };
    };
    const one = await run('one fast tab', { workers: 1 });
    const even = await run('three tabs, even shares', { workers: 3, shares: 'even' });
    const bySpeed = await run('three tabs, shares by speed', { workers: 3, shares: 'speed' });
    const auto = await run("three tabs, 'auto'", { workers: 'auto' });
    const checked = await run(`three tabs, shares by speed, spot checks at rate ${o.spotCheckRate}`, {
      workers: 3,
      shares: 'speed',
      spotCheckRate: o.spotCheckRate,
    });
    const maxAbs = (a: Float32Array) => a.reduce((m, v, i) => Math.max(m, Math.abs(v - one.values[i])), 0);
    // with even shares every rank does the same work: its compute time is its speed
    const [r0, r1, r2] = even.result.rankComputeMs;
    const slowdown = round(r2 / ((r0 + r1) / 2), 2);
    const gain = round(even.result.stepMs / bySpeed.result.stepMs, 2);
    const parity = {
      even: maxAbs(even.values),
      bySpeed: maxAbs(bySpeed.values),
      auto: maxAbs(auto.values),
      checked: maxAbs(checked.values),
    };
    return {
      benchmark: 'uneven',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: {
        model: { path: folder.path, ...model },
        tokens,
        ...o,
        guidance: 1,
        ep: 'wasm',
        slowdownBy:
          'each worker tab in a Chromium of its own pinned to one core (taskset) in a cpu cgroup ' +
          `with a CFS quota of ${o.fastShare}, ${o.fastShare} and ${o.slowShare} of a core ` +
          `(period ${PERIOD_US / 1000} ms): cores 0, 1 and 1; the dashboard's Chromium on core 0 unlimited; ` +
          'each browser told it has one core',
      },
      machine: machine(machines.browserVersion),
      versions: versions(),
      /** the slow tab's compute over the fast tabs' in the even run */
      measuredSlowdown: slowdown,
      runs: { one: one.result, even: even.result, bySpeed: bySpeed.result, auto: auto.result, checked: checked.result },
      /**
       * what spot checks cost: a check's time, and the step's growth at the checked run's rate,
       * over the same plan unchecked
       */
      spotCheckCost: {
        rate: o.spotCheckRate,
        msPerCheck: checked.result.spotChecks.count
          ? round(checked.result.spotChecks.ms / checked.result.spotChecks.count, 1)
          : null,
        stepGrowth: round(checked.result.stepMs / bySpeed.result.stepMs - 1),
        atDefaultRate: round(
          (checked.result.stepMs / bySpeed.result.stepMs - 1) *
            (DEFAULT_SPOT_CHECK_RATE / Math.max(o.spotCheckRate, 1e-9)),
        ),
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
    await machines.close();
  }
}

export function parseUnevenArgs(args: string[]): Partial<UnevenOptions> {
  const { values } = parseArgs({
    args,
    options: Object.fromEntries(Object.keys(DEFAULT_UNEVEN).map((k) => [k, { type: 'string' as const }])),
  });
  const out: Partial<UnevenOptions> = {};
  for (const [k, v] of Object.entries(values)) {
    const n = Number(v);
    const fraction = k === 'spotCheckRate' || k === 'fastShare' || k === 'slowShare';
    if (fraction ? !(n >= 0 && n <= 1) || (k !== 'spotCheckRate' && n === 0) : !Number.isInteger(n) || n < 0)
      throw new Error(`--${k} takes ${fraction ? 'a fraction from 0 to 1' : 'a whole number'}, got ${v}`);
    out[k as keyof UnevenOptions] = n;
  }
  return out;
}

if (isMain(import.meta)) {
  const report = await runUneven(parseUnevenArgs(process.argv.slice(2)));
  writeReport('uneven.json', report);
  console.log(
    JSON.stringify(
      {
        measuredSlowdown: report.measuredSlowdown,
        runs: report.runs,
        gain: report.gain,
        parity: report.parityMaxAbs,
        meets: report.meets,
      },
      null,
      2,
    ),
  );
}
