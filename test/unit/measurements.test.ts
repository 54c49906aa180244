import { describe, expect, it } from 'vitest';
import {
  MEASUREMENT_MAX_AGE_MS,
  Measurements,
  type MeasurementStorage,
  type WorkerGroup,
} from '../../coordinator/measurements.ts';

const groupOf = (...members: WorkerGroup['members']): WorkerGroup => ({
  modelUrl: '/models/tiny-wan',
  ep: 'wasm',
  shape: [1, 16, 1, 8, 8],
  members,
});
const run = { ulyssesDegree: 2, cfgParallel: false, heads: null, mode: 'ulysses', bytesPerElement: 4 } as const;
const probes = { wasm: { ep: 'wasm', flops: 1e9, softmaxRate: 1e8, stageMs: 2 } } as const;

/** a dashboard's storage, and a clock its measurements are aged by */
function dashboard() {
  let kept: string | null = null;
  const storage: MeasurementStorage = { read: () => kept, write: (json) => void (kept = json) };
  const clock = { now: 1_000_000 };
  /** the dashboard (re)loaded: its measurements, from what the storage kept */
  const load = () => {
    const m = new Measurements(() => clock.now);
    m.keepIn(storage);
    return m;
  };
  return { storage, clock, load };
}

describe('measurements by browser', () => {
  it("a group's rehearsal and measured step are found by its members' browsers and threads, whatever their pages' peer ids", () => {
    const m = new Measurements();
    m.setRehearsal(
      groupOf({ id: 'p0', browser: 'b0', threads: 2 }, { id: 'p1', browser: 'b1', threads: 2 }),
      2,
      [1, 2],
    );
    m.recordStep(groupOf({ id: 'p0', browser: 'b0', threads: 2 }), run, 0.5);
    // p1's tab reloaded: it joined again as p2
    expect(
      m.rehearsal(groupOf({ id: 'p0', browser: 'b0', threads: 2 }, { id: 'p2', browser: 'b1', threads: 2 }), 2),
    ).toEqual([1, 2]);
    expect(m.measuredStep(groupOf({ id: 'p9', browser: 'b0', threads: 2 }), run)).toBe(0.5);
    // another share of its cores, or a page that says no browser, is another worker
    expect(
      m.rehearsal(groupOf({ id: 'p0', browser: 'b0', threads: 2 }, { id: 'p2', browser: 'b1', threads: 1 }), 2),
    ).toBeUndefined();
    m.setRehearsal(groupOf({ id: 'p3', threads: 1 }), 1, [1]);
    expect(m.rehearsal(groupOf({ id: 'p4', threads: 1 }), 1)).toBeUndefined();
    expect(m.rehearsal(groupOf({ id: 'p3', threads: 1 }), 1)).toEqual([1]);
  });

  it("a worker's buffer limit is its browser's", () => {
    const m = new Measurements();
    m.setMaxBufferBytes({ id: 'p0', browser: 'b0' }, 1000);
    expect(m.maxBufferBytes({ id: 'p1', browser: 'b0' })).toBe(1000);
    expect(m.maxBufferBytes({ id: 'p1' })).toBeUndefined();
  });
});

describe("measurements kept across the dashboard's reloads", () => {
  it('a reloaded dashboard finds the rehearsals, steps, buffers and compute probes measured before it', () => {
    const { load } = dashboard();
    const before = load();
    const group = groupOf({ id: 'p0', browser: 'b0', threads: 2 });
    before.setRehearsal(group, 1, [0.25]);
    before.recordStep(group, run, 0.5);
    before.setMaxBufferBytes({ id: 'p0', browser: 'b0' }, 1 << 28);
    before.setCompute('b0', 2, probes);
    const after = load();
    expect(after.rehearsal(group, 1)).toEqual([0.25]);
    expect(after.measuredStep(group, run)).toBe(0.5);
    expect(after.maxBufferBytes({ id: 'p1', browser: 'b0' })).toBe(1 << 28);
    expect(after.computeOf('b0', 2)).toEqual(probes);
    expect(after.computeOf('b0', 1)).toBeUndefined();
  });

  it('a measurement a day old is none: not taken, not restored, and dropped from the storage', () => {
    const { storage, clock, load } = dashboard();
    const before = load();
    before.setCompute('b0', 2, probes);
    clock.now += MEASUREMENT_MAX_AGE_MS - 1;
    before.setCompute('b1', 2, probes);
    expect(load().computeOf('b0', 2)).toEqual(probes);
    clock.now += 1;
    expect(before.computeOf('b0', 2)).toBeUndefined();
    const after = load();
    expect([after.computeOf('b0', 2), after.computeOf('b1', 2)]).toEqual([undefined, probes]);
    expect(storage.read()).not.toContain('"b0"');
  });

  it('what a storage holds that is not a measurement is skipped, and an unreadable storage is measured again', () => {
    const measurementsFrom = (kept: string) => {
      const m = new Measurements(() => 0);
      m.keepIn({ read: () => kept, write: () => {} });
      return m;
    };
    const key = JSON.stringify(['b0', 2]);
    expect(measurementsFrom('not json').computeOf('b0', 2)).toBeUndefined();
    expect(
      measurementsFrom(JSON.stringify({ compute: [[key, 0, { wasm: { flops: 'fast' } }]] })).computeOf('b0', 2),
    ).toBeUndefined();
    expect(measurementsFrom(JSON.stringify({ compute: [[key, 0, probes]] })).computeOf('b0', 2)).toEqual(probes);
  });

  it('a storage that refuses to keep them costs nothing but the next reload', () => {
    const m = new Measurements();
    m.keepIn({
      read: () => null,
      write: () => {
        throw new Error('quota exceeded');
      },
    });
    m.setCompute('b0', 1, probes);
    expect(m.computeOf('b0', 1)).toEqual(probes);
  });
});
