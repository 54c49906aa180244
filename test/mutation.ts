// Mutation testing (stryker.config.mjs): Stryker plants small bugs in a module and reruns the unit tests that
// reach each one; a bug no test notices is a test missing. Then bench/out/mutation/summary.json gets each mutated
// module's score and its living mutants (earlier runs' other modules kept).
//
//   npm run test:mutation                              every module of stryker.config.mjs's list (hours on 2 cores)
//   npm run test:mutation -- --module core/step-cache.ts    one module (or several: --module A --module B), in minutes
//
// Not a CI gate (too slow): a habit before changing these modules.

import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { mergeSummary, moduleScores, type MutationReport, type MutationSummary } from './mutation-summary.ts';

const ROOT = join(import.meta.dirname, '..');
const REPORT = join(ROOT, 'bench/out/mutation/mutation.json');
const SUMMARY = join(ROOT, 'bench/out/mutation/summary.json');

const fail = (message: string): never => {
  console.error(`test:mutation: ${message}`);
  process.exit(1);
};

const { values } = parseArgs({ options: { module: { type: 'string', multiple: true } } });
const modules = values.module ?? [];
for (const module of modules)
  if (!existsSync(join(ROOT, module))) fail(`no such module: ${module} (give a path from the repository's root)`);

const started = Date.now();
const run = spawnSync(
  process.execPath,
  [
    join(ROOT, 'node_modules/@stryker-mutator/core/bin/stryker.js'),
    'run',
    ...(modules.length ? ['--mutate', modules.join(',')] : []),
  ],
  { cwd: ROOT, stdio: 'inherit' },
);
if (run.status !== 0) fail(`stryker exited with status ${run.status}`);

const scores = moduleScores(
  JSON.parse(readFileSync(REPORT, 'utf8')) as MutationReport,
  new Date(started).toISOString(),
);
const earlier = existsSync(SUMMARY) ? (JSON.parse(readFileSync(SUMMARY, 'utf8')) as MutationSummary) : null;
writeFileSync(SUMMARY, JSON.stringify(mergeSummary(earlier, scores), null, 2) + '\n');
for (const [file, s] of Object.entries(scores))
  console.log(
    `${file}: ${s.score}% (${s.killed} killed, ${s.survived} survived, ${s.noCoverage} reached by no test, ` +
      `${s.notJudged} not judged)`,
  );
console.log(`test:mutation: wrote bench/out/mutation/summary.json in ${Math.round((Date.now() - started) / 1000)} s`);
