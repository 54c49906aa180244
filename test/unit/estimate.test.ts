import { describe, expect, it } from 'vitest';
import {
  CONFIRM_FROM_MS,
  describeEstimate,
  describeLeft,
  estimateJob,
  formatDuration,
  needsConfirmation,
  PhaseRates,
  timeLeft,
  type JobDemand,
  type JobEstimate,
} from '../../coordinator/estimate.ts';
import type { PromptEncoding } from '../../coordinator/text-encoding.ts';

const demand: JobDemand = {
  steps: 20,
  stepMs: 500,
  promptTokens: [12, 3],
  loadBytes: 4e9,
  decodedValues: 16 * 3 * 8 * 8,
};

/**
 * What a finished job measured: a prompt of 12 tokens in 600 ms, 41 s of placing as it loaded 4 GB a rank, 3072 latent
 * values decoded in 3 s.
 */
function finished(loadBytes = 4e9): Parameters<PhaseRates['record']>[0] {
  const encoded: PromptEncoding = { source: 'encoded', tokens: 12, truncated: false, ms: 600, layers: [], checks: [] };
  return {
    encoding: { prompt: encoded, negativePrompt: { ...encoded, source: 'cache', ms: 1 } },
    phasesMs: { encoding: 601, placing: 41_000, denoising: 10_000, decoding: 3_000, muxing: 5 },
    latentShape: [16, 3, 8, 8],
    decoding: {},
    estimate: { phasesMs: {} as JobEstimate['phasesMs'], knownMs: 0, unmeasured: [], loadBytes },
  };
}

describe('job estimates (issue 36)', () => {
  it('a new pipeline predicts the steps alone and names each phase it has not measured; after a job, every phase', () => {
    const rates = new PhaseRates();
    const first = estimateJob(demand, rates);
    expect(first.phasesMs).toEqual({ encoding: null, placing: null, denoising: 10_000, decoding: null });
    expect(first.knownMs).toBe(10_000);
    expect(first.unmeasured).toEqual([
      'encoding: no prompt was encoded here yet',
      'placing: no job here has loaded this model yet',
      'decoding: no job of this model has decoded here yet',
    ]);
    expect(describeEstimate(first)).toMatch(/^at least 10 s \(not counted: encoding: .*; placing: .*; decoding: /);

    rates.record(finished());
    const second = estimateJob(demand, rates);
    // 50 ms a token (not the cached prompt's); the placing of a job that loaded as many bytes; ~1 ms a latent value
    expect(second.phasesMs).toEqual({ encoding: 750, placing: 41_000, denoising: 10_000, decoding: 3_000 });
    expect(second.unmeasured).toEqual([]);
    expect(second.knownMs).toBe(54_750);
    expect(describeEstimate(second)).toBe('about 55 s');
    // a job whose workers hold the model places as the last such job did: none yet, then 2 s
    const held = { ...demand, loadBytes: 0 };
    expect(estimateJob(held, rates).unmeasured).toEqual([
      'placing: no job here was placed on workers holding this model yet',
    ]);
    rates.record({ ...finished(0), phasesMs: { ...finished().phasesMs, placing: 2_000 } });
    expect(estimateJob(held, rates).phasesMs.placing).toBe(2_000);
    // and one that loads half the bytes places in half the time
    expect(estimateJob({ ...demand, loadBytes: 2e9 }, rates).phasesMs.placing).toBe(20_500);
  });

  it('what a job measured is saved, and a pipeline made from it (a reload, the next run of generate) starts from it; junk saved is measured again', () => {
    let saved: string | null = null;
    new PhaseRates(null, (json) => (saved = json)).record(finished());
    const restored = new PhaseRates(saved);
    expect(estimateJob(demand, restored).unmeasured).toEqual([]);
    expect(restored).toMatchObject({
      encodingMsPerToken: 50,
      placingMsPerLoadedByte: 41_000 / 4e9,
      placingHeldMs: null,
      decodingMsPerValue: 3_000 / 3072,
    });
    for (const junk of [
      'not json',
      '7',
      '{"encodingMsPerToken":"fast","loadingMsPerByte":-1,"decodingMsPerValue":null}',
    ])
      expect(estimateJob(demand, new PhaseRates(junk)).unmeasured).toHaveLength(3);
  });

  it('a phase the job does not need costs nothing and is not asked to be measured; a step with no prediction says why', () => {
    const none = estimateJob(
      { steps: 4, stepMs: 'no worker has joined yet', promptTokens: [0, 0], loadBytes: 0, decodedValues: 0 },
      new PhaseRates(),
    );
    expect(none.phasesMs).toEqual({ encoding: 0, placing: null, denoising: null, decoding: 0 });
    expect(none.unmeasured).toEqual([
      'placing: no job here was placed on workers holding this model yet',
      'denoising: no worker has joined yet',
    ]);
  });

  it('what is left: the current phase less its time so far, and every later one; at least that while one is unmeasured', () => {
    const rates = new PhaseRates();
    rates.record(finished());
    const estimate = estimateJob(demand, rates);
    expect(timeLeft(estimate, 'encoding', 0)).toEqual({ ms: 54_750, atLeast: false });
    expect(timeLeft(estimate, 'placing', 10_000)).toEqual({ ms: 31_000 + 10_000 + 3_000, atLeast: false });
    // a phase that overruns its estimate leaves the later ones, not less
    expect(timeLeft(estimate, 'denoising', 60_000)).toEqual({ ms: 3_000, atLeast: false });
    expect(timeLeft(estimate, 'muxing', 500)).toEqual({ ms: 0, atLeast: false });
    expect(describeLeft(timeLeft(estimate, 'placing', 10_000))).toBe('about 44 s left');
    expect(describeLeft(timeLeft(estimate, 'muxing', 500))).toBe('nearly done');
    const first = estimateJob(demand, new PhaseRates());
    expect(timeLeft(first, 'placing', 0)).toEqual({ ms: 10_000, atLeast: true });
    expect(describeLeft(timeLeft(first, 'placing', 0))).toBe('at least 10 s left');
    expect(describeLeft(timeLeft(first, 'decoding', 0))).toBe('time left not measured yet');
    // past the last unmeasured phase, the figure is the whole of what is left
    const decodedBefore = estimateJob({ ...demand, decodedValues: 0 }, new PhaseRates());
    expect(timeLeft(decodedBefore, 'denoising', 4_000)).toEqual({ ms: 6_000, atLeast: false });
  });

  it('a job whose predicted part passes an hour asks to be confirmed; durations read as a person says them', () => {
    const hours = (stepMs: number) => estimateJob({ ...demand, stepMs, steps: 50 }, new PhaseRates());
    expect(needsConfirmation(hours(CONFIRM_FROM_MS / 50 + 1))).toBe(true);
    expect(needsConfirmation(hours(CONFIRM_FROM_MS / 50 - 1))).toBe(false);
    expect(formatDuration(1234)).toBe('1.2 s');
    expect(formatDuration(59_400)).toBe('59 s');
    expect(formatDuration(59_600)).toBe('1 min 0 s');
    expect(formatDuration(200_000)).toBe('3 min 20 s');
    expect(formatDuration(2 * 3600_000 + 5 * 60_000)).toBe('2 h 5 min');
    expect(formatDuration(3.1 * 86_400_000)).toBe('3.1 days');
  });
});
