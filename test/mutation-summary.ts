// What a Stryker run (its mutation-testing-report-schema JSON) says of each module it mutated: the mutation score
// and the mutants that lived, as bench/out/mutation/summary.json keeps them, one entry per module, each from the
// run that last mutated it.

/** A mutant as Stryker's JSON report gives it (the fields read here). */
interface ReportedMutant {
  mutatorName: string;
  replacement?: string;
  status: string;
  location: { start: { line: number; column: number } };
}

export interface MutationReport {
  files: Record<string, { mutants: ReportedMutant[] }>;
}

export interface ModuleScore {
  /** killed (a test failed or timed out) over every valid mutant (killed, survived or reached by no test), in % */
  score: number;
  killed: number;
  survived: number;
  noCoverage: number;
  /** mutants that no test could judge: they broke compilation or the run, or the config ignores them */
  notJudged: number;
  /** each living mutant, "line:column mutator → replacement", to look at */
  alive: string[];
  date: string;
  /** the SHA-256 of the module's text the run mutated: its living mutants' lines are where they were while it holds */
  source?: string;
  /** how the score was made where it is not one whole run (a rerun of the living mutants' lines: rejudged) */
  method?: string;
}

export interface MutationSummary {
  modules: Record<string, ModuleScore>;
}

const isAlive = (m: ReportedMutant) => m.status === 'Survived' || m.status === 'NoCoverage';
const describeMutant = (m: ReportedMutant) =>
  `${m.location.start.line}:${m.location.start.column} ${m.mutatorName}` +
  (m.replacement === undefined ? '' : ` → ${m.replacement}`);

/** The score of each file of the report. */
export function moduleScores(report: MutationReport, date: string): Record<string, ModuleScore> {
  return Object.fromEntries(
    Object.entries(report.files).map(([file, { mutants }]) => {
      const count = (...statuses: string[]) => mutants.filter((m) => statuses.includes(m.status)).length;
      const killed = count('Killed', 'Timeout');
      const survived = count('Survived');
      const noCoverage = count('NoCoverage');
      const valid = killed + survived + noCoverage;
      const alive = mutants.filter(isAlive).map(describeMutant);
      const score = valid ? Math.round((1000 * killed) / valid) / 10 : 100;
      return [file, { score, killed, survived, noCoverage, notJudged: mutants.length - valid, alive, date }] satisfies [
        string,
        ModuleScore,
      ];
    }),
  );
}

/** The summary with this run's modules replacing their earlier entries, the others kept, in path order. */
export function mergeSummary(earlier: MutationSummary | null, scores: Record<string, ModuleScore>): MutationSummary {
  const modules = { ...earlier?.modules, ...scores };
  return { modules: Object.fromEntries(Object.entries(modules).sort(([a], [b]) => a.localeCompare(b))) };
}

/**
 * The lines a rerun of a module's living mutants mutates, as Stryker's `--mutate file:A-B` ranges: each living
 * mutant's line and the 3 after it (a mutant may span a statement's lines), ranges that touch merged.
 */
export function aliveRanges(file: string, score: ModuleScore): string[] {
  const lines = [...new Set(score.alive.map((a) => Number(a.split(':')[0])))].sort((a, b) => a - b);
  const ranges: [number, number][] = [];
  for (const line of lines) {
    const last = ranges.at(-1);
    if (last && line <= last[1] + 1) last[1] = Math.max(last[1], line + 3);
    else ranges.push([line, line + 3]);
  }
  return ranges.map(([from, to]) => `${file}:${from}-${to}`);
}

/**
 * A module's score after a rerun of its living mutants' lines (aliveRanges), its text unchanged but for tests
 * added: the earlier run's judged mutants, less those now ignored (a Stryker disable comment), with every mutant
 * living in the rerun alive and the rest killed. A mutant the earlier run killed outside those lines is taken as
 * still killed: tests were only added.
 */
export function rejudged(earlier: ModuleScore, rerun: ReportedMutant[], date: string): ModuleScore {
  const wasAlive = new Set(earlier.alive);
  const nowIgnored = rerun.filter((m) => m.status === 'Ignored' && wasAlive.has(describeMutant(m))).length;
  const alive = rerun.filter(isAlive);
  const judged = earlier.killed + earlier.survived + earlier.noCoverage - nowIgnored;
  const killed = judged - alive.length;
  return {
    score: judged ? Math.round((1000 * killed) / judged) / 10 : 100,
    killed,
    survived: alive.filter((m) => m.status === 'Survived').length,
    noCoverage: alive.filter((m) => m.status === 'NoCoverage').length,
    notJudged: earlier.notJudged + nowIgnored,
    alive: alive.map(describeMutant),
    date,
    ...(earlier.source && { source: earlier.source }),
    method:
      `the run of ${earlier.date} with its ${earlier.alive.length} living mutants' lines run again on ${date}: ` +
      `${earlier.alive.length - alive.length} of them killed or ignored since`,
  };
}
