// A slow worker keeps its job with a smaller share: after each step the coordinator weighs how long
// each rank computed for its heads, and where sharing the heads by those speeds would make the step
// markedly shorter, step after step, the job is placed again on the same workers with shares by
// measured speed (Placer.rebalance). Shares do not change what a forward computes, only who computes
// which heads, so the latent stays the same; a worker is let go only when it stops making progress
// (call-watch.ts), never for being slow.
import { proportionalShares } from '../core/parallel.ts';

/** how much shorter a step must get, by the steps' measured speeds, for the shares to change */
export const REBALANCE_GAIN = 1.3;
/** in this many steps running: one slow step is a page's hiccup (a collection, a tab switch), not a slow worker */
export const SLOW_STEPS = 2;
/** a job changes its shares at most this often: a machine whose load comes and goes must not re-place it every step */
export const MAX_REBALANCES = 2;

export interface SharesJudgement {
  /** the heads each rank would have, shared by its measured speed */
  heads: number[];
  /** the step's compute time now over what it would be with `heads`, if each rank kept its speed per head */
  gain: number;
  /** the rank that took longest, which the step waited for (null: the step could not be read) */
  slowest: number | null;
}

/**
 * The heads by speed, from each rank's heads and the time it computed for them in a step: a rank's
 * work (its tokens outside attention, its heads inside) is in proportion to its heads, so its speed is
 * heads per ms, and a step lasts as long as its slowest rank.
 */
export function judgeShares(heads: readonly number[], computeMs: readonly number[]): SharesJudgement {
  if (heads.length !== computeMs.length || heads.length < 2 || !computeMs.every((ms) => Number.isFinite(ms) && ms > 0))
    return { heads: [...heads], gain: 1, slowest: null };
  const speeds = heads.map((h, i) => h / computeMs[i]);
  const shared = proportionalShares(
    heads.reduce((a, b) => a + b, 0),
    speeds,
  );
  const now = Math.max(...computeMs);
  const after = Math.max(...shared.map((h, i) => h / speeds[i]));
  return { heads: shared, gain: now / after, slowest: computeMs.indexOf(now) };
}

/**
 * Whether a job should change its shares now: the last SLOW_STEPS steps each predicted REBALANCE_GAIN
 * with the same rank slowest (a machine's load moving from tab to tab makes each step's slowest another:
 * noise no share follows), it has changed them fewer than MAX_REBALANCES times, and the steps left are
 * enough to win back a re-placement (which costs about a step: every rank is given the job again).
 */
export function shouldRebalance(
  judged: readonly Pick<SharesJudgement, 'gain' | 'slowest'>[],
  rebalances: number,
  stepsLeft: number,
): boolean {
  const recent = judged.slice(-SLOW_STEPS);
  if (recent.length < SLOW_STEPS || rebalances >= MAX_REBALANCES) return false;
  if (recent.some((j) => j.slowest === null || j.slowest !== recent[0].slowest)) return false;
  const gain = Math.min(...recent.map((j) => j.gain));
  // a step of 1 becomes 1/gain: the steps left save (1 − 1/gain) each, the re-placement costs about 1
  return gain >= REBALANCE_GAIN && stepsLeft * (1 - 1 / gain) > 1;
}
