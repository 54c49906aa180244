// The video API's parts apart from HTTP (server/api): the POST body's checks, the key, the job database and the
// queue that runs its jobs on a stand-in coordinator.

import { spawn, spawnSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Ajv2020 } from 'ajv/dist/2020.js';
import express from 'express';
import sqlite from 'node-sqlite3-wasm';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { defined } from '../../core/defined.ts';
import { prepareApi } from '../../server/api/api.ts';
import { OPENAPI } from '../../server/api/openapi.ts';
import { videoApi } from '../../server/api/routes.ts';
import type { VideoObject } from '../../server/api/video-object.ts';
import { serverOrigins } from '../../server/origins.ts';
import type { AutomationProgress, JobResult } from '../../app/automation.ts';
import { authorized, loadApiKey } from '../../server/api/api-key.ts';
import {
  CoordinatorLost,
  type Coordinator,
  type RunHooks,
  type SwarmState,
} from '../../server/api/coordinator-host.ts';
import { DatabaseInUse } from '../../server/api/db-owner.ts';
import { DiskFullError, JobDb, type VideoJob } from '../../server/api/job-db.ts';
import { JobFiles } from '../../server/api/job-files.ts';
import { MAX_ATTEMPTS, QueueError, VideoJobs } from '../../server/api/video-jobs.ts';
import { allowedModelHosts } from '../../server/api/model-hosts.ts';
import { NAMED_SIZES, parseVideoRequest, RequestError } from '../../server/api/video-request.ts';
import { readSafetensors } from '../../core/safetensors.ts';
import { DEFAULT_MODEL_URL, LIMITS } from '../../core/job.ts';
import { MAX_REFERENCE_BYTES } from '../../server/api/video-form.ts';
import { MAX_SWARM_WORKERS } from '../../server/signaling-capacity.ts';
import type { GenerateReport } from '../../coordinator/pipeline.ts';

const tmp = () => mkdtempSync(join(tmpdir(), 'ditswarm-api-'));

/** The RequestError a body is refused with. */
function refusal(body: unknown, options?: Parameters<typeof parseVideoRequest>[1]): RequestError {
  try {
    parseVideoRequest(body, options);
  } catch (e) {
    if (e instanceof RequestError) return e;
    throw e;
  }
  throw new Error(`${JSON.stringify(body)} was accepted`);
}

describe("POST /v1/videos's body", () => {
  it("takes OpenAI's size and seconds, and the job fields, as the dashboard takes them", () => {
    const { overrides } = parseVideoRequest(
      {
        prompt: 'a cat',
        negative_prompt: 'blur',
        size: '832x480',
        seconds: '5',
        steps: 30,
        guidance: 5,
        seed: 7,
        flow_shift: 3,
        workers: 4,
        cfg_parallel: true,
        dtype: 'f16',
        weights: 'int8',
        ep: 'wasm',
        cache: 'magcache',
        cache_threshold: 0.2,
        output: 'latent',
        lora: ['https://x/a.safetensors', { url: 'https://x/b.safetensors', strength: 0.5 }],
      },
      { modelHosts: ['x'] },
    );
    expect(overrides).toEqual({
      prompt: 'a cat',
      negativePrompt: 'blur',
      width: 832,
      height: 480,
      frames: 81, // 5 s at 16 fps, Wan's 4k+1
      steps: 30,
      guidance: 5,
      seed: 7,
      flowShift: 3,
      backend: 'swarm',
      workers: 2, // each of the two CFG groups
      cfgParallel: true,
      dtype: 'f16',
      weightType: 'int8',
      ep: 'wasm',
      cache: { method: 'magcache', threshold: 0.2 },
      outputType: 'latent',
      model: DEFAULT_MODEL_URL,
      loras: [
        { url: 'https://x/a.safetensors', strength: 1 },
        { url: 'https://x/b.safetensors', strength: 0.5 },
      ],
    });
  });

  it('leaves what it is not given to the model folder, and runs on the served model unless it names one', () => {
    expect(parseVideoRequest({ prompt: 'a' }, { model: '/models/local' }).overrides).toEqual({
      prompt: 'a',
      backend: 'swarm',
      workers: 'auto',
      model: '/models/local',
    });
    expect(
      parseVideoRequest({ prompt: 'a', model: 'https://h/m' }, { model: '/models/local', modelHosts: ['h'] }).overrides
        .model,
    ).toBe('https://h/m');
    expect(parseVideoRequest({ prompt: 'a', width: 64, height: 32, frames: 9 }).overrides).toMatchObject({
      width: 64,
      height: 32,
      frames: 9,
    });
    expect(parseVideoRequest({ prompt: 'a', seconds: 0.5 }).overrides.frames).toBe(9);
    // a server without --model runs the bundled model, and says so from the start
    expect(parseVideoRequest({ prompt: 'a' }).overrides.model).toBe(DEFAULT_MODEL_URL);
    expect(parseVideoRequest({ prompt: 'a', stages: 2, workers: 4 }).overrides).toMatchObject({
      stages: 2,
      workers: 2,
    });
  });

  it('refuses a bad size by naming the sizes it may be', () => {
    for (const size of ['100x64', '832*480', 832, '2000x480']) {
      const e = refusal({ prompt: 'a', size });
      expect(e.param).toBe('size');
      expect(e.message).toContain('multiple of 16 from 16 to 1280');
      for (const named of NAMED_SIZES) expect(e.message).toContain(named);
    }
    expect(refusal({ prompt: 'a', size: '100x64' }).message).toContain('try 96');
    expect(refusal({ prompt: 'a', size: '64x64', width: 64 }).param).toBe('size');
  });

  it('refuses each bad field by its name', () => {
    const cases: [object, string][] = [
      [{}, 'prompt'],
      [{ prompt: '  ' }, 'prompt'],
      [{ prompt: 'a', sizes: '64x64' }, 'sizes'],
      [{ prompt: 'a', frames: 10 }, 'frames'],
      [{ prompt: 'a', frames: 9, seconds: 1 }, 'seconds'],
      [{ prompt: 'a', seconds: 'long' }, 'seconds'],
      [{ prompt: 'a', steps: 0 }, 'steps'],
      [{ prompt: 'a', negative_prompt: 3 }, 'negative_prompt'],
      [{ prompt: 'a', flow_shift: 99 }, 'flow_shift'],
      [{ prompt: 'a', scheduler: 'ddim' }, 'scheduler'],
      [{ prompt: 'a', workers: 3, stages: 2 }, 'workers'],
      [{ prompt: 'a', workers: 0 }, 'workers'],
      [{ prompt: 'a', cfg_parallel: 'yes' }, 'cfg_parallel'],
      [{ prompt: 'a', dtype: 'f8' }, 'dtype'],
      [{ prompt: 'a', weights: 'int4' }, 'weights'],
      [{ prompt: 'a', parallel: 'ring' }, 'parallel'],
      [{ prompt: 'a', cache_threshold: 0.1 }, 'cache_threshold'],
      [{ prompt: 'a', model: 'file:///etc' }, 'model'],
      [{ prompt: 'a', lora: [{ url: 'x', strength: 'max' }] }, 'lora'],
      [{ prompt: 'a', output: 'gif' }, 'output'],
    ];
    for (const [body, param] of cases) expect(refusal(body).param, JSON.stringify(body)).toBe(param);
    expect(refusal([1]).param).toBeNull();
    expect(refusal({ prompt: 'a', sizes: 1 }).message).toContain('the fields are prompt');
  });

  it('bounds every placement field by what the planner can ever use, naming the field and its range', () => {
    const most = MAX_SWARM_WORKERS;
    const cases: [object, string, string][] = [
      [{ workers: 1e9 }, 'workers', `from 1 to ${most}`],
      [{ workers: most + 1 }, 'workers', `from 1 to ${most}`],
      [{ stages: 1e9 }, 'stages', `from 1 to ${most}`],
      [{ stages: most / 2 + 1, cfg_parallel: true }, 'stages', `from 1 to ${Math.floor(most / 2)}`],
      [{ warmup_steps: 1e9 }, 'warmup_steps', `from 0 to ${LIMITS.steps.max}`],
      [{ stages: 2, pipefusion: 1e9 }, 'pipefusion', 'from 2 to '],
    ];
    for (const [fields, param, range] of cases) {
      const e = refusal({ prompt: 'a', ...fields });
      expect(e.param, JSON.stringify(fields)).toBe(param);
      expect(e.message, JSON.stringify(fields)).toContain(range);
      expect(e.message).toContain(`got ${(fields as Record<string, number>)[param]}`);
    }
    // the largest of each is taken
    expect(parseVideoRequest({ prompt: 'a', workers: most }).overrides.workers).toBe(most);
    expect(parseVideoRequest({ prompt: 'a', warmup_steps: LIMITS.steps.max }).overrides.warmupSteps).toBe(100);
  });
});

describe("a job's model and LoRA URLs", () => {
  const hosts = allowedModelHosts(['Models.Example.org']);
  const parse = (body: object) => parseVideoRequest({ prompt: 'a', ...body }, { modelHosts: hosts });
  const refused = (body: object) => refusal({ prompt: 'a', ...body }, { modelHosts: hosts });

  it("are the server's own model folders and LoRA files, or of a host on the allow-list", () => {
    expect(parse({ model: '/models/tiny-wan-demo' }).overrides.model).toBe('/models/tiny-wan-demo');
    expect(parse({ model: 'https://models.example.org/wan' }).overrides.model).toBe('https://models.example.org/wan');
    expect(parse({ model: 'https://MODELS.example.org./wan' }).overrides.model).toBe('https://MODELS.example.org./wan');
    const loras = ['/loras/0/a.safetensors', 'https://models.example.org/b.safetensors'];
    expect(parse({ lora: loras }).overrides.loras?.map((l) => l.url)).toEqual(loras);
    // the model the server runs on, whatever its URL
    const own = 'http://10.0.0.7/wan';
    expect(parseVideoRequest({ prompt: 'a', model: own }, { model: own }).overrides.model).toBe(own);
  });

  it('are refused at a host off the allow-list, and at any loopback, link-local or private address', () => {
    const inside = [
      'http://127.0.0.1:8080/models/tiny-wan-demo',
      'http://2130706433/', // 127.0.0.1 as one number
      'http://0x7f.1/',
      'http://169.254.169.254/latest/meta-data/',
      'http://10.1.2.3/wan',
      'http://172.16.0.1/wan',
      'http://192.168.1.1/wan',
      'http://100.64.0.1/wan',
      'http://0.0.0.0:8080/wan',
      'http://[::1]:8080/wan',
      'http://[::ffff:127.0.0.1]/wan',
      'http://[::ffff:10.0.0.1]/wan',
      'http://[::]/wan',
      'http://172.31.255.255/wan',
      'http://[fe80::1]/wan',
      'http://[fd00::1]/wan',
      'http://localhost:8080/wan',
      'http://api.localhost/wan',
    ];
    for (const url of inside) {
      for (const [body, param] of [
        [{ model: url }, 'model'],
        [{ lora: [url] }, 'lora'],
      ] as const) {
        const e = refused(body);
        expect(e.param, url).toBe(param);
        expect(e.message, url).toMatch(/loopback, link-local or private/);
      }
    }
    for (const url of ['https://evil.example/wan', 'https://models.example.org.evil.example/wan']) {
      const e = refused({ model: url });
      expect(e.param, url).toBe('model');
      expect(e.message, url).toContain('--allow-model-host');
    }
    for (const path of [
      'ftp://models.example.org/x',
      '/models/../v1/videos',
      '/modelsx',
      '/v1/videos',
      'file:///etc/passwd',
      '//evil.example/x',
    ])
      expect(refused({ model: path }).param, path).toBe('model');
    expect(refused({ lora: [{ url: '/loras/../api-key', strength: 1 }] }).param).toBe('lora');
    // without an allow-list, no URL of another host
    expect(() => parseVideoRequest({ prompt: 'a', model: 'https://models.example.org/wan' })).toThrow(
      /--allow-model-host/,
    );
  });

  it('--allow-model-host takes names and public addresses, never one of this machine or its network', () => {
    expect(allowedModelHosts(['Models.Example.org.', '203.0.113.9', '172.32.0.1', '[2001:db8::1]'])).toEqual([
      'models.example.org',
      '203.0.113.9',
      '172.32.0.1',
      '[2001:db8::1]',
    ]);
    const refusedHosts = ['127.0.0.1', 'localhost', '169.254.169.254', '10.0.0.5', '[::1]', '[fe80::1]', '0x7f.1'];
    for (const host of [...refusedHosts, 'a/b', ''])
      expect(() => allowedModelHosts([host]), host).toThrow(/--allow-model-host/);
  });
});

describe("the API's key", () => {
  it('is made on the first start, kept for its owner alone, and the same at the next start', () => {
    const dir = tmp();
    const first = loadApiKey(dir, undefined);
    expect(first.where).toBe(join(dir, 'api-key'));
    expect(first.key.length).toBeGreaterThanOrEqual(32);
    expect(statSync(first.where).mode & 0o777).toBe(0o600);
    expect(loadApiKey(dir, undefined).key).toBe(first.key);
    expect(loadApiKey(tmp(), undefined).key).not.toBe(first.key);
    expect(readFileSync(first.where, 'utf8').trim()).toBe(first.key);
  });

  it("is refused from a file others may read, saying how to make it its owner's alone", () => {
    const dir = tmp();
    const file = join(dir, 'api-key');
    writeFileSync(file, 'ds-0123456789abcdef0123\n', { mode: 0o644 });
    chmodSync(file, 0o644);
    expect(() => loadApiKey(dir, undefined)).toThrow(`chmod 600 ${file}`);
    chmodSync(file, 0o640);
    expect(() => loadApiKey(dir, undefined)).toThrow(/mode 640/);
    chmodSync(file, 0o600);
    expect(loadApiKey(dir, undefined).key).toBe('ds-0123456789abcdef0123');
  });

  it('comes from DITSWARM_API_KEY where given, which is refused when short', () => {
    expect(loadApiKey(tmp(), 'k'.repeat(16))).toEqual({ key: 'k'.repeat(16), where: 'DITSWARM_API_KEY' });
    expect(() => loadApiKey(tmp(), 'short')).toThrow(/at least 16/);
  });

  it('matches only `Bearer <the key>`', () => {
    const key = 'ds-0123456789abcdef';
    expect(authorized(`Bearer ${key}`, key)).toBe(true);
    expect(authorized(`bearer  ${key} `, key)).toBe(true);
    for (const header of [undefined, '', key, `Bearer ${key}x`, `Bearer ${key.slice(0, -1)}`, `Basic ${key}`])
      expect(authorized(header, key), String(header)).toBe(false);
  });
});

describe("the API's data folder", () => {
  let umask = 0;
  beforeEach(() => {
    // as a login shell sets it: what a server does not set, others may read
    umask = process.umask(0o022);
  });
  afterEach(() => {
    process.umask(umask);
  });

  it("is its owner's alone, and so is everything written under it, the videos too", async () => {
    const dataDir = join(tmp(), 'data');
    mkdirSync(join(dataDir, 'videos'), { recursive: true, mode: 0o755 }); // as an earlier server left it
    const api = prepareApi({
      dataDir,
      localWorkers: 0,
      maxQueued: 1,
      requestsPerMinute: 1,
      defaultModelDir: null,
      log: () => {},
    });
    // what it wrote (its key, its folders) stays; its database is opened again here, to write a job and its video
    await api.close();
    const db = JobDb.open(dataDir);
    try {
      const files = new JobFiles(join(dataDir, 'videos'));
      const jobs = new VideoJobs(db, files, new StandInCoordinator(), {
        maxQueued: 1,
        hasWorkers: () => Promise.resolve(true),
        log: () => {},
      });
      const job = await jobs.accept({ overrides: { prompt: 'a' } });
      files.write(job.id, resultOf(0));
      const modes = (dir: string): [string, number][] =>
        readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
          const path = join(dir, e.name);
          return [[path, statSync(path).mode & 0o777] as [string, number], ...(e.isDirectory() ? modes(path) : [])];
        });
      const written = modes(dataDir);
      expect(written.map(([path]) => path)).toEqual(
        expect.arrayContaining([
          api.key.where,
          join(dataDir, 'jobs.sqlite'),
          defined(files.path(job.id, 'video'), 'the video'),
        ]),
      );
      expect(statSync(dataDir).mode & 0o777).toBe(0o700);
      for (const [path, mode] of written) expect(mode, path).toBe(statSync(path).isDirectory() ? 0o700 : 0o600);
    } finally {
      db.close();
    }
  });
});

/** A finished job as the coordinator's automation API gives it: a 9-frame 64×64 latent of 16 channels. */
function resultOf(seed: number): JobResult {
  const latent = Float32Array.from({ length: 16 * 3 * 8 * 8 }, (_, i) => seed + i / 1000);
  const report = {
    config: { frames: 9, height: 64, width: 64, model: '/models/tiny-wan-demo', latentShape: [16, 3, 8, 8] },
    steps: [],
    totalMs: 1,
  };
  return {
    report: report as unknown as GenerateReport,
    latent: Buffer.from(latent.buffer).toString('base64'),
    video: Buffer.from(`webm of ${seed}`).toString('base64'),
  };
}

/** A coordinator that runs the jobs it is given when the test says, recording them. */
class StandInCoordinator implements Coordinator {
  readonly runs: {
    prompt: string;
    signal: AbortSignal;
    /** the page job it was told to go on from */
    resume: number | null;
    /** as the page says the run's id */
    started(pageJob: number): void;
    finish(r: JobResult | Error): void;
    progress(p: AutomationProgress): void;
  }[] = [];
  workers = 1;
  /** times its link was revoked, each giving a new one */
  revoked = 0;
  revokeFails = false;
  revokeJoinLink() {
    if (this.revokeFails) return Promise.reject(new Error('the server did not answer'));
    this.revoked++;
    return Promise.resolve();
  }
  swarm() {
    return Promise.resolve({
      joinUrl: `j${this.revoked}`,
      lanJoinUrl: `l${this.revoked}`,
      coordinator: 'ready' as const,
      restarts: 0,
      workers: Array.from({ length: this.workers }, (_, i) => ({
        id: `w${i}`,
        ep: 'wasm' as const,
        threads: 1,
        adapter: '',
        transport: 'direct' as const,
        state: 'idle',
        thisMachine: true,
      })),
    });
  }
  run(overrides: { prompt?: string }, hooks: RunHooks) {
    return new Promise<JobResult>((resolve, reject) => {
      this.runs.push({
        prompt: overrides.prompt ?? '',
        signal: hooks.signal,
        resume: hooks.resume,
        started: hooks.onPageJob,
        finish: (r) => (r instanceof Error ? reject(r) : resolve(r)),
        progress: hooks.onProgress,
      });
      hooks.signal.addEventListener('abort', () => reject(new Error('cancelled')));
    });
  }
}

/** Waits for `what` to hold: up to 5 s, which a loaded 2-core machine needs where an idle one takes milliseconds. */
const until = async (what: () => boolean) => {
  for (const end = Date.now() + 5000; Date.now() < end && !what();) await new Promise((r) => setTimeout(r, 5));
  expect(what()).toBe(true);
};

describe("the API's queue", () => {
  const opened: JobDb[] = [];
  afterEach(() => {
    for (const db of opened.splice(0)) db.close();
  });
  function queue(dir = tmp(), coordinator = new StandInCoordinator(), maxQueued = 10) {
    const db = JobDb.open(dir);
    opened.push(db);
    const jobs = new VideoJobs(db, new JobFiles(join(dir, 'videos')), coordinator, {
      maxQueued,
      hasWorkers: async () => (await coordinator.swarm()).workers.length > 0,
      log: () => {},
    });
    return { dir, db, jobs, coordinator };
  }
  const ask = (prompt: string) => ({ overrides: { prompt } });

  it('runs the jobs one at a time in the order accepted, and keeps their video and latent', async () => {
    const { jobs, coordinator } = queue();
    jobs.start();
    const [a, b] = [await jobs.accept(ask('a')), await jobs.accept(ask('b'))];
    expect(a.status).toBe('queued');
    await until(() => coordinator.runs.length === 1);
    expect(jobs.get(a.id)?.status).toBe('in_progress');
    expect(jobs.get(b.id)?.status).toBe('queued');
    coordinator.runs[0].progress({ job: 1, step: 5, steps: 20, stepMs: 100, etaMs: 1500 });
    expect(jobs.get(a.id)).toMatchObject({ progress: 25, phase: 'step 5 of 20', etaMs: 1500 });
    coordinator.runs[0].finish(resultOf(1));
    await until(() => coordinator.runs.length === 2);
    expect(coordinator.runs.map((r) => r.prompt)).toEqual(['a', 'b']);
    const done = jobs.get(a.id) as VideoJob;
    expect(done).toMatchObject({ status: 'completed', progress: 100, attempts: 1 });
    expect(readFileSync(jobs.files.path(a.id, 'video') as string, 'utf8')).toBe('webm of 1');
    const latent = readSafetensors(readFileSync(jobs.files.path(a.id, 'latent') as string), 'latent').get('latent');
    expect(latent?.shape).toEqual([16, 3, 8, 8]);
    expect(latent?.data[5]).toBeCloseTo(1.005, 6);
  });

  it('cancels the running job (its run is told to stop) and starts the next', async () => {
    const { jobs, coordinator } = queue();
    jobs.start();
    const [a, b] = [await jobs.accept(ask('a')), await jobs.accept(ask('b'))];
    await until(() => coordinator.runs.length === 1);
    expect(jobs.cancel(a.id).status).toBe('cancelled');
    expect(coordinator.runs[0].signal.aborted).toBe(true);
    await until(() => coordinator.runs.length === 2);
    expect(jobs.get(a.id)).toMatchObject({ status: 'cancelled', error: { code: 'cancelled' } });
    expect(jobs.get(b.id)?.status).toBe('in_progress');
    expect(() => jobs.cancel(a.id)).toThrow(QueueError);
    // a queued one never starts
    const c = await jobs.accept(ask('c'));
    jobs.cancel(c.id);
    coordinator.runs[1].finish(resultOf(2));
    await until(() => jobs.get(b.id)?.status === 'completed');
    await new Promise((r) => setTimeout(r, 20));
    expect(coordinator.runs).toHaveLength(2);
  });

  it('runs a job again where its coordinator page went, and gives it up after MAX_ATTEMPTS', async () => {
    const { jobs, coordinator } = queue();
    jobs.start();
    const a = await jobs.accept(ask('a'));
    for (let n = 1; n <= MAX_ATTEMPTS; n++) {
      await until(() => coordinator.runs.length === n);
      expect(jobs.get(a.id)?.attempts).toBe(n);
      // each run goes on from the page job of the run before it
      expect(coordinator.runs[n - 1].resume).toBe(n === 1 ? null : 10 + n - 1);
      coordinator.runs[n - 1].started(10 + n);
      expect(jobs.get(a.id)?.pageJob).toBe(10 + n);
      coordinator.runs[n - 1].finish(new CoordinatorLost('the coordinator page crashed while the job ran'));
    }
    await until(() => jobs.get(a.id)?.status === 'failed');
    expect(jobs.get(a.id)?.error).toMatchObject({ code: 'interrupted' });
    // a job's own failure is not run again
    const b = await jobs.accept(ask('b'));
    await until(() => coordinator.runs.length === MAX_ATTEMPTS + 1);
    coordinator.runs[MAX_ATTEMPTS].finish(new Error('stages 3 need 3 workers'));
    await until(() => jobs.get(b.id)?.status === 'failed');
    expect(jobs.get(b.id)?.error).toEqual({ code: 'job_failed', message: 'stages 3 need 3 workers' });
  });

  it('after a restart runs the interrupted job first, then the queued ones, and none that completed', async () => {
    const dir = tmp();
    const first = queue(dir);
    first.jobs.start();
    const done = await first.jobs.accept(ask('done'));
    await until(() => first.coordinator.runs.length === 1);
    first.coordinator.runs[0].finish(resultOf(0));
    const running = await first.jobs.accept(ask('running'));
    const waiting = [await first.jobs.accept(ask('w1')), await first.jobs.accept(ask('w2'))];
    await until(() => first.coordinator.runs.length === 2);
    first.coordinator.runs[1].started(7);
    // the server is killed: nothing more is written; the database is all the next one has
    first.db.close();
    const second = queue(dir);
    second.jobs.start();
    await until(() => second.coordinator.runs.length === 1);
    expect(second.jobs.get(running.id)).toMatchObject({ status: 'in_progress', attempts: 2 });
    for (let n = 0; n < 3; n++) {
      await until(() => second.coordinator.runs.length === n + 1);
      second.coordinator.runs[n].finish(resultOf(n));
    }
    await until(() => second.jobs.get(waiting[1].id)?.status === 'completed');
    expect(second.coordinator.runs.map((r) => r.prompt)).toEqual(['running', 'w1', 'w2']);
    // the interrupted run goes on from the page's checkpoint of it
    expect(second.coordinator.runs.map((r) => r.resume)).toEqual([7, null, null]);
    expect(second.jobs.get(done.id)).toMatchObject({ status: 'completed', attempts: 1 });
    expect(waiting.map((w) => second.jobs.get(w.id)?.attempts)).toEqual([1, 1]);
  });

  it('refuses a job while no worker has joined (503) and past a full queue (429), storing nothing', async () => {
    const { jobs, coordinator, db } = queue(tmp(), new StandInCoordinator(), 2);
    coordinator.workers = 0;
    await expect(jobs.accept(ask('a'))).rejects.toMatchObject({ status: 503 });
    coordinator.workers = 1;
    await jobs.accept(ask('a')); // runs
    await until(() => coordinator.runs.length === 1);
    await jobs.accept(ask('b'));
    await jobs.accept(ask('c'));
    await expect(jobs.accept(ask('d'))).rejects.toMatchObject({ status: 429 });
    expect(db.list({ limit: 10 }).map((j) => j.request.overrides.prompt)).toEqual(['c', 'b', 'a']);
  });

  it('takes the queue cap atomically: 64 jobs POSTed at once under a cap of 10 leave 10 waiting', async () => {
    const dir = tmp();
    const db = JobDb.open(dir);
    opened.push(db);
    const coordinator = new StandInCoordinator();
    // the swarm is asked over the coordinator page: an answer comes after a while, in no set order
    const jobs = new VideoJobs(db, new JobFiles(join(dir, 'videos')), coordinator, {
      maxQueued: 10,
      hasWorkers: () => new Promise((r) => setTimeout(() => r(true), Math.random() * 20)),
      log: () => {},
    });
    const results = await Promise.allSettled(Array.from({ length: 64 }, (_, i) => jobs.accept(ask(`${i}`))));
    const waiting = db.list({ limit: 100 }).filter((j) => j.status === 'queued');
    expect(waiting).toHaveLength(10);
    // the first runs at once, so one more than the cap is taken in all
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(11);
    for (const r of results) if (r.status === 'rejected') expect(r.reason).toMatchObject({ status: 429 });
  });

  it('fails a job whose files the disk has no room for, keeping the jobs stored before it', async () => {
    const { jobs, coordinator, dir } = queue();
    jobs.start();
    const a = await jobs.accept(ask('a'));
    await until(() => coordinator.runs.length === 1);
    coordinator.runs[0].finish(resultOf(0));
    await until(() => jobs.get(a.id)?.status === 'completed');
    const b = await jobs.accept(ask('b'));
    // its latent's file is written to /dev/full: ENOSPC, as on a full disk
    symlinkSync('/dev/full', join(dir, 'videos', `${b.id}.latent.safetensors.partial`));
    await until(() => coordinator.runs.length === 2);
    coordinator.runs[1].finish(resultOf(1));
    await until(() => jobs.get(b.id)?.status === 'failed');
    expect(jobs.get(b.id)?.error?.code).toBe('storage_full');
    expect(jobs.files.path(b.id, 'latent')).toBeNull();
    expect(jobs.get(a.id)?.status).toBe('completed');
    expect(readFileSync(jobs.files.path(a.id, 'video') as string, 'utf8')).toBe('webm of 0');
  });

  it("opens a database made before jobs kept their page's id, keeping its jobs", () => {
    const dir = tmp();
    const old = new sqlite.Database(join(dir, 'jobs.sqlite'));
    old.exec(
      'CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, status TEXT NOT NULL, ' +
        'request TEXT NOT NULL, created_at INTEGER NOT NULL, started_at INTEGER, completed_at INTEGER, ' +
        'progress INTEGER NOT NULL DEFAULT 0, phase TEXT, eta_ms INTEGER, error TEXT, report TEXT, ' +
        'attempts INTEGER NOT NULL DEFAULT 0)',
    );
    old.run("INSERT INTO jobs (id, status, request, created_at) VALUES ('video_a', 'in_progress', '{}', 1)");
    old.close();
    const { db } = queue(dir);
    expect(db.get('video_a')).toMatchObject({ status: 'in_progress', pageJob: null });
    db.update('video_a', { pageJob: 3 });
    expect(db.get('video_a')?.pageJob).toBe(3);
  });

  it('lists newest first, a page at a time', async () => {
    const { jobs, db } = queue();
    const ids = [];
    for (const p of ['a', 'b', 'c', 'd', 'e']) ids.push((await jobs.accept(ask(p))).id);
    expect(db.list({ limit: 2 }).map((j) => j.id)).toEqual([ids[4], ids[3]]);
    expect(db.list({ limit: 2, after: ids[3] }).map((j) => j.id)).toEqual([ids[2], ids[1]]);
    expect(db.list({ limit: 2, after: ids[1] }).map((j) => j.id)).toEqual([ids[0]]);
    expect(db.list({ limit: 2, after: 'video_none' })).toEqual([]);
  });
});

/** A queued job as VideoJobs.accept writes it, less its id. */
const NOT_RUN = { startedAt: null, completedAt: null, phase: null, etaMs: null, error: null, report: null };
const newJob = (id: string): Omit<VideoJob, 'seq'> => ({
  ...NOT_RUN,
  id,
  status: 'queued',
  request: { overrides: { prompt: 'a' } },
  createdAt: 1,
  progress: 0,
  attempts: 0,
  pageJob: null,
});

describe("the job database's lock", () => {
  /** A process that has ended: its pid names no running process (until the kernel gives it again). */
  const deadPid = () => {
    const child = spawnSync('true');
    return defined(child.pid, 'a pid');
  };

  it('is held by no call once it returned: reads, lists and writes leave no lock behind', () => {
    const dir = tmp();
    const db = JobDb.open(dir);
    const lock = join(dir, 'jobs.sqlite.lock');
    try {
      const job = db.insert(newJob('video_a'));
      expect(existsSync(lock)).toBe(false);
      expect(db.get(job.id)?.id).toBe('video_a');
      expect(existsSync(lock)).toBe(false);
      db.update(job.id, { progress: 5 });
      expect(db.list({ limit: 5, after: 'video_a' })).toEqual([]);
      expect(db.unfinished()).toHaveLength(1);
      expect(db.countQueued()).toBe(1);
      expect(existsSync(lock)).toBe(false);
      // the owner file names this process while it has the database open
      expect(JSON.parse(readFileSync(join(dir, 'jobs.sqlite.owner'), 'utf8'))).toMatchObject({ pid: process.pid });
    } finally {
      db.close();
    }
    expect(existsSync(join(dir, 'jobs.sqlite.owner'))).toBe(false);
  });

  it("is taken over from a killed server, its lock removed, with a line that names the dead server's pid", () => {
    const dir = tmp();
    const first = JobDb.open(dir);
    first.insert(newJob('video_a'));
    first.close();
    // what a server killed mid-write leaves: its owner file, and SQLite's lock directory
    const pid = deadPid();
    writeFileSync(join(dir, 'jobs.sqlite.owner'), JSON.stringify({ pid, start: '1' }));
    mkdirSync(join(dir, 'jobs.sqlite.lock'));
    const lines: string[] = [];
    const db = JobDb.open(dir, (line) => lines.push(line));
    try {
      expect(db.get('video_a')?.status).toBe('queued');
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(
        new RegExp(`pid ${pid}, which no longer runs.*taken over.*jobs\\.sqlite\\.lock\\) removed`),
      );
    } finally {
      db.close();
    }
    // a server that closed it leaves nothing to say
    const quiet: string[] = [];
    JobDb.open(dir, (line) => quiet.push(line)).close();
    expect(quiet).toEqual([]);
  });

  it('is refused while the server holding it runs, naming its pid; a pid since given to another process is no holder', () => {
    const dir = tmp();
    const holder = spawn('sleep', ['30']);
    try {
      const pid = defined(holder.pid, 'a pid');
      const start = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')[19];
      writeFileSync(join(dir, 'jobs.sqlite.owner'), JSON.stringify({ pid, start }));
      let refused: unknown;
      try {
        JobDb.open(dir).close();
      } catch (e) {
        refused = e;
      }
      expect(refused).toBeInstanceOf(DatabaseInUse);
      expect((refused as DatabaseInUse).holder.pid).toBe(pid);
      expect((refused as Error).message).toMatch(
        new RegExp(`pid ${pid}, which is still running: stop it \\(kill ${pid}\\)`),
      );
      expect(existsSync(join(dir, 'jobs.sqlite'))).toBe(false);
      // the same pid with another start time is a process that came after the holder ended
      writeFileSync(join(dir, 'jobs.sqlite.owner'), JSON.stringify({ pid, start: `${start}0` }));
      const lines: string[] = [];
      JobDb.open(dir, (line) => lines.push(line)).close();
      expect(lines[0]).toMatch(`pid ${pid}, which no longer runs`);
    } finally {
      holder.kill('SIGKILL');
    }
    // open in this process: a second open is refused too
    const db = JobDb.open(dir);
    try {
      expect(() => JobDb.open(dir)).toThrow(`pid ${process.pid}`);
    } finally {
      db.close();
    }
  });
});

describe('the API over HTTP', () => {
  const KEY = 'ds-test-key-0123456789';
  const ajv = new Ajv2020({ strict: false });
  ajv.addSchema({ $id: 'openapi', components: OPENAPI.components });
  /** Asserts that `body` is what the OpenAPI document says the schema `name` is. */
  const conforms = (name: string, body: unknown) => {
    const validate = defined(ajv.getSchema(`openapi#/components/schemas/${name}`), `schema ${name}`);
    expect(validate(body), JSON.stringify(validate.errors)).toBe(true);
  };
  let server: Server;
  let base = '';
  let opened: { db: JobDb; coordinator: StandInCoordinator; jobs: VideoJobs };
  const call = async (path: string, init: RequestInit & { key?: string | null } = {}) => {
    const { key = KEY, ...rest } = init;
    const response = await fetch(`${base}${path}`, {
      ...rest,
      headers: {
        ...(key === null ? {} : { Authorization: `Bearer ${key}` }),
        ...(rest.body ? { 'Content-Type': 'application/json' } : {}),
        ...(rest.headers as Record<string, string> | undefined),
      },
    });
    const type = response.headers.get('content-type') ?? '';
    return { status: response.status, type, body: (type.includes('json') ? await response.json() : null) as unknown };
  };
  const post = (body: object) => call('/v1/videos', { method: 'POST', body: JSON.stringify(body) });

  beforeEach(async () => {
    // under a folder whose name starts with a dot, as the default data folder (~/.local/share/ditswarm) is
    const dir = join(tmp(), '.data');
    const db = JobDb.open(dir);
    const coordinator = new StandInCoordinator();
    const jobs = new VideoJobs(db, new JobFiles(join(dir, 'videos')), coordinator, {
      maxQueued: 3,
      hasWorkers: async () => (await coordinator.swarm()).workers.length > 0,
      log: () => {},
    });
    jobs.start();
    opened = { db, coordinator, jobs };
    const app = express();
    let port: number | null = null;
    app.use(
      '/v1',
      videoApi(Promise.resolve({ jobs, coordinator }), {
        key: KEY,
        origins: serverOrigins([], () => port),
        requestsPerMinute: 120,
      }),
    );
    server = app.listen(0);
    await new Promise((r) => server.once('listening', r));
    port = (server.address() as AddressInfo).port;
    base = `http://localhost:${port}`;
  });
  afterEach(async () => {
    vi.restoreAllMocks();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    opened.db.close();
  });

  it('answers every endpoint without the key, or with a wrong one, 401 as OpenAI errors', async () => {
    const id = (await post({ prompt: 'a' })).body as VideoObject;
    const paths: [string, string][] = [
      ['POST', '/v1/videos'],
      ['GET', '/v1/videos'],
      ['GET', `/v1/videos/${id.id}`],
      ['GET', `/v1/videos/${id.id}/content`],
      ['GET', `/v1/videos/${id.id}/events`],
      ['DELETE', `/v1/videos/${id.id}`],
      ['GET', '/v1/swarm'],
      ['POST', '/v1/swarm/revoke'],
      ['GET', '/v1/openapi.json'],
      ['GET', '/v1/anything'],
    ];
    for (const [method, path] of paths)
      for (const key of [null, 'ds-wrong-key-0123456789']) {
        const { status, body } = await call(path, { method, key });
        expect(status, `${method} ${path}`).toBe(401);
        conforms('Error', body);
        expect((body as ApiError).error.type).toBe('authentication_error');
      }
    expect(opened.jobs.get(id.id)?.status).toBe('in_progress'); // no DELETE got through
  });

  it('queues with 202, and answers each job, list, file and error as the OpenAPI document says', async () => {
    const accepted = await post({ prompt: 'a red ball', size: '64x64', frames: 9 });
    expect(accepted.status).toBe(202);
    conforms('Video', accepted.body);
    const a = accepted.body as VideoObject;
    expect(a).toMatchObject({ object: 'video', status: 'queued', size: '64x64', frames: 9, seconds: '0.5' });
    const b = (await post({ prompt: 'b' })).body as VideoObject;
    await until(() => opened.coordinator.runs.length === 1);

    const running = await call(`/v1/videos/${a.id}`);
    conforms('Video', running.body);
    expect((running.body as VideoObject).status).toBe('in_progress');
    const early = await call(`/v1/videos/${a.id}/content`);
    expect(early.status).toBe(409);
    conforms('Error', early.body);

    // a long poll answers at the job's next change
    const polled = call(`/v1/videos/${a.id}?wait=10`);
    await new Promise((r) => setTimeout(r, 50));
    opened.coordinator.runs[0].progress({ job: 1, step: 1, steps: 2, stepMs: 10, etaMs: 10 });
    expect(((await polled).body as VideoObject).progress).toBe(50);
    opened.coordinator.runs[0].finish(resultOf(1));
    await until(() => opened.jobs.get(a.id)?.status === 'completed');

    const done = await call(`/v1/videos/${a.id}`);
    conforms('Video', done.body);
    expect(done.body).toMatchObject({ status: 'completed', progress: 100 });
    const video = await fetch(`${base}/v1/videos/${a.id}/content`, { headers: { Authorization: `Bearer ${KEY}` } });
    expect(video.headers.get('content-type')).toBe('video/webm');
    expect(await video.text()).toBe('webm of 1');
    const latent = await fetch(`${base}/v1/videos/${a.id}/content?variant=latent`, {
      headers: { Authorization: `Bearer ${KEY}` },
    });
    const tensors = readSafetensors(new Uint8Array(await latent.arrayBuffer()), 'latent');
    expect(tensors.get('latent')?.shape).toEqual([16, 3, 8, 8]);
    expect((await call(`/v1/videos/${a.id}/content?variant=gif`)).status).toBe(400);

    const list = await call('/v1/videos?limit=1');
    conforms('VideoList', list.body);
    expect(list.body).toMatchObject({ first_id: b.id, last_id: b.id, has_more: true });
    const next = await call(`/v1/videos?limit=1&after=${b.id}`);
    expect(next.body).toMatchObject({ first_id: a.id, has_more: false });
    expect((await call('/v1/videos?limit=0')).status).toBe(400);

    const swarm = await call('/v1/swarm');
    conforms('Swarm', swarm.body);

    // DELETE: a running job is cancelled, a finished one deleted with its files
    const cancelled = await call(`/v1/videos/${b.id}`, { method: 'DELETE' });
    conforms('Video', cancelled.body);
    expect((cancelled.body as VideoObject).status).toBe('cancelled');
    const deleted = await call(`/v1/videos/${a.id}`, { method: 'DELETE' });
    conforms('DeletedVideo', deleted.body);
    expect((await call(`/v1/videos/${a.id}`)).status).toBe(404);
    expect(opened.jobs.files.path(a.id, 'video')).toBeNull();
  });

  it('refuses bad calls with the status that says why, naming the field', async () => {
    const size = await post({ prompt: 'a', size: '100x100' });
    expect(size.status).toBe(400);
    conforms('Error', size.body);
    expect((size.body as ApiError).error).toMatchObject({ param: 'size', type: 'invalid_request_error' });
    expect((size.body as ApiError).error.message).toContain('832x480');
    const notJson = await call('/v1/videos', { method: 'POST', body: '{"prompt":', key: KEY });
    expect(notJson.status).toBe(400);
    conforms('Error', notJson.body);
    expect(
      (await call('/v1/videos', { method: 'POST', body: JSON.stringify({ prompt: 'x'.repeat(70_000) }) })).status,
    ).toBe(413);
    expect((await call('/v1/videos/video_000000000000000000000000')).status).toBe(404);
    // a page of another site may not use it, key or not
    expect((await call('/v1/videos', { headers: { Origin: 'https://evil.example' } })).status).toBe(403);

    opened.coordinator.workers = 0;
    const none = await post({ prompt: 'a' });
    expect(none.status).toBe(503);
    conforms('Error', none.body);
    opened.coordinator.workers = 1;
    for (let i = 0; i < 4; i++) expect((await post({ prompt: `${i}` })).status).toBe(202); // one runs, 3 wait
    const first = opened.db.list({ limit: 1 })[0].id;
    expect(((await call(`/v1/videos/${first}?wait=61`)).body as ApiError).error.param).toBe('wait');
    const full = await post({ prompt: 'one too many' });
    expect(full.status).toBe(429);
    expect((full.body as ApiError).error.message).toContain('queue is full');

    vi.spyOn(opened.db, 'insert').mockImplementation(() => {
      throw new DiskFullError('the disk holding the job database is full');
    });
    opened.jobs.cancel(opened.db.list({ limit: 1 })[0].id); // room in the queue
    const disk = await post({ prompt: 'a' });
    expect(disk.status).toBe(507);
    conforms('Error', disk.body);
  });

  /** A POST of `fields` as multipart/form-data, as `curl -F` and the openai SDK send it. */
  const postForm = async (fields: [string, string | Blob][]) => {
    const form = new FormData();
    for (const [name, value] of fields) form.append(name, value);
    const response = await fetch(`${base}/v1/videos`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${KEY}` },
      body: form,
    });
    return { status: response.status, body: (await response.json()) as unknown };
  };
  const PNG = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 1, 2, 3]);

  it('takes the form OpenAI documents (curl -F), its fields as text, its image kept with the job', async () => {
    const accepted = await postForm([
      ['prompt', 'a red ball'],
      ['size', '64x64'],
      ['seconds', '0.5'],
      ['steps', '2'],
      ['seed', '7'],
      ['cfg_parallel', 'false'],
      ['lora', '/loras/0/a.safetensors'],
      ['lora', '/loras/1/b.safetensors'],
      ['input_reference', new File([PNG], 'first.png', { type: 'image/png' })],
    ]);
    expect(accepted.status).toBe(202);
    conforms('Video', accepted.body);
    const job = accepted.body as VideoObject;
    expect(job).toMatchObject({ status: 'queued', size: '64x64', frames: 9, model: DEFAULT_MODEL_URL });
    expect(job.input_reference).toMatchObject({ type: 'image/png', bytes: PNG.length, name: 'first.png' });
    expect(job.input_reference?.note).toMatch(/first frame.*Wan2.2 TI2V/);
    expect(opened.jobs.get(job.id)?.request.overrides).toMatchObject({
      steps: 2,
      seed: 7,
      cfgParallel: false,
      loras: [
        { url: '/loras/0/a.safetensors', strength: 1 },
        { url: '/loras/1/b.safetensors', strength: 1 },
      ],
    });
    const kept = defined(opened.jobs.files.path(job.id, 'reference'), 'the kept image');
    expect(new Uint8Array(readFileSync(kept))).toEqual(PNG);
    // a JSON job has none, and its model is set while it waits too
    const plain = (await post({ prompt: 'b' })).body as VideoObject;
    expect(plain).toMatchObject({ input_reference: null, model: DEFAULT_MODEL_URL });
  });

  it('refuses a form field or image it cannot take, by name, and a form past its bound with 413', async () => {
    const refused = async (fields: [string, string | Blob][], param: string | null, message: RegExp) => {
      const { status, body } = await postForm(fields);
      expect(status).toBe(400);
      conforms('Error', body);
      expect((body as { error: { param: string | null; message: string } }).error).toMatchObject({ param });
      expect((body as { error: { message: string } }).error.message).toMatch(message);
    };
    await refused([['size', '64x64']], 'prompt', /prompt is required/);
    await refused(
      [
        ['prompt', 'a'],
        ['steps', 'many'],
      ],
      'steps',
      /steps/,
    );
    await refused(
      [
        ['prompt', 'a'],
        ['prompt', 'b'],
      ],
      'prompt',
      /came twice/,
    );
    await refused(
      [
        ['prompt', 'a'],
        ['input_reference', 'https://x/a.png'],
      ],
      'input_reference',
      /came as text/,
    );
    await refused(
      [
        ['prompt', 'a'],
        ['input_reference', new File(['GIF89a'], 'a.gif', { type: 'image/gif' })],
      ],
      'input_reference',
      /PNG, JPEG or WebP.*a\.gif \(image\/gif\)/,
    );
    await refused(
      [
        ['prompt', 'a'],
        ['input_reference[image_url]', 'https://x/a.png'],
      ],
      'input_reference',
      /file part/,
    );
    const big = await postForm([
      ['prompt', 'a'],
      ['input_reference', new File([new Uint8Array(MAX_REFERENCE_BYTES + 128 * 1024)], 'big.png')],
    ]);
    expect(big.status).toBe(413);
    expect((big.body as { error: { message: string } }).error.message).toMatch(/larger than \d+ KB/);
    // nothing was queued, and no image kept
    expect((await call('/v1/videos')).body).toMatchObject({ data: [] });
  });

  it('matches ids exactly: an id with anything after it is no job', async () => {
    const a = (await post({ prompt: 'a' })).body as VideoObject;
    expect((await call(`/v1/videos/${a.id}`)).status).toBe(200);
    for (const id of [`${a.id}%00garbage`, `${a.id}%00`, `${a.id}x`, a.id.toUpperCase(), `${a.id.slice(0, -1)}%00`])
      for (const path of [`/v1/videos/${id}`, `/v1/videos/${id}/content`, `/v1/videos/${id}/events`]) {
        const { status, body } = await call(path);
        expect(status, path).toBe(404);
        conforms('Error', body);
      }
    expect((await call(`/v1/videos/${a.id}%00garbage`, { method: 'DELETE' })).status).toBe(404);
    expect((await call(`/v1/videos?after=${a.id}%00garbage`)).status).toBe(404);
    expect(opened.jobs.get(a.id)?.status).toBe('in_progress');
  });

  it('serves a byte range of the content: 206 with Content-Range, Accept-Ranges, 416 past its end', async () => {
    const a = (await post({ prompt: 'a' })).body as VideoObject;
    await until(() => opened.coordinator.runs.length === 1);
    opened.coordinator.runs[0].finish(resultOf(1)); // its video is the 9 bytes "webm of 1"
    await until(() => opened.jobs.get(a.id)?.status === 'completed');
    const get = (range?: string) =>
      fetch(`${base}/v1/videos/${a.id}/content`, {
        headers: { Authorization: `Bearer ${KEY}`, ...(range && { Range: range }) },
      });
    const whole = await get();
    expect(whole.status).toBe(200);
    expect(whole.headers.get('accept-ranges')).toBe('bytes');
    expect(whole.headers.get('cache-control')).toBe('private');
    expect(await whole.text()).toBe('webm of 1');
    const part = await get('bytes=5-7');
    expect(part.status).toBe(206);
    expect(part.headers.get('content-range')).toBe('bytes 5-7/9');
    expect(part.headers.get('content-type')).toBe('video/webm');
    expect(await part.text()).toBe('of ');
    const tail = await get('bytes=-1');
    expect([tail.status, await tail.text()]).toEqual([206, '1']);
    const past = await get('bytes=9-');
    expect(past.status).toBe(416);
    expect(past.headers.get('content-range')).toBe('bytes */9');
    conforms('Error', await past.json());
  });

  it('revokes the worker link with the key (POST /v1/swarm/revoke), answering the swarm with its new link', async () => {
    const before = (await call('/v1/swarm')).body as SwarmState;
    expect((await call('/v1/swarm/revoke', { method: 'POST', key: null })).status).toBe(401);
    expect((await call('/v1/swarm/revoke', { method: 'POST', key: 'ds-wrong-key-0123456789' })).status).toBe(401);
    expect(opened.coordinator.revoked).toBe(0);
    const revoked = await call('/v1/swarm/revoke', { method: 'POST' });
    expect(revoked.status).toBe(200);
    conforms('Swarm', revoked.body);
    expect(opened.coordinator.revoked).toBe(1);
    const after = revoked.body as SwarmState;
    expect(after.joinUrl).not.toBe(before.joinUrl);
    expect(((await call('/v1/swarm')).body as SwarmState).joinUrl).toBe(after.joinUrl);
    // a page that could not revoke it says why
    opened.coordinator.revokeFails = true;
    const failed = await call('/v1/swarm/revoke', { method: 'POST' });
    expect(failed.status).toBe(503);
    expect((failed.body as ApiError).error.message).toContain('not revoked');
  });

  it('streams a job as server-sent events until it ends', async () => {
    const a = (await post({ prompt: 'a' })).body as VideoObject;
    await until(() => opened.coordinator.runs.length === 1);
    const response = await fetch(`${base}/v1/videos/${a.id}/events`, { headers: { Authorization: `Bearer ${KEY}` } });
    expect(response.headers.get('content-type')).toBe('text/event-stream');
    const text = response.text();
    opened.coordinator.runs[0].progress({ job: 1, step: 1, steps: 4, stepMs: 10, etaMs: 30 });
    opened.coordinator.runs[0].finish(resultOf(0));
    const events = (await text)
      .split('\n\n')
      .filter(Boolean)
      .map((e) => JSON.parse(e.replace(/^event: video\ndata: /, '')) as VideoObject);
    for (const e of events) conforms('Video', e);
    expect(events.map((e) => e.status)).toEqual(['in_progress', 'in_progress', 'completed']);
    expect(events[1].progress).toBe(25);
  });

  it('limits the requests of a key', async () => {
    // the clock stands still: the buckets refill with time, which a loaded machine gives them
    vi.spyOn(Date, 'now').mockReturnValue(Date.now());
    const statuses = [];
    for (let i = 0; i < 125; i++) statuses.push((await call('/v1/swarm')).status);
    expect(statuses.filter((s) => s === 200)).toHaveLength(120);
    expect(statuses.at(-1)).toBe(429);
  });

  it('limits the requests of an address before the key is checked: 1,000 wrong keys meet 429s', async () => {
    vi.spyOn(Date, 'now').mockReturnValue(Date.now());
    const statuses = [];
    for (let i = 0; i < 1000; i++) statuses.push((await call('/v1/swarm', { key: `ds-guess-${i}-0123456789` })).status);
    expect(statuses.filter((s) => s === 401)).toHaveLength(120);
    expect(statuses.filter((s) => s === 429)).toHaveLength(880);
  });
});

interface ApiError {
  error: { message: string; type: string; param: string | null };
}
