// Scores the demo model on prompts it never saw in training: for each held-out combination of
// colour, shape and direction it samples videos (the pipeline's sampler in Node, through the ONNX
// stage graphs workers run), decodes them and reads them with the detector of demo/. Writes
// bench/out/demo-eval.json with colorAccuracy, directionAccuracy and every prompt's result.
//
//   npm run eval-demo [-- --model DIR --steps N --guidance X --seeds N --ranks P --set held-out|training
//                        --displaced --warmup-steps N --dtype f32|f16|i8|i4 --cache auto|magcache --cache-threshold X
//                        --pipefusion M]
// With --displaced the ranks run displaced patch parallelism (keys and values one step stale past
// the warm-up, as the executor runs it) instead of Ulysses: its cost in accuracy (issue 20). With
// --pipefusion M each step past the warm-up goes in M patches as PipeFusion's stages run them (issue 35).

import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import * as ort from 'onnxruntime-web';
import { CLIP, HELD_OUT_COMBOS, TRAINING_COMBOS } from '../world.ts';
import { evaluateDemo } from '../evaluate.ts';
import { loadModel } from '../generate.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { placedStepCache } from '../../coordinator/planner.ts';
import { parseCacheFlags } from '../../core/step-cache.ts';
import { DTYPES, type DType } from '../../core/net/protocol.ts';
import { EVAL_DEMO_OPTIONS } from './flags.ts';

const { values } = parseArgs({
  options: EVAL_DEMO_OPTIONS,
});

ort.env.wasm.numThreads = 1;
const started = performance.now();
const model = await loadModel(folderFiles(values.model));
const combos = values.set === 'training' ? TRAINING_COMBOS : HELD_OUT_COMBOS;
const steps = Number(values.steps);
const guidance = Number(values.guidance);
const seeds = Array.from({ length: Number(values.seeds) }, (_, i) => Number(values['first-seed']) + i);
const ranks = Number(values.ranks);
if (!(DTYPES as readonly string[]).includes(values.dtype))
  throw new Error(`--dtype is ${DTYPES.join(', ')}, got ${values.dtype}`);
const dtype = values.dtype as DType;
const warmupSteps = Number(values['warmup-steps']);
if (!(Number.isInteger(warmupSteps) && warmupSteps >= 0))
  throw new Error(`--warmup-steps is a whole number ≥ 0, got ${values['warmup-steps']}`);
const displaced = values.displaced ? { warmupSteps } : undefined;
const patches = values.pipefusion === undefined ? null : Number(values.pipefusion);
if (patches !== null && !(Number.isInteger(patches) && patches >= 2))
  throw new Error(`--pipefusion is a whole number ≥ 2 of patches, got ${values.pipefusion}`);
const pipeFusion = patches === null ? undefined : { patches, warmupSteps };
// the step cache as a job asking these flags is placed with on this folder
const cache = placedStepCache(
  { stepCacheCurve: model.stepCacheCurve },
  { cache: parseCacheFlags(values.cache, values['cache-threshold']) },
);

const { results, colorAccuracy, directionAccuracy, bothAccuracy } = await evaluateDemo(
  model,
  combos,
  seeds,
  { steps, guidance, ranks, displaced, pipeFusion, dtype, ...(cache && { cache }) },
  ({ colourCorrect, directionCorrect, prompt, seed, detected: seen }) =>
    console.log(
      `${colourCorrect ? '✓' : '✗'}${directionCorrect ? '✓' : '✗'} ${prompt} (seed ${seed}) → ` +
        `${seen.colour} ${seen.direction} ` +
        `(dx ${seen.dx.toFixed(1)}, dy ${seen.dy.toFixed(1)}, area ${seen.area.toFixed(0)})`,
    ),
);

const report = {
  model: values.model,
  set: values.set,
  colorAccuracy,
  directionAccuracy,
  bothAccuracy,
  promptCount: combos.length,
  videoCount: results.length,
  sampling: {
    steps,
    guidance,
    seeds,
    negativePrompt: '',
    frames: CLIP.frames,
    height: CLIP.height,
    width: CLIP.width,
    flowShift: model.flowShift,
    ulyssesRanks: ranks,
    parallel: displaced ? 'displaced' : 'ulysses',
    pipeFusionPatches: pipeFusion?.patches ?? null,
    warmupSteps: (displaced ?? pipeFusion)?.warmupSteps ?? null,
    dtype,
    cache: cache && { ...cache.settings, curve: cache.curve?.source ?? null },
    stages: 'onnx wasm',
  },
  seconds: Math.round((performance.now() - started) / 1000),
  machine: {
    cpus: cpus().length,
    cpu: cpus()[0]?.model,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    node: process.version,
    platform: process.platform,
  },
  results,
};
mkdirSync(dirname(values.out), { recursive: true });
writeFileSync(values.out, JSON.stringify(report, null, 2) + '\n');
console.log(
  `${values.set} prompts: ${combos.length}, videos: ${results.length}; ` +
    `colour ${(report.colorAccuracy * 100).toFixed(1)}%, direction ${(report.directionAccuracy * 100).toFixed(1)}% ` +
    `(steps ${steps}, guidance ${guidance}) → ${values.out}`,
);
