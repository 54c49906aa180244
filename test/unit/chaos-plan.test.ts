import { describe, expect, it } from 'vitest';
import {
  compareLatents,
  explainingFault,
  FAULT_KINDS,
  FAULT_PHASES,
  HOLD_MS,
  jobVariants,
  landingPoint,
  parseSwarmNotice,
  planFaults,
  REPLACE_AFTER_MS,
  seededRandom,
  SLOW_SHARE,
  THAW_GRACE_MS,
  type LandedFault,
} from '../../bench/chaos-plan.ts';

describe('the chaos soak’s seeded fault schedule', () => {
  it('is the same for the same seed and differs for another', () => {
    const a = planFaults({ jobs: 12, faultsPerJob: 2, seed: 7 });
    expect(planFaults({ jobs: 12, faultsPerJob: 2, seed: 7 })).toEqual(a);
    expect(planFaults({ jobs: 12, faultsPerJob: 2, seed: 8 })).not.toEqual(a);
    expect(seededRandom(3)()).toBe(seededRandom(3)());
  });

  it('gives each job its faults, within the bounds each field has', () => {
    const plan = planFaults({ jobs: 5, faultsPerJob: 3, seed: 1 });
    expect(plan.map((faults) => faults.length)).toEqual([3, 3, 3, 3, 3]);
    for (const [job, faults] of plan.entries())
      for (const f of faults) {
        expect(f.job).toBe(job);
        for (const fraction of [f.at, f.target]) expect(fraction >= 0 && fraction < 1).toBe(true);
        expect(f.holdMs).toBeGreaterThanOrEqual(HOLD_MS.min);
        expect(f.holdMs).toBeLessThanOrEqual(HOLD_MS.max);
        expect(f.share).toBeGreaterThanOrEqual(SLOW_SHARE.min);
        expect(f.share).toBeLessThanOrEqual(SLOW_SHARE.max);
        expect(f.replaceAfterMs).toBeGreaterThanOrEqual(REPLACE_AFTER_MS.min);
        expect(f.replaceAfterMs).toBeLessThanOrEqual(REPLACE_AFTER_MS.max);
      }
  });

  it('deals every kind in every phase once per deck, so one deck of faults covers them all', () => {
    const pairs = FAULT_KINDS.length * FAULT_PHASES.length;
    const plan = planFaults({ jobs: pairs, faultsPerJob: 1, seed: 42 }).flat();
    const seen = new Set(plan.map((f) => `${f.kind}/${f.phase}`));
    expect(seen.size).toBe(pairs);
    // two decks: each pair exactly twice
    const twice = planFaults({ jobs: pairs, faultsPerJob: 2, seed: 42 }).flat();
    const counts = new Map<string, number>();
    for (const f of twice) counts.set(`${f.kind}/${f.phase}`, (counts.get(`${f.kind}/${f.phase}`) ?? 0) + 1);
    expect([...counts.values()]).toEqual(Array<number>(pairs).fill(2));
  });

  it('makes distinct, reproducible job variants from the demo grammar', () => {
    const variants = jobVariants(4, 9);
    expect(jobVariants(4, 9)).toEqual(variants);
    expect(new Set(variants.map((v) => v.prompt)).size).toBe(4);
    expect(new Set(variants.map((v) => v.seed)).size).toBe(4);
  });
});

describe('where a fault lands in its phase', () => {
  const expected = { phaseMs: 1000, steps: 8, stepMs: 100 };
  it('lands denoising faults at a step and a delay into it', () => {
    expect(landingPoint({ phase: 'denoising', at: 0 }, expected)).toEqual({ afterStep: 0, delayMs: 0 });
    expect(landingPoint({ phase: 'denoising', at: 0.5625 }, expected)).toEqual({ afterStep: 4, delayMs: 50 });
    // never after the last step has begun
    expect(landingPoint({ phase: 'denoising', at: 0.9999 }, expected).afterStep).toBe(7);
  });
  it('lands the other phases at a share of their length', () => {
    expect(landingPoint({ phase: 'placing', at: 0.25 }, expected)).toEqual({ afterStep: 0, delayMs: 250 });
    expect(landingPoint({ phase: 'decoding', at: 0 }, expected)).toEqual({ afterStep: 0, delayMs: 0 });
  });
});

describe('a latent against its uninterrupted run', () => {
  it('is identical only when every byte is', () => {
    const a = new Float32Array([1, 2, 3]);
    expect(compareLatents(a, new Float32Array([1, 2, 3]))).toEqual({ identical: true, maxAbs: 0 });
    expect(compareLatents(a, new Float32Array([1, 2.5, 3]))).toEqual({ identical: false, maxAbs: 0.5 });
    // −0 equals 0 in value but is another result
    expect(compareLatents(new Float32Array([0]), new Float32Array([-0]))).toEqual({ identical: false, maxAbs: 0 });
  });
  it('says NaN when either holds one, and refuses latents of different sizes', () => {
    expect(compareLatents(new Float32Array([1, NaN]), new Float32Array([1, 1])).maxAbs).toBeNaN();
    expect(() => compareLatents(new Float32Array(2), new Float32Array(3))).toThrow(/2 and 3 values/);
  });
});

describe('the swarm’s departures', () => {
  it('reads the dashboard’s event lines', () => {
    expect(parseSwarmNotice('Worker abc123 left: no heartbeat for 3.6 s.')).toEqual({
      type: 'leave',
      workerSuffix: 'abc123',
      reason: 'no heartbeat for 3.6 s',
    });
    expect(parseSwarmNotice('Refused def456: it was banned from this swarm for lying (x).')).toEqual({
      type: 'refused',
      workerSuffix: 'def456',
      reason: 'it was banned from this swarm for lying (x)',
    });
    expect(parseSwarmNotice('The old worker link is revoked: share the new one.')).toBeNull();
  });

  const fault = (kind: LandedFault['kind'], endedAt: number | null = null): LandedFault => ({
    kind,
    worker: 'w1',
    landedAt: 1_000,
    endedAt,
  });
  it('puts a closed, crashed or reloaded tab’s departure down to its fault', () => {
    for (const kind of ['kill', 'crash', 'reload'] as const) {
      expect(explainingFault('w1', 2_000, [fault(kind)])?.kind).toBe(kind);
      // not before the fault, nor another worker's
      expect(explainingFault('w1', 500, [fault(kind)])).toBeNull();
      expect(explainingFault('w2', 2_000, [fault(kind)])).toBeNull();
    }
  });
  it('puts a frozen tab’s departure down to the freeze while frozen and shortly after the thaw', () => {
    expect(explainingFault('w1', 5_000, [fault('freeze')])?.kind).toBe('freeze');
    expect(explainingFault('w1', 3_000 + THAW_GRACE_MS, [fault('freeze', 3_000)])?.kind).toBe('freeze');
    expect(explainingFault('w1', 3_001 + THAW_GRACE_MS, [fault('freeze', 3_000)])).toBeNull();
  });
  it('never puts a departure down to slowness: a slow worker is an honest one let go', () => {
    expect(explainingFault('w1', 2_000, [fault('slow')])).toBeNull();
    // a thaw long past does not explain it either
    const late = 2_000 + THAW_GRACE_MS;
    expect(explainingFault('w1', late, [fault('slow', late - 100), fault('freeze', 1_200)])).toBeNull();
  });
});
