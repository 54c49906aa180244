// Trains the demo model — the tiny Wan2.1-format transformer and its byte-level text encoder — on
// the procedural world of demo/world.ts with flow matching, deterministically from a seed,
// and writes it in make-model's layout (plus training-log.json):
//   public/models/tiny-wan-demo/{model_index.json, transformer/, text_encoder/, vae/}
// Before it exits it reloads the written files with the app's loaders and checks that the
// training forward equals core/model/reference.ts on them (max-abs ≤ 1e-4).
//
//   npm run train-demo [-- --out DIR --seed N --steps N --batch N --minutes N --threads N
//                          --layers N --head-dim N --ffn N --text-dim N --lr X]

import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { CLIP, HELD_OUT_COMBOS, TRAINING_COMBOS, promptOf } from '../world.ts';
import { latentShape, wan21Latent } from '../../core/model/family.ts';
import { wanConfigOfSize } from '../../core/model/config.ts';
import { referenceForward } from '../../core/model/reference.ts';
import { readWeights } from '../../core/model/files.ts';
import { loadTextEncoder } from '../../core/model/text-encoder.ts';
import { latentToRows, patchify, tokenGrid } from '../../core/model/tokens.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { SeededRandom } from '../../core/random.ts';
import { onnxGemm } from '../gemm.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { writeDemoModel } from '../model-folder.ts';
import { Tape } from '../tape.ts';
import { sampleLatent, trainDemo, withWeights, type TrainResult } from '../train.ts';
import { forwardBatch, fromWeights } from '../trainable-wan.ts';

const { values } = parseArgs({
  options: {
    out: { type: 'string', default: 'public/models/tiny-wan-demo' },
    seed: { type: 'string', default: '7' },
    steps: { type: 'string', default: '1800' },
    batch: { type: 'string', default: '16' },
    lr: { type: 'string', default: '0.001' },
    warmup: { type: 'string', default: '100' },
    minutes: { type: 'string', default: '50' },
    threads: { type: 'string', default: '2' },
    layers: { type: 'string', default: '3' },
    'head-dim': { type: 'string', default: '24' },
    ffn: { type: 'string', default: '512' },
    'text-dim': { type: 'string', default: '64' },
    'text-length': { type: 'string', default: '32' },
    'flow-shift': { type: 'string', default: '3' },
    'checkpoint-every': { type: 'string', default: '200' },
  },
});

const out = values.out;
const seed = Number(values.seed);
const flowShift = Number(values['flow-shift']);
const textLength = Number(values['text-length']);
const config = wanConfigOfSize(
  {
    headDim: Number(values['head-dim']),
    textDim: Number(values['text-dim']),
    ffnDim: Number(values.ffn),
    numLayers: Number(values.layers),
  },
  'train-demo flags',
);
const options = {
  config,
  textLength,
  seed,
  steps: Number(values.steps),
  batch: Number(values.batch),
  lr: Number(values.lr),
  warmup: Number(values.warmup),
  flowShift,
  dropPrompt: 0.1,
  maxSeconds: Number(values.minutes) * 60,
};

const gemm = await onnxGemm(Number(values.threads), { heads: config.numHeads, headDim: config.headDim });
console.log(
  `train-demo: ${config.numLayers} blocks, 12 heads × ${config.headDim}, ffn ${config.ffnDim}, ` +
    `text ${textLength} × ${config.textDim}; ${options.steps} steps of ${options.batch} clips ` +
    `(${TRAINING_COMBOS.length} training prompts, ${HELD_OUT_COMBOS.length} held out), seed ${seed}, ` +
    `at most ${values.minutes} min`,
);

let window: number[] = [];
const save = (r: TrainResult, final: boolean) => {
  writeDemoModel(out, withWeights(r.model, r.ema), { name: 'tiny-wan-demo', seed, flowShift });
  const tail = r.history.slice(-100);
  const log = {
    generator: 'npm run train-demo',
    seed,
    steps: r.steps,
    batch: options.batch,
    seconds: Math.round(r.seconds),
    finalLoss: tail.reduce((s, p) => s + p.loss, 0) / Math.max(1, tail.length),
    complete: final,
    options: { ...options, config: undefined, threads: Number(values.threads) },
    config: {
      layers: config.numLayers,
      heads: config.numHeads,
      headDim: config.headDim,
      ffn: config.ffnDim,
      textDim: config.textDim,
      textLength,
    },
    trainingPrompts: TRAINING_COMBOS.map(promptOf),
    heldOutPrompts: HELD_OUT_COMBOS.map(promptOf),
    machine: { cpus: cpus().length, cpu: cpus()[0]?.model, node: process.version },
    loss: r.history
      .filter((_, i) => i % 25 === 24)
      .map((p) => ({ step: p.step, loss: +p.loss.toFixed(5), seconds: Math.round(p.seconds) })),
  };
  mkdirSync(out, { recursive: true });
  writeFileSync(join(out, 'training-log.json'), JSON.stringify(log, null, 2) + '\n');
  return log;
};

const result = await trainDemo(
  gemm,
  options,
  (p) => {
    window.push(p.loss);
    if (p.step % 25 === 0 || p.step === 1) {
      const mean = window.reduce((a, b) => a + b, 0) / window.length;
      console.log(
        `step ${p.step}  loss ${mean.toFixed(4)}  |g| ${p.gradNorm.toFixed(2)}  lr ${p.lr.toExponential(2)}  ` +
          `${p.seconds.toFixed(0)} s`,
      );
      window = [];
    }
  },
  (r) => void save(r, false),
  Number(values['checkpoint-every']),
);
const log = save(result, true);

// The written files, read back by the app's loaders, must give the reference forward's numbers.
const files = folderFiles(out);
const transformer = await loadTransformer(files);
const textEncoder = await loadTextEncoder(files);
const shape = latentShape(CLIP, wan21Latent(config.inChannels));
const grid = tokenGrid(config, shape);
const loaded = fromWeights(
  config,
  transformer.weights,
  await readWeights(files, 'text_encoder/model.safetensors'),
  textLength,
);
const random = new SeededRandom(seed + 2);
let maxAbs = 0;
for (const [i, combo] of [TRAINING_COMBOS[0], HELD_OUT_COMBOS[0]].entries()) {
  const { latent, prompt } = sampleLatent(combo, random);
  const xt = { shape, data: latent.map((x) => 0.5 * x + 0.5 * random.normal()) };
  const timestep = i === 0 ? 500 : 900;
  const reference = latentToRows(config, referenceForward(transformer, xt, timestep, textEncoder.encode(prompt)));
  const rows = await forwardBatch(new Tape(gemm), loaded, {
    patches: patchify(config, xt).data,
    timesteps: [timestep],
    prompts: [prompt],
    grid,
  });
  for (let k = 0; k < reference.length; k++) maxAbs = Math.max(maxAbs, Math.abs(reference[k] - rows.data[k]));
}
writeFileSync(join(out, 'training-log.json'), JSON.stringify({ ...log, referenceMaxAbs: maxAbs }, null, 2) + '\n');
console.log(
  `wrote ${out} after ${result.steps} steps in ${(result.seconds / 60).toFixed(1)} min, ` +
    `final loss ${log.finalLoss.toFixed(4)}; ` +
    `training forward vs reference on the saved weights: max-abs ${maxAbs.toExponential(2)}`,
);
if (!(maxAbs <= 1e-4)) {
  console.error(
    'the training forward does not match core/model/reference.ts on the saved weights (expected max-abs ≤ 1e-4)',
  );
  process.exit(1);
}
process.exit(0);
