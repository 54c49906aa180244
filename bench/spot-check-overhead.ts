// What the default spot checks cost a job (issue 33): the same guided job on P worker tabs with checks
// off (spotCheckRate 0) and at the default rate, runs of the two interleaved in one swarm so that the
// machine's load falls on both alike; per run the denoising phase's time, the median and the last step
// (every forward of which is checked), and the checks made. The ratio of the medians over the runs is the
// overhead; the forwards recomputed per forward run, the compute the rate implies. Writes
// bench/out/spot-check-overhead.json.
//
//   npm run bench -- spot-check-overhead [--workers 2] [--repeats 3] [--steps 20] [--frames 9]
//                                        [--height 64] [--width 64]

import { parseArgs } from 'node:util';
import type { JobOverrides, JobResult } from '../app/automation.ts';
import { DEFAULT_SPOT_CHECK_RATE } from '../coordinator/spot-check.ts';
import { median } from '../core/median.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import { log, machine, round } from './lib.ts';

export interface SpotCheckOverheadOptions {
  workers: number;
  repeats: number;
  steps: number;
  frames: number;
  height: number;
  width: number;
}

export const DEFAULT_SPOT_CHECK_OVERHEAD: SpotCheckOverheadOptions = {
  workers: 2,
  repeats: 3,
  steps: 20,
  frames: 9,
  height: 64,
  width: 64,
};
/** `npm run bench -- --smoke`: one job each way, two steps at 16 tokens */
export const SMOKE_SPOT_CHECK_OVERHEAD: SpotCheckOverheadOptions = {
  workers: 2,
  repeats: 1,
  steps: 2,
  frames: 1,
  height: 32,
  width: 32,
};

interface Run {
  rate: number;
  denoisingMs: number;
  medianStepMs: number;
  lastStepMs: number;
  checks: number;
  forwards: number;
}

export async function runSpotCheckOverhead(options: Partial<SpotCheckOverheadOptions> = {}) {
  const o = { ...DEFAULT_SPOT_CHECK_OVERHEAD, ...options };
  const rates = [0, DEFAULT_SPOT_CHECK_RATE];
  const swarm = await startLocalSwarm({ workers: o.workers, log: (l) => log(l) });
  const started = Date.now();
  const runs: Run[] = [];
  try {
    const generate = async (rate: number): Promise<Run> => {
      const job: JobOverrides = {
        prompt: 'a red square moving right',
        frames: o.frames,
        height: o.height,
        width: o.width,
        steps: o.steps,
        guidance: 4,
        seed: 42,
        backend: 'swarm',
        workers: o.workers,
        ep: 'wasm',
        shares: 'even',
        outputType: 'latent',
        spotCheckRate: rate,
      };
      const { report } = (await swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), job)) as JobResult;
      const steps = report.steps.map((s) => s.ms);
      return {
        rate,
        denoisingMs: round(report.phasesMs.denoising, 0),
        medianStepMs: round(median(steps), 1),
        lastStepMs: round(steps.at(-1) ?? NaN, 1),
        checks: report.spotChecks.length,
        forwards: 2 * steps.length,
      };
    };
    // one unmeasured job first: the engines load and warm up
    await generate(0);
    for (let r = 0; r < o.repeats; r++)
      for (const rate of r % 2 ? [...rates].reverse() : rates) {
        const run = await generate(rate);
        runs.push(run);
        log(
          `rate ${rate}: denoising ${run.denoisingMs} ms, median step ${run.medianStepMs} ms, ` +
            `last ${run.lastStepMs} ms, ${run.checks} checks of ${run.forwards} forwards`,
        );
      }
  } finally {
    await swarm.close();
  }
  const at = (rate: number) => runs.filter((r) => r.rate === rate);
  const summary = (rate: number) => ({
    denoisingMs: median(at(rate).map((r) => r.denoisingMs)),
    medianStepMs: median(at(rate).map((r) => r.medianStepMs)),
    checksPerJob: median(at(rate).map((r) => r.checks)),
  });
  const [off, on] = rates.map(summary);
  return {
    benchmark: 'spot-check-overhead',
    date: new Date().toISOString(),
    durationS: round((Date.now() - started) / 1000, 1),
    config: { ...o, rates, guidance: 4, model: 'the bundled demo model', ep: 'wasm', shares: 'even' },
    machine: machine(),
    runs,
    off,
    on,
    overhead: {
      denoising: round(on.denoisingMs / off.denoisingMs - 1, 3),
      medianStep: round(on.medianStepMs / off.medianStepMs - 1, 3),
      recomputedPerForward: round(on.checksPerJob / (2 * o.steps), 3),
    },
  };
}

export function parseSpotCheckOverheadArgs(args: string[]): Partial<SpotCheckOverheadOptions> {
  const { values } = parseArgs({
    args,
    options: Object.fromEntries(Object.keys(DEFAULT_SPOT_CHECK_OVERHEAD).map((k) => [k, { type: 'string' }])),
  });
  return Object.fromEntries(
    Object.entries(values).map(([k, v]) => {
      const n = Number(v);
      if (!Number.isInteger(n) || n < 1) throw new Error(`--${k} is a whole number ≥ 1, got ${String(v)}`);
      return [k, n];
    }),
  );
}
