import { describe, expect, it } from 'vitest';
import type { ResolvedPlacement } from '../../coordinator/placement.ts';
import { timeoutsOf } from '../../coordinator/planner.ts';
import { RankLayout } from '../../core/parallel.ts';
import type { DType } from '../../core/net/protocol.ts';
import { summarizeReport, type KeptReport } from '../../app/views/report-summary.ts';
import { EXACT_SETTINGS } from './in-process-executor.ts';

// The dashboard's status line reads the placement the planner decided and names each transport
// in the planner's words (TRANSPORTS), so an int4 job is never called int8 again.
const placement = (dtype: DType, parallel: 'ulysses' | 'displaced' = 'displaced'): ResolvedPlacement => ({
  backend: 'swarm',
  modelUrl: '/models/tiny-wan',
  loras: [],
  weightType: null,
  layout: new RankLayout(2),
  workers: [
    { id: 'a', ep: 'wasm' },
    { id: 'b', ep: 'wasm' },
  ],
  ep: 'auto',
  settings: { ...EXACT_SETTINGS, dtype, parallel },
  warmupSteps: 2,
  spotChecks: { rate: 0, tolerance: 3e-2 },
  untrustedAlone: 'stop',
  timeouts: timeoutsOf(),
  prediction: null,
  cfgFallback: null,
  stages: null,
  pipeFusion: null,
  cache: null,
});

/** The fields of a report the status line reads; the rest does not matter to it. */
const report = (p: ResolvedPlacement | undefined): KeptReport =>
  ({
    config: { frames: 9, backend: 'swarm' },
    placement: p,
    totalMs: 1000,
    failures: [],
    workers: [{ ep: 'wasm', threads: 1 }],
    steps: [],
    medianStepMs: 100,
  }) as unknown as KeptReport;

describe("the dashboard's status line of a finished job", () => {
  it('names each transport as it goes on the wire: int4 is int4, int8 is int8, float16 is float16', () => {
    const said = (dtype: DType) => summarizeReport(7, report(placement(dtype)));
    expect(said('i4')).toContain('Activations went between ranks as int4 with a float32 scale per 64 values');
    expect(said('i4')).not.toContain('int8');
    expect(said('i8')).toContain('as int8 with a float32 scale per 64 values, not exact float32');
    expect(said('f16')).toContain('as float16, not exact float32');
    expect(said('f32')).not.toContain('Activations went');
  });

  it('says the ranks and mode from the placement, and keeps to what a report an older version kept has', () => {
    expect(summarizeReport(7, report(placement('f32')))).toMatch(
      /^#7 done: 9 frames in 1\.0 s on 2 swarm ranks, each on WASM on 1 thread\. Displaced: past 2 exact steps/,
    );
    const staged: ResolvedPlacement = {
      ...placement('f32', 'ulysses'),
      layout: new RankLayout(1, 1, null, 2),
      stages: [
        { blocks: [0, 1], workers: ['a'], heldBytes: 7 },
        { blocks: [1, 2], workers: ['b'], heldBytes: 4 },
      ],
    };
    expect(summarizeReport(7, report(staged))).toContain(
      "Pooled memory: the blocks in 2 pipeline stages (0–0 on a; 1–1 on b), each worker holding its stage's weights alone.",
    );
    expect(summarizeReport(7, report(placement('f32')))).not.toContain('Pooled');
    // each of a staged job's checks is of one stage of a forward
    const check = { step: 0, pass: 0, checker: 1, third: null, difference: 0, verdict: 'agreed' as const, ms: 1 };
    const checked = (spotChecks: KeptReport['spotChecks']) => summarizeReport(7, { ...report(staged), spotChecks });
    expect(checked([0, 1].map((stage) => ({ ...check, stage })))).toContain(
      " 2 forwards' pipeline stage(s) recomputed to spot-check the workers, all agreed.",
    );
    expect(checked([check])).toContain(' 1 forward(s) recomputed to spot-check the workers, all agreed.');
    expect(summarizeReport(7, report(undefined))).toBe(
      '#7 done: 9 frames in 1.0 s on swarm ranks, each on WASM on 1 thread.',
    );
  });

  it('says which worker was given the fewest heads, why, and what would give it more; nothing of even shares (issue 66)', () => {
    const uneven = { ...placement('f32', 'ulysses'), layout: new RankLayout(2, 1, [[3, 9]]) };
    expect(summarizeReport(7, report(uneven))).toContain(
      ' Worker a was given 3 of the 12 heads: its forward was the slowest when rehearsed; on more of its cores ' +
        '(fewer tabs beside it) or on WebGPU, it would be given more.',
    );
    const even = { ...placement('f32', 'ulysses'), layout: new RankLayout(2, 1, [[6, 6]]) };
    expect(summarizeReport(7, report(even))).not.toContain('was given');
  });

  it("says which workers look like one machine and share its cores, in the planner's words (issue 66)", () => {
    const note =
      'workers a and b look like one machine (their pages see the same cores, memory, OS, time zone and adapter) ' +
      'and share its 2 cores: with 4 threads between them each computes at about 50% of its speed alone';
    const prediction = {
      asked: true,
      by: 'asked for',
      link: { bandwidth: 1e7, latency: 1e-3, from: 'coordinator links' as const },
      predictedStepMs: 800,
      oneWorkerStepMs: 700,
      leftOut: null,
    };
    const shared = {
      ...placement('f32', 'ulysses'),
      prediction: { ...prediction, sharedCores: { workers: ['a', 'b'], note } },
    };
    expect(summarizeReport(7, report(shared))).toContain(
      ' Workers a and b look like one machine (their pages see the same cores, memory, OS, time zone and adapter) ' +
        'and share its 2 cores: with 4 threads between them each computes at about 50% of its speed alone.',
    );
    const apart = { ...placement('f32', 'ulysses'), prediction: { ...prediction, sharedCores: null } };
    expect(summarizeReport(7, report(apart))).not.toContain('one machine');
    // a placement an older version kept says nothing of shared cores
    const older = { ...placement('f32', 'ulysses'), prediction } as unknown as ResolvedPlacement;
    expect(summarizeReport(7, report(older))).toContain('measured 0.10 s (the median step).');
  });

  it("names each worker's device: a tab's WebGPU or WASM, a process's CPU, CUDA or Dawn's WebGPU", () => {
    const on = (workers: { ep: string; threads: number; nativeDevice?: string }[]) =>
      summarizeReport(7, { ...report(undefined), workers } as unknown as KeptReport);
    expect(
      on([
        { ep: 'wasm', threads: 2, nativeDevice: 'cpu' },
        { ep: 'wasm', threads: 1, nativeDevice: 'cuda' },
        { ep: 'wasm', threads: 1, nativeDevice: 'webgpu' },
        { ep: 'webgpu', threads: 1 },
        { ep: 'wasm', threads: 1 },
      ]),
    ).toBe(
      '#7 done: 9 frames in 1.0 s on swarm ranks, each on CPU on 2 threads, CUDA on 1 thread, ' +
        'WebGPU (Dawn) on 1 thread, WebGPU on 1 thread, WASM on 1 thread.',
    );
  });
});
