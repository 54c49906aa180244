import { describe, expect, it } from 'vitest';
import { stringMatching } from './matchers.ts';
import { planUlysses } from '../../core/parallel.ts';
import { judgeSpotCheck, rowDifferences, spotCheckSchedule, spotCheckTolerance } from '../../coordinator/spot-check.ts';

// The spot checks' arithmetic (issue 18): which forwards are checked, and who is convicted when a
// recomputation disagrees. The executor's use of it, over real ranks, is in executor.test.ts.
const plan = planUlysses({ numHeads: 12, headDim: 4 }, 6, [6, 4, 2]); // tokens 3/2/1
const width = 2;
const truth = Float32Array.from({ length: 6 * width }, (_, i) => Math.sin(i));
const partsOf = (rows: Float32Array) => [rows.slice(0, 6), rows.slice(6, 10), rows.slice(10, 12)];
const off = (rows: Float32Array, at: number, by = 0.05) => Object.assign(rows.slice(), { [at]: rows[at] + by });

describe('spot checks', () => {
  it('check every ⌈1/rate⌉-th forward from a random start, so a cheat lasting that long is caught; rate 0 checks none', () => {
    for (const start of [0, 0.5, 0.99]) {
      const due = spotCheckSchedule(1 / 16, () => start);
      const checked = Array.from({ length: 64 }, (_, f) => f).filter(due);
      expect(checked).toHaveLength(4);
      expect(checked[1] - checked[0]).toBe(16);
      expect(checked[0]).toBeLessThan(16);
    }
    expect(Array.from({ length: 100 }, (_, f) => f).some(spotCheckSchedule(0))).toBe(false);
    expect(Array.from({ length: 3 }, (_, f) => f).every(spotCheckSchedule(1))).toBe(true);
    expect(() => spotCheckSchedule(1.5)).toThrow(/between 0 and 1/);
  });

  it("measure each rank's rows against a recomputation, relative to its scale", () => {
    expect(rowDifferences(plan, partsOf(truth), truth, width)).toEqual([0, 0, 0]);
    const d = rowDifferences(plan, partsOf(off(truth, 7)), truth, width);
    expect(d[1]).toBeCloseTo(0.05 / Math.max(...truth.map(Math.abs), 1), 6);
    expect([d[0], d[2]]).toEqual([0, 0]);
  });

  const TOLERANCE = spotCheckTolerance('f32');

  it('agree within the tolerance; convict the rank whose rows two recomputations contradict, the checker whom the group and a third contradict, and both where no third can say', () => {
    const ranks = [4, 5, 6];
    const checker = { rank: 0, rows: truth };
    expect(
      judgeSpotCheck(plan, ranks, partsOf(off(truth, 3, TOLERANCE / 2)), width, checker, null, TOLERANCE).verdict,
    ).toBe('agreed');
    const cheated = partsOf(off(truth, 7)); // rank 5's rows
    expect(
      judgeSpotCheck(plan, ranks, cheated, width, checker, { rank: 1, rows: truth }, TOLERANCE).verdict,
    ).toMatchObject({ convicted: [5] });
    expect(
      judgeSpotCheck(
        plan,
        ranks,
        partsOf(truth),
        width,
        { rank: 0, rows: off(truth, 0) },
        { rank: 1, rows: truth },
        TOLERANCE,
      ).verdict,
    ).toMatchObject({ convicted: [0] });
    expect(judgeSpotCheck(plan, ranks, cheated, width, checker, null, TOLERANCE).verdict).toMatchObject({
      convicted: [5, 0],
      why: stringMatching(/no third rank/),
    });
    expect(
      judgeSpotCheck(plan, ranks, cheated, width, checker, { rank: 1, rows: off(truth, 11) }, TOLERANCE).verdict,
    ).toMatchObject({ convicted: [5, 0] });
    // a cheat that checks itself: its rows and its recomputation disagree with each other and with a third
    expect(
      judgeSpotCheck(plan, ranks, cheated, width, { rank: 5, rows: off(truth, 6) }, { rank: 4, rows: truth }, TOLERANCE)
        .verdict,
    ).toMatchObject({ convicted: [5], why: stringMatching(/its own recomputation/) });
  });
});
