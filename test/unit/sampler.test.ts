import { describe, expect, it } from 'vitest';
import { guide, initialNoise, sample } from '../../core/sampler.ts';
import {
  eulerStep,
  FlowMatchEulerDiscreteScheduler,
  flowMatchSchedule,
} from '../../core/schedulers/flow-match-euler-discrete-scheduler.ts';
import { indexForTimestep } from '../../core/schedulers/scheduler.ts';
import type { Tensor } from '../../core/tensor.ts';

// The sampler's arithmetic against numbers worked out by hand from the formulas (classifier-free
// guidance, flow-matching Euler steps as in diffusers' FlowMatchEulerDiscreteScheduler), never
// against another run of the same code: the parity tests run one implementation on both sides, so
// a swapped argument or a flipped sign passes them all and fails here.

const f32 = (...values: number[]) => Float32Array.from(values);

describe('guide: v_uncond + g·(v_cond − v_uncond)', () => {
  it('guide([1, 2, −1], [3, 2, 0.5], 5) is [−7, 2, −7]: 3 + 5·(1 − 3), 2 + 5·0, 0.5 + 5·(−1 − 0.5)', () => {
    // with conditional and unconditional swapped it would be [11, 2, 6.5]
    expect(Array.from(guide(f32(1, 2, -1), f32(3, 2, 0.5), 5))).toEqual([-7, 2, -7]);
    expect(Array.from(guide(f32(0.5), f32(0.25), 4))).toEqual([1.25]); // 0.25 + 4·0.25
  });

  it('scale 1 is the conditional velocity and scale 0 the unconditional one', () => {
    expect(Array.from(guide(f32(1, -3), f32(5, 7), 1))).toEqual([1, -3]);
    expect(Array.from(guide(f32(1, -3), f32(5, 7), 0))).toEqual([5, 7]);
  });
});

describe('eulerStep: x + (σ_next − σ)·v', () => {
  it('from σ 0.75 to 0.25 (dt = −0.5), [1, −2] along [0.5, 4] goes to [0.75, −4]', () => {
    // with the sign of dt flipped it would be [1.25, 0]
    expect(Array.from(eulerStep(f32(1, -2), f32(0.5, 4), 0.75, 0.25))).toEqual([0.75, -4]);
  });

  it('with the exact flow velocity noise − x₀, one step from σ to 0 lands on x₀', () => {
    // x₀ = [0.5, −1], noise [2, 1], σ = 0.75: x = (1 − σ)·x₀ + σ·noise = [1.625, 0.5], v = [1.5, 2]
    expect(Array.from(eulerStep(f32(1.625, 0.5), f32(1.5, 2), 0.75, 0))).toEqual([0.5, -1]);
  });
});

// The unshifted grid ends at 1/1000, as FlowMatchEulerDiscreteScheduler's port documents. diffusers' set_timesteps
// ends it at its already shifted sigma_min instead (3/1002 for shift 3), so its last sigma there is 1/112.
describe('flowMatchSchedule: unshifted sigmas 1 → 1/1000, shifted s ↦ shift·s / (1 + (shift − 1)·s), then 0', () => {
  it('2 steps with shift 3: sigmas [1, 3/1002, 0] and timesteps [1000, 3000/1002]', () => {
    const { sigmas, timesteps } = flowMatchSchedule(2, 3);
    expect(sigmas).toHaveLength(3);
    expect(sigmas[0]).toBe(1);
    expect(sigmas[1]).toBeCloseTo(0.0029940119760479, 14); // 3·0.001 / (1 + 2·0.001)
    expect(sigmas[2]).toBe(0);
    expect(timesteps).toHaveLength(2);
    expect(timesteps[0]).toBe(1000);
    expect(timesteps[1]).toBeCloseTo(2.9940119760479, 11);
  });

  it('3 steps with shift 3: the middle unshifted sigma 0.5005 becomes 1.5015/2.001 = 0.750374…', () => {
    const { sigmas, timesteps } = flowMatchSchedule(3, 3);
    expect(sigmas).toHaveLength(4);
    [1, 0.7503748125937032, 0.0029940119760479, 0].forEach((sigma, i) =>
      expect(sigmas[i], `sigma ${i}`).toBeCloseTo(sigma, 14),
    );
    [1000, 750.3748125937032, 2.9940119760479].forEach((t, i) =>
      expect(timesteps[i], `timestep ${i}`).toBeCloseTo(t, 10),
    );
  });

  it('shift 1 leaves the linear grid: 3 steps give [1, 0.5005, 0.001, 0]', () => {
    const { sigmas, timesteps } = flowMatchSchedule(3, 1);
    [1, 0.5005, 0.001, 0].forEach((sigma, i) => expect(sigmas[i], `sigma ${i}`).toBeCloseTo(sigma, 14));
    [1000, 500.5, 1].forEach((t, i) => expect(timesteps[i], `timestep ${i}`).toBeCloseTo(t, 10));
  });

  it('shift 5 bends harder toward noise: 2 steps end on 5·0.001 / (1 + 4·0.001) = 0.004980…', () => {
    expect(flowMatchSchedule(2, 5).sigmas[1]).toBeCloseTo(0.0049800796812749, 14);
  });
});

describe('FlowMatchEulerDiscreteScheduler: set_timesteps, then step() through them', () => {
  it('steps from σ at its step index to the next: eulerStep on its own sigmas, the index moving on by itself', () => {
    const scheduler = new FlowMatchEulerDiscreteScheduler({ shift: 3 });
    scheduler.setTimesteps(3);
    expect(scheduler.sigmas).toEqual(flowMatchSchedule(3, 3).sigmas);
    const [x, v] = [f32(1, -2), f32(0.5, 4)];
    const first = scheduler.step(v, scheduler.timesteps[0], x).prevSample;
    expect(first).toEqual(eulerStep(x, v, scheduler.sigmas[0], scheduler.sigmas[1]));
    // the next step is at index 1 whatever timestep it is given, as diffusers keeps its step index
    expect(scheduler.step(v, 0, first).prevSample).toEqual(
      eulerStep(first, v, scheduler.sigmas[1], scheduler.sigmas[2]),
    );
  });

  it("without a begin index, starts at the timestep's step; with one, there; never before setTimesteps", () => {
    const scheduler = new FlowMatchEulerDiscreteScheduler({ shift: 3 });
    expect(() => scheduler.step(f32(1), 1000, f32(0))).toThrow('step before setTimesteps');
    scheduler.setTimesteps(3);
    const [x, v] = [f32(1, -2), f32(0.5, 4)];
    const at1 = eulerStep(x, v, scheduler.sigmas[1], scheduler.sigmas[2]);
    expect(scheduler.step(v, scheduler.timesteps[1], x).prevSample).toEqual(at1);
    scheduler.setTimesteps(3);
    expect(() => scheduler.step(v, 123, x)).toThrow("timestep 123 is none of the schedule's 3: give setBeginIndex");
    scheduler.setBeginIndex(1);
    expect(scheduler.step(v, 123, x).prevSample).toEqual(at1);
  });

  it("indexForTimestep: the timestep's place, the second of two (diffusers' image-to-image start), else undefined", () => {
    expect(indexForTimestep([999, 500, 1], 500)).toBe(1);
    expect(indexForTimestep([999, 500, 500, 1], 500)).toBe(2);
    expect(indexForTimestep([999, 500, 1], 7)).toBeUndefined();
  });
});

describe('initialNoise: standard normals from the seed (mulberry32, then Box–Muller)', () => {
  it('seed 42 gives −1.2848382, 0.43278027, −0.94535279, −1.7128043, in the shape asked for', () => {
    // mulberry32(42): u = 0.6011037519, 0.4482905590, 0.8524657935, 0.6697340414; each pair gives
    // r = √(−2·ln(1 − u₁)), then r·cos(2π·u₂) and r·sin(2π·u₂)
    const noise = initialNoise([2, 1, 1, 2], 42);
    expect(noise.shape).toEqual([2, 1, 1, 2]);
    expect(noise.data).toBeInstanceOf(Float32Array);
    expect(noise.data).toHaveLength(4);
    [-1.2848382, 0.43278027, -0.94535279, -1.7128043].forEach((x, i) =>
      expect(noise.data[i], `value ${i}`).toBeCloseTo(x, 6),
    );
  });

  it('seed 7 gives 0.14197044, 0.058240715, −0.86425304, −2.6056809', () => {
    const noise = initialNoise([4], 7);
    [0.14197044, 0.058240715, -0.86425304, -2.6056809].forEach((x, i) =>
      expect(noise.data[i], `value ${i}`).toBeCloseTo(x, 6),
    );
  });
});

describe('sample(): the denoising loop', () => {
  const x0 = f32(0.5, -1);
  /** the velocity of a perfect model of the single clip x₀: (x − x₀)/σ, with σ = timestep/1000 */
  const idealVelocity = (latent: Tensor, timestep: number) =>
    latent.data.map((x, i) => (x - x0[i]) / (timestep / 1000));

  it('with the ideal velocity, step k lands on x₀ + σ_k·(noise − x₀) and the last step on x₀', async () => {
    const asked: { step: number; timestep: number; latent: number[] }[] = [];
    const done: { step: number; latent: number[] }[] = [];
    const latent = await sample({
      shape: [1, 1, 1, 2],
      steps: 2,
      flowShift: 3,
      seed: 42,
      velocity(at) {
        asked.push({ step: at.step, timestep: at.timestep, latent: Array.from(at.latent.data) });
        return Promise.resolve(idealVelocity(at.latent, at.timestep));
      },
      onStep: ({ step, latent }) => done.push({ step, latent: Array.from(latent) }),
    });
    // step 0 starts from seed 42's noise at timestep 1000; step 1 is at σ = 3/1002
    expect(asked.map((a) => a.step)).toEqual([0, 1]);
    expect(asked[0].timestep).toBe(1000);
    expect(asked[1].timestep).toBeCloseTo(2.9940119760479, 11);
    [-1.2848382, 0.43278027].forEach((x, i) => expect(asked[0].latent[i]).toBeCloseTo(x, 6));
    // after step 1: [0.5 + (3/1002)·(−1.2848382 − 0.5), −1 + (3/1002)·(0.43278027 + 1)]
    expect(done.map((d) => d.step)).toEqual([1, 2]);
    [0.49465617, -0.99571024].forEach((x, i) =>
      expect(done[0].latent[i], `after step 1, value ${i}`).toBeCloseTo(x, 6),
    );
    expect(asked[1].latent).toEqual(done[0].latent);
    expect(latent.shape).toEqual([1, 1, 1, 2]);
    [0.5, -1].forEach((x, i) => expect(latent.data[i], `after step 2, value ${i}`).toBeCloseTo(x, 6));
    expect(done[1].latent).toEqual(Array.from(latent.data));
  });

  it('resuming from step k with the latent after k steps gives the uninterrupted latent bit for bit, asking only for steps k…n−1', async () => {
    const steps = 4;
    // any deterministic model will do; this one depends on the latent, the step and the timestep
    const velocity = (at: { step: number; timestep: number; latent: Tensor }) =>
      Promise.resolve(at.latent.data.map((x, i) => Math.sin(x + i) * (at.timestep / 1000) - 0.1 * at.step));
    const checkpoints: Float32Array[] = [];
    const full = await sample({
      shape: [16, 1, 2, 2],
      steps,
      flowShift: 3,
      seed: 42,
      velocity,
      onStep: ({ latent }) => checkpoints.push(latent),
    });
    expect(checkpoints).toHaveLength(steps);
    for (let k = 1; k < steps; k++) {
      const asked: number[] = [];
      const reported: number[] = [];
      const resumed = await sample({
        shape: [16, 1, 2, 2],
        steps,
        flowShift: 3,
        seed: 999, // the checkpoint, not the seed, is where a resumed job starts
        resume: { step: k, latent: checkpoints[k - 1] },
        velocity: async (at) => (asked.push(at.step), velocity(at)),
        onStep: ({ step }) => reported.push(step),
      });
      expect(asked, `resumed after ${k} steps`).toEqual(Array.from({ length: steps - k }, (_, i) => k + i));
      expect(reported, `resumed after ${k} steps`).toEqual(Array.from({ length: steps - k }, (_, i) => k + i + 1));
      expect(resumed.data, `resumed after ${k} steps`).toEqual(full.data);
    }
  });

  it('onStep reports steps 1…n in order, each with the latent the next step starts from and its duration', async () => {
    const asked: Float32Array[] = [];
    const done: { step: number; latent: Float32Array; stepMs: number }[] = [];
    await sample({
      shape: [1, 1, 1, 2],
      steps: 3,
      flowShift: 3,
      seed: 1,
      async velocity(at) {
        asked.push(at.latent.data);
        await new Promise((r) => setTimeout(r, 20));
        return f32(1, 1);
      },
      onStep: (d) => done.push(d),
    });
    expect(done.map((d) => d.step)).toEqual([1, 2, 3]);
    expect(asked[1]).toBe(done[0].latent);
    expect(asked[2]).toBe(done[1].latent);
    for (const d of done) {
      expect(d.stepMs, `step ${d.step}`).toBeGreaterThanOrEqual(15);
      expect(d.stepMs, `step ${d.step}`).toBeLessThan(5_000);
    }
  });

  it('an abort stops the loop before the next step: later velocities are never asked, and sample rejects with the abort reason', async () => {
    const controller = new AbortController();
    const asked: number[] = [];
    const stop = new Error('the user cancelled the job');
    const run = sample({
      shape: [1, 1, 1, 2],
      steps: 3,
      flowShift: 3,
      seed: 1,
      signal: controller.signal,
      velocity: (at) => (asked.push(at.step), Promise.resolve(f32(0, 0))),
      onStep: ({ step }) => step === 1 && controller.abort(stop),
    });
    await expect(run).rejects.toBe(stop);
    expect(asked).toEqual([0]);

    const never: number[] = [];
    await expect(
      sample({
        shape: [1],
        steps: 2,
        flowShift: 3,
        seed: 1,
        signal: AbortSignal.abort(stop),
        velocity: (at) => (never.push(at.step), Promise.resolve(f32(0))),
      }),
    ).rejects.toBe(stop);
    expect(never).toEqual([]);
  });
});
