import { describe, expect, it } from 'vitest';
import { checkJobParams, DEFAULT_JOB, jobParams, JobParamsError, LIMITS } from '../../core/job.ts';
import { latentShape, wan21Latent } from '../../core/model/family.ts';
import { initialNoise } from '../../core/sampler.ts';
import { flowMatchSchedule } from '../../core/schedulers/flow-match-euler-discrete-scheduler.ts';

/** What a user may ask for, and how the sampler starts from it. */
describe('job parameters', () => {
  it('the defaults are a valid job', () => {
    expect(checkJobParams({})).toEqual({});
    expect(jobParams({})).toEqual(DEFAULT_JOB);
    expect(jobParams({ frames: 17, height: 96, width: 128 })).toMatchObject({
      frames: 17,
      height: 96,
      width: 128,
      steps: DEFAULT_JOB.steps,
    });
  });

  it('each bad field yields an error naming only that field, with a suggestion where one exists', () => {
    const cases: [Record<string, unknown>, string, string][] = [
      [{ frames: 8 }, 'frames', 'must be 4k+1 (1, 5, 9, 13, …), got 8; try 9'],
      [{ frames: 15 }, 'frames', 'must be 4k+1 (1, 5, 9, 13, …), got 15; try 17'],
      [{ frames: 125 }, 'frames', 'must be between 1 and 121, got 125'],
      [{ height: 100 }, 'height', 'must be a multiple of 16, got 100; try 96'],
      [{ width: 72 }, 'width', 'must be a multiple of 16, got 72; try 80'],
      [{ width: 8 }, 'width', 'must be between 16 and 1280, got 8'],
      [{ steps: 0 }, 'steps', 'must be between 1 and 100, got 0'],
      [{ steps: 2.5 }, 'steps', 'must be a whole number, got 2.5'],
      [{ seed: -1 }, 'seed', 'must be between 0 and 4294967295, got -1'],
      [{ seed: '42' }, 'seed', 'must be a whole number, got "42"'],
      [{ prompt: '' }, 'prompt', 'is empty; describe the video you want'],
      [{ prompt: '   \n' }, 'prompt', 'is empty; describe the video you want'],
      [{ prompt: 'x'.repeat(LIMITS.promptChars + 1) }, 'prompt', 'is 2001 characters; at most 2000'],
      [{ negativePrompt: 'x'.repeat(2500) }, 'negativePrompt', 'is 2500 characters; at most 2000'],
      [{ guidance: 21 }, 'guidance', 'must be between 0 and 20, got 21'],
      [{ flowShift: 0 }, 'flowShift', 'must be between 0.1 and 20, got 0'],
    ];
    for (const [input, field, message] of cases) {
      expect(checkJobParams(input), JSON.stringify(input).slice(0, 40)).toEqual({ [field]: message });
    }
  });

  it('a guidance of NaN or Infinity is rejected as not a number', () => {
    for (const guidance of [Number.NaN, Number.POSITIVE_INFINITY]) {
      const errors = checkJobParams({ guidance });
      expect(Object.keys(errors)).toEqual(['guidance']);
      expect(errors.guidance).toMatch(/^must be a number, got /);
    }
  });

  it('jobParams throws a JobParamsError listing every bad field by name', () => {
    let error: unknown;
    try {
      jobParams({ frames: 8, steps: 0, prompt: '' });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(JobParamsError);
    const { fields, message } = error as JobParamsError;
    expect(Object.keys(fields).sort()).toEqual(['frames', 'prompt', 'steps']);
    expect(message).toContain('frames: must be 4k+1 (1, 5, 9, 13, …), got 8; try 9');
    expect(message).toContain('steps: must be between 1 and 100, got 0');
    expect(message).toContain('prompt: is empty; describe the video you want');
  });

  it('the latent of 17 frames at 96×96 is [16, 5, 12, 12]: 4 frames per latent frame after the first, 8× smaller', () => {
    expect(latentShape({ frames: 17, height: 96, width: 96 }, wan21Latent(16))).toEqual([16, 5, 12, 12]);
    expect(latentShape({ frames: 1, height: 64, width: 128 }, wan21Latent(16))).toEqual([16, 1, 8, 16]);
    expect(latentShape(DEFAULT_JOB, wan21Latent(16))).toEqual([16, 3, 8, 8]);
  });
});

describe('flow-matching schedule', () => {
  it('4 steps with shift 3 start at sigma 1, end at 0, decrease strictly, and give timesteps of sigma·1000', () => {
    const { sigmas, timesteps } = flowMatchSchedule(4, 3);
    expect(sigmas).toHaveLength(5);
    expect(sigmas[0]).toBe(1);
    expect(sigmas[4]).toBe(0);
    for (let i = 1; i < sigmas.length; i++) expect(sigmas[i], `sigma ${i}`).toBeLessThan(sigmas[i - 1]);
    // unshifted sigmas run linearly from 1 to 1/1000; the shift maps s to 3s / (1 + 2s)
    const shifted = (s: number) => (3 * s) / (1 + 2 * s);
    expect(sigmas[1]).toBeCloseTo(shifted(1 - 0.999 / 3), 12);
    expect(sigmas[3]).toBeCloseTo(shifted(0.001), 12);
    expect(sigmas[3]).toBeCloseTo(0.002994, 6);
    expect(timesteps).toHaveLength(4);
    timesteps.forEach((t, i) => expect(t).toBeCloseTo(sigmas[i] * 1000, 9));
    expect(timesteps[0]).toBe(1000);
  });

  it('one step goes straight from sigma 1 to 0', () => {
    expect(flowMatchSchedule(1, 3)).toEqual({ sigmas: [1, 0], timesteps: [1000] });
  });
});

describe('initial noise', () => {
  it('is the same for the same seed and different for another', () => {
    const a = initialNoise([16, 1, 4, 4], 42);
    const b = initialNoise([16, 1, 4, 4], 42);
    const c = initialNoise([16, 1, 4, 4], 43);
    expect(a.shape).toEqual([16, 1, 4, 4]);
    expect(a.data).toHaveLength(256);
    expect(Array.from(b.data)).toEqual(Array.from(a.data));
    const differing = a.data.filter((x, i) => x !== c.data[i]).length;
    expect(differing).toBe(256);
  });

  it('is standard normal: mean ≈ 0 and std ≈ 1 over 10 000 samples', () => {
    const { data } = initialNoise([10_000], 7);
    const mean = data.reduce((s, x) => s + x, 0) / data.length;
    const std = Math.sqrt(data.reduce((s, x) => s + (x - mean) ** 2, 0) / data.length);
    expect(Math.abs(mean)).toBeLessThan(0.03); // 3 standard errors
    expect(Math.abs(std - 1)).toBeLessThan(0.03);
  });
});
