// Worker processes against a tab (issue 40): the bench's P = 1 job on one tab with every core, on one worker process
// with every core (onnxruntime-node natively), and the same job on two worker processes sharing the cores, each
// on a swarm of its own, measured in one run. Writes bench/out/node-worker.json.
//
//   npm run bench -- node-worker [--frames 45 --height 512 --width 512 --steps 2]

import { availableParallelism } from 'node:os';
import { parseArgs } from 'node:util';
import type { JobOverrides } from '../app/automation.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { type JobParams } from '../core/job.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import { startLocalSwarm, type LocalSwarmOptions } from '../server/cli/browser-swarm.ts';
import { JOB_FLAG_OPTIONS, jobFlagValues, type JobFlag } from '../server/cli/job-flags.ts';
import {
  SMOKE_MODEL_DIR,
  type OnModel,
  BENCH_MODEL_PATH,
  benchModel,
  isMain,
  log,
  machine,
  NO_SPOT_CHECKS,
  round,
  versions,
  waitForQuietMachine,
  writeReport,
} from './lib.ts';
import { DEFAULT_SCALING } from './scaling.ts';

/** `npm run bench -- --smoke`: one step at 16 tokens */
export const SMOKE_NODE_WORKER: Partial<Pick<JobParams, JobFlag>> & OnModel = {
  model: SMOKE_MODEL_DIR,
  frames: 1,
  height: 32,
  width: 32,
  steps: 1,
};

export async function runNodeWorker(options: Partial<Pick<JobParams, JobFlag>> & OnModel = {}) {
  const o = { ...DEFAULT_SCALING, ...options };
  const folder = await benchModel(options.model);
  const model = folder.config;
  const tokens = tokenGrid(model, latentShape(o, wan21Latent(model.inChannels))).count;
  const cores = availableParallelism();
  log(`node-worker: ${folder.path} (D ${model.dim}, ${model.numLayers} blocks), ${tokens} tokens, ${o.steps} steps`);
  const started = Date.now();
  const machineAtStart = machine();

  /** the job on a swarm of its own of `workers` (its degree: all of them), with what each worker computed on */
  const run = async (label: string, swarmOptions: LocalSwarmOptions, workers: number) => {
    const swarm = await startLocalSwarm({ ...swarmOptions, modelFolders: folder.modelFolders, log });
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
        workers,
        ep: 'wasm',
        model: BENCH_MODEL_PATH,
        spotCheckRate: NO_SPOT_CHECKS,
      };
      const load = await waitForQuietMachine();
      log(`${label}: generating… (load ${load.loadAverage1m})`);
      const { report } = await swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), job);
      const outcome = {
        workers: report.workers.map(({ kind, adapter, threads }) => ({ kind, adapter, threads })),
        // the last step: the first also pays onnxruntime's first-run allocations
        stepMs: round(report.steps[report.steps.length - 1].ms, 1),
        stepsMs: report.steps.map((s) => round(s.ms, 1)),
        totalMs: round(report.totalMs, 1),
        links: report.links.map((l) => `${l.from}->${l.to}:${l.transport}`),
        loadAverage1m: { start: load.loadAverage1m, end: machine().loadAverage1m },
      };
      log(`${label}: step ${outcome.stepMs} ms, job ${outcome.totalMs} ms`);
      return outcome;
    } finally {
      await swarm.close();
    }
  };

  const tab = await run('one tab, every core', { workers: 1 }, 1);
  const node = await run('one worker process, every core', { nodeWorkers: 1, nodeThreads: cores }, 1);
  const two = await run(
    'two worker processes sharing the cores',
    { nodeWorkers: 2, nodeThreads: Math.max(1, Math.floor(cores / 2)) },
    2,
  );
  return {
    benchmark: 'node-worker',
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
      ep: 'wasm (a process: onnxruntime-node on the CPU)',
      cores,
      stepMsIs: 'the last step of each run',
    },
    machine: { ...machineAtStart, loadAverage1mAtEnd: machine().loadAverage1m },
    versions: versions(),
    tab,
    node,
    twoNodes: two,
    /** how many times faster a step is on one process than on one tab, on the same cores */
    nativeSpeedup: round(tab.stepMs / node.stepMs),
  };
}

export function parseNodeWorkerArgs(args: string[]): Partial<Pick<JobParams, JobFlag>> {
  return jobFlagValues(parseArgs({ args, options: JOB_FLAG_OPTIONS }).values);
}

if (isMain(import.meta)) {
  const report = await runNodeWorker(parseNodeWorkerArgs(process.argv.slice(2)));
  writeReport('node-worker.json', report);
  console.log(JSON.stringify({ tab: report.tab, node: report.node, twoNodes: report.twoNodes }, null, 2));
}
