// One transformer forward's inputs and output under diffusers' argument names
// (`WanTransformer3DModel.forward(hidden_states, timestep, encoder_hidden_states)` → `sample`),
// as tensors with the batch dimension, which must be 1; inside ditswarm the batch is dropped.

import { SeededRandom } from '../random.ts';
import type { TensorMap } from '../safetensors.ts';
import { sizeOf, type Tensor } from '../tensor.ts';
import type { WanConfig } from './config.ts';
import { timestepError, type Timestep } from './timesteps.ts';
import { tokenGrid } from './tokens.ts';

export interface ForwardInputs {
  latent: Tensor; // [C, T, H, W]
  /** [1] as one number; [1, S] (diffusers' `expand_timesteps`, Wan2.2) one per token */
  timestep: Timestep;
  text: Float32Array; // [L, text_dim]
}

export class ForwardInputError extends Error {
  override name = 'ForwardInputError';
}

const EXPECTED = 'hidden_states [1, C, T, H, W], timestep [1] or [1, S], encoder_hidden_states [1, L, text_dim]';

export function readForwardInputs(cfg: WanConfig, tensors: TensorMap, source: string): ForwardInputs {
  const fail = (what: string) => new ForwardInputError(`${source}: ${what}`);
  const get = (name: string): Tensor => {
    const t = tensors.get(name);
    if (!t) {
      const has = [...tensors].map(([n, v]) => `${n} [${v.shape.join(',')}]`).join(', ') || 'no tensors';
      throw fail(`no tensor "${name}" (it has ${has}); expected ${EXPECTED}`);
    }
    return t;
  };
  const batchOf = (name: string, t: Tensor, rank: number, dims: string) => {
    if (t.shape.length !== rank) throw fail(`${name} is [${t.shape.join(',')}], expected ${rank} dimensions ${dims}`);
    if (t.shape[0] !== 1)
      throw fail(`${name} has batch ${t.shape[0]}; only batch 1 is supported, run one sample per call`);
  };

  const hidden = get('hidden_states');
  batchOf('hidden_states', hidden, 5, '[1, C, T, H, W]');
  const [, C, T, H, W] = hidden.shape;
  if (C !== cfg.inChannels) throw fail(`hidden_states has ${C} channels, the model's in_channels is ${cfg.inChannels}`);
  const [pt, ph, pw] = cfg.patchSize;
  if (T % pt || H % ph || W % pw || !T || !H || !W) {
    throw fail(
      `hidden_states latent ${T}×${H}×${W} (T×H×W) must be non-empty multiples of the patch size ${pt}×${ph}×${pw}`,
    );
  }

  const tokens = tokenGrid(cfg, [C, T, H, W]).count;
  const timestepTensor = get('timestep');
  const perToken = timestepTensor.shape.length === 2;
  if (perToken ? timestepTensor.shape.join() !== `1,${tokens}` : timestepTensor.shape.join() !== '1')
    throw fail(
      `timestep is [${timestepTensor.shape.join(',')}], expected [1] (one timestep for the batch of 1) or ` +
        `[1, ${tokens}] (one per token of the latent's ${tokens})`,
    );
  const timestep = perToken ? timestepTensor.data : timestepTensor.data[0];
  const wrongTimestep = timestepError(timestep, tokens);
  if (wrongTimestep) throw fail(`timestep: ${wrongTimestep}`);

  const text = get('encoder_hidden_states');
  batchOf('encoder_hidden_states', text, 3, '[1, L, text_dim]');
  if (text.shape[2] !== cfg.textDim)
    throw fail(`encoder_hidden_states is [${text.shape.join(',')}], the model's text_dim is ${cfg.textDim}`);

  return { latent: { shape: [C, T, H, W], data: hidden.data }, timestep, text: text.data };
}

export function forwardOutput(sample: Tensor): TensorMap {
  return new Map([['sample', { shape: [1, ...sample.shape], data: sample.data }]]);
}

export interface RandomInputSize {
  frames: number; // latent T
  height: number; // latent H
  width: number; // latent W
  textLength: number; // L
  seed: number;
  /** timestep [1, S]: the first latent frame's tokens at 0, the rest at the drawn one (Wan2.2 TI2V with an image) */
  perToken?: boolean;
}

/** Seeded example inputs for the model's dims: normal latent and text, a timestep in [0, 1000). */
export function randomForwardInputs(
  cfg: WanConfig,
  { frames, height, width, textLength, seed, perToken = false }: RandomInputSize,
): TensorMap {
  const random = new SeededRandom(seed);
  const latentShape = [1, cfg.inChannels, frames, height, width];
  const hidden = random.normals(sizeOf(latentShape));
  const t = Math.floor(random.uniform() * 1000);
  const grid = tokenGrid(cfg, latentShape.slice(1));
  const firstFrameTokens = grid.count / grid.frames;
  const timestep = perToken
    ? Float32Array.from({ length: grid.count }, (_, token) => (token < firstFrameTokens ? 0 : t))
    : Float32Array.of(t);
  const text = random.normals(textLength * cfg.textDim);
  return new Map([
    ['hidden_states', { shape: latentShape, data: hidden }],
    ['timestep', { shape: perToken ? [1, grid.count] : [1], data: timestep }],
    ['encoder_hidden_states', { shape: [1, textLength, cfg.textDim], data: text }],
  ]);
}
