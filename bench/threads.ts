// One worker tab on its machine's cores: the bench's P = 1 job on a tab alone (it takes every core)
// and on the same tab once a second worker tab has opened beside it (each takes its share, here one
// thread), measured in one run, with what the dashboard predicted for each. Writes
// bench/out/threads.json; `meets` says whether the figures hold on this machine.
//
//   npm run bench -- threads [--frames 45 --height 512 --width 512 --steps 2]

import { parseArgs } from 'node:util';
import type { JobOverrides } from '../app/automation.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { type JobParams } from '../core/job.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import { JOB_FLAG_OPTIONS, jobFlagValues, type JobFlag } from '../server/cli/job-flags.ts';
import {
  SMOKE_MODEL_DIR,
  type OnModel,
  BENCH_MODEL_PATH,
  benchModel,
  isMain,
  log,
  machine,
  round,
  versions,
  waitForQuietMachine,
  writeReport,
} from './lib.ts';
import { DEFAULT_SCALING } from './scaling.ts';

/** two threads on one tab must beat one by this much (issue 13) */
const MIN_SPEEDUP = 1.6;
/** the dashboard's prediction of a step, relative to the measured step */
const MAX_PREDICTION_ERROR = 0.25;

/** `npm run bench -- --smoke`: one step at 16 tokens */
export const SMOKE_THREADS: Partial<Pick<JobParams, JobFlag>> & OnModel = {
  model: SMOKE_MODEL_DIR,
  frames: 1,
  height: 32,
  width: 32,
  steps: 1,
};

export async function runThreads(options: Partial<Pick<JobParams, JobFlag>> & OnModel = {}) {
  const o = { ...DEFAULT_SCALING, ...options };
  const folder = await benchModel(options.model);
  const model = folder.config;
  const tokens = tokenGrid(model, latentShape(o, wan21Latent(model.inChannels))).count;
  log(`threads: ${folder.path} (D ${model.dim}, ${model.numLayers} blocks), ${tokens} tokens, ${o.steps} steps, P = 1`);
  const swarm = await startLocalSwarm({ workers: 1, modelFolders: folder.modelFolders, log });
  const started = Date.now();
  const machineAtStart = machine(swarm.browserVersion);
  try {
    const job: JobOverrides = {
      prompt: 'a red ball bouncing on a wooden floor',
      frames: o.frames,
      height: o.height,
      width: o.width,
      steps: o.steps,
      guidance: o.guidance,
      seed: o.seed,
      backend: 'swarm',
      workers: 1,
      ep: 'wasm',
      model: BENCH_MODEL_PATH,
    };
    const generate = async (label: string) => {
      const load = await waitForQuietMachine();
      log(`${label}: generating… (load ${load.loadAverage1m})`);
      const { report } = await swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), job);
      // the last step: the first also pays onnxruntime's first-run allocations
      const stepMs = report.steps[report.steps.length - 1].ms;
      const predictedStepMs = report.placement.prediction?.predictedStepMs ?? null;
      const run = {
        threads: report.workers[0].threads,
        stepMs: round(stepMs, 1),
        stepsMs: report.steps.map((s) => round(s.ms, 1)),
        predictedStepMs: predictedStepMs === null ? null : round(predictedStepMs, 1),
        predictionError: predictedStepMs === null ? null : round((predictedStepMs - stepMs) / stepMs),
        predictedBy: report.placement.prediction?.by ?? null,
        loadAverage1m: { start: load.loadAverage1m, end: machine().loadAverage1m },
      };
      log(`${label}: ${run.threads} thread(s), step ${run.stepMs} ms, predicted ${run.predictedStepMs} ms`);
      return run;
    };
    const threadsShown = () => Promise.all(swarm.workers.map((page) => page.locator('#threads').textContent()));

    const alone = await generate('one tab alone');
    const shownAlone = await threadsShown();
    await swarm.addWorker();
    await swarm.dashboard.waitForFunction(() => window.ditswarm.workerCount() >= 2, null, { timeout: 60_000 });
    const beside = await generate('the same tab beside a second one');
    const shownBeside = await threadsShown();
    const speedup = round(beside.stepMs / alone.stepMs);
    const errors = [alone.predictionError, beside.predictionError];
    return {
      benchmark: 'threads',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: {
        model: { path: folder.path, ...model },
        tokens,
        frames: o.frames,
        height: o.height,
        width: o.width,
        steps: o.steps,
        guidance: o.guidance,
        seed: o.seed,
        backend: 'swarm',
        ep: 'wasm',
        degree: 1,
        stepMsIs: 'the last step of each run',
      },
      machine: { ...machineAtStart, loadAverage1mAtEnd: machine().loadAverage1m },
      versions: versions(),
      alone: { ...alone, workerPages: shownAlone },
      beside: { ...beside, workerPages: shownBeside },
      /** the lone tab's speed-up over the same tab with a second beside it */
      speedup,
      meets: {
        [`alone at least ${MIN_SPEEDUP}× faster`]: speedup >= MIN_SPEEDUP,
        'beside another tab: one thread each': beside.threads === 1 && shownBeside.every((t) => t?.startsWith('1 of')),
        [`predictions within ${MAX_PREDICTION_ERROR * 100}%`]: errors.every(
          (e) => e !== null && Math.abs(e) <= MAX_PREDICTION_ERROR,
        ),
      },
    };
  } finally {
    await swarm.close();
  }
}

export function parseThreadsArgs(args: string[]): Partial<Pick<JobParams, JobFlag>> {
  return jobFlagValues(parseArgs({ args, options: JOB_FLAG_OPTIONS }).values);
}

if (isMain(import.meta)) {
  const report = await runThreads(parseThreadsArgs(process.argv.slice(2)));
  writeReport('threads.json', report);
  console.log(
    JSON.stringify(
      { alone: report.alone, beside: report.beside, speedup: report.speedup, meets: report.meets },
      null,
      2,
    ),
  );
}
