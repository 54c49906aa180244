import { describe, expect, it, vi } from 'vitest';
import { stringMatching } from './matchers.ts';
import { planUlysses } from '../../core/parallel.ts';
import {
  catchProbability,
  DEFAULT_SPOT_CHECK_RATE,
  forwardCheckRates,
  judgeSpotCheck,
  pickChecker,
  rowDifferences,
  secureRandom,
  spotCheckDraw,
  spotCheckOdds,
  spotCheckRate,
  spotCheckTolerance,
} from '../../coordinator/spot-check.ts';

// The spot checks' arithmetic (issue 18): which forwards are checked, and who is convicted when a
// recomputation disagrees. The executor's use of it, over real ranks, is in executor.test.ts.
const plan = planUlysses({ numHeads: 12, headDim: 4 }, 6, [6, 4, 2]); // tokens 3/2/1
const width = 2;
const truth = Float32Array.from({ length: 6 * width }, (_, i) => Math.sin(i));
const partsOf = (rows: Float32Array) => [rows.slice(0, 6), rows.slice(6, 10), rows.slice(10, 12)];
const off = (rows: Float32Array, at: number, by = 0.05) => Object.assign(rows.slice(), { [at]: rows[at] + by });

describe('spot checks', () => {
  it('check each forward on its own draw from the CSPRNG, at the rate, and every forward of the final step; rate 0 checks none', () => {
    expect([0, 10, 18, 19].map((step) => spotCheckRate(1 / 16, step, 20))).toEqual([1 / 16, 1 / 16, 1 / 16, 1]);
    expect(spotCheckRate(1 / 16, 19)).toBe(1 / 16); // a job of unknown length: the rate throughout
    expect(spotCheckRate(0, 19, 20)).toBe(0);
    // one draw per forward, compared with that forward's rate: no period, no phase
    const draws = [0.5, 0.01, 0.07, 0.06, 0.999];
    const due = spotCheckDraw(1 / 16, () => draws.shift() ?? 0);
    const forwards = [0, 0, 1, 1, 19].map((step) => due({ step, steps: 20 }));
    expect(forwards).toEqual([false, true, false, true, true]);
    expect(Array.from({ length: 100 }, (_, step) => step).some((step) => spotCheckDraw(0)({ step, steps: 100 }))).toBe(
      false,
    );
    expect(Array.from({ length: 3 }, (_, step) => step).every((step) => spotCheckDraw(1)({ step }))).toBe(true);
    expect(() => spotCheckDraw(1.5)).toThrow(/between 0 and 1/);
    expect(() => spotCheckRate(-1, 0, 1)).toThrow(/between 0 and 1/);
  });

  it('draw from crypto.getRandomValues, forwards and checkers alike: about the rate, unconditional passes too, with no period', () => {
    const cryptoDraw = vi.spyOn(crypto, 'getRandomValues').mockImplementation((a: ArrayBufferView) => {
      (a as unknown as Uint32Array).fill(3 * 2 ** 30);
      return a;
    });
    expect(secureRandom()).toBe(0.75);
    expect(pickChecker(4, [])).toBe(3);
    expect(spotCheckDraw(0.7)({ step: 0 })).toBe(false);
    expect(spotCheckDraw(0.8)({ step: 0 })).toBe(true);
    cryptoDraw.mockRestore();
    const drawn = Array.from({ length: 4000 }, secureRandom);
    expect(drawn.every((x) => x >= 0 && x < 1)).toBe(true);
    // about 1/16 of forwards, with both passes of a step checked independently
    const due = spotCheckDraw(1 / 16);
    const checked = Array.from({ length: 16_000 }, (_, f) => due({ step: f >> 1, steps: 1e6 }));
    const share = checked.filter(Boolean).length / checked.length;
    expect(share).toBeGreaterThan(0.055);
    expect(share).toBeLessThan(0.07);
    expect(checked.some((c, f) => c && f % 2 === 1)).toBe(true); // unconditional passes are checked too
    const gaps = checked.flatMap((c, f) => (c ? [f] : [])).map((f, i, all) => (i ? f - all[i - 1] : f));
    expect(new Set(gaps).size).toBeGreaterThan(10); // no period
    const chosen = new Set(Array.from({ length: 200 }, () => pickChecker(4, [1])));
    expect([...chosen].sort()).toEqual([0, 2, 3]);
  });

  it('give the chance a liar lying on k forwards is convicted, as a Monte Carlo of the real draws finds it', () => {
    // a seeded stand-in for the CSPRNG, so the simulation is reproducible
    let seed = 12345;
    const random = () => {
      seed = (seed + 0x6d2b79f5) | 0;
      let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
    };
    const steps = 20;
    const passes = 2;
    const jobs = 20_000;
    for (const [world, lies, chosen] of [
      [2, 1, 'uniform'],
      [3, 1, 'uniform'],
      [3, 3, 'uniform'],
      [4, 2, 'last'],
      [2, 6, 'uniform'],
    ] as const) {
      const liar = world - 1;
      let caught = 0;
      for (let job = 0; job < jobs; job++) {
        const forwards = Array.from({ length: steps * passes }, (_, f) => f);
        if (chosen === 'uniform')
          for (let i = forwards.length - 1; i > 0; i--) {
            const j = Math.floor(random() * (i + 1));
            [forwards[i], forwards[j]] = [forwards[j], forwards[i]];
          }
        const lied = new Set(chosen === 'uniform' ? forwards.slice(0, lies) : forwards.slice(-lies));
        // the job as the executor runs it: a draw per forward, then a checker drawn among all ranks
        const due = spotCheckDraw(DEFAULT_SPOT_CHECK_RATE, random);
        let convicted = false;
        for (let f = 0; f < steps * passes; f++)
          if (due({ step: Math.floor(f / passes), steps }) && pickChecker(world, [], random) !== liar && lied.has(f))
            convicted = true;
        if (convicted) caught++;
      }
      const p = catchProbability(forwardCheckRates(DEFAULT_SPOT_CHECK_RATE, steps, passes), lies, chosen, world);
      const sigma = Math.sqrt((p * (1 - p)) / jobs);
      expect(Math.abs(caught / jobs - p)).toBeLessThan(4 * sigma);
    }
  });

  it('state the default odds: the mean rate (the overhead) stays under 15% and the final step is always checked', () => {
    const odds = spotCheckOdds(DEFAULT_SPOT_CHECK_RATE, 20, 2, 3);
    expect(odds.meanRate).toBeCloseTo((19 / 16 + 1) / 20, 12);
    expect(odds.meanRate).toBeLessThanOrEqual(0.15);
    expect(odds.catchOneForward).toBeCloseTo(odds.meanRate * (2 / 3), 12);
    expect(odds.catchOneFinalForward).toBeCloseTo(2 / 3, 12);
    expect(spotCheckOdds(DEFAULT_SPOT_CHECK_RATE, 20, 2, 1)).toMatchObject({ meanRate: 0, catchOneForward: 0 });
    expect(spotCheckOdds(0, 20, 1, 4)).toMatchObject({ meanRate: 0, finalStepsChecked: 0, catchOneFinalForward: 0 });
    // two lies on the last step's two forwards, rate 1 there: escaped only if the liar checks both itself
    expect(catchProbability([0, 0, 1, 1], 2, 'last', 2)).toBeCloseTo(3 / 4, 12);
    expect(catchProbability([0.5, 0.5, 0.5], 2, 'uniform', 2)).toBeCloseTo(1 - 0.75 ** 2, 12);
    expect(() => catchProbability([0.5], 2, 'uniform', 2)).toThrow(/0 to 1 forwards/);
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
