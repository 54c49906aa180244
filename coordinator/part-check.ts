// Checks of the parts a worker computes outside the DiT's forwards: a run of the text encoder's
// layers, a VAE tile. Another worker, drawn by a secret CSPRNG, recomputes the part from the same
// inputs; where the two disagree a third decides, by the spot checks' rule (spot-check.ts:
// judgeSpotCheck, the part judged as a one-rank group's rows). A part is used only once a check
// agreed with it; a reply that breaks what the model can produce convicts its sender outright.
import type { UlyssesPlan } from '../core/parallel.ts';
import { judgeSpotCheck, pickChecker, spotCheckTolerance } from './spot-check.ts';

/**
 * How far a recomputation may stray, relative to the part's scale: these parts come back in float32 whatever the
 * job's transport, so the bound of a float32 forward.
 */
export const PART_TOLERANCE = spotCheckTolerance('f32');

/** A reply that breaks what the model can produce (its size, NaN, beyond its range): its sender is convicted. */
export class PartBreach extends Error {
  override name = 'PartBreach';
}

/** What a check of one part found, for the report. */
export interface PartCheck {
  /** who computed the part, who recomputed it, who decided where those disagreed (null: nobody was left to) */
  worker: string;
  checker: string | null;
  third: string | null;
  /** the largest difference of the part from the checker's recomputation, relative to its scale (null: none made) */
  difference: number | null;
  /**
   * unchecked: no other worker was there to recompute it; undecided: the recomputation disagreed and the workers
   * that could have decided failed (they left, say): nobody is convicted, and the part is not used
   */
  verdict: 'agreed' | 'unchecked' | 'undecided' | { convicted: string[]; why: string };
}

export interface CheckedPart<H> {
  check: PartCheck;
  /** the worker's part may be used: a check agreed with it, or there was no other worker to make one ('unchecked') */
  stands: boolean;
  /** the workers a check convicted (the part's, its checker's, or a checker whose reply broke the contract) */
  convicted: { host: H; why: string }[];
}

export interface PartCheckRequest<H extends { id: string }> {
  /** what the part is, for the verdict's words ("layers 0–11 of the text encoder") */
  what: string;
  worker: H;
  part: Float32Array;
  /** the workers that may recompute it (the worker's own entry is left out) */
  hosts: H[];
  /** the part recomputed on `host`: a PartBreach where its reply breaks the contract, another error where it failed */
  recompute(host: H): Promise<Float32Array>;
  /** uniform in [0, 1): a CSPRNG, so that no worker can tell who will recompute its part */
  random?: () => number;
}

/** Has another worker recompute `part`, and a third where the two disagree; the verdict and who it convicts. */
export async function checkPart<H extends { id: string }>(r: PartCheckRequest<H>): Promise<CheckedPart<H>> {
  const convicted: CheckedPart<H>['convicted'] = [];
  const tried = new Set([r.worker.id]);
  let failed = 0;
  /** a recomputation by a worker not yet asked, drawn at random; null when none is left that answers */
  const recomputation = async (): Promise<{ host: H; values: Float32Array } | null> => {
    for (;;) {
      const free = r.hosts.filter((h) => !tried.has(h.id));
      const drawn = pickChecker(free.length, [], r.random);
      if (drawn === null) return null;
      const host = free[drawn];
      tried.add(host.id);
      try {
        return { host, values: await r.recompute(host) };
      } catch (e) {
        // one that failed (it left, say) is passed over; one that broke the contract is convicted too
        if (e instanceof PartBreach) convicted.push({ host, why: `its recomputation of ${r.what} ${e.message}` });
        else failed++;
      }
    }
  };
  const checker = await recomputation();
  const noCheck = { worker: r.worker.id, checker: null, third: null, difference: null };
  if (!checker)
    return failed
      ? { check: { ...noCheck, verdict: 'undecided' }, stands: false, convicted }
      : { check: { ...noCheck, verdict: 'unchecked' }, stands: true, convicted };
  // the part as a one-rank group's rows, one value a row: the worker rank 0, checker 1, third 2
  const plan: UlyssesPlan = {
    degree: 1,
    tokens: r.part.length,
    heads: [1],
    rows: [r.part.length],
    headDim: 1,
    headGroups: 1,
  };
  const judge = (third: { host: H; values: Float32Array } | null) =>
    judgeSpotCheck(
      plan,
      [0],
      [r.part],
      1,
      { rank: 1, rows: checker.values },
      third && { rank: 2, rows: third.values },
      PART_TOLERANCE,
    );
  let judged = judge(null);
  let third: { host: H; values: Float32Array } | null = null;
  const failedBefore = failed;
  if (judged.verdict !== 'agreed') {
    third = await recomputation();
    judged = judge(third);
  }
  const check = { ...noCheck, checker: checker.host.id, third: third?.host.id ?? null, difference: judged.difference };
  if (judged.verdict === 'agreed') return { check: { ...check, verdict: 'agreed' }, stands: true, convicted };
  // a third there was, but it failed: a rule for two alone would convict an honest worker for a departure
  if (!third && failed > failedBefore) return { check: { ...check, verdict: 'undecided' }, stands: false, convicted };
  const roles = [r.worker, checker.host, third?.host];
  const guilty = judged.verdict.convicted.map((rank) => roles[rank]).filter((h) => h !== undefined);
  const why = verdictWords(r.what, judged.difference, guilty.length, {
    worker: r.worker.id,
    checker: checker.host.id,
    third: third?.host.id ?? null,
    checkerConvicted: guilty.includes(checker.host),
  });
  for (const host of guilty) convicted.push({ host, why });
  return {
    check: { ...check, verdict: { convicted: guilty.map((h) => h.id), why } },
    stands: !guilty.includes(r.worker),
    convicted,
  };
}

/** The verdict in workers' ids (judgeSpotCheck's own words speak of ranks). */
function verdictWords(
  what: string,
  difference: number,
  count: number,
  who: { worker: string; checker: string; third: string | null; checkerConvicted: boolean },
): string {
  const by =
    `${what} by worker ${who.worker} differs from worker ${who.checker}'s recomputation ` +
    `by ${difference.toExponential(1)} of its scale`;
  if (who.third === null) return `${by}, and no third worker could say which is wrong: both are let go`;
  if (count === 2) return `${by}, and worker ${who.third}'s recomputation agrees with neither: both are let go`;
  return who.checkerConvicted
    ? `${by}, and worker ${who.third} recomputed it as worker ${who.worker} did: the recomputation was wrong`
    : `${by}, and worker ${who.third} recomputed it as worker ${who.checker} did`;
}
