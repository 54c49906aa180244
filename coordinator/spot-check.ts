// Spot checks (issue 18): a volunteer's tab can return rows of the right size, finite and plausible,
// and wrong; no check of shapes or finiteness sees that. Now and then the coordinator has another
// rank recompute a forward pass alone — every token, from the same latent, timestep and text — and
// compares each rank's rows with it. Where they disagree, a third rank recomputes it too: the two
// recomputations agreeing convicts the rank whose rows differ most; the third agreeing with the
// group convicts the checker; with no third rank to ask, checker and suspect both go (one of the
// two lies). A rank that alters only what it sends its peers corrupts every rank's rows: that is
// caught all the same (the group disagrees with two recomputations) but blamed on the rank whose
// rows differ most, which may be a victim: the step is re-run without it either way.
import type { DType } from '../core/net/protocol.ts';
import { tokenStart, type UlyssesPlan } from '../core/parallel.ts';

/** forwards checked, on average: one in sixteen (a constant cheat is caught within sixteen forwards) */
export const DEFAULT_SPOT_CHECK_RATE = 1 / 16;
/**
 * How far a rank's rows may be from a recomputation (made alone, so exact), relative to the rows' scale: the coarser
 * the transport's values, the further honest rows stray, so the wider the bound (and the larger a cheat it misses).
 */
export function spotCheckTolerance(dtype: DType): number {
  return dtype === 'i4' ? 3e-2 : dtype === 'i8' ? 8e-3 : 2e-3;
}

/**
 * Which forwards to check at `rate`: every ⌈1/rate⌉-th one from a random start, so a rank cannot
 * tell a checked forward from another and a cheat that lasts that many forwards is caught.
 * 0: none.
 */
export function spotCheckSchedule(rate: number, random: () => number = Math.random): (forward: number) => boolean {
  if (!(rate >= 0 && rate <= 1)) throw new RangeError(`a spot-check rate is between 0 and 1, got ${rate}`);
  if (rate === 0) return () => false;
  const period = Math.max(1, Math.round(1 / rate));
  const phase = Math.floor(random() * period);
  return (forward) => (forward + phase) % period === 0;
}

/**
 * A rank to recompute a forward, or to decide a disagreement: any of the `world` ranks but `out`,
 * at random, so a rank cannot tell whether it will be its own judge. Null when none is left.
 */
export function pickChecker(world: number, out: number[], random: () => number = Math.random): number | null {
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
  /** global ranks: who recomputed, and who decided where that disagreed */
  checker: number;
  third: number | null;
  /** the largest difference of a rank's rows from the checker's, relative to their scale */
  difference: number;
  verdict: 'agreed' | { convicted: number[]; why: string };
  ms: number;
}

/**
 * What a check found: the group's parts against the checker's rows and, where those disagree, a
 * third rank's. `ranks` are the group's global ranks in plan order.
 */
export function judgeSpotCheck(
  plan: UlyssesPlan,
  ranks: number[],
  parts: Float32Array[],
  width: number,
  checker: { rank: number; rows: Float32Array },
  third: { rank: number; rows: Float32Array } | null,
  tolerance: number,
): Pick<SpotCheck, 'difference' | 'verdict'> {
  const byChecker = rowDifferences(plan, parts, checker.rows, width);
  const difference = Math.max(...byChecker);
  if (difference <= tolerance) return { difference, verdict: 'agreed' };
  const suspect = ranks[byChecker.indexOf(difference)];
  const what = `its rows of the pass differ from a recomputation by ${difference.toExponential(1)} of their scale`;
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
  const recomputationsAgree =
    Math.max(...rowDifferences({ ...plan, degree: 1, rows: [plan.tokens] }, [third.rows], checker.rows, width)) <=
    tolerance;
  if (recomputationsAgree)
    return {
      difference,
      verdict: { convicted: [suspect], why: `${what} (ranks ${checker.rank} and ${third.rank} recomputed it alike)` },
    };
  const groupAgreesWithThird = Math.max(...rowDifferences(plan, parts, third.rows, width)) <= tolerance;
  if (groupAgreesWithThird)
    return {
      difference,
      verdict: {
        convicted: [checker.rank],
        why: `its recomputation of the pass disagreed with its group and with rank ${third.rank}'s`,
      },
    };
  if (suspect === checker.rank)
    return {
      difference,
      verdict: {
        convicted: [suspect],
        why:
          'its rows of the pass and its own recomputation of it disagree with each other ' +
          `and with rank ${third.rank}'s`,
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
