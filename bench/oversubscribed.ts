// The oversubscription check of issue 34's "Done when": with the machine oversubscribed 4× (spinning
// processes beside the job), `npm run generate -- --workers 4` completes with the latent of an
// unloaded one-worker run (max-abs 0), no honest worker let go, in 5 of 5 tries. Runs exactly that
// command: once on one worker with the machine otherwise idle (the reference), then the tries
// under load. Writes bench/out/oversubscribed.json; the runs' files go to bench/out/oversubscribed/.
//
//   npm run oversubscribed -- [--tries 5] [--workers 4] [--busy-per-core 4] [--prompt "a red square moving right"]

import { spawn } from 'node:child_process';
import { createWriteStream, existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join, relative } from 'node:path';
import { parseArgs } from 'node:util';
import type { GenerateReport } from '../coordinator/pipeline.ts';
import { startBusyLoad } from './busy-load.ts';
import { compareLatents } from './chaos-plan.ts';
import { isMain, log, machine, median, OUT_DIR, ROOT, round, writeReport } from './lib.ts';

export interface OversubscribedOptions {
  tries: number;
  workers: number;
  /** spinning processes beside the job, per core */
  busyPerCore: number;
  prompt: string;
}

export const DEFAULT_OVERSUBSCRIBED: OversubscribedOptions = {
  tries: 5,
  workers: 4,
  busyPerCore: 4,
  prompt: 'a red square moving right',
};

const RUNS_DIR = join(OUT_DIR, 'oversubscribed');
/** a line of generate's verbose log that tells of a worker lost, let go or refused */
const WORKER_TROUBLE = /left|silent|let go|lost|banned|refused|no answer|failed|hangs/i;
const LOAD_SAMPLE_MS = 5_000;

interface GenerateRun {
  exitCode: number | null;
  ms: number;
  /** what generate said when it failed (its last "generate: …" line) */
  error: string | null;
  report: (GenerateReport & { injected?: unknown }) | null;
  latent: Float32Array | null;
  /** the verbose log's lines about workers in trouble */
  workerLines: string[];
  log: string;
  loadAverage1m: { median: number; max: number };
}

/** `npm run generate -- --prompt … --workers N --verbose`, its report, latent and log under `name`. */
async function generate(name: string, workers: number, prompt: string): Promise<GenerateRun> {
  mkdirSync(RUNS_DIR, { recursive: true });
  const files = {
    report: join(RUNS_DIR, `${name}.json`),
    latent: join(RUNS_DIR, `${name}.f32`),
    video: join(RUNS_DIR, `${name}.webm`),
    log: join(RUNS_DIR, `${name}.log`),
  };
  for (const f of [files.report, files.latent, files.video]) rmSync(f, { force: true });
  const args = ['run', 'generate', '--', '--prompt', prompt, '--workers', String(workers), '--verbose'];
  args.push('--report', files.report, '--latent-out', files.latent, '--out', files.video);
  log(`oversubscribed: npm ${args.join(' ')}`);
  const started = Date.now();
  const loads: number[] = [];
  const sampler = setInterval(() => loads.push(loadavg()[0]), LOAD_SAMPLE_MS);
  const logFile = createWriteStream(files.log);
  let stderr = '';
  const exitCode = await new Promise<number | null>((resolve) => {
    const child = spawn('npm', args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout.pipe(logFile, { end: false });
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString();
      logFile.write(chunk);
    });
    child.on('close', resolve);
  });
  clearInterval(sampler);
  logFile.end();
  loads.push(loadavg()[0]);
  const lines = stderr.split('\n').map((l) => l.trim());
  const ok = exitCode === 0 && existsSync(files.report) && existsSync(files.latent);
  const latentBytes = ok ? readFileSync(files.latent) : null;
  return {
    exitCode,
    ms: Date.now() - started,
    error: ok ? null : (lines.filter((l) => l.startsWith('generate: ')).at(-1) ?? lines.filter(Boolean).at(-1) ?? null),
    report: ok ? (JSON.parse(readFileSync(files.report, 'utf8')) as GenerateRun['report']) : null,
    latent: latentBytes && new Float32Array(latentBytes.buffer, latentBytes.byteOffset, latentBytes.byteLength / 4),
    workerLines: lines.filter((l) => WORKER_TROUBLE.test(l) && !l.startsWith('> ')).slice(0, 30),
    log: relative(ROOT, files.log),
    loadAverage1m: { median: round(median(loads), 2), max: round(Math.max(...loads), 2) },
  };
}

export async function runOversubscribed(options: Partial<OversubscribedOptions> = {}) {
  const o = { ...DEFAULT_OVERSUBSCRIBED, ...options };
  const started = Date.now();
  log('oversubscribed: the reference: one worker, the machine otherwise idle…');
  const reference = await generate('reference', 1, o.prompt);
  if (!reference.latent || !reference.report)
    throw new Error(`the unloaded one-worker reference run failed: ${reference.error ?? 'no latent'}`);
  const busy = startBusyLoad(o.busyPerCore);
  log(`oversubscribed: ${busy.processes} spinning processes beside each try`);
  const tries = [];
  try {
    for (let t = 1; t <= o.tries; t++) {
      const run = await generate(`try-${t}`, o.workers, o.prompt);
      const comparison = run.latent && compareLatents(run.latent, reference.latent);
      const letGo = (run.report?.failures ?? []).flatMap((f) =>
        f.lost.map((l) => ({ step: f.step, rank: l.rank, worker: l.worker, cause: l.cause, reason: l.evidence })),
      );
      const record = {
        try: t,
        completed: !!run.report,
        error: run.error,
        exitCode: run.exitCode,
        s: round(run.ms / 1000, 1),
        ranks: run.report?.placement.workers.length ?? null,
        leftOut: run.report?.placement.prediction?.leftOut ?? null,
        identical: comparison?.identical ?? null,
        maxAbs: comparison?.maxAbs ?? null,
        workersLetGo: letGo,
        workerLines: run.workerLines,
        loadAverage1m: run.loadAverage1m,
        log: run.log,
      };
      const outcome = record.completed
        ? `completed on ${record.ranks} rank(s), max-abs ${record.maxAbs}`
        : `FAILED: ${record.error}`;
      log(`oversubscribed: try ${t}: ${outcome}; ${letGo.length} worker(s) let go; load ${run.loadAverage1m.median}`);
      tries.push(record);
    }
  } finally {
    busy.stop();
  }
  const passed = tries.filter((t) => t.completed && t.maxAbs === 0 && !t.workersLetGo.length);
  return {
    benchmark: 'oversubscribed',
    date: new Date(started).toISOString(),
    durationS: round((Date.now() - started) / 1000, 1),
    config: {
      ...o,
      command: `npm run generate -- --prompt "${o.prompt}" --workers ${o.workers} --verbose`,
      oversubscription: `${busy.processes} spinning processes (${o.busyPerCore} per core) beside each try`,
    },
    machine: machine(),
    reference: {
      s: round(reference.ms / 1000, 1),
      latentSha256: reference.report.latentSha256,
      loadAverage1m: reference.loadAverage1m,
      log: reference.log,
    },
    tries,
    summary: {
      tries: tries.length,
      completed: tries.filter((t) => t.completed).length,
      maxAbsZero: tries.filter((t) => t.maxAbs === 0).length,
      workersLetGo: tries.reduce((n, t) => n + t.workersLetGo.length, 0),
      passed: passed.length,
      failures: tries.filter((t) => !t.completed).map((t) => ({ try: t.try, error: t.error })),
    },
    meets: {
      [`${o.tries} of ${o.tries} complete with the one-worker latent (max-abs 0) and no worker let go`]:
        passed.length === o.tries,
    },
  };
}

export function parseOversubscribedArgs(args: string[]): Partial<OversubscribedOptions> {
  const { values } = parseArgs({
    args,
    options: {
      tries: { type: 'string' },
      workers: { type: 'string' },
      'busy-per-core': { type: 'string' },
      prompt: { type: 'string' },
    },
  });
  const out: Partial<OversubscribedOptions> = {};
  for (const key of ['tries', 'workers'] as const) {
    const v = values[key];
    if (v === undefined) continue;
    if (!(Number.isInteger(Number(v)) && Number(v) >= 1))
      throw new Error(`--${key} takes a whole number ≥ 1, got ${v}`);
    out[key] = Number(v);
  }
  const perCore = values['busy-per-core'];
  if (perCore !== undefined) {
    if (!(Number(perCore) >= 0)) throw new Error(`--busy-per-core takes a number ≥ 0, got ${perCore}`);
    out.busyPerCore = Number(perCore);
  }
  if (values.prompt !== undefined) out.prompt = values.prompt;
  return out;
}

if (isMain(import.meta)) {
  const report = await runOversubscribed(parseOversubscribedArgs(process.argv.slice(2)));
  writeReport('oversubscribed.json', report);
  console.log(JSON.stringify({ summary: report.summary, meets: report.meets }, null, 2));
}
