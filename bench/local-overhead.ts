/**
 * What the executor costs: the `local` backend's step time (pipeline → executor → worker runtime →
 * engine in a Web Worker, one stage call at a time) against a forward on the same ONNX sessions
 * called directly in a page. Rounds alternate between the two so a change in the machine's load
 * hits both. Writes bench/out/local-overhead.json.
 *
 *   npm run bench -- local-overhead [--frames 13 --height 512 --width 512 --steps 3 --rounds 2]
 */
import { parseArgs } from 'node:util';
import { latentShape } from '../core/job.ts';
import { flowMatchSchedule } from '../core/scheduler.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import { APP_MODEL_PATH, buildBenchPages, ensureBenchModel, isMain, log, machine, median, openProbePage, round, serveBenchFiles, versions, waitForQuietMachine, writeReport } from './lib.ts';

export interface OverheadOptions {
  frames: number;
  height: number;
  width: number;
  steps: number;
  rounds: number;
}

/** 13 frames at 512×512: 4 latent frames × 32 × 32 = 4,096 tokens. */
export const DEFAULT_OVERHEAD: OverheadOptions = { frames: 13, height: 512, width: 512, steps: 3, rounds: 2 };

declare const bench: { direct(modelUrl: string, latentShape: number[], timesteps: number[]): Promise<{ loadMs: number; forwardMs: number[]; lastForwardStageMs: Record<string, number> }> };

export async function runLocalOverhead(options: Partial<OverheadOptions> = {}) {
  const o = { ...DEFAULT_OVERHEAD, ...options };
  const model = ensureBenchModel();
  await buildBenchPages();
  const shape = latentShape(o, model.inChannels);
  const tokens = tokenGrid(model, shape).count;
  log(`local overhead: bench-wan, ${tokens} tokens, ${o.steps} steps × ${o.rounds} rounds, local backend vs direct sessions`);
  const swarm = await startLocalSwarm({ workers: 0, log: (l) => log(l) });
  const started = Date.now();
  const machineAtStart = machine(swarm.browser);
  try {
    const context = swarm.dashboard.context();
    await serveBenchFiles(context);
    const page = await openProbePage(context, swarm.server.url);
    const timesteps = flowMatchSchedule(o.steps, 3).timesteps;
    const local: number[][] = [];
    const direct: number[][] = [];
    let stageMs: Record<string, number> = {};
    const loads: number[] = [];
    for (let round = 0; round < o.rounds; round++) {
      loads.push((await waitForQuietMachine()).loadAverage1m);
      const job = { prompt: 'a red ball bouncing on a wooden floor', frames: o.frames, height: o.height, width: o.width, steps: o.steps, guidance: 1, seed: 42, backend: 'local', workers: 1, ep: 'wasm' };
      const out = (await swarm.dashboard.evaluate((j) => (window as unknown as { ditswarm: { generate(j: unknown): Promise<unknown> } }).ditswarm.generate(j), job)) as { report: { steps: { ms: number }[] } };
      local.push(out.report.steps.map((s) => round1(s.ms)));
      const d = await page.evaluate(([url, s, t]) => bench.direct(url, s, t), [`${swarm.server.url}${APP_MODEL_PATH}`, shape, timesteps] as const);
      direct.push(d.forwardMs.map(round1));
      stageMs = Object.fromEntries(Object.entries(d.lastForwardStageMs).map(([k, v]) => [k, round1(v)]));
      log(`round ${round + 1}: local steps ${local[round].join(', ')} ms; direct forwards ${direct[round].join(', ')} ms`);
    }
    // the first step of each round also pays onnxruntime's first-run allocations (direct builds new sessions each round)
    const steady = (runs: number[][]) => runs.flatMap((r) => r.slice(1));
    const localStepMs = median(steady(local));
    const directForwardMs = median(steady(direct));
    return {
      benchmark: 'local-overhead',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: { model: { path: 'bench/out/models/bench-wan', ...model }, tokens, latentShape: shape, ...o, guidance: 1, ep: 'wasm', threads: 1, measure: 'median over every step but the first of each round' },
      machine: { ...machineAtStart, loadAverage1mAtEnd: machine().loadAverage1m, loadAverage1mPerRound: loads },
      versions: versions(),
      localStepsMs: local,
      directForwardsMs: direct,
      localStepMs,
      directForwardMs,
      /** where a direct forward's time goes, by stage kind (last forward of the last round, all blocks) */
      directStageMs: stageMs,
      /** local step time / direct session time − 1 */
      localOverhead: round(localStepMs / directForwardMs - 1, 4),
    };
  } finally {
    await swarm.close();
  }
}

const round1 = (x: number) => round(x, 1);

export function parseOverheadArgs(args: string[]): Partial<OverheadOptions> {
  const { values } = parseArgs({ args, options: { frames: { type: 'string' }, height: { type: 'string' }, width: { type: 'string' }, steps: { type: 'string' }, rounds: { type: 'string' } } });
  return Object.fromEntries(Object.entries(values).map(([k, v]) => [k, Number(v)]));
}

if (isMain(import.meta)) writeReport('local-overhead.json', await runLocalOverhead(parseOverheadArgs(process.argv.slice(2))));
