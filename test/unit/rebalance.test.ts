import { describe, expect, it } from 'vitest';
import {
  judgeShares,
  MAX_REBALANCES,
  REBALANCE_GAIN,
  shouldRebalance,
  SLOW_STEPS,
} from '../../coordinator/rebalance.ts';

describe('a slow rank keeps its job with a smaller share (coordinator/rebalance.ts)', () => {
  it('shares the heads by heads per ms, and predicts the step from the slowest rank before and after', () => {
    // 6 heads in 120 ms against 6 in 480: 4× slower, 10/2 of 12 heads, the step 480 → 200 ms
    expect(judgeShares([6, 6], [120, 480])).toEqual({ heads: [10, 2], gain: 2.4, slowest: 1 });
    // already shared by speed: nothing to gain
    expect(judgeShares([10, 2], [200, 160])).toEqual({ heads: [10, 2], gain: 1, slowest: 0 });
    // a rank faster than its share takes more: speed, not order, decides
    expect(judgeShares([2, 10], [20, 100]).heads).toEqual([6, 6]);
  });

  it('judges nothing from a step it cannot read: a rank that reported no time, or reports of another degree', () => {
    expect(judgeShares([6, 6], [0, 480])).toEqual({ heads: [6, 6], gain: 1, slowest: null });
    expect(judgeShares([6, 6], [120, Number.NaN])).toEqual({ heads: [6, 6], gain: 1, slowest: null });
    expect(judgeShares([6, 6], [120])).toEqual({ heads: [6, 6], gain: 1, slowest: null });
  });

  it(`changes shares only after ${SLOW_STEPS} steps in a row each gaining ${REBALANCE_GAIN}× with the same rank slowest, at most ${MAX_REBALANCES} times a job, while the steps left win back a re-placement`, () => {
    const slow = (...gains: number[]) => gains.map((gain) => ({ gain, slowest: 1 }));
    expect(shouldRebalance(slow(2.4), 0, 10), 'one slow step is a hiccup').toBe(false);
    expect(shouldRebalance(slow(2.4, 2.4), 0, 10)).toBe(true);
    expect(shouldRebalance(slow(2.4, 1.1), 0, 10), 'the slowness passed').toBe(false);
    expect(shouldRebalance(slow(2.4, 1.1, 2.4), 0, 10), 'not in a row').toBe(false);
    expect(
      shouldRebalance(
        [
          { gain: 2.4, slowest: 0 },
          { gain: 2.4, slowest: 1 },
        ],
        0,
        10,
      ),
      'the load moved from tab to tab',
    ).toBe(false);
    expect(shouldRebalance([{ gain: 2.4, slowest: null }, ...slow(2.4)], 0, 10), 'a step it could not read').toBe(
      false,
    );
    expect(shouldRebalance(slow(REBALANCE_GAIN, REBALANCE_GAIN), 0, 10)).toBe(true);
    expect(shouldRebalance(slow(REBALANCE_GAIN * 0.99, 2.4), 0, 10)).toBe(false);
    expect(shouldRebalance(slow(2.4, 2.4), MAX_REBALANCES, 10)).toBe(false);
    expect(shouldRebalance(slow(2.4, 2.4), MAX_REBALANCES - 1, 10)).toBe(true);
    // a step of 1 becomes 1/2.4: each step left saves 0.58, the re-placement costs about 1
    expect(shouldRebalance(slow(2.4, 2.4), 0, 1)).toBe(false);
    expect(shouldRebalance(slow(2.4, 2.4), 0, 2)).toBe(true);
  });
});
