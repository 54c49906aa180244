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
}

export interface MutationSummary {
  modules: Record<string, ModuleScore>;
}

/** The score of each file of the report. */
export function moduleScores(report: MutationReport, date: string): Record<string, ModuleScore> {
  return Object.fromEntries(
    Object.entries(report.files).map(([file, { mutants }]) => {
      const count = (...statuses: string[]) => mutants.filter((m) => statuses.includes(m.status)).length;
      const killed = count('Killed', 'Timeout');
      const survived = count('Survived');
      const noCoverage = count('NoCoverage');
      const valid = killed + survived + noCoverage;
      const alive = mutants
        .filter((m) => m.status === 'Survived' || m.status === 'NoCoverage')
        .map(
          (m) =>
            `${m.location.start.line}:${m.location.start.column} ${m.mutatorName}` +
            (m.replacement === undefined ? '' : ` → ${m.replacement}`),
        );
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
