// The kill soak of the video API (issue 64): a client polls every job with the official `openai` SDK while the
// server is killed (SIGKILL) at chosen moments of its jobs, each moment a random instant within the phase it aims at,
// and started again on the same data folder and port, as a supervisor would, with no other step. What it returns
// is what the test asserts: every accepted job completed, once.

import { statSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import OpenAI from 'openai';
import { SeededRandom } from '../../core/random.ts';
import { spawnApiServer, type ApiProcess } from '../../server/api/api-process.ts';
import type { VideoObject } from '../../server/api/video-object.ts';

/**
 * Where a kill aims: a job just queued; the running job's prompt encoding, placement, a denoising step, its VAE
 * decode or its WebM muxing; or just after a GET of a finished job (one the server reads from SQLite).
 */
export type KillTarget = 'queued' | 'encoding' | 'placing' | 'step' | 'decoding' | 'muxing' | 'after-get';

export interface SoakOptions {
  dataDir: string;
  /** the kills, in order; each waits for its moment up to `aimWithinMs`, then kills where the jobs are */
  targets: KillTarget[];
  /** jobs kept waiting behind the running one: new ones are posted before each kill */
  keepQueued: number;
  /** seeds the random instants and the jobs' sizes, so that a failing run can be run again */
  seed: number;
  aimWithinMs?: number;
  /** how long the jobs have to complete once the kills are done */
  drainWithinMs?: number;
  log?: (line: string) => void;
}

export interface Kill {
  target: KillTarget;
  /** where it fell, by the last poll: the running job's phase ('none running' where none ran), or 'after-get' */
  at: string;
  /** jobs that were queued */
  queued: number;
  restartMs: number;
}

export interface SoakResult {
  kills: Kill[];
  /** every job the server answered 202, with what the client saw of it */
  jobs: { id: string; status: string; attempts: number; completedAt: number | null; error: string | null }[];
  /** jobs seen completed with another completed_at, or their video rewritten, after they were first seen completed */
  completedAgain: string[];
  /** jobs seen to leave `completed` */
  regressed: string[];
  /** the ids `videos.list` gives at the end */
  listed: string[];
  /** polls that failed (the server was down) / that answered */
  polls: { failed: number; answered: number };
  /** lines of the restarts' logs that speak of the database */
  databaseLines: string[];
  durationMs: number;
  api: ApiProcess;
  client: OpenAI;
}

/** A port nothing listens on now: the server keeps its address across restarts, as `npm start`'s fixed port does. */
export const freePort = () =>
  new Promise<number>((resolve) => {
    const probe = createServer().listen(0, () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The running job's phase as a kill names it. */
function phaseOf(jobs: Iterable<VideoObject>): string {
  for (const job of jobs)
    if (job.status === 'in_progress') {
      const phase = job.phase ?? 'starting';
      return phase.startsWith('step ') ? 'step' : phase.split(':')[0];
    }
  return 'none running';
}

export async function killSoak(options: SoakOptions): Promise<SoakResult> {
  const { dataDir, targets, keepQueued, aimWithinMs = 30_000, drainWithinMs = 300_000, log = () => {} } = options;
  const generator = new SeededRandom(options.seed);
  const rand = () => generator.uniform();
  const started = Date.now();
  const port = await freePort();
  // the client polls as fast as the server answers, to see the short phases a kill aims at: past the key's default rate
  const flags = ['--local-workers', '2', '--port', String(port), '--api-rate', '100000'];
  const start = () => spawnApiServer(dataDir, flags);
  let api = await start();
  const client = new OpenAI({ apiKey: api.key, baseURL: `${api.url}/v1`, maxRetries: 0, timeout: 10_000 });
  const swarmReady = async () => {
    for (let end = Date.now() + 60_000; Date.now() < end; await sleep(200)) {
      const swarm = await api.json<{ workers: unknown[] }>('/v1/swarm');
      if (swarm.workers.length >= 2) return;
    }
    throw new Error(`the 2 local workers did not join within 60 s:\n${api.log()}`);
  };
  await swarmReady();

  const seen = new Map<string, VideoObject>();
  const firstCompleted = new Map<string, { at: number | null; video: number }>();
  const completedAgain = new Set<string>();
  const regressed = new Set<string>();
  const polls = { failed: 0, answered: 0 };
  const videoFile = (id: string) => join(dataDir, 'videos', `${id}.webm`);
  const observe = (job: VideoObject) => {
    const first = firstCompleted.get(job.id);
    if (job.status === 'completed') {
      // the file's inode: a video written again (renamed over) is another file
      const video = statSync(videoFile(job.id)).ino;
      if (!first) firstCompleted.set(job.id, { at: job.completed_at, video });
      else if (first.at !== job.completed_at || first.video !== video) completedAgain.add(job.id);
    } else if (first) regressed.add(job.id);
    seen.set(job.id, job);
  };
  /** A client that polls each job, as a program waiting on its videos does; the server's absence is no error. */
  let polling = true;
  const poll = async () => {
    while (polling) {
      for (const id of [...seen.keys()]) {
        const last = seen.get(id);
        // the finished ones now and then (each is a read of SQLite), the others as fast as the server answers
        if (last?.status === 'completed' && Math.random() > 0.05) continue;
        try {
          observe((await client.videos.retrieve(id)) as unknown as VideoObject);
          polls.answered++;
        } catch {
          polls.failed++;
          await sleep(20);
        }
      }
      await sleep(5);
    }
  };
  const poller = poll();

  const unfinished = () => [...seen.values()].filter((j) => j.status === 'queued' || j.status === 'in_progress');
  let posted = 0;
  const post = async () => {
    const job = await client.videos.create({
      prompt: `a red square moving right, take ${posted++}`,
      size: '64x64',
      frames: 9,
      steps: 2 + Math.floor(rand() * 5),
      seed: Math.floor(rand() * 1000),
      workers: 2,
      cfg_parallel: false,
    } as unknown as OpenAI.VideoCreateParams);
    observe(job as unknown as VideoObject);
    return job.id;
  };

  const kills: Kill[] = [];
  const databaseLines: string[] = [];
  for (const target of targets) {
    while (unfinished().filter((j) => j.status === 'queued').length < keepQueued) await post();
    const aim = Date.now() + aimWithinMs;
    let aimed = false;
    if (target === 'queued') {
      // a job the server has just written, that nothing has run yet
      await post();
      await sleep(rand() * 100);
    } else if (target === 'after-get') {
      // a finished job, read by id: what kept SQLite's lock until the next read
      for (; Date.now() < aim && !aimed; await sleep(50)) {
        const done = [...seen.values()].find((j) => j.status === 'completed');
        if (done) {
          observe((await client.videos.retrieve(done.id)) as unknown as VideoObject);
          aimed = true;
        }
      }
    } else {
      for (; Date.now() < aim && !aimed; await sleep(2)) aimed = phaseOf(seen.values()) === target;
      // a random instant within the phase: the longer ones (placing, steps) are seldom left at once
      if (aimed && (target === 'placing' || target === 'step')) await sleep(rand() * 300);
    }
    const at = target === 'after-get' ? 'after-get' : phaseOf(seen.values());
    const queued = unfinished().filter((j) => j.status === 'queued').length;
    api.process.kill('SIGKILL');
    await new Promise((r) => api.process.once('exit', r));
    const restart = Date.now();
    api = await start();
    await swarmReady();
    const restartMs = Date.now() - restart;
    databaseLines.push(
      ...api
        .log()
        .split('\n')
        .filter((l) => /database/.test(l)),
    );
    kills.push({ target, at, queued, restartMs });
    log(
      `kill ${kills.length}/${targets.length} at ${at} (aimed at ${target}), ${queued} queued; up in ${restartMs} ms`,
    );
  }

  // the kills are over: every job ends
  for (const end = Date.now() + drainWithinMs; unfinished().length > 0; await sleep(200))
    if (Date.now() > end)
      throw new Error(
        `${unfinished().length} jobs did not end within ${drainWithinMs / 1000} s of the last kill:\n` +
          unfinished()
            .map((j) => `${j.id} ${j.status} ${j.phase ?? ''}`)
            .join('\n'),
      );
  // one more read of each, past any poll in flight
  polling = false;
  await poller;
  for (const id of seen.keys()) observe((await client.videos.retrieve(id)) as unknown as VideoObject);
  const listed: string[] = [];
  for await (const job of client.videos.list({ limit: 100 })) listed.push(job.id);
  return {
    kills,
    jobs: [...seen.values()].map((j) => ({
      id: j.id,
      status: j.status,
      attempts: j.attempts,
      completedAt: j.completed_at,
      error: j.error?.message ?? null,
    })),
    completedAgain: [...completedAgain],
    regressed: [...regressed],
    listed,
    polls,
    databaseLines,
    durationMs: Date.now() - started,
    api,
    client,
  };
}
