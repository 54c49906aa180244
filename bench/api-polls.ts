// What status polls cost the API's jobs (issue 39): the same job through `npm start -- --api --local-workers N`
// (a server process of its own) with no polls, with `clients` clients each polling GET /v1/videos/{id} once a
// second, and with `clients` polls in flight at every moment (each client asks again as soon as it is answered),
// the three interleaved over the repeats so that the machine's load falls on each alike. Per run the median step;
// the ratios of the medians to the runs without polls are the cost. Writes bench/out/api-polls.json.
//
//   npm run bench -- api-polls [--clients 200] [--repeats 2] [--steps 20] [--workers 2]

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { spawnApiServer, type ApiProcess } from '../server/api/api-process.ts';
import type { VideoObject } from '../server/api/video-object.ts';
import { isMain, log, machine, median, round, waitForQuietMachine, writeReport } from './lib.ts';

export interface ApiPollsOptions {
  clients: number;
  repeats: number;
  steps: number;
  workers: number;
}

export const DEFAULT_API_POLLS: ApiPollsOptions = { clients: 200, repeats: 2, steps: 20, workers: 2 };
/** `npm run bench -- --smoke`: one short job each way, 10 clients */
export const SMOKE_API_POLLS: ApiPollsOptions = { clients: 10, repeats: 1, steps: 2, workers: 2 };

const LOADS = ['none', 'every-second', 'back-to-back'] as const;
type Load = (typeof LOADS)[number];

interface Run {
  load: Load;
  medianStepMs: number;
  steps: number;
  polls: number;
  /** the slowest answer to a poll */
  maxPollMs: number;
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

/** Polls `id` from `clients` clients until `stop` says, each once a second or back to back. */
function poll(api: ApiProcess, id: string, clients: number, load: Load, stop: () => boolean) {
  const counts = { polls: 0, maxPollMs: 0 };
  const client = async () => {
    while (!stop()) {
      const asked = performance.now();
      await (await api.call(`/v1/videos/${id}`)).arrayBuffer();
      const took = performance.now() - asked;
      counts.polls++;
      counts.maxPollMs = Math.max(counts.maxPollMs, took);
      if (load === 'every-second') await new Promise((r) => setTimeout(r, Math.max(0, 1000 - took)));
    }
  };
  return { counts, done: load === 'none' ? Promise.resolve() : Promise.all(Array.from({ length: clients }, client)) };
}

export async function runApiPolls(options: Partial<ApiPollsOptions> = {}) {
  const o = { ...DEFAULT_API_POLLS, ...options };
  const quiet = await waitForQuietMachine();
  const dataDir = mkdtempSync(join(tmpdir(), 'ditswarm-bench-api-'));
  // the polls are the load measured here, not the rate limit's refusals
  const api = await spawnApiServer(dataDir, ['--local-workers', String(o.workers), '--api-rate', '100000000']);
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
      let finished = false;
      const polls = poll(api, posted.id, o.clients, load, () => finished);
      let video = posted;
      while (video.status === 'queued' || video.status === 'in_progress')
        video = await api.json<VideoObject>(`/v1/videos/${posted.id}?wait=10`);
      finished = true;
      await polls.done;
      if (video.status !== 'completed' || !video.report)
        throw new Error(`the ${load} job ended ${video.status}: ${JSON.stringify(video.error)}`);
      const steps = video.report.steps.map((s) => s.ms);
      return { load, medianStepMs: round(median(steps), 1), steps: steps.length, ...polls.counts };
    };
    await runJob('none');
    for (let r = 0; r < o.repeats; r++)
      for (const load of LOADS) {
        const run = await runJob(load);
        log(`${load}: median step ${run.medianStepMs} ms, ${run.polls} polls (slowest ${round(run.maxPollMs, 0)} ms)`);
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
