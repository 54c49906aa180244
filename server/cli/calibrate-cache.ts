// Calibrates the step cache for a model folder on this machine: runs one job through generate with
// every forward computed (--cache calibrate), reads the magnitude ratios its ranks measured of each
// step's residual against the step before's, and writes them beside the model as step_cache.json
// (core/step-cache.ts), which every later job on the folder reads its schedule from.
//
//   npm run calibrate-cache -- --model DIR [any generate flag: --prompt, --steps, --frames, --workers …]

import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { STEP_CACHE_FILE, parseMagnitudeCurve, type MagnitudeCurve } from '../../core/step-cache.ts';
import type { CacheReport, GenerateReport } from '../../coordinator/pipeline.ts';

const USAGE =
  'usage: npm run calibrate-cache -- --model DIR [--prompt TEXT] [--steps K] [--frames F --height H --width W] ' +
  '[--workers N] [any other flag of npm run generate]';

function fail(message: string): never {
  console.error(`calibrate-cache: ${message}`);
  process.exit(1);
}

const args = process.argv.slice(2);
if (args.includes('--help')) {
  console.log(USAGE);
  process.exit(0);
}
const at = args.indexOf('--model');
const dir = at >= 0 ? args[at + 1] : undefined;
if (!dir) fail(`--model DIR is required: the curve is written beside the folder's files\n${USAGE}`);
if (!existsSync(dir) || !statSync(dir).isDirectory())
  fail(`--model ${dir} is no folder on this machine: the curve is written into the folder, so give a path, not a URL`);
if (args.includes('--cache') || args.includes('--cache-threshold'))
  fail('a calibration computes every forward: leave out --cache and --cache-threshold');

const scratch = mkdtempSync(join(tmpdir(), 'ditswarm-calibrate-'));
const reportPath = join(scratch, 'report.json');
const prompt = args.includes('--prompt') ? [] : ['--prompt', 'a red square moving right'];
const run = spawnSync(
  process.execPath,
  [
    '--import',
    'tsx',
    resolve(import.meta.dirname, 'generate.ts'),
    ...prompt,
    ...args,
    '--cache',
    'calibrate',
    '--output-type',
    'latent',
    '--report',
    reportPath,
    '--latent-out',
    join(scratch, 'latent.f32'),
  ],
  { stdio: 'inherit' },
);
if (run.status !== 0) fail(`the calibration job failed (generate exited with ${run.status ?? run.signal})`);

const report = JSON.parse(readFileSync(reportPath, 'utf8')) as GenerateReport;
const curve = curveOf(report);
const path = join(dir, STEP_CACHE_FILE);
writeFileSync(path, JSON.stringify(curve, null, 2) + '\n');
console.error(
  `calibrate-cache: wrote ${path}: ${curve.steps} steps, ratios from ${curve.ratios[0][1].toFixed(4)} to ` +
    `${curve.ratios[0].at(-1)?.toFixed(4)} (conditional pass)`,
);

/** The curve a calibration job measured: step 0 has no residual before it (1, as MagCache pads it). */
function curveOf(r: GenerateReport): MagnitudeCurve {
  const cache: CacheReport | null = r.cache;
  if (!cache || cache.curve !== null) throw new Error('the report holds no calibration run');
  const { steps, prompt, frames, height, width, seed } = r.config;
  if (steps < 2) fail('a calibration needs at least 2 steps: a ratio is between two steps');
  const measured = cache.measuredRatios.map((pass) => pass.map((ratio, step) => (step === 0 ? 1 : ratio)));
  const missing = measured.flatMap((pass, p) => pass.flatMap((ratio, step) => (ratio === null ? [[step, p]] : [])));
  if (missing.length) fail(`no ratio was measured at [step, pass] ${JSON.stringify(missing)}: run it again`);
  // an unguided job has one pass: its curve stands for both
  const ratios = (measured.length === 2 ? measured : [measured[0], measured[0]]) as [number[], number[]];
  const source =
    `calibrated by ditswarm on ${new Date().toISOString().slice(0, 10)}: "${prompt}", ${frames} frames ` +
    `${width}×${height}, ${steps} steps, seed ${seed}`;
  const rounded = ratios.map((pass) => pass.map((x) => Math.round(x * 1e5) / 1e5)) as [number[], number[]];
  const curve: MagnitudeCurve = { method: 'magcache', steps, ratios: rounded, source };
  parseMagnitudeCurve(curve, 'the calibration'); // what the folder's next job will read
  return curve;
}
