// What the executor costs: the `local` backend's step time (pipeline → executor → worker runtime →
// engine in a Web Worker, one stage call at a time) against a forward on the same ONNX sessions
// called directly in a page. After a warm-up of both, one-step jobs and direct forwards alternate,
// so a change in the machine's load hits both sides of a pair; the overhead is the median of the
// pairs' ratios. Writes bench/out/local-overhead.json.
//
//   npm run bench -- local-overhead [--frames 13 --height 512 --width 512 --pairs 5]

import { parseArgs } from 'node:util';
import type { JobOverrides } from '../app/automation.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import {
  SMOKE_MODEL_DIR,
  type OnModel,
  BENCH_MODEL_PATH,
  buildBenchPages,
  benchModel,
  isMain,
  log,
  machine,
  median,
  openProbePage,
  round,
  serveBenchPages,
  versions,
  waitForQuietMachine,
  writeReport,
} from './lib.ts';

export interface OverheadOptions {
  frames: number;
  height: number;
  width: number;
  pairs: number;
}

/** 13 frames at 512×512: 4 latent frames × 32 × 32 = 4,096 tokens. */
export const DEFAULT_OVERHEAD: OverheadOptions = { frames: 13, height: 512, width: 512, pairs: 5 };

/** `npm run bench -- --smoke`: one pair at 16 tokens */
export const SMOKE_OVERHEAD: OverheadOptions & OnModel = {
  model: SMOKE_MODEL_DIR,
  frames: 1,
  height: 32,
  width: 32,
  pairs: 1,
};

declare const bench: {
  directLoad(modelUrl: string): Promise<{ loadMs: number }>;
  directForward(latentShape: number[], timestep: number): Promise<{ ms: number; stageMs: Record<string, number> }>;
};

export async function runLocalOverhead(options: Partial<OverheadOptions> & OnModel = {}) {
  const o = { ...DEFAULT_OVERHEAD, ...options };
  const folder = await benchModel(options.model);
  const model = folder.config;
  await buildBenchPages();
  const shape = latentShape(o, wan21Latent(model.inChannels));
  const tokens = tokenGrid(model, shape).count;
  log(`local overhead: ${folder.path}, ${tokens} tokens, ${o.pairs} pairs of (local-backend step, direct forward)`);
  const swarm = await startLocalSwarm({ workers: 0, modelFolders: folder.modelFolders, log: (l) => log(l) });
  const started = Date.now();
  const machineAtStart = machine(swarm.browserVersion);
  try {
    const context = swarm.dashboard.context();
    await serveBenchPages(context);
    const page = await openProbePage(context, swarm.server.url);
    const job: JobOverrides = {
      prompt: 'a red ball bouncing on a wooden floor',
      frames: o.frames,
      height: o.height,
      width: o.width,
      steps: 1,
      guidance: 1,
      seed: 42,
      backend: 'local',
      workers: 1,
      ep: 'wasm',
      model: BENCH_MODEL_PATH,
    };
    const localStep = async () => {
      const out = await swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), job);
      return out.report.steps[0].ms;
    };
    // a one-step job runs at timestep 1000 (σ = 1); the direct forward gets the same
    const directForward = () => page.evaluate(([s, t]) => bench.directForward(s, t), [shape, 1000] as const);

    const load = await waitForQuietMachine();
    const warmUp = {
      localMs: round(await localStep(), 1),
      ...(await page.evaluate((url) => bench.directLoad(url), `${swarm.server.url}${BENCH_MODEL_PATH}`)),
      directMs: round((await directForward()).ms, 1),
    };
    log(`warm-up: local ${warmUp.localMs} ms, direct ${warmUp.directMs} ms (load ${load.loadAverage1m})`);
    const pairs: { localMs: number; directMs: number; ratio: number }[] = [];
    let stageMs: Record<string, number> = {};
    for (let i = 0; i < o.pairs; i++) {
      const localMs = await localStep();
      const d = await directForward();
      stageMs = Object.fromEntries(Object.entries(d.stageMs).map(([k, v]) => [k, round(v, 1)]));
      pairs.push({ localMs: round(localMs, 1), directMs: round(d.ms, 1), ratio: round(localMs / d.ms, 4) });
      log(`pair ${i + 1}: local step ${localMs.toFixed(0)} ms, direct forward ${d.ms.toFixed(0)} ms`);
    }
    return {
      benchmark: 'local-overhead',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: {
        model: { path: folder.path, ...model },
        tokens,
        latentShape: shape,
        ...o,
        guidance: 1,
        ep: 'wasm',
        threads: 1,
        measure: 'median of local/direct over alternating pairs after a warm-up of both',
      },
      machine: { ...machineAtStart, loadAverage1mAtEnd: machine().loadAverage1m },
      versions: versions(),
      warmUp,
      pairs,
      localStepMs: median(pairs.map((p) => p.localMs)),
      directForwardMs: median(pairs.map((p) => p.directMs)),
      /** where a direct forward's time goes, by stage kind (the last pair, all blocks) */
      directStageMs: stageMs,
      /** local step time / direct session time − 1 */
      localOverhead: round(median(pairs.map((p) => p.ratio)) - 1, 4),
    };
  } finally {
    await swarm.close();
  }
}

export function parseOverheadArgs(args: string[]): Partial<OverheadOptions> {
  const { values } = parseArgs({
    args,
    options: {
      frames: { type: 'string' },
      height: { type: 'string' },
      width: { type: 'string' },
      pairs: { type: 'string' },
    },
  });
  return Object.fromEntries(Object.entries(values).map(([k, v]) => [k, Number(v)]));
}

if (isMain(import.meta))
  writeReport('local-overhead.json', await runLocalOverhead(parseOverheadArgs(process.argv.slice(2))));
