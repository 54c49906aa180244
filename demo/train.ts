// Flow-matching training of the tiny Wan transformer (and the text encoder's embeddings) on the
// procedural world: x_t = (1 − σ)·x0 + σ·ε, the model predicts ε − x0 at timestep 1000·σ, σ drawn
// as the sampler spaces it (uniform, bent by the flow shift). The prompt is dropped ("") for a
// tenth of the samples so classifier-free guidance has an unconditional model to push against,
// and its words are spaced at random (spacedPrompt) so they are read wherever they fall.

import { encodeClip } from './patch-vae.ts';
import { CLIP, promptOf, sampleClip, TRAINING_COMBOS, type Combo } from './world.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import type { WanConfig } from '../core/model/config.ts';
import { latentToRows, patchify, tokenGrid } from '../core/model/tokens.ts';
import { SeededRandom } from '../core/random.ts';
import { concat } from '../core/tensor.ts';
import { Adam } from './adam.ts';
import type { Gemm } from './gemm.ts';
import { parameter, Tape } from './tape.ts';
import { forwardBatch, initialWan, parametersOf, type TrainableWan } from './trainable-wan.ts';

export interface TrainOptions {
  config: WanConfig;
  textLength: number;
  seed: number;
  steps: number;
  batch: number;
  lr: number;
  warmup: number;
  flowShift: number;
  dropPrompt: number;
  /** stop early (and still save) after this many seconds */
  maxSeconds: number;
  combos?: Combo[];
}

export interface TrainProgress {
  step: number;
  loss: number;
  gradNorm: number;
  lr: number;
  seconds: number;
}

export interface TrainResult {
  model: TrainableWan;
  /** the moving average of the weights, in parametersOf order */
  ema: Float32Array[];
  steps: number;
  seconds: number;
  history: TrainProgress[];
}

export interface Sample {
  latent: Float32Array; // x0 [16, T, H, W]
  prompt: string;
}

/**
 * Half the time the prompt as written, otherwise with 0–3 extra spaces before each word after the
 * first, as far as the text encoder's length allows. Its tokens are bytes at absolute positions,
 * so in "a red circle moving left" the direction word starts at a byte that depends on the words
 * before it: without spacing, a held-out combination puts its direction word where the model
 * never read it (the first run learned colour, at a fixed position, perfectly, and direction at a
 * third of the held-out prompts); without the prompts as written, the model rarely sees what
 * users type (a run that always spaced them got "a red square moving right" moving down).
 */
export function spacedPrompt(prompt: string, random: SeededRandom, maxBytes: number): string {
  if (random.uniform() < 0.5) return prompt;
  let budget = Math.max(0, maxBytes - prompt.length);
  return prompt
    .split(' ')
    .map((word, i) => {
      const extra = i === 0 ? 0 : Math.min(budget, Math.floor(random.uniform() * 4));
      budget -= extra;
      return ' '.repeat(extra) + word;
    })
    .join(' ');
}

/** One training clip: a seeded layout of a combination, encoded by the patch VAE. */
export function sampleLatent(combo: Combo, random: SeededRandom): Sample {
  const spec = sampleClip(combo, random);
  return { latent: encodeClip(spec, CLIP.frames, CLIP.height, CLIP.width).data, prompt: promptOf(combo) };
}

export const QK_NORM_LR_SCALE = 10;

export const shiftSigma = (u: number, shift: number) => (shift * u) / (1 + (shift - 1) * u);

export async function trainDemo(
  gemm: Gemm,
  o: TrainOptions,
  onProgress?: (p: TrainProgress) => void,
  onCheckpoint?: (r: TrainResult) => void | Promise<void>,
  checkpointEvery = 0,
): Promise<TrainResult> {
  const combos = o.combos ?? TRAINING_COMBOS;
  const model = initialWan(o.config, o.textLength, o.seed);
  const named = parametersOf(model);
  // The q/k RMSNorm scales bound how sharp attention can get (logit std ≈ w² at head dim 24); at
  // the common rate they barely move in a short run, so they get a 10× rate to find their level.
  const adam = new Adam(
    named.map(([, v]) => v),
    undefined,
    named.map(([name]) => (/norm_[qk]\.weight$/.test(name) ? QK_NORM_LR_SCALE : 1)),
  );
  const random = new SeededRandom(o.seed + 1);
  const shape = latentShape(CLIP, wan21Latent(o.config.inChannels));
  const grid = tokenGrid(o.config, shape);
  const size = shape.reduce((a, b) => a * b, 1);
  const history: TrainProgress[] = [];
  const started = performance.now();
  const seconds = () => (performance.now() - started) / 1000;
  let step = 0;
  for (; step < o.steps && seconds() < o.maxSeconds; step++) {
    const patches: Float32Array[] = [];
    const targets = new Float32Array(o.batch * size);
    const timesteps: number[] = [];
    const prompts: string[] = [];
    for (let g = 0; g < o.batch; g++) {
      const { latent, prompt } = sampleLatent(combos[Math.floor(random.uniform() * combos.length)], random);
      const sigma = shiftSigma(random.uniform(), o.flowShift);
      const noise = random.normals(size);
      const xt = latent.map((x0, i) => (1 - sigma) * x0 + sigma * noise[i]);
      const velocity = noise.map((e, i) => e - latent[i]);
      patches.push(patchify(o.config, { shape, data: xt }).data);
      targets.set(latentToRows(o.config, { shape, data: velocity }), g * size);
      timesteps.push(sigma * 1000);
      prompts.push(random.uniform() < o.dropPrompt ? '' : spacedPrompt(prompt, random, o.textLength));
    }
    const tape = new Tape(gemm);
    const rows = await forwardBatch(tape, model, { patches: concat(patches), timesteps, prompts, grid });
    const loss = tape.meanSquaredError(rows, targets);
    await tape.backward(loss);
    const lr =
      o.lr * Math.min(1, (step + 1) / o.warmup) * (0.1 + 0.9 * 0.5 * (1 + Math.cos((Math.PI * step) / o.steps)));
    const gradNorm = adam.step(lr, Math.min(0.999, (1 + step) / (10 + step)));
    const progress = { step: step + 1, loss: loss.data[0], gradNorm, lr, seconds: seconds() };
    history.push(progress);
    onProgress?.(progress);
    if (checkpointEvery && (step + 1) % checkpointEvery === 0)
      await onCheckpoint?.({ model, ema: adam.ema, steps: step + 1, seconds: seconds(), history });
  }
  return { model, ema: adam.ema, steps: step, seconds: seconds(), history };
}

/** The model with its weights replaced by the moving average. */
export function withWeights(model: TrainableWan, weights: Float32Array[]): TrainableWan {
  const copy: TrainableWan = { ...model, weights: new Map(), text: new Map() };
  const vars = parametersOf(model);
  vars.forEach(([name], i) => {
    const target = name.startsWith('text_encoder.') ? copy.text : copy.weights;
    target.set(name.replace(/^text_encoder\./, ''), parameter(weights[i]));
  });
  return copy;
}
