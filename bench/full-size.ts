// Wan2.1-T2V-1.3B's transformer at full size in Chromium worker tabs (WASM): seeded random weights in
// exactly the published layout (make-model --preset wan2.1-t2v-1.3b, written on demand outside the
// repository), prompt embeddings and the latent alone (the transformer is what this measures). The
// same job on 1, 2 and 3 worker tabs in one run, then on all of them again after reloading them;
// writes bench/out/full-size.json: per run each rank's model load and whether its weights came from
// the network or its browser's cache, per-step times, each rank's peak memory as its page measured
// it and as the OS saw its renderer process, and the latent's difference from one tab's.
//
//   npm run bench -- full-size [--model DIR] [--ranks 1,2,3]
//     [--frames 9 --height 32 --width 32 --steps 2]

import { parseArgs } from 'node:util';
import { FULL_SIZE_MODEL_DIR } from '../server/model-folder.ts';
import {
  ensureFullSizeModel,
  isMain,
  latentFromBase64,
  log,
  machine,
  rendererPeaks,
  round,
  TEXT_TOKENS,
  transformerSwarm,
  versions,
  waitForQuietMachine,
  writeReport,
  SMOKE_MODEL_DIR,
  transformerJob,
} from './lib.ts';

/** the bound on P ranks against one, relative to the latent's scale */
const MAX_RELATIVE_ERROR = 1e-4;

export interface FullSizeOptions {
  model: string;
  ranks: number[];
  frames: number;
  height: number;
  width: number;
  steps: number;
}

/**
 * `npm run bench -- --smoke`: the bundled model (the published transformer layout, narrow) on one tab, then on it again
 * after its reload (its weights from the browser's cache); more tabs' parity is the e2e tests'
 */
export const SMOKE_FULL_SIZE: FullSizeOptions = {
  model: SMOKE_MODEL_DIR,
  ranks: [1],
  frames: 1,
  height: 32,
  width: 32,
  steps: 1,
};

export async function runFullSize(o: FullSizeOptions) {
  await ensureFullSizeModel(o.model);
  const { config, promptEmbeds, started, swarm, machineAtStart } = await transformerSwarm(
    o.model,
    Math.max(...o.ranks),
  );
  try {
    const runs = [];
    let oneTab: Float32Array | null = null;
    // each degree in turn (a tab placed before keeps its model; a new one reads what the first kept
    // in the browser's cache), then the largest again after every worker tab was reloaded
    const plan = [...o.ranks.map((P) => ({ P, afterReload: false })), { P: Math.max(...o.ranks), afterReload: true }];
    for (const { P, afterReload } of plan) {
      if (afterReload) {
        for (const page of swarm.workers) {
          await page.reload();
          await page.waitForFunction(() => window.ditswarmWorker?.connected, null, { timeout: 120_000 });
        }
        // the old tabs' links closed as they unloaded: the swarm is the reloaded tabs alone
        await swarm.dashboard.waitForFunction((n) => window.ditswarm.workerCount() === n, swarm.workers.length, {
          timeout: 120_000,
        });
      }
      const load = await waitForQuietMachine();
      log(
        `full-size: ${P} worker tab(s)${afterReload ? ' after reloading them' : ''}, ` +
          `${o.frames} frames ${o.width}×${o.height}, ${o.steps} steps… (load ${load.loadAverage1m})`,
      );
      const job = transformerJob(o, promptEmbeds, { workers: P });
      const { report, latent: base64 } = await swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), job);
      const latent = latentFromBase64(base64);
      oneTab ??= latent;
      let maxAbs = 0;
      let scale = 0;
      for (let i = 0; i < latent.length; i++) {
        maxAbs = Math.max(maxAbs, Math.abs(latent[i] - oneTab[i]));
        scale = Math.max(scale, Math.abs(oneTab[i]));
      }
      const run = {
        ranks: P,
        afterReload,
        /** each rank's model load, and where its weights came from (its browser's cache or the server) */
        loads: report.workers.map(
          (w: {
            inMemory: boolean;
            loadMs: number;
            weights: { networkBytes: number; cacheBytes: number; note: string };
          }) => ({
            ...(w.inMemory ? { inMemory: true } : {}), // loaded for an earlier run: the figures are that load's
            loadS: round(w.loadMs / 1000, 1),
            networkGB: round(w.weights.networkBytes / 1e9, 3),
            cacheGB: round(w.weights.cacheBytes / 1e9, 3),
            ...(w.weights.note ? { note: w.weights.note } : {}),
          }),
        ),
        /** placing: the rehearsal and the placement, both of which load the model on ranks that do not have it yet */
        placingMs: round(report.phasesMs.placing, 0),
        stepsMs: report.steps.map((s: { ms: number }) => round(s.ms, 0)),
        computeMsPerRank: report.steps.map((s: { ranks: { computeMs: number }[] }) =>
          s.ranks.map((r) => round(r.computeMs, 0)),
        ),
        /** measureUserAgentSpecificMemory of each rank's page: JS heaps with the weights' ArrayBuffers */
        peakMemoryGiB: report.workers.map((w: { peakMemoryBytes: number | null }) =>
          w.peakMemoryBytes === null ? null : round(w.peakMemoryBytes / 2 ** 30, 2),
        ),
        /** the OS's peak resident memory of every renderer process so far (dashboard and worker tabs), largest first */
        rendererPeakRssGiB: rendererPeaks().map((b) => round(b / 2 ** 30, 2)),
        relativeToOneTab: round(maxAbs / Math.max(scale, Number.MIN_VALUE), 9),
        loadAverage1m: { start: load.loadAverage1m, end: machine().loadAverage1m },
      };
      log(
        `full-size: ${P} tab(s): placing ${run.placingMs} ms, steps ${run.stepsMs.join(', ')} ms, ` +
          `peak ${run.peakMemoryGiB.join(', ')} GiB, ${run.relativeToOneTab} of one tab's latent; ` +
          `loads ${JSON.stringify(run.loads)}`,
      );
      runs.push(run);
    }
    return {
      benchmark: 'full-size',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: {
        model: o.model,
        layout: 'Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer (make-model --preset wan2.1-t2v-1.3b)',
        numLayers: config.num_layers,
        frames: o.frames,
        height: o.height,
        width: o.width,
        steps: o.steps,
        guidance: 1,
        textTokens: TEXT_TOKENS,
        ep: 'wasm',
        outputType: 'latent',
      },
      machine: { ...machineAtStart, loadAverage1mAtEnd: machine().loadAverage1m },
      versions: versions(),
      runs,
      meets: {
        [`every degree within ${MAX_RELATIVE_ERROR} of one tab, relative`]: runs.every(
          (r) => r.relativeToOneTab <= MAX_RELATIVE_ERROR,
        ),
        'after a reload every rank loads its weights from the browser cache': runs
          .filter((r) => r.afterReload)
          .every((r) =>
            r.loads.every((l: { networkGB: number; cacheGB: number }) => l.networkGB === 0 && l.cacheGB > 0),
          ),
      },
    };
  } finally {
    await swarm.close();
  }
}

export function parseFullSizeArgs(args: string[]): FullSizeOptions {
  const { values } = parseArgs({
    args,
    options: {
      model: { type: 'string', default: FULL_SIZE_MODEL_DIR },
      ranks: { type: 'string', default: '1,2,3' },
      frames: { type: 'string', default: '9' },
      height: { type: 'string', default: '32' },
      width: { type: 'string', default: '32' },
      steps: { type: 'string', default: '2' },
    },
  });
  const ranks = values.ranks.split(',').map(Number);
  if (!ranks.length || !ranks.every((r) => Number.isInteger(r) && r >= 1) || ranks[0] !== 1)
    throw new Error(`--ranks must list whole numbers starting with 1 (the reference), got ${values.ranks}`);
  return {
    model: values.model,
    ranks,
    frames: Number(values.frames),
    height: Number(values.height),
    width: Number(values.width),
    steps: Number(values.steps),
  };
}

if (isMain(import.meta)) {
  const report = await runFullSize(parseFullSizeArgs(process.argv.slice(2)));
  writeReport('full-size.json', report);
  console.log(JSON.stringify({ runs: report.runs, meets: report.meets }, null, 2));
}
