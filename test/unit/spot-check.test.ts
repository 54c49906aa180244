import { describe, expect, it, vi } from 'vitest';
import { stringMatching } from './matchers.ts';
import { planUlysses } from '../../core/parallel.ts';
import type { HiddenState } from '../../core/model/blocks.ts';
import {
  catchProbability,
  checkedHiddenStates,
  checkedRows,
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

describe('spot checks of a pipeline stage (issue 35)', () => {
  // a stage of the plan's 3 ranks hands on its tokens' x [rows_r, dim] and, whole, temb [dim], tproj [6, dim] and
  // the context [2, dim]; a recomputation of the stage has every token's x and the same carried parts
  const dim = 2;
  const ramp = (n: number, from: number) => Float32Array.from({ length: n }, (_, i) => from + i);
  const whole: HiddenState = { x: truth, temb: ramp(dim, 5), tproj: ramp(6 * dim, -3), context: ramp(2 * dim, 0.5) };
  const handed = (x = truth, carried: Partial<HiddenState>[] = []) =>
    partsOf(x).map((part, r) => ({ ...whole, x: part, ...carried[r] }));

  it("measure each rank's tokens and each carried part against the recomputation, each relative to its own scale", () => {
    const stage = checkedHiddenStates(plan, handed(), { dim, textRows: 2, stage: 0 });
    expect(stage.differences(whole)).toEqual([0, 0, 0]);
    // a token of rank 1's: relative to x's scale (1: every |sin| is below it)
    expect(
      checkedHiddenStates(plan, handed(off(truth, 7, 0.25)), { dim, textRows: 2, stage: 0 }).differences(whole),
    ).toEqual([0, 0.25, 0]);
    // rank 2's tproj, whose largest magnitude is 8: 0.4 off is 0.05 of it
    const tproj = Object.assign(ramp(6 * dim, -3), { 11: 8.4 });
    const moved = checkedHiddenStates(plan, handed(truth, [{}, {}, { tproj }]), { dim, textRows: 2, stage: 1 });
    expect(moved.differences(whole).map((d) => d.toFixed(3))).toEqual(['0.000', '0.000', '0.050']);
    // rank 0's context, and its temb
    for (const part of ['context', 'temb'] as const) {
      const carried = [{ [part]: whole[part].map((v) => v * 2) }];
      expect(
        checkedHiddenStates(plan, handed(truth, carried), { dim, textRows: 2, stage: 0 }).differences(whole)[0],
      ).toBeGreaterThan(0.4);
    }
  });

  it('compare two recomputations over every token and every carried part, and name the stage in a verdict', () => {
    const stage = checkedHiddenStates(plan, handed(), { dim, textRows: 2, stage: 1 });
    expect(stage.between(whole, whole)).toBe(0);
    expect(stage.between(whole, { ...whole, x: off(truth, 11, 0.5) })).toBe(0.5);
    // relative to the second's scale: its context's largest is 3.85
    expect(stage.between(whole, { ...whole, context: whole.context.map((v) => v + 0.35) })).toBeCloseTo(0.35 / 3.85, 6);
    expect([stage.what, stage.of]).toEqual(['its outputs of pipeline stage 2', 'pipeline stage 2']);
  });

  it("take a recomputation only where it is one of every token: the stage's hidden state, or the last stage's rows", () => {
    const stage = checkedHiddenStates(plan, handed(), { dim, textRows: 2, stage: 0 });
    const none = new Float32Array(0);
    expect(stage.take({ rows: none, hidden: whole })).toEqual({ output: whole });
    expect(stage.take({ rows: none })).toEqual({ wrong: 'handed no hidden state on from its pipeline stage' });
    expect(stage.take({ rows: none, hidden: { ...whole, x: truth.subarray(2) } })).toEqual({
      wrong: 'its x has 10 values, not 6×2',
    });
    expect(stage.take({ rows: none, hidden: { ...whole, temb: Float32Array.of(1, NaN) } })).toEqual({
      wrong: 'its temb has NaN or infinite values',
    });
    const rows = checkedRows(plan, partsOf(truth), width);
    expect(rows.take({ rows: truth })).toEqual({ output: truth });
    expect(rows.take({ rows: truth.subarray(1) })).toEqual({ wrong: 'returned 11 values, not 6×2' });
    expect(rows.take({ rows: Float32Array.from(truth, (v, i) => (i ? v : Infinity)) })).toEqual({
      wrong: 'returned 12 values with NaN or infinite ones, not 6×2',
    });
  });
});

describe('spot checks, to the exact number', () => {
  it('never check at rate 0, even on a draw of exactly 0; a draw equal to the rate is not under it', () => {
    expect(spotCheckDraw(0, () => 0)({ step: 5, steps: 6 })).toBe(false);
    expect(spotCheckDraw(1 / 16, () => 1 / 16)({ step: 0, steps: 20 })).toBe(false);
    expect(spotCheckDraw(1 / 16, () => 1 / 16 - 2 ** -32)({ step: 0, steps: 20 })).toBe(true);
  });

  it('widen the tolerance as the transport coarsens: 2e-3 for floats, 8e-3 for int8, 3e-2 for int4', () => {
    expect(spotCheckTolerance('f32')).toBe(2e-3);
    expect(spotCheckTolerance('f16')).toBe(2e-3);
    expect(spotCheckTolerance('i8')).toBe(8e-3);
    expect(spotCheckTolerance('i4')).toBe(3e-2);
  });

  it('pick a checker from the ranks not out, by the draw; none when every rank is out', () => {
    expect(pickChecker(3, [0, 1, 2], () => 0)).toBeNull();
    expect(pickChecker(0, [], () => 0)).toBeNull();
    expect(pickChecker(5, [1, 3], () => 0)).toBe(0);
    expect(pickChecker(5, [1, 3], () => 0.5)).toBe(2);
    expect(pickChecker(5, [1, 3], () => 0.999)).toBe(4);
  });

  it('give the exact odds of a liar on forwards of unequal rates, uniform or last, and none for no lies or one rank', () => {
    // an honest checker half the time (world 2); escapes 0.5, 1, 0.75: the pairs escape 0.5, 0.375, 0.75
    expect(catchProbability([1, 0, 0.5], 2, 'uniform', 2)).toBeCloseTo(1 - 1.625 / 3, 12);
    expect(catchProbability([1, 0, 0.5], 1, 'uniform', 2)).toBeCloseTo(1 - 2.25 / 3, 12);
    expect(catchProbability([1, 0, 0.5], 1, 'last', 2)).toBeCloseTo(0.25, 12);
    expect(catchProbability([1, 0, 0.5], 2, 'last', 3)).toBeCloseTo(1 / 3, 12);
    expect(catchProbability([1, 0, 0.5], 3, 'uniform', 4)).toBeCloseTo(1 - 0.25 * 1 * 0.625, 12);
    expect(catchProbability([1, 0.5], 0, 'uniform', 3)).toBe(0);
    expect(catchProbability([1, 0.5], 0, 'last', 3)).toBe(0);
    expect(catchProbability([1, 1], 2, 'last', 1)).toBe(0); // a liar alone checks itself
    expect(catchProbability([], 0, 'uniform', 2)).toBe(0);
    // refused by its own check, saying so (not by an array of a negative or fractional length further on)
    for (const lies of [-1, 0.5, 3])
      expect(() => catchProbability([1, 1], lies, 'uniform', 2)).toThrow(
        new RangeError(`a liar lies on 0 to 2 forwards of this job, not ${lies}`),
      );
  });

  it('state the checks of every job shape: the final step checked, none for a job of no steps or at rate 0', () => {
    const odds = spotCheckOdds(DEFAULT_SPOT_CHECK_RATE, 20, 2, 3);
    expect(odds).toMatchObject({ rate: DEFAULT_SPOT_CHECK_RATE, finalStepsChecked: 1, meanRate: (19 / 16 + 1) / 20 });
    expect(odds.catchOneForward).toBeCloseTo(((19 / 16 + 1) / 20) * (2 / 3), 12);
    expect(odds.catchOneFinalForward).toBeCloseTo(2 / 3, 12);
    expect(spotCheckOdds(0.5, 0, 2, 3)).toEqual({
      rate: 0.5,
      finalStepsChecked: 0,
      meanRate: 0,
      catchOneForward: 0,
      catchOneFinalForward: 0,
    });
    expect(spotCheckOdds(0.5, 1, 1, 2)).toMatchObject({ finalStepsChecked: 1, meanRate: 1, catchOneForward: 0.5 });
    expect(forwardCheckRates(0.25, 3, 2)).toEqual([0.25, 0.25, 0.25, 0.25, 1, 1]);
  });

  it('measure rows relative to the largest magnitude of the recomputation, or to 1 where all are smaller', () => {
    const two = planUlysses({ numHeads: 4, headDim: 4 }, 2, 2); // a token each
    expect(
      rowDifferences(two, [Float32Array.of(0, 1), Float32Array.of(-4, 0)], Float32Array.of(0, 0, -4, 0), 2),
    ).toEqual([0.25, 0]);
    expect(rowDifferences(two, [Float32Array.of(0.5), Float32Array.of(0)], Float32Array.of(0.25, 0), 1)).toEqual([
      0.25, 0,
    ]);
  });

  // tokens 3/2/1, one value a token; the checker's rows have scale 1, every difference a power of 2
  const rows = (...at: [number, number][]) => {
    const r = Float32Array.of(1, 0, 0, 0, 0, 0);
    for (const [i, v] of at) r[i] = v;
    return r;
  };
  const parts = (r: Float32Array) => [r.slice(0, 3), r.slice(3, 5), r.slice(5, 6)];
  const judge = (group: Float32Array, checker: Float32Array, third: Float32Array | null, checkerRank = 0) =>
    judgeSpotCheck(
      plan,
      [4, 5, 6],
      parts(group),
      1,
      { rank: checkerRank, rows: checker },
      third && { rank: 1, rows: third },
      0.25,
    );

  it('count a difference of exactly the tolerance as within it, for the group, the recomputations and the third alike', () => {
    expect(judge(rows([3, 0.25]), rows(), null)).toEqual({ difference: 0.25, verdict: 'agreed' });
    // the recomputations agree at exactly the tolerance: the rank alone goes
    expect(judge(rows([3, 0.5]), rows(), rows([5, 0.25])).verdict).toMatchObject({ convicted: [5] });
    // the group agrees with the third at exactly the tolerance: the checker alone goes
    expect(judge(rows(), rows([3, 0.5]), rows([5, 0.25])).verdict).toMatchObject({ convicted: [0] });
  });

  it('say why in words: what differed, by how much, and who recomputed it', () => {
    const what = 'its rows of the pass differ from a recomputation by 5.0e-1 of their scale';
    expect(judge(rows([3, 0.5]), rows(), null)).toEqual({
      difference: 0.5,
      verdict: {
        convicted: [5, 0],
        why: `${what}, and no third rank could say whether the recomputation (rank 0) or the rank was wrong: both are let go`,
      },
    });
    expect(judge(rows([3, 0.5]), rows(), null, 5)).toEqual({
      difference: 0.5,
      verdict: {
        convicted: [5],
        why: `${what}, and no third rank could say whether the recomputation (rank 5) or the rank was wrong: it recomputed its own`,
      },
    });
    expect(judge(rows([3, 0.5]), rows(), rows()).verdict).toEqual({
      convicted: [5],
      why: `${what} (ranks 0 and 1 recomputed it alike)`,
    });
    expect(judge(rows(), rows([3, 0.5]), rows()).verdict).toEqual({
      convicted: [0],
      why: "its recomputation of the pass disagreed with its group and with rank 1's",
    });
    expect(judge(rows([3, 1]), rows([5, 0.5]), rows()).verdict).toEqual({
      convicted: [5, 0],
      why:
        'its rows of the pass differ from a recomputation by 1.0e+0 of their scale, and the recomputations of ranks 0 and 1 disagree too: ' +
        'both the rank and the first checker are let go',
    });
    expect(judge(rows([3, 0.5]), rows(), rows([5, 1]), 5)).toEqual({
      difference: 0.5,
      verdict: {
        convicted: [5],
        why: "its rows of the pass and its own recomputation of it disagree with each other and with rank 1's",
      },
    });
  });
});
