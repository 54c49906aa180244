// The video API as a program uses it (issue 39): `npm start -- --api --local-workers 2` on the demo model, called
// over HTTP with its key. Its jobs run on a real coordinator page in the server's own headless Chromium, with real
// worker tabs; the server is killed (SIGKILL) and started again on the same data folder.

import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { expect, test, type Page } from '@playwright/test';
import { defined } from '../../core/defined.ts';
import { readSafetensors } from '../../core/safetensors.ts';
import type { VideoObject } from '../../server/api/video-object.ts';
import { CI, maxAbsDiff } from './swarm-page.ts';
import { firstFrameOf, nodeEncodedImage } from './image-condition.ts';
import { spawnApiServer, type ApiProcess } from '../../server/api/api-process.ts';
import OpenAI, { NotFoundError, toFile } from 'openai';
import { probeWebM } from '../../coordinator/video.ts';
import { encodePng } from '../../server/png.ts';
import { LOCAL_MODEL_PATH } from '../../server/serve.ts';
import { freePort, killSoak, type KillTarget, type SoakResult } from './api-kill-soak.ts';

const ROOT = resolve(import.meta.dirname, '../..');
/** the demo model's settings every job here asks for: 2 workers of one group, as `generate --workers 2` places them */
const JOB = {
  prompt: 'a red square moving right',
  size: '64x64',
  frames: 9,
  seed: 42,
  workers: 2,
  cfg_parallel: false,
};

/** `npm start -- --api --local-workers N --data DIR --port P`, as a process of its own (so it can be killed). */
const startApiServer = (dataDir: string, localWorkers = 2, port = 0) =>
  spawnApiServer(dataDir, ['--local-workers', String(localWorkers), '--port', String(port)]);

const postJob = (api: ApiProcess, body: object) =>
  api.json<VideoObject>('/v1/videos', { method: 'POST', body: JSON.stringify({ ...JOB, ...body }) });

/** Waits (by long polls) until the job is in one of `statuses`. */
async function until(api: ApiProcess, id: string, statuses: VideoObject['status'][], timeout = 150_000) {
  let job = await api.json<VideoObject>(`/v1/videos/${id}`);
  const end = Date.now() + timeout;
  while (!statuses.includes(job.status)) {
    if (Date.now() > end)
      throw new Error(`${id} is still ${job.status} (${job.phase ?? ''}): ${JSON.stringify(job.error)}`);
    job = await api.json<VideoObject>(`/v1/videos/${id}?wait=10`);
  }
  return job;
}

/** What a <video> element makes of the WebM: it loads it and decodes a frame. */
async function playable(page: Page, bytes: Buffer) {
  return page.evaluate(async (base64) => {
    const blob = new Blob([Uint8Array.from(atob(base64), (c) => c.charCodeAt(0))], { type: 'video/webm' });
    const video = document.createElement('video');
    video.muted = true;
    video.src = URL.createObjectURL(blob);
    await new Promise((ok, fail) => {
      video.onloadeddata = ok;
      video.onerror = () => fail(new Error(`the WebM does not load: ${video.error?.message ?? ''}`));
    });
    return {
      width: video.videoWidth,
      height: video.videoHeight,
      readyState: video.readyState,
      duration: video.duration,
    };
  }, bytes.toString('base64'));
}

test.describe.configure({ mode: 'serial' });

test(
  "a POSTed job completes as a playable WebM whose latent is generate's; jobs queue in order; DELETE cancels; no key, 401; a bad size, 400",
  CI,
  async ({ page }) => {
    test.setTimeout(600_000);
    const dataDir = mkdtempSync(join(tmpdir(), 'ditswarm-api-e2e-'));
    const api = await startApiServer(dataDir);
    try {
      const swarm = await api.json<{ workers: unknown[]; joinUrl: string }>('/v1/swarm');
      expect(swarm.joinUrl).toContain('/worker.html#token=');
      await expect
        .poll(async () => (await api.json<{ workers: unknown[] }>('/v1/swarm')).workers.length, { timeout: 60_000 })
        .toBe(2);

      // without the key, each endpoint is 401
      for (const [method, path] of [
        ['POST', '/v1/videos'],
        ['GET', '/v1/videos'],
        ['GET', '/v1/videos/video_000000000000000000000000'],
        ['GET', '/v1/videos/video_000000000000000000000000/content'],
        ['DELETE', '/v1/videos/video_000000000000000000000000'],
        ['GET', '/v1/swarm'],
        ['GET', '/v1/openapi.json'],
      ])
        expect((await fetch(`${api.url}${path}`, { method })).status, `${method} ${path}`).toBe(401);
      const badSize = await api.call('/v1/videos', {
        method: 'POST',
        body: JSON.stringify({ ...JOB, size: '100x64' }),
      });
      expect(badSize.status).toBe(400);
      const refusal = (await badSize.json()) as { error: { param: string; message: string } };
      expect(refusal.error.param).toBe('size');
      expect(refusal.error.message).toMatch(/multiple of 16.*64x64 \(this server's default model's\).*832x480/);

      // three jobs: the first runs, the next two wait behind it and finish in order
      const first = await postJob(api, { steps: 4 });
      expect(first.status).toBe('queued');
      const second = await postJob(api, { steps: 2, seed: 1 });
      const third = await postJob(api, { steps: 2, seed: 2 });
      const done = await until(api, first.id, ['completed', 'failed']);
      expect(done.error).toBeNull();
      expect(done).toMatchObject({ status: 'completed', progress: 100, size: '64x64', frames: 9 });
      const [s2, s3] = [await until(api, second.id, ['completed']), await until(api, third.id, ['completed'])];
      expect((s2.started_at ?? 0) >= (done.completed_at ?? Infinity)).toBe(true);
      expect((s3.started_at ?? 0) >= (s2.completed_at ?? Infinity)).toBe(true);

      // the video plays
      const webm = Buffer.from(await (await api.call(`/v1/videos/${first.id}/content`)).arrayBuffer());
      await page.goto(api.url.replace(/\/$/, '') + '/models.json');
      expect(await playable(page, webm)).toMatchObject({ width: 64, height: 64 });

      // a person opening the server sees the API's queue and swarm, with the key from the link's fragment
      await page.goto(`${api.url}/#key=${api.key}`);
      await expect(page).toHaveURL(`${api.url}/api.html`); // the key left the address bar
      await expect(page.locator('#worker-count')).toHaveText('2 workers');
      for (const job of [first, second, third])
        await expect(page.locator(`#queue li[data-job="${job.id}"]`)).toHaveAttribute('data-status', 'completed');
      await expect // the newest video is on show, and plays
        .poll(() => page.evaluate(() => (document.getElementById('video') as HTMLVideoElement).readyState))
        .toBeGreaterThanOrEqual(2);
      // a refused field is named on the form; a job queued there is the API's
      await page.reload(); // the key was kept
      await page.fill('[name=prompt]', 'queued from the page');
      await page.fill('[name=size]', '100x64');
      await page.click('#generate');
      await expect(page.locator('#form-errors')).toContainText('832x480');
      await expect(page.locator('[name=size]')).toHaveAttribute('aria-invalid', 'true');
      await page.fill('[name=size]', '64x64');
      await page.fill('[name=frames]', '9');
      await page.fill('[name=steps]', '2');
      await page.click('#generate');
      await expect(page.locator('#form-errors')).toHaveText('');
      const fromPage = (await api.json<{ data: VideoObject[] }>('/v1/videos')).data[0];
      expect(fromPage).toMatchObject({ prompt: 'queued from the page', size: '64x64', frames: 9 });
      expect((await until(api, fromPage.id, ['completed', 'failed'])).status).toBe('completed');

      // a running job cancelled by DELETE stops, and the next starts
      const long = await postJob(api, { steps: 40 });
      const next = await postJob(api, { steps: 2 });
      await expect
        .poll(async () => (await api.json<VideoObject>(`/v1/videos/${long.id}`)).progress, { timeout: 120_000 })
        .toBeGreaterThan(0);
      const cancelled = await api.json<VideoObject>(`/v1/videos/${long.id}`, { method: 'DELETE' });
      expect(cancelled.status).toBe('cancelled');
      expect((await until(api, next.id, ['completed', 'failed'])).status).toBe('completed');
      expect((await api.json<VideoObject>(`/v1/videos/${long.id}`)).status).toBe('cancelled');

      // the first job's latent is npm run generate's for the same settings, to the bit
      const latent = readSafetensors(
        new Uint8Array(await (await api.call(`/v1/videos/${first.id}/content?variant=latent`)).arrayBuffer()),
        'latent',
      ).get('latent');
      await api.stop();
      const generated = join(dataDir, 'generate.f32');
      const gen = spawn(
        process.execPath,
        [
          '--import',
          'tsx',
          'server/cli/generate.ts',
          '--prompt',
          JOB.prompt,
          '--workers',
          '2',
          '--steps',
          '4',
          '--frames',
          '9',
          '--height',
          '64',
          '--width',
          '64',
          '--seed',
          '42',
          '--port',
          '0',
          '--latent-out',
          generated,
          '--out',
          join(dataDir, 'g.webm'),
          '--report',
          join(dataDir, 'g.json'),
        ],
        { cwd: ROOT, stdio: 'inherit' },
      );
      expect(await new Promise((r) => gen.once('exit', r))).toBe(0);
      const reference = new Float32Array(new Uint8Array(readFileSync(generated)).buffer);
      expect(latent?.shape).toEqual([16, 3, 8, 8]);
      expect(Buffer.from(defined(latent, 'the latent').data.buffer).equals(Buffer.from(reference.buffer))).toBe(true);
    } finally {
      await api.stop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  },
);

/** The job's latent, as its content endpoint serves it. */
async function latentOf(api: ApiProcess, id: string) {
  const bytes = await (await api.call(`/v1/videos/${id}/content?variant=latent`)).arrayBuffer();
  return defined(readSafetensors(new Uint8Array(bytes), 'latent').get('latent'), `${id}'s latent`).data;
}

test('the server killed (SIGKILL) with a job running and two queued: started again, all three complete, none twice, the running one from its checkpoint', async () => {
  test.setTimeout(600_000);
  const dataDir = mkdtempSync(join(tmpdir(), 'ditswarm-api-kill-'));
  // the same address both times, as `npm start`'s fixed port gives: the coordinator page's checkpoints are its
  // browser's storage for that origin
  const port = await freePort();
  let api = await startApiServer(dataDir, 2, port);
  try {
    await expect
      .poll(async () => (await api.json<{ workers: unknown[] }>('/v1/swarm')).workers.length, { timeout: 60_000 })
      .toBe(2);
    const running = await postJob(api, { steps: 20 });
    const queued = [await postJob(api, { steps: 2, seed: 1 }), await postJob(api, { steps: 2, seed: 2 })];
    // past step 2 of 20: the coordinator page has a checkpoint of the job kept
    await expect
      .poll(async () => (await api.json<VideoObject>(`/v1/videos/${running.id}`)).progress, { timeout: 120_000 })
      .toBeGreaterThanOrEqual(10);
    api.process.kill('SIGKILL');
    await new Promise((r) => api.process.once('exit', r));

    api = await startApiServer(dataDir, 2, port);
    const ended = [];
    for (const job of [running, ...queued]) ended.push(await until(api, job.id, ['completed', 'failed']));
    expect(ended.map((j) => j.status)).toEqual(['completed', 'completed', 'completed']);
    // the running one ran again, the queued ones once; the list holds the three and nothing else
    expect(ended.map((j) => j.attempts)).toEqual([2, 1, 1]);
    expect((ended[1].started_at ?? 0) >= (ended[0].completed_at ?? Infinity)).toBe(true);
    // the running one went on from the page's checkpoint, and ends as it would have: the same job run whole
    const resumedFrom = ended[0].report?.resumedFromStep;
    expect(resumedFrom).toBeGreaterThanOrEqual(1);
    const whole = await until(api, (await postJob(api, { steps: 20 })).id, ['completed', 'failed']);
    expect(whole.report?.resumedFromStep).toBe(0);
    const [resumed, again] = [await latentOf(api, running.id), await latentOf(api, whole.id)];
    expect(Buffer.from(resumed.buffer).equals(Buffer.from(again.buffer))).toBe(true);
    const list = await api.json<{ data: VideoObject[] }>('/v1/videos');
    expect(list.data.map((j) => j.id)).toEqual([whole.id, queued[1].id, queued[0].id, running.id]);
  } finally {
    await api.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
});

/** An 8×8 image of a colour ramp as a PNG: the first frame of a Wan2.2 TI2V job, stretched to its size. */
const PNG = encodePng({
  width: 8,
  height: 8,
  data: Uint8ClampedArray.from({ length: 8 * 8 * 4 }, (_, i) => (i % 4 === 3 ? 255 : 32 * ((i >> 2) % 8))),
});

test(
  'the official openai client: videos.create (multipart, with an image) on a Wan2.2 TI2V folder, retrieve to completed, list, downloadContent a playable WebM at 24 fps, delete',
  CI,
  async () => {
    test.setTimeout(300_000);
    const dataDir = mkdtempSync(join(tmpdir(), 'ditswarm-api-sdk-'));
    const ti2v = defined(process.env.DITSWARM_TI2V_DIR, "global-setup's TI2V folder");
    const api = await spawnApiServer(dataDir, ['--local-workers', '2', '--model', ti2v]);
    try {
      await expect
        .poll(async () => (await api.json<{ workers: unknown[] }>('/v1/swarm')).workers.length, { timeout: 60_000 })
        .toBe(2);
      const client = new OpenAI({ apiKey: api.key, baseURL: `${api.url}/v1` });
      // the SDK types OpenAI's own fields; ditswarm's (frames, steps, placement) go in the same form
      const created = (await client.videos.create({
        ...JOB,
        steps: 2,
        input_reference: await toFile(PNG, 'first-frame.png', { type: 'image/png' }),
      } as unknown as OpenAI.VideoCreateParams)) as unknown as VideoObject;
      expect(created).toMatchObject({ object: 'video', status: 'queued', size: '64x64', model: LOCAL_MODEL_PATH });
      expect(created.input_reference).toMatchObject({ type: 'image/png', bytes: PNG.length, name: 'first-frame.png' });
      expect(readFileSync(join(dataDir, 'videos', `${created.id}.input_reference`))).toEqual(Buffer.from(PNG));

      let job = await client.videos.retrieve(created.id);
      for (const end = Date.now() + 180_000; job.status === 'queued' || job.status === 'in_progress';) {
        expect(Date.now()).toBeLessThan(end);
        await new Promise((r) => setTimeout(r, 250));
        job = await client.videos.retrieve(created.id);
      }
      expect(job.error).toBeNull();
      expect(job).toMatchObject({ status: 'completed', progress: 100, model: LOCAL_MODEL_PATH });
      // the image is the video's first latent frame: the job's latent starts with it as Node encodes it
      const latent = await latentOf(api, created.id);
      expect(
        maxAbsDiff(firstFrameOf(latent, [48, 3, 4, 4]), await nodeEncodedImage(PNG, { height: 64, width: 64 })),
      ).toBeLessThanOrEqual(1e-5);

      const listed = [];
      for await (const j of client.videos.list({ limit: 10 })) listed.push(j.id);
      expect(listed).toEqual([created.id]);

      const bytes = new Uint8Array(await (await client.videos.downloadContent(created.id)).arrayBuffer());
      expect([...bytes.subarray(0, 4)]).toEqual([0x1a, 0x45, 0xdf, 0xa3]); // EBML: a Matroska/WebM file
      const probe = await probeWebM(new Blob([bytes]));
      expect(probe).toMatchObject({ width: 64, height: 64, frameCount: 9 });
      // 9 frames at the family's 24 fps, not Wan2.1's 16 (0.56 s)
      expect(probe.durationSeconds).toBeGreaterThanOrEqual(8 / 24);
      expect(probe.durationSeconds).toBeLessThanOrEqual(10 / 24);

      expect(await client.videos.delete(created.id)).toMatchObject({ id: created.id, deleted: true });
      await expect(client.videos.retrieve(created.id)).rejects.toBeInstanceOf(NotFoundError);
      expect(existsSync(join(dataDir, 'videos', `${created.id}.input_reference`))).toBe(false);
    } finally {
      await api.stop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  },
);

/** Asserts what the kill soak promises: every accepted job completed once, and no restart needed a hand. */
function expectEveryJobCompletedOnce(result: SoakResult, kills: number) {
  const summary = {
    kills: result.kills.length,
    at: Object.fromEntries(
      [...new Set(result.kills.map((k) => k.at))].map((at) => [at, result.kills.filter((k) => k.at === at).length]),
    ),
    withQueued: result.kills.filter((k) => k.queued > 0).length,
    jobs: result.jobs.length,
    completed: result.jobs.filter((j) => j.status === 'completed').length,
    attempts: result.jobs.reduce((n, j) => n + j.attempts, 0),
    restartMs: result.kills.map((k) => k.restartMs),
    polls: result.polls,
    durationS: Math.round(result.durationMs / 1000),
  };
  console.log(`kill soak: ${JSON.stringify(summary)}`);
  expect(result.kills).toHaveLength(kills);
  expect(result.databaseLines.filter((l) => /locked|could not open/i.test(l))).toEqual([]);
  expect(result.jobs.filter((j) => j.status !== 'completed')).toEqual([]);
  expect(result.completedAgain).toEqual([]);
  expect(result.regressed).toEqual([]);
  expect([...result.listed].sort()).toEqual(result.jobs.map((j) => j.id).sort());
  return summary;
}

test(
  'a client polling with the openai SDK while the server is killed (SIGKILL) thrice, once right after a GET of a finished job: each restart comes up alone, every job completes once',
  CI,
  async () => {
    test.setTimeout(240_000);
    const dataDir = mkdtempSync(join(tmpdir(), 'ditswarm-api-soak-'));
    const targets: KillTarget[] = ['placing', 'after-get', 'step'];
    const result = await killSoak({ dataDir, targets, keepQueued: 1, seed: 64, log: console.log });
    try {
      const summary = expectEveryJobCompletedOnce(result, targets.length);
      expect(summary.at).toMatchObject({ 'after-get': 1 });
      // a second server on the same data folder is refused before it serves, naming the one that runs
      const second = await spawnApiServer(dataDir, ['--port', '0']).then(
        async (api) => {
          await api.stop();
          return 'it started';
        },
        (e: unknown) => (e as Error).message,
      );
      expect(second).toMatch(new RegExp(`exited \\(2\\)[^]*pid ${result.api.process.pid}, which is still running`));
    } finally {
      await result.api.stop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  },
);

test('kill soak: 21 SIGKILLs at random instants of queued, encoding, placing, running, decoding and muxing jobs and after GETs, while the openai SDK polls; every accepted job completes exactly once, no restart needs a hand', async () => {
  test.setTimeout(1_200_000);
  const dataDir = mkdtempSync(join(tmpdir(), 'ditswarm-api-soak-'));
  const cycle: KillTarget[] = ['queued', 'encoding', 'placing', 'step', 'decoding', 'muxing', 'after-get'];
  const targets = [...cycle, ...cycle, ...cycle];
  const seed = Number(process.env.DITSWARM_SOAK_SEED ?? Date.now() % 100_000);
  console.log(`kill soak seed ${seed} (DITSWARM_SOAK_SEED=${seed} runs the same instants again)`);
  const result = await killSoak({ dataDir, targets, keepQueued: 2, seed, log: console.log });
  try {
    const { at, withQueued } = expectEveryJobCompletedOnce(result, targets.length);
    // the kills fell where they aimed: with jobs queued, in placement, in a step, in an encoding (of the prompt, or
    // of the video) and after a read of a finished job
    expect(withQueued).toBeGreaterThan(0);
    expect(at).toMatchObject({ placing: expect.any(Number), step: expect.any(Number), 'after-get': 3 });
    expect(['encoding', 'decoding', 'muxing'].filter((phase) => phase in at)).not.toEqual([]);
  } finally {
    await result.api.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }
});
