// What each way to fewer forwards costs a video (issue 38), on the bundled demo model in one swarm of worker tabs:
// the same job at full settings (every forward computed), with the step cache at two thresholds, and at 4 steps
// without guidance with a random LoRA merged (the shape of a step-distilled LoRA's job; a random one is not distilled,
// so its deviation is the bare cost of 4 steps). Per run: forwards computed, the denoising phase's wall time, and the
// deviation from the full job (max-abs of the latent, PSNR of the video decoded in Node by the folder's VAE). Then the
// held-out accuracy of the demo model with the cache and without (demo/evaluate.ts), in Node. Writes
// bench/out/time-to-video.json.
//
//   npm run bench -- time-to-video [--workers 1] [--thresholds 0.12,0.24] [--seeds 2] [--accuracy true] [--steps 20]

import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { JobOverrides, JobResult } from '../app/automation.ts';
import { placedStepCache } from '../coordinator/planner.ts';
import { DEFAULT_JOB } from '../core/job.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import { maxAbsDiff } from '../core/tensor.ts';
import { writeSafetensors } from '../core/safetensors.ts';
import { evaluateDemo } from '../demo/evaluate.ts';
import { loadModel, type LoadedModel } from '../demo/generate.ts';
import { DEMO_SAMPLING, HELD_OUT_COMBOS } from '../demo/world.ts';
import { randomWanLora } from '../server/cli/make-lora.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import { folderFiles } from '../server/model-folder.ts';
import { servedLoras } from '../server/serve.ts';
import { log, machine, NO_SPOT_CHECKS, ROOT, round } from './lib.ts';

export interface TimeToVideoOptions {
  workers: number;
  thresholds: number[];
  /** seeds per held-out prompt in the accuracy runs */
  seeds: number;
  accuracy: boolean;
  /** the full and cached jobs' steps: the default job's (DEFAULT_JOB) where not given */
  steps?: number;
}

export const DEFAULT_TIME_TO_VIDEO: TimeToVideoOptions = {
  workers: 1,
  thresholds: [0.12, 0.24],
  seeds: 2,
  accuracy: true,
};

/** `npm run bench -- --smoke`: one threshold over 8 steps, without the held-out accuracy runs */
export const SMOKE_TIME_TO_VIDEO: TimeToVideoOptions = {
  workers: 1,
  thresholds: [0.24],
  seeds: 1,
  accuracy: false,
  steps: 8,
};

const DEMO_DIR = join(ROOT, 'public/models/tiny-wan-demo');
/** strong enough to move every merged module, small enough to leave the demo model's video recognisable */
const LORA_STRENGTH = 0.1;

interface Run {
  name: string;
  steps: number;
  guidance: number;
  forwardsComputed: number;
  denoisingMs: number;
  latentMaxAbs: number;
  videoPsnrDb: number;
}

export async function runTimeToVideo(options: Partial<TimeToVideoOptions> = {}) {
  const o = { ...DEFAULT_TIME_TO_VIDEO, ...options };
  const started = Date.now();
  const model = await loadModel(folderFiles(DEMO_DIR));
  const lora = join(mkdtempSync(join(tmpdir(), 'ditswarm-bench-lora-')), 'random-wan-lora.safetensors');
  writeFileSync(
    lora,
    writeSafetensors(randomWanLora(model.config, { rank: 8, alpha: 8, strength: LORA_STRENGTH, seed: 'bench' })),
  );
  const served = servedLoras([`${lora}:${LORA_STRENGTH}`]);
  const swarm = await startLocalSwarm({ workers: o.workers, loraFiles: served.loraFiles, log: (l) => log(l) });
  const job: JobOverrides = {
    ...DEFAULT_JOB,
    steps: o.steps ?? DEFAULT_JOB.steps,
    backend: 'swarm',
    workers: o.workers,
    ep: 'wasm',
    shares: 'even',
    spotCheckRate: NO_SPOT_CHECKS,
    outputType: 'latent',
  };
  const runs: Run[] = [];
  try {
    const generate = async (overrides: JobOverrides) => {
      const { report, latent } = (await swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), {
        ...job,
        ...overrides,
      })) as JobResult;
      const bytes = Buffer.from(latent, 'base64');
      return { report, latent: new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4) };
    };
    await generate({ steps: 2 }); // the engines load and warm up
    const full = await generate({});
    const fullVideo = await decoded(model, full.latent);
    const measure = async (name: string, overrides: JobOverrides) => {
      const { report, latent } = name === 'full' ? full : await generate(overrides);
      const passes = report.config.guidance === 1 ? 1 : 2;
      const run: Run = {
        name,
        steps: report.config.steps,
        guidance: report.config.guidance,
        forwardsComputed: report.cache?.forwardsComputed ?? report.config.steps * passes,
        denoisingMs: round(report.phasesMs.denoising, 0),
        latentMaxAbs: round(maxAbsDiff(latent, full.latent), 4),
        videoPsnrDb: round(psnr(await decoded(model, latent), fullVideo), 2),
      };
      runs.push(run);
      log(
        `${name}: ${run.forwardsComputed} forwards, denoising ${run.denoisingMs} ms, ` +
          `latent max-abs ${run.latentMaxAbs}, video PSNR ${run.videoPsnrDb} dB`,
      );
    };
    await measure('full', {});
    for (const threshold of o.thresholds)
      await measure(`cache ${threshold}`, { cache: { method: 'magcache', threshold } });
    await measure(`4 steps, guidance 1, random LoRA at ${LORA_STRENGTH}`, {
      steps: 4,
      guidance: 1,
      loras: served.defaultLoras,
    });
  } finally {
    await swarm.close();
  }
  const accuracy = o.accuracy ? await heldOutAccuracy(model, o) : null;
  const full = runs[0];
  return {
    benchmark: 'time-to-video',
    date: new Date().toISOString(),
    durationS: round((Date.now() - started) / 1000, 1),
    config: {
      ...o,
      job: { ...DEFAULT_JOB, steps: job.steps },
      model: 'the bundled demo model',
      ep: 'wasm',
      loraStrength: LORA_STRENGTH,
    },
    machine: machine(),
    runs: runs.map((r) => ({
      ...r,
      fewerForwards: round(full.forwardsComputed / r.forwardsComputed, 2),
      speedup: round(full.denoisingMs / r.denoisingMs, 2),
    })),
    accuracy,
  };
}

/** Held-out colour and direction accuracy without the cache and with it at each threshold. */
async function heldOutAccuracy(model: LoadedModel, o: TimeToVideoOptions) {
  const seeds = Array.from({ length: o.seeds }, (_, i) => 1000 + i);
  const sampling = { steps: DEMO_SAMPLING.steps, guidance: DEMO_SAMPLING.guidance };
  const scored = async (name: string, cache: ReturnType<typeof placedStepCache>) => {
    const { colorAccuracy, directionAccuracy } = await evaluateDemo(model, HELD_OUT_COMBOS, seeds, {
      ...sampling,
      ...(cache && { cache }),
    });
    log(
      `held-out ${name}: colour ${round(100 * colorAccuracy, 1)} %, direction ${round(100 * directionAccuracy, 1)} %`,
    );
    return { name, colorAccuracy: round(colorAccuracy, 4), directionAccuracy: round(directionAccuracy, 4) };
  };
  const runs = [await scored('no cache', null)];
  for (const threshold of o.thresholds)
    runs.push(
      await scored(
        `cache ${threshold}`,
        placedStepCache({ stepCacheCurve: model.stepCacheCurve }, { cache: { method: 'magcache', threshold } }),
      ),
    );
  return { prompts: HELD_OUT_COMBOS.length, seeds, runs };
}

async function decoded(model: LoadedModel, latent: Float32Array): Promise<Float32Array> {
  const shape = latentShape(DEFAULT_JOB, wan21Latent(model.config.inChannels));
  return (await model.decoder())({ shape, data: latent }).rgb;
}

/** PSNR of frames in [0, 1] against the reference's, in dB. */
function psnr(frames: Float32Array, reference: Float32Array): number {
  let squared = 0;
  for (let i = 0; i < frames.length; i++) squared += (frames[i] - reference[i]) ** 2;
  const mse = squared / frames.length;
  return mse === 0 ? Infinity : 10 * Math.log10(1 / mse);
}

export function parseTimeToVideoArgs(args: string[]): Partial<TimeToVideoOptions> {
  const { values } = parseArgs({
    args,
    options: {
      workers: { type: 'string' },
      thresholds: { type: 'string' },
      seeds: { type: 'string' },
      accuracy: { type: 'string' },
      steps: { type: 'string' },
    },
  });
  return {
    ...(values.workers && { workers: Number(values.workers) }),
    ...(values.thresholds && { thresholds: values.thresholds.split(',').map(Number) }),
    ...(values.seeds && { seeds: Number(values.seeds) }),
    ...(values.accuracy && { accuracy: values.accuracy !== 'false' }),
    ...(values.steps && { steps: Number(values.steps) }),
  };
}
