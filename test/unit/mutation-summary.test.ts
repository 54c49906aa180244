import { describe, expect, it } from 'vitest';
import { aliveRanges, mergeSummary, moduleScores, rejudged, type MutationReport } from '../mutation-summary.ts';

const mutant = (status: string, line: number, replacement?: string) => ({
  mutatorName: 'EqualityOperator',
  replacement,
  status,
  location: { start: { line, column: 3 } },
});

describe("a mutation run's summary", () => {
  const report: MutationReport = {
    files: {
      'core/a.ts': {
        mutants: [
          mutant('Killed', 1),
          mutant('Timeout', 2),
          mutant('Killed', 3),
          mutant('Survived', 4, 'i <= n'),
          mutant('NoCoverage', 5),
          mutant('CompileError', 6),
          mutant('Ignored', 7),
        ],
      },
      'core/b.ts': { mutants: [mutant('Ignored', 1)] },
    },
  };

  it('scores a module by what its tests killed (a timeout too) of the mutants they could judge, and lists the living', () => {
    const scores = moduleScores(report, 'today');
    // 3 killed of 5 judged (killed, timed out, survived, reached by no test); compile errors and ignored ones left out
    expect(scores['core/a.ts']).toEqual({
      score: 60,
      killed: 3,
      survived: 1,
      noCoverage: 1,
      notJudged: 2,
      alive: ['4:3 EqualityOperator → i <= n', '5:3 EqualityOperator'],
      date: 'today',
    });
    // nothing to judge is nothing missed
    expect(scores['core/b.ts'].score).toBe(100);
  });

  it("replaces a module's entry with the newest run's and keeps the others", () => {
    const first = mergeSummary(null, moduleScores(report, 'monday'));
    const again = mergeSummary(
      first,
      moduleScores({ files: { 'core/a.ts': { mutants: [mutant('Killed', 1)] } } }, 'tuesday'),
    );
    expect(Object.keys(again.modules)).toEqual(['core/a.ts', 'core/b.ts']);
    expect(again.modules['core/a.ts']).toMatchObject({ score: 100, date: 'tuesday' });
    expect(again.modules['core/b.ts'].date).toBe('monday');
  });

  it("reruns a module's living mutants by their lines, and scores it by the earlier run with those judged again", () => {
    const earlier = moduleScores(report, 'monday')['core/a.ts'];
    // lines 4 and 5 live: one range, from the first to three past the last
    expect(aliveRanges('core/a.ts', earlier)).toEqual(['core/a.ts:4-8']);
    expect(aliveRanges('core/a.ts', { ...earlier, alive: ['4:3 X', '20:1 Y', '12:2 Z'] })).toEqual([
      'core/a.ts:4-7',
      'core/a.ts:12-15',
      'core/a.ts:20-23',
    ]);
    // the rerun: the survivor at line 4 is killed now; line 5's is ignored (a disable comment says it is equivalent);
    // a mutant it killed before at line 3 still is
    const again = rejudged(
      earlier,
      [mutant('Killed', 3), mutant('Killed', 4, 'i <= n'), mutant('Ignored', 5)],
      'tuesday',
    );
    expect(again).toMatchObject({ score: 100, killed: 4, survived: 0, noCoverage: 0, notJudged: 3, alive: [] });
    // one still living: 4 judged, 3 killed
    const still = rejudged(earlier, [mutant('Survived', 4, 'i <= n'), mutant('Ignored', 5)], 'tuesday');
    expect(still).toMatchObject({ score: 75, killed: 3, survived: 1, alive: ['4:3 EqualityOperator → i <= n'] });
    expect(still.method).toBe(
      "the run of monday with its 2 living mutants' lines run again on tuesday: 1 of them killed or ignored since",
    );
  });
});
