// Spot checks (issue 18): a volunteer's tab can return rows of the right size, finite and plausible,
// and wrong; no check of shapes or finiteness sees that. Now and then the coordinator has another
// rank recompute a forward pass alone — every token, from the same latent, timestep and text — and
// compares each rank's rows with it. Which forwards, and which rank, come from a secret CSPRNG draw
// per forward (issue 33): a rank that knows every past check knows nothing of the next. Where they
// disagree, a third rank recomputes it too: the two recomputations agreeing convicts the rank whose
// rows differ most; the third agreeing with the group convicts the checker; with no third rank to
// ask, checker and suspect both go (one of the two lies). A rank that alters only what it sends its
// peers corrupts every rank's rows: that is caught all the same (the group disagrees with two
// recomputations) but blamed on the rank whose rows differ most, which may be a victim: the step is
// re-run without it either way.
import type { DType } from '../core/net/protocol.ts';
import { hiddenStateError, type HiddenState } from '../core/model/blocks.ts';
import type { Recomputed } from '../core/worker-api.ts';
import { tokenStart, type UlyssesPlan } from '../core/parallel.ts';

/** the share of forwards checked before the final steps: a constant cheat is seen within sixteen forwards on average */
export const DEFAULT_SPOT_CHECK_RATE = 1 / 16;
/**
 * How many of a job's last steps have every forward checked (at any rate but 0): a lie there goes into the video as
 * sent, with no later step to carry it off.
 */
export const FINAL_STEPS_CHECKED = 1;

/** A draw in [0, 1) from the browser's CSPRNG: nothing a rank sees of the job tells it the next draw. */
export function secureRandom(): number {
  return crypto.getRandomValues(new Uint32Array(1))[0] / 2 ** 32;
}

function checkRate(rate: number): void {
  if (!(rate >= 0 && rate <= 1)) throw new RangeError(`a spot-check rate is between 0 and 1, got ${rate}`);
}

/**
 * The chance that a forward of `step` (of a job of `steps`, where known) is checked, at the placement's `rate`:
 * the rate, and every forward of the final steps. 0: none.
 */
export function spotCheckRate(rate: number, step: number, steps?: number): number {
  checkRate(rate);
  if (rate === 0) return 0;
  return steps !== undefined && step >= steps - FINAL_STEPS_CHECKED ? 1 : rate;
}

/**
 * Whether to check a forward, drawn for each forward alone (each pass of a step too) from `random`, a secret
 * CSPRNG's: a rank that saw every past check knows nothing more of the next.
 */
export function spotCheckDraw(
  rate: number,
  random: () => number = secureRandom,
): (forward: { step: number; steps?: number }) => boolean {
  checkRate(rate);
  return ({ step, steps }) => random() < spotCheckRate(rate, step, steps);
}

/** Each forward's chance of a check in a job of `steps` steps of `passes` passes each, in the order they run. */
export function forwardCheckRates(rate: number, steps: number, passes: number): number[] {
  return Array.from({ length: steps * passes }, (_, f) => spotCheckRate(rate, Math.floor(f / passes), steps));
}

/**
 * The probability that a liar among `world` ranks, lying on `lies` forwards of a job whose forwards are checked at
 * `rates`, is convicted: some forward it lied on is checked, by a rank other than itself (pickChecker draws from all
 * `world`; a liar recomputing its own lie agrees with it). Its lies are `chosen` uniformly among the forwards, or are
 * the last ones. Assumes every lie is beyond the tolerance and the other ranks honest.
 */
export function catchProbability(rates: number[], lies: number, chosen: 'uniform' | 'last', world: number): number {
  if (!(Number.isInteger(lies) && lies >= 0 && lies <= rates.length))
    throw new RangeError(`a liar lies on 0 to ${rates.length} forwards of this job, not ${lies}`);
  // Stryker disable next-line ConditionalExpression,EqualityOperator: jobs have ranks; at 1 (world − 1)/world is 0
  const honestChecker = world > 1 ? (world - 1) / world : 0;
  const escapes = rates.map((r) => 1 - r * honestChecker); // a lie on that forward goes unseen
  if (chosen === 'last') return 1 - escapes.slice(rates.length - lies).reduce((p, e) => p * e, 1);
  // the mean over all sets of `lies` forwards of the product of their escapes: the elementary symmetric polynomial
  // of degree `lies` over the number of such sets, each built up forward by forward
  let sums = [1, ...new Array<number>(lies).fill(0)]; // sums[j]: over the sets of j of the forwards so far
  let sets = [1, ...new Array<number>(lies).fill(0)];
  for (const e of escapes) {
    sums = sums.map((s, j) => (j ? s + sums[j - 1] * e : s));
    sets = sets.map((c, j) => (j ? c + sets[j - 1] : c));
  }
  return 1 - sums[lies] / sets[lies];
}

/** What a job's checks cost and catch, as its report states it. */
export interface SpotCheckOdds {
  /** the placement's rate: the chance a forward before the final steps is checked */
  rate: number;
  /** every forward of these last steps is checked (at any rate but 0) */
  finalStepsChecked: number;
  /** forwards recomputed per forward of the job, on average: the checks' share of the job's compute */
  meanRate: number;
  /** the chance a liar lying on one forward, chosen uniformly, is convicted */
  catchOneForward: number;
  /** the chance a liar lying on one forward of the last step is convicted */
  catchOneFinalForward: number;
}

/** The odds of a job of `steps` steps of `passes` passes on `world` ranks whose placement checks at `rate`. */
export function spotCheckOdds(rate: number, steps: number, passes: number, world: number): SpotCheckOdds {
  const rates = forwardCheckRates(rate, steps, passes);
  const checks = world > 1 ? rates : rates.map(() => 0); // one rank: nobody to check it
  return {
    rate,
    finalStepsChecked: rate > 0 ? Math.min(FINAL_STEPS_CHECKED, steps) : 0,
    meanRate: checks.reduce((a, r) => a + r, 0) / Math.max(1, checks.length),
    catchOneForward: catchProbability(checks, Math.min(1, checks.length), 'uniform', world),
    catchOneFinalForward: catchProbability(checks, Math.min(1, checks.length), 'last', world),
  };
}

/**
 * How far a rank's rows may be from a recomputation (made alone, so exact), relative to the rows' scale: the coarser
 * the transport's values, the further honest rows stray, so the wider the bound (and the larger a cheat it misses).
 */
export function spotCheckTolerance(dtype: DType): number {
  return dtype === 'i4' ? 3e-2 : dtype === 'i8' ? 8e-3 : 2e-3;
}

/**
 * A rank to recompute a forward, or to decide a disagreement: any of the `world` ranks but `out`,
 * drawn from the CSPRNG, so a rank cannot tell whether it will be its own judge. Null when none is left.
 */
export function pickChecker(world: number, out: number[], random: () => number = secureRandom): number | null {
  const free = Array.from({ length: world }, (_, r) => r).filter((r) => !out.includes(r));
  return free.length ? free[Math.floor(random() * free.length)] : null;
}

/** Per rank of the plan, how far its token rows are from `reference` [S, width], relative to the reference's scale. */
export function rowDifferences(
  plan: UlyssesPlan,
  parts: Float32Array[],
  reference: Float32Array,
  width: number,
): number[] {
  const scale = Math.max(
    1,
    reference.reduce((m, v) => Math.max(m, Math.abs(v)), 0),
  );
  return parts.map((part, rank) => {
    const start = tokenStart(plan, rank) * width;
    let worst = 0;
    for (let i = 0; i < plan.rows[rank] * width; i++) worst = Math.max(worst, Math.abs(part[i] - reference[start + i]));
    return worst / scale;
  });
}

export interface SpotCheck {
  step: number;
  pass: number;
  /** the pipeline stage checked (its index in `placement.stages`), where the placement has stages */
  stage?: number;
  /** global ranks: who recomputed, and who decided where that disagreed */
  checker: number;
  third: number | null;
  /** the largest difference of a rank's rows from the checker's, relative to their scale */
  difference: number;
  verdict: 'agreed' | { convicted: number[]; why: string };
  /** where the rows were wrong: what the group's signed receipts of its exchanges showed (exchange-evidence.ts) */
  receipts?: string;
  ms: number;
}

/**
 * What a checked group's ranks computed, to be judged against a recomputation of type T made alone: `what` names it
 * in a verdict ("its rows of the pass"), `of` what was recomputed ("the pass"), `take` reads a recompute's reply as
 * one (or says why it is none), `differences` says per rank (in plan order) how far its part is from a recomputation,
 * and `between` how far one recomputation is from another, each relative to its scale.
 */
export interface CheckedOutputs<T> {
  what: string;
  of: string;
  take(reply: Pick<Recomputed, 'rows' | 'hidden'>): { output: T } | { wrong: string };
  differences(recomputed: T): number[];
  between(a: T, b: T): number;
}

/** The group's rows of a forward [rows_r, width] each, against recomputations of every token [S, width]. */
export function checkedRows(plan: UlyssesPlan, parts: Float32Array[], width: number): CheckedOutputs<Float32Array> {
  const alone = { ...plan, degree: 1, rows: [plan.tokens] };
  return {
    what: 'its rows of the pass',
    of: 'the pass',
    take: ({ rows }) => {
      const finite = rows.every(Number.isFinite);
      if (rows.length === plan.tokens * width && finite) return { output: rows };
      const nonFinite = finite ? '' : ' with NaN or infinite ones';
      return { wrong: `returned ${rows.length} values${nonFinite}, not ${plan.tokens}×${width}` };
    },
    differences: (recomputed) => rowDifferences(plan, parts, recomputed, width),
    between: (a, b) => Math.max(...rowDifferences(alone, [a], b, width)),
  };
}

/**
 * The hidden states a pipeline stage's ranks handed on after `stage` (its index), against recomputations of every
 * token (over a text of `textRows` rows): each rank's tokens of x, and the timestep's and text's embeddings it carries
 * whole, each part relative to its own scale.
 */
export function checkedHiddenStates(
  plan: UlyssesPlan,
  parts: HiddenState[],
  { dim, textRows, stage }: { dim: number; textRows: number; stage: number },
): CheckedOutputs<HiddenState> {
  const alone = { ...plan, degree: 1, rows: [plan.tokens] };
  const carried = ['temb', 'tproj', 'context'] as const;
  const apart = (a: HiddenState, b: HiddenState) =>
    Math.max(...carried.map((part) => rowDifferences({ ...alone, rows: [1] }, [a[part]], b[part], a[part].length)[0]));
  return {
    what: `its outputs of pipeline stage ${stage + 1}`,
    of: `pipeline stage ${stage + 1}`,
    take: ({ hidden }) => {
      if (!hidden) return { wrong: 'handed no hidden state on from its pipeline stage' };
      const wrong = hiddenStateError({ dim }, hidden, plan.tokens, textRows);
      return wrong ? { wrong } : { output: hidden };
    },
    differences: (recomputed) => {
      const xs = rowDifferences(
        plan,
        parts.map((p) => p.x),
        recomputed.x,
        dim,
      );
      return parts.map((part, rank) => Math.max(xs[rank], apart(part, recomputed)));
    },
    between: (a, b) => Math.max(rowDifferences(alone, [a.x], b.x, dim)[0], apart(a, b)),
  };
}

/**
 * What a check found: the group's outputs against the checker's recomputation and, where those disagree, a third
 * rank's. `ranks` are the group's global ranks in plan order.
 */
export function judgeOutputs<T>(
  ranks: number[],
  outputs: CheckedOutputs<T>,
  checker: { rank: number; output: T },
  third: { rank: number; output: T } | null,
  tolerance: number,
): Pick<SpotCheck, 'difference' | 'verdict'> {
  const byChecker = outputs.differences(checker.output);
  const difference = Math.max(...byChecker);
  if (difference <= tolerance) return { difference, verdict: 'agreed' };
  const suspect = ranks[byChecker.indexOf(difference)];
  const what = `${outputs.what} differ from a recomputation by ${difference.toExponential(1)} of their scale`;
  if (!third)
    return {
      difference,
      verdict: {
        convicted: suspect === checker.rank ? [suspect] : [suspect, checker.rank],
        why:
          `${what}, and no third rank could say whether the recomputation (rank ${checker.rank}) or the rank was ` +
          `wrong: ${suspect === checker.rank ? 'it recomputed its own' : 'both are let go'}`,
      },
    };
  const recomputationsAgree = outputs.between(third.output, checker.output) <= tolerance;
  if (recomputationsAgree)
    return {
      difference,
      verdict: { convicted: [suspect], why: `${what} (ranks ${checker.rank} and ${third.rank} recomputed it alike)` },
    };
  const groupAgreesWithThird = Math.max(...outputs.differences(third.output)) <= tolerance;
  if (groupAgreesWithThird)
    return {
      difference,
      verdict: {
        convicted: [checker.rank],
        why: `its recomputation of ${outputs.of} disagreed with its group and with rank ${third.rank}'s`,
      },
    };
  if (suspect === checker.rank)
    return {
      difference,
      verdict: {
        convicted: [suspect],
        why: `${outputs.what} and its own recomputation of it disagree with each other and with rank ${third.rank}'s`,
      },
    };
  return {
    difference,
    verdict: {
      convicted: [suspect, checker.rank],
      why:
        `${what}, and the recomputations of ranks ${checker.rank} and ${third.rank} disagree too: ` +
        'both the rank and the first checker are let go',
    },
  };
}

/** judgeOutputs of a group's rows of a forward (checkedRows). */
export function judgeSpotCheck(
  plan: UlyssesPlan,
  ranks: number[],
  parts: Float32Array[],
  width: number,
  checker: { rank: number; rows: Float32Array },
  third: { rank: number; rows: Float32Array } | null,
  tolerance: number,
): Pick<SpotCheck, 'difference' | 'verdict'> {
  const recomputed = (r: { rank: number; rows: Float32Array }) => ({ rank: r.rank, output: r.rows });
  return judgeOutputs(
    ranks,
    checkedRows(plan, parts, width),
    recomputed(checker),
    third && recomputed(third),
    tolerance,
  );
}
