// Flow-matching sampling as Wan uses it (diffusers' FlowMatchEulerDiscreteScheduler): sigmas from
// 1 down to 1/1000, bent toward high noise by the flow shift, then Euler steps along the predicted
// velocity; classifier-free guidance mixes the conditional and unconditional velocities.
import { SeededRandom } from './random.ts';
import type { Tensor } from './tensor.ts';

export interface Schedule {
  sigmas: number[]; // steps + 1 values, the last 0
  timesteps: number[]; // what the transformer is given at each step: sigma · 1000
}

const TRAIN_TIMESTEPS = 1000;

export function flowMatchSchedule(steps: number, flowShift: number): Schedule {
  const sigmas: number[] = [];
  for (let i = 0; i < steps; i++) {
    const s = steps === 1 ? 1 : 1 + ((1 / TRAIN_TIMESTEPS - 1) * i) / (steps - 1);
    sigmas.push((flowShift * s) / (1 + (flowShift - 1) * s));
  }
  return { sigmas: [...sigmas, 0], timesteps: sigmas.map((s) => s * TRAIN_TIMESTEPS) };
}

/** The starting latent: standard normal noise from the job's seed, identical on every backend. */
export function initialNoise(shape: number[], seed: number): Tensor {
  const size = shape.reduce((a, b) => a * b, 1);
  return { shape, data: new SeededRandom(seed).normals(size) };
}

/** v_uncond + g·(v_cond − v_uncond) */
export function guide(cond: Float32Array, uncond: Float32Array, scale: number): Float32Array {
  return cond.map((c, i) => uncond[i] + scale * (c - uncond[i]));
}

/** x + (σ_next − σ)·v */
export function eulerStep(
  latent: Float32Array,
  velocity: Float32Array,
  sigma: number,
  sigmaNext: number,
): Float32Array {
  const dt = sigmaNext - sigma;
  return latent.map((x, i) => x + dt * velocity[i]);
}
