// Pooled memory measured (issue 35): Wan2.1-T2V-14B's width (40 heads × 128, ffn 13824) stored as bfloat16
// as it is published, with fewer blocks so that one tab can still hold it all for the reference, run as the
// same job in S = 1, 2 and 4 pipeline stages on one worker tab a stage, each row on fresh tabs. Per S: what each
// worker holds (`workers[].heldWeightBytes`, and the planner's `placement.stages`), its page's peak memory, its
// load's peak (its renderer's peak resident memory, reset before the job, as the load ends) over what it
// holds, the placing and step times, and the latent against S = 1's (exact staged mode: the same to the bit).
// Then per S > 1 the same job in PipeFusion (twice S patches, as many as the tokens allow, after one exact
// step): its steps' times against exact staged mode's, and its latent's deviation from S = 1's.
// Writes bench/out/pooled.json; the projection of the whole 14B on real GPUs is `npm run bench -- projection`.
//
//   npm run bench -- pooled [--model DIR] [--layers 8] [--stages 1,2,4] [--weights float16|float32]
//                           [--memory-gib 16] [--frames 1 --height 32 --width 32 --steps 2]

import { parseArgs } from 'node:util';
import type { Page } from '@playwright/test';
import type { JobOverrides, JobResult } from '../app/automation.ts';
import { defined } from '../core/defined.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import { parseWanConfig } from '../core/model/config.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { WEIGHT_TYPES, type WeightType } from '../core/worker-api.ts';
import {
  ensureWan14b,
  isMain,
  latentFromBase64,
  log,
  machine,
  rendererOf,
  rendererPeaks,
  resetPeak,
  residentMemory,
  round,
  SMOKE_MODEL_DIR,
  transformerJob,
  transformerSwarm,
  versions,
  wan14bModelDir,
  waitForQuietMachine,
  writeReport,
} from './lib.ts';

/** how the stages are cut: by memory alone, since the tabs share this machine's cores */
const SHARES = 'even';

/** issue 35: at S = 4 the worker holding most holds at most this share of the whole */
const MAX_LARGEST_SHARE_AT_4 = 0.35;
/** issue 65: a rank's load peaks at most this many times the bytes it holds */
const MAX_LOAD_OVER_HELD = 1.3;
/** issue 65: PipeFusion's target over exact staged mode at S = 4 */
const MIN_PIPEFUSION_SPEEDUP = 1.2;

export interface PooledOptions {
  /** the model folder; written (make-model --preset wan2.1-t2v-14b --layers L --dtype bf16) when it is the default */
  model: string;
  layers: number;
  /** the stage counts, one worker tab a stage; the first (1) is the reference */
  stages: number[];
  weights: WeightType;
  /** what each worker page is told it may hold (its "Memory for the model"): one tab holds all at S = 1 */
  memoryGiB: number;
  frames: number;
  height: number;
  width: number;
  steps: number;
}

export const DEFAULT_POOLED: PooledOptions = {
  model: wan14bModelDir(8),
  layers: 8,
  stages: [1, 2, 4],
  weights: 'float16',
  memoryGiB: 16,
  frames: 1,
  height: 32,
  width: 32,
  // the first exact, the second PipeFusion's where it runs
  steps: 2,
};
/** `npm run bench -- --smoke`: the bundled model's two blocks in one and two stages */
export const SMOKE_POOLED: PooledOptions = { ...DEFAULT_POOLED, model: SMOKE_MODEL_DIR, layers: 2, stages: [1, 2] };

/** What a rank's renderer process held while the job loaded: Linux's VmHWM and VmRSS, from a fresh page. */
interface LoadMemory {
  /** the rank's peer id and its renderer process */
  worker: string;
  pid: number;
  weightType: WeightType;
  heldBytes: number;
  /** the growth of the process's peak resident memory from before the job to its page's last moment of loading */
  loadPeakBytes: number;
  /** its resident memory's growth at that moment: what the loaded model holds, the sessions with it */
  loadedBytes: number;
}

/**
 * One job on a fresh swarm of `tabs` worker tabs (fresh pages: nothing of an earlier row's model is in them), and each
 * rank's load peak: its renderer's peak resident memory is reset before the job and read while its page says it loads.
 */
async function runRow(o: PooledOptions, tabs: number, placement: JobOverrides) {
  // a renderer process a tab, so that each rank's memory is its process's: Chromium lets same-site tabs share one
  const { config, promptEmbeds, started, swarm, machineAtStart } = await transformerSwarm(o.model, tabs, [
    '--disable-features=ProcessPerSiteUpToMainFrameThreshold',
    // rendererOf's marker collected at once, and each page collected before its peak is reset
    '--js-flags=--expose-gc',
  ]);
  try {
    for (const page of swarm.workers) {
      await page.fill('#model-memory', String(o.memoryGiB));
      await page.locator('#model-memory').dispatchEvent('change');
    }
    // each worker's next pulse carries its budget to the dashboard, which plans with it
    await swarm.dashboard.waitForFunction(
      (n) =>
        [...document.querySelectorAll('#workers tbody tr')].filter((tr) => tr.textContent.includes('(set on its page)'))
          .length === n,
      swarm.workers.length,
      { timeout: 30_000 },
    );
    // one page at a time, a few tries each: other tabs' memory moves too (their probes) while a page holds its marker
    const renderers = new Map<string, number>();
    const pidOf = new Map<Page, number>();
    for (const page of swarm.workers) {
      const id = await page.evaluate(() => window.ditswarmWorker?.peerId ?? '');
      for (let tries = 0; tries < 3 && id && !renderers.has(id); tries++) {
        const pid = await rendererOf(page);
        if (pid === null || [...renderers.values()].includes(pid)) continue;
        renderers.set(id, pid);
        pidOf.set(page, pid);
      }
    }
    const pids = [...renderers.values()];
    const measurable = pids.length === tabs && new Set(pids).size === tabs;
    if (!measurable)
      log(`pooled: the worker tabs' renderer processes are not one each (${pids.join(', ')}): no load peaks`);
    // the markers' memory let go before the peaks start again: a collection frees a large buffer's a moment after
    for (let round = 0; round < 3; round++) {
      for (const page of swarm.workers) await page.evaluate(() => (globalThis as { gc?: () => void }).gc?.());
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
    const before = new Map(pids.map((pid) => [pid, residentMemory(pid).now]));
    if (measurable) pids.forEach(resetPeak);
    // while a worker page says it loads, its renderer's memory every tenth of a second: the last sample is the load's
    // (within a tenth of a second of its end), and none is of the denoising after, which widens a block to compute it
    // (read when the dashboard said it denoised, the first block's compute was in it)
    const loaded = new Map<number, { now: number; peak: number }>();
    const jobRuns = { now: true };
    const sampling = (async () => {
      while (jobRuns.now && measurable) {
        for (const [page, pid] of pidOf) {
          const state = await page.evaluate(() => window.ditswarmWorker?.state).catch(() => null);
          if (state === 'loading') loaded.set(pid, residentMemory(pid));
        }
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    })();
    const job = transformerJob(o, promptEmbeds, placement);
    const result = await (
      swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), job) as Promise<JobResult>
    ).finally(() => (jobRuns.now = false));
    await sampling;
    const atLoad = measurable ? loaded : null;
    const memory: (LoadMemory | null)[] = result.report.workers.map((w) => {
      const pid = renderers.get(w.id);
      const at = pid === undefined ? undefined : atLoad?.get(pid);
      const from = pid === undefined ? undefined : before.get(pid);
      if (pid === undefined || !at || from === undefined) return null;
      const heldBytes = w.heldWeightBytes;
      return {
        worker: w.id,
        pid,
        weightType: w.weightType,
        heldBytes,
        loadPeakBytes: at.peak - from,
        loadedBytes: at.now - from,
      };
    });
    return { config, promptEmbeds, started, machineAtStart, browserVersion: swarm.browserVersion, result, memory };
  } finally {
    await swarm.close();
  }
}

/** a row's load peaks per rank: GB, and over what the rank holds */
const loadPeaks = (memory: (LoadMemory | null)[]) =>
  memory.map((m) =>
    m === null
      ? null
      : {
          weightType: m.weightType,
          heldGB: round(m.heldBytes / 1e9, 3),
          loadPeakGB: round(m.loadPeakBytes / 1e9, 3),
          loadedGB: round(m.loadedBytes / 1e9, 3),
          peakOverHeld: round(m.loadPeakBytes / m.heldBytes, 3),
        },
  );

export async function runPooled(o: PooledOptions) {
  await ensureWan14b(o.model, o.layers);
  const started = Date.now();
  let machineAtStart: ReturnType<typeof machine> | null = null;
  let config: Awaited<ReturnType<typeof transformerSwarm>>['config'] | null = null;
  const runs = [];
  let reference: Float32Array | null = null;
  // every row on as many tabs, fresh: each tab takes the same share of the cores (worker/cores.ts), so computes with
  // as many threads, in every row
  const tabs = Math.max(...o.stages);
  for (const S of o.stages) {
    const load = await waitForQuietMachine();
    log(`pooled: ${S} stage(s) of ${tabs} fresh tab(s), ${o.weights} weights… (load ${load.loadAverage1m})`);
    // `workers` is a stage's: each stage on one tab. The blocks cut by memory alone ('even' shares): the tabs
    // share this machine's cores, so each one's measured speed says when it was probed, not what it is
    const row = await runRow(o, tabs, { workers: 1, stages: S, weightType: o.weights, shares: SHARES });
    machineAtStart ??= row.machineAtStart;
    config ??= row.config;
    const { report, latent: base64 } = row.result;
    const latent = latentFromBase64(base64);
    reference ??= latent;
    const maxAbs = maxAbsOf(latent, reference);
    const held = report.workers.map((w) => w.heldWeightBytes);
    const whole = report.placement.stages ? report.placement.stages.reduce((sum, s) => sum + s.heldBytes, 0) : held[0];
    const run = {
      stages: S,
      /** each stage's blocks [from, to) as the planner cut them (null: one worker holds all) */
      blocks: report.placement.stages?.map((s) => s.blocks) ?? null,
      heldGB: held.map((b) => round(b / 1e9, 3)),
      /** the largest share of the whole model's held bytes one worker holds */
      largestShare: round(Math.max(...held) / whole, 3),
      /** measureUserAgentSpecificMemory of each worker's page: JS heaps with the weights' ArrayBuffers */
      peakMemoryGiB: report.workers.map((w) =>
        w.peakMemoryBytes === null ? null : round(w.peakMemoryBytes / 2 ** 30, 2),
      ),
      /** per rank, its fresh page's renderer: peak resident memory while it loaded, over what it holds (runRow) */
      load: loadPeaks(row.memory),
      placingS: round(report.phasesMs.placing / 1000, 1),
      stepsMs: report.steps.map((s) => round(s.ms, 0)),
      maxAbsFromOneTab: maxAbs,
      loadAverage1m: { start: load.loadAverage1m, end: machine().loadAverage1m },
    };
    log(
      `pooled: S = ${S}: held ${run.heldGB.join(' / ')} GB (largest ${run.largestShare} of the whole), ` +
        `load peak over held ${run.load.map((l) => l?.peakOverHeld ?? '?').join(' / ')}, ` +
        `placing ${run.placingS} s, steps ${run.stepsMs.join(', ')} ms, max-abs vs S = 1 ${maxAbs.toExponential(2)}`,
    );
    runs.push(run);
  }
  const cfg = defined(config, 'the pooled model config');
  // PipeFusion: the same job's steps after the first in patches flowing through the stages at once
  const wan = parseWanConfig(cfg, 'the pooled model');
  const tokens = tokenGrid(wan, latentShape(o, wan21Latent(wan.inChannels))).count;
  const pipeFusion = [];
  for (const S of o.steps > 1 ? o.stages.filter((s) => s > 1) : []) {
    const patches = Math.min(2 * S, tokens, cfg.num_attention_heads);
    const load = await waitForQuietMachine();
    log(`pooled: PipeFusion, ${S} stages, ${patches} patches after 1 exact step… (load ${load.loadAverage1m})`);
    const row = await runRow(o, tabs, {
      workers: 1,
      stages: S,
      weightType: o.weights,
      shares: SHARES,
      pipeFusionPatches: patches,
      warmupSteps: 1,
    });
    const { report, latent: base64 } = row.result;
    const latent = latentFromBase64(base64);
    const exact = defined(
      runs.find((r) => r.stages === S),
      `the exact run of ${S} stages`,
    );
    const stepsMs = report.steps.map((s) => round(s.ms, 0));
    const fused = {
      stages: S,
      patches,
      tokens,
      /** what its ranks hold, as exact mode's */
      weightType: report.placement.weightType,
      heldGB: report.workers.map((w) => round(w.heldWeightBytes / 1e9, 3)),
      load: loadPeaks(row.memory),
      stepsMs,
      /** PipeFusion's steps after the exact first against exact staged mode's same steps */
      speedupOverExact: round(sum(exact.stepsMs.slice(1)) / sum(stepsMs.slice(1)), 3),
      maxAbsFromOneTab: maxAbsOf(latent, defined(reference, 'the S = 1 latent')),
      latentScale: round(Math.max(...latent.map(Math.abs)), 4),
      loadAverage1m: { start: load.loadAverage1m, end: machine().loadAverage1m },
    };
    log(
      `pooled: PipeFusion S = ${S}, ${patches} patches, ${fused.weightType} weights: steps ${stepsMs.join(', ')} ms ` +
        `(exact ${exact.stepsMs.join(', ')}: ${fused.speedupOverExact}× its speed), max-abs vs S = 1 ` +
        `${fused.maxAbsFromOneTab.toExponential(2)} of a latent scale ${fused.latentScale}`,
    );
    pipeFusion.push(fused);
  }
  const atFour = runs.find((r) => r.stages === 4);
  const loads = [...runs, ...pipeFusion].flatMap((r) => r.load).filter((l) => l !== null);
  return {
    benchmark: 'pooled',
    date: new Date(started).toISOString(),
    durationS: round((Date.now() - started) / 1000, 1),
    config: {
      ...o,
      layout: `Wan-AI/Wan2.1-T2V-14B-Diffusers transformer, ${cfg.num_layers} of its 40 blocks`,
      heads: cfg.num_attention_heads,
      headDim: cfg.attention_head_dim,
      guidance: 1,
      ep: 'wasm',
      outputType: 'latent',
      shares: SHARES,
      /** every row runs on fresh worker tabs; a rank's load peak is its renderer's VmHWM, reset before the job */
      rows: 'fresh pages',
    },
    machine: { ...defined(machineAtStart, 'the machine at start'), loadAverage1mAtEnd: machine().loadAverage1m },
    versions: versions(),
    runs,
    /** PipeFusion per S > 1: not exact, so its latent's deviation from S = 1's, and its steps against exact mode's */
    pipeFusion,
    /** the OS's peak resident memory of every renderer process (dashboard and worker tabs), largest first */
    rendererPeakRssGiB: rendererPeaks().map((b) => round(b / 2 ** 30, 2)),
    meets: {
      'every S gives the latent of one tab holding everything, to the bit': runs.every((r) => r.maxAbsFromOneTab === 0),
      ...(atFour && {
        [`at S = 4 no worker holds more than ${MAX_LARGEST_SHARE_AT_4} of the whole`]:
          atFour.largestShare <= MAX_LARGEST_SHARE_AT_4,
      }),
      ...(loads.length && {
        [`every rank's load peaks at most ${MAX_LOAD_OVER_HELD}× what it holds`]: loads.every(
          (l) => l.peakOverHeld <= MAX_LOAD_OVER_HELD,
        ),
      }),
      ...(pipeFusion.length && {
        [`PipeFusion at least ${MIN_PIPEFUSION_SPEEDUP}× exact staged mode's speed at its largest S`]:
          defined(pipeFusion.at(-1), 'a PipeFusion row').speedupOverExact >= MIN_PIPEFUSION_SPEEDUP,
      }),
    },
  };
}

const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

function maxAbsOf(a: Float32Array, b: Float32Array): number {
  let most = 0;
  for (let i = 0; i < a.length; i++) most = Math.max(most, Math.abs(a[i] - b[i]));
  return most;
}

export function parsePooledArgs(args: string[]): PooledOptions {
  const { values } = parseArgs({
    args,
    options: Object.fromEntries(
      Object.keys(DEFAULT_POOLED).map((k) => [k === 'memoryGiB' ? 'memory-gib' : k, { type: 'string' }]),
    ),
  });
  const whole = (flag: string, fallback: number): number => {
    const value = values[flag];
    if (value === undefined) return fallback;
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new Error(`--${flag} is a whole number ≥ 1, got ${value}`);
    return n;
  };
  const layers = whole('layers', DEFAULT_POOLED.layers);
  const stages = typeof values.stages === 'string' ? values.stages.split(',').map(Number) : DEFAULT_POOLED.stages;
  if (!stages.every((s) => Number.isInteger(s) && s >= 1 && s <= layers) || stages[0] !== 1)
    throw new Error(`--stages lists stage counts from 1 (the reference) to --layers ${layers}, got ${values.stages}`);
  const weights = values.weights ?? DEFAULT_POOLED.weights;
  if (!(WEIGHT_TYPES as readonly unknown[]).includes(weights))
    throw new Error(`--weights is one of ${WEIGHT_TYPES.join(', ')}, got ${weights}`);
  const memoryGiB = Number(values['memory-gib'] ?? DEFAULT_POOLED.memoryGiB);
  if (!(memoryGiB > 0)) throw new Error(`--memory-gib is a number of GiB > 0, got ${String(values['memory-gib'])}`);
  return {
    model: typeof values.model === 'string' ? values.model : wan14bModelDir(layers),
    layers,
    stages,
    weights: weights as WeightType,
    memoryGiB,
    frames: whole('frames', DEFAULT_POOLED.frames),
    height: whole('height', DEFAULT_POOLED.height),
    width: whole('width', DEFAULT_POOLED.width),
    steps: whole('steps', DEFAULT_POOLED.steps),
  };
}

if (isMain(import.meta)) {
  const report = await runPooled(parsePooledArgs(process.argv.slice(2)));
  writeReport('pooled.json', report);
  console.log(JSON.stringify({ runs: report.runs, pipeFusion: report.pipeFusion, meets: report.meets }, null, 2));
}
