import { describe, expect, it } from 'vitest';
import { checkJobParams, DEFAULT_JOB, FEW_STEP_SAMPLING, jobParams } from '../../core/job.ts';
import { EULER, jobSolver, sample, scheduleOf, STEP_DISTILL } from '../../core/sampler.ts';
import { WanStepDistillScheduler } from '../../core/schedulers/wan-step-distill-scheduler.ts';

describe("few-step sampling: lightx2v's WanStepDistillScheduler", () => {
  it('4 steps at shift 5 start from the grid points 1000, 750, 500, 250, their sigmas x/1000 shifted, and end at 0', () => {
    const scheduler = new WanStepDistillScheduler({ shift: 5, numTrainTimesteps: 1000 });
    scheduler.setTimesteps(4);
    expect(scheduler.denoisingStepList).toEqual([1000, 750, 500, 250]);
    // 5s / (1 + 4s) at s = 1, 0.75, 0.5, 0.25
    const expected = [1, 0.9375, 2.5 / 3, 0.625];
    scheduler.sigmas.slice(0, 4).forEach((s, i) => expect(s).toBeCloseTo(expected[i], 12));
    expect(scheduler.sigmas[4]).toBe(0);
    scheduler.timesteps.forEach((t, i) => expect(t).toBeCloseTo(1000 * expected[i], 9));
    // its scheduler's own spacing for a step count a config does not list: 1000 // steps apart
    scheduler.setTimesteps(3);
    expect(scheduler.denoisingStepList).toEqual([1000, 667, 334]);
    // the folder's Euler at 4 steps ends near sigma 0 by its last step; this one jumps from 0.625 to 0
    expect(scheduleOf(EULER, 4, 5).sigmas[3]).toBeLessThan(0.01);
  });

  it('each step is Euler from its sigma to the next, so a constant velocity v takes the noise x to x − v', async () => {
    const v = Float32Array.of(0.5, -2, 3);
    const latent = await sample({
      shape: [3],
      steps: 4,
      flowShift: 5,
      seed: 7,
      solver: STEP_DISTILL,
      velocity: () => Promise.resolve(v),
    });
    const noise = await sample({
      shape: [3],
      steps: 1,
      flowShift: 5,
      seed: 7,
      velocity: () => Promise.resolve(new Float32Array(3)),
    });
    latent.data.forEach((x, i) => expect(x).toBeCloseTo(noise.data[i] - v[i], 5));
  });

  it('a job asks it by its scheduler field, the fast preset among its settings; anything else is refused naming the field', () => {
    expect(jobSolver(EULER, DEFAULT_JOB)).toBe(EULER);
    expect(jobSolver(EULER, jobParams(FEW_STEP_SAMPLING))).toBe(STEP_DISTILL);
    expect(jobParams(FEW_STEP_SAMPLING)).toMatchObject({ steps: 4, guidance: 1, flowShift: 5 });
    expect(checkJobParams({ scheduler: 'lcm' })).toEqual({ scheduler: 'is folder or step-distill, got "lcm"' });
  });
});
