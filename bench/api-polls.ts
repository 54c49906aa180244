// What status polls cost the API's jobs (issue 39): the same job through `npm start -- --api --local-workers N`
// (a server process of its own) with no polls, with `clients` clients each polling GET /v1/videos/{id} once a
// second, and with `clients` polls in flight at every moment (each client asks again as soon as it is answered),
// the three interleaved over the repeats so that the machine's load falls on each alike. The clients are a process
// at the lowest priority (bench/api-pollers.ts): they stand for programs on other machines, and here would otherwise
// take the job's cores themselves. Per run the median step, the polls' answer times and the server's CPU time; the
// ratios of the medians to the runs without polls are the cost. Writes bench/out/api-polls.json.
//
//   npm run bench -- api-polls [--clients 200] [--repeats 3] [--steps 60] [--workers 2]

import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { spawnApiServer, type ApiProcess } from '../server/api/api-process.ts';
import type { VideoObject } from '../server/api/video-object.ts';
import { defined } from '../core/defined.ts';
import { API_KEY_FILE } from '../server/api/api-key.ts';
import { isMain, log, machine, median, ROOT, round, waitForQuietMachine, writeReport } from './lib.ts';

export interface ApiPollsOptions {
  clients: number;
  repeats: number;
  steps: number;
  workers: number;
}

/** 60 steps: a job of about 20 s here, long enough that the clients' first connections are a small part of it */
export const DEFAULT_API_POLLS: ApiPollsOptions = { clients: 200, repeats: 3, steps: 60, workers: 2 };
/** `npm run bench -- --smoke`: one short job each way, 10 clients */
export const SMOKE_API_POLLS: ApiPollsOptions = { clients: 10, repeats: 1, steps: 2, workers: 1 };

const LOADS = ['none', 'every-second', 'back-to-back'] as const;
type Load = (typeof LOADS)[number];

interface Run {
  load: Load;
  medianStepMs: number;
  steps: number;
  polls: number;
  /** how long the polls took to be answered: the median, the 99th percentile, the slowest */
  pollMs: { p50: number; p99: number; max: number };
  /** the server process's CPU time over the job (its answers to the polls among it) */
  serverCpuMs: number;
}

export function parseApiPollsArgs(args: string[]): ApiPollsOptions {
  const { values } = parseArgs({
    args,
    options: {
      clients: { type: 'string' },
      repeats: { type: 'string' },
      steps: { type: 'string' },
      workers: { type: 'string' },
    },
  });
  const o = { ...DEFAULT_API_POLLS };
  for (const key of Object.keys(o) as (keyof ApiPollsOptions)[]) {
    const v = values[key];
    if (v === undefined) continue;
    if (!/^\d+$/.test(v) || Number(v) < 1) throw new Error(`--${key} takes a whole number ≥ 1, got ${v}`);
    o[key] = Number(v);
  }
  return o;
}

/** The server's CPU time so far (user and system), in ms, from /proc: what its answers cost the job's cores. */
function cpuMs(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // utime, stime in clock ticks of 1/100 s
}

/** Polls `id` from `clients` clients (bench/api-pollers.ts, at nice 19) until `stop`; the polls' times. */
function poll(api: ApiProcess, key: string, id: string, clients: number, load: Load) {
  if (load === 'none') return { stop: () => Promise.resolve([] as number[]) };
  const child = spawn(
    'nice',
    ['-n', '19', process.execPath, '--import', 'tsx', 'bench/api-pollers.ts', api.url, key, id, String(clients), load],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] },
  );
  // the first line says the clients' SIGTERM handler is in place (a SIGTERM before it would end them with nothing
  // printed, as when a short job ends before tsx has started them); the second is the polls' times
  let out = '';
  let readyNow = () => {};
  const ready = new Promise<void>((r) => (readyNow = r));
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
    if (out.includes('\n')) readyNow();
  });
  const exited = new Promise((r) => child.once('exit', r));
  return {
    stop: async () => {
      await Promise.race([ready, exited]);
      child.kill('SIGTERM');
      const code = await exited;
      const [, times] = out.split('\n');
      if (!times)
        throw new Error(`the pollers (bench/api-pollers.ts) exited with ${String(code)} and printed no times`);
      return JSON.parse(times) as number[];
    },
  };
}

export async function runApiPolls(options: Partial<ApiPollsOptions> = {}) {
  const o = { ...DEFAULT_API_POLLS, ...options };
  const quiet = await waitForQuietMachine();
  const dataDir = mkdtempSync(join(tmpdir(), 'ditswarm-bench-api-'));
  // the polls are the load measured here, not the rate limit's refusals
  const api = await spawnApiServer(dataDir, ['--local-workers', String(o.workers), '--api-rate', '100000000']);
  const key = readFileSync(join(dataDir, API_KEY_FILE), 'utf8').trim();
  const runs: Run[] = [];
  try {
    for (;;) {
      const swarm = await api.json<{ workers: unknown[] }>('/v1/swarm');
      if (swarm.workers.length >= o.workers) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    const job = { prompt: 'a red square moving right', steps: o.steps, workers: o.workers, cfg_parallel: false };
    // the first job loads the weights: not measured
    const runJob = async (load: Load): Promise<Run> => {
      const posted = await api.json<VideoObject>('/v1/videos', { method: 'POST', body: JSON.stringify(job) });
      const polls = poll(api, key, posted.id, o.clients, load);
      const cpuBefore = cpuMs(defined(api.process.pid, 'the server process'));
      let video = posted;
      while (video.status === 'queued' || video.status === 'in_progress')
        video = await api.json<VideoObject>(`/v1/videos/${posted.id}?wait=10`);
      const serverCpuMs = cpuMs(defined(api.process.pid, 'the server process')) - cpuBefore;
      const took = (await polls.stop()).sort((a, b) => a - b);
      const at = (q: number) => round(took[Math.min(took.length - 1, Math.floor(q * took.length))] ?? 0, 1);
      if (video.status !== 'completed' || !video.report)
        throw new Error(`the ${load} job ended ${video.status}: ${JSON.stringify(video.error)}`);
      const steps = video.report.steps.map((s) => s.ms);
      return {
        load,
        medianStepMs: round(median(steps), 1),
        steps: steps.length,
        polls: took.length,
        pollMs: { p50: at(0.5), p99: at(0.99), max: at(1) },
        serverCpuMs: round(serverCpuMs, 0),
      };
    };
    await runJob('none');
    for (let r = 0; r < o.repeats; r++)
      for (const load of LOADS) {
        const run = await runJob(load);
        log(
          `${load}: median step ${run.medianStepMs} ms, ${run.polls} polls ` +
            `(answered in ${JSON.stringify(run.pollMs)} ms)`,
        );
        runs.push(run);
      }
  } finally {
    await api.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
  const medianOf = (load: Load) => median(runs.filter((r) => r.load === load).map((r) => r.medianStepMs));
  return {
    config: o,
    machine: { ...machine(), quiet },
    runs,
    /** each load's median step over the runs without polls: 1.1 is the 10 % the issue allows */
    stepRatio: Object.fromEntries(LOADS.map((load) => [load, round(medianOf(load) / medianOf('none'))])),
  };
}

if (isMain(import.meta)) writeReport('api-polls.json', await runApiPolls(parseApiPollsArgs(process.argv.slice(2))));
