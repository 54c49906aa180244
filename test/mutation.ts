// Mutation testing (stryker.config.mjs): Stryker plants small bugs in a module and reruns the unit tests that
// reach each one; a bug no test notices is a test missing. Then bench/out/mutation/summary.json gets each mutated
// module's score and its living mutants (earlier runs' other modules kept).
//
//   npm run test:mutation                              every module of stryker.config.mjs's list (hours on 2 cores)
//   npm run test:mutation -- --module core/step-cache.ts    one module (or several: --module A --module B), in minutes
//   npm run test:mutation -- --module X --alive       only the lines of X's living mutants of its last run, after tests
//                                                     were added for them (X's own text unchanged since that run)
// MUTATION_TESTS=a.test.ts,b.test.ts narrows the tests each mutant runs to a module's own (vitest.mutation.config.ts).
//
// Not a CI gate (too slow): a habit before changing these modules.

import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { createHash } from 'node:crypto';
import {
  aliveRanges,
  mergeSummary,
  moduleScores,
  rejudged,
  type MutationReport,
  type MutationSummary,
} from './mutation-summary.ts';

const ROOT = join(import.meta.dirname, '..');
const REPORT = join(ROOT, 'bench/out/mutation/mutation.json');
const SUMMARY = join(ROOT, 'bench/out/mutation/summary.json');

const fail = (message: string): never => {
  console.error(`test:mutation: ${message}`);
  process.exit(1);
};

const { values } = parseArgs({
  options: { module: { type: 'string', multiple: true }, alive: { type: 'boolean', default: false } },
});
const modules = values.module ?? [];
for (const module of modules)
  if (!existsSync(join(ROOT, module))) fail(`no such module: ${module} (give a path from the repository's root)`);
const sourceOf = (module: string) =>
  createHash('sha256')
    .update(readFileSync(join(ROOT, module)))
    .digest('hex');
const earlier = existsSync(SUMMARY) ? (JSON.parse(readFileSync(SUMMARY, 'utf8')) as MutationSummary) : null;

let mutate = modules;
if (values.alive) {
  if (!modules.length) fail('--alive reruns the living mutants of the modules given with --module');
  mutate = modules.flatMap((module) => {
    const last = earlier?.modules[module];
    if (!last) return fail(`${module} has no run in bench/out/mutation/summary.json to take its living mutants from`);
    if (last.source !== sourceOf(module))
      return fail(`${module} changed since its last run (its mutants' lines moved): run it whole, without --alive`);
    return last.alive.length ? aliveRanges(module, last) : [];
  });
  if (!mutate.length) fail('no living mutants to run again');
}

const started = Date.now();
const run = spawnSync(
  process.execPath,
  [
    join(ROOT, 'node_modules/@stryker-mutator/core/bin/stryker.js'),
    'run',
    ...(mutate.length ? ['--mutate', mutate.join(',')] : []),
  ],
  { cwd: ROOT, stdio: 'inherit' },
);
if (run.status !== 0) fail(`stryker exited with status ${run.status}`);

const report = JSON.parse(readFileSync(REPORT, 'utf8')) as MutationReport;
const date = new Date(started).toISOString();
const scores = Object.fromEntries(
  Object.entries(moduleScores(report, date)).map(([file, score]) => {
    const last = earlier?.modules[file];
    return [
      file,
      values.alive && last ? rejudged(last, report.files[file].mutants, date) : { ...score, source: sourceOf(file) },
    ];
  }),
);
writeFileSync(SUMMARY, JSON.stringify(mergeSummary(earlier, scores), null, 2) + '\n');
for (const [file, s] of Object.entries(scores))
  console.log(
    `${file}: ${s.score}% (${s.killed} killed, ${s.survived} survived, ${s.noCoverage} reached by no test, ` +
      `${s.notJudged} not judged)`,
  );
console.log(`test:mutation: wrote bench/out/mutation/summary.json in ${Math.round((Date.now() - started) / 1000)} s`);
