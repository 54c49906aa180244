import { describe, expect, it } from 'vitest';
import { JobQueue, MAX_ATTEMPTS, type RunJob } from '../../coordinator/job-queue.ts';
import { MemoryJobStore, resultBytes, type JobPlacement, type StoredJob } from '../../coordinator/job-store.ts';
import { defined } from '../../core/defined.ts';
import { JobParamsError } from '../../core/job.ts';

const placement: JobPlacement = { backend: 'swarm', workers: 1, ep: 'wasm' };

/**
 * A runner that takes a little while and returns the seed as its "latent". It logs `start <id>`
 * and `end <id>`, so two jobs running at once show up as two starts in a row.
 */
function fakeRunner(log: string[], failOn?: number): RunJob {
  return async (job, hooks) => {
    log.push(`start ${job.id}`);
    try {
      const start = hooks.resume?.step ?? 0;
      for (let step = start; step < job.params.steps; step++) {
        await new Promise((r) => setTimeout(r, 1));
        hooks.onCheckpoint?.({ step: step + 1, latent: Float32Array.of(job.params.seed, step) });
      }
      if (job.id === failOn) throw new Error('rank 0 failed in executeModel: boom');
      return {
        video: new Blob([String(job.params.seed)]),
        latent: Float32Array.of(job.params.seed),
        frames: null as never,
        report: { resumedFromStep: start } as never,
      };
    } finally {
      log.push(`end ${job.id}`);
    }
  };
}

/** The log of jobs run one after another, in this order. */
const oneAtATime = (ids: number[]): string[] => ids.flatMap((id) => [`start ${id}`, `end ${id}`]);

describe('job queue', () => {
  it('20 jobs submitted at once run one at a time in order; none lost, none repeated', async () => {
    const log: string[] = [];
    const queue = await JobQueue.restore(new MemoryJobStore(), fakeRunner(log));
    const jobs = await Promise.all(
      Array.from({ length: 20 }, (_, i) => queue.submit({ prompt: `job ${i}`, seed: 1000 + i, steps: 3 }, placement)),
    );
    const settled = await Promise.all(jobs.map((j) => queue.settled(j.id)));
    expect(log).toEqual(oneAtATime(jobs.map((j) => j.id))); // each job ends before the next starts
    expect(settled.every((j) => j.status === 'done')).toBe(true);
    expect(new Set(settled.map((j) => defined(j.result, `job ${j.id}'s result`).latent[0])).size).toBe(20);
    expect(queue.list().map((j) => j.id)).toEqual(jobs.map((j) => j.id));
  });

  it('a bad parameter is refused before anything is queued', async () => {
    const queue = await JobQueue.restore(new MemoryJobStore(), fakeRunner([]));
    await expect(queue.submit({ prompt: 'x', frames: 8 }, placement)).rejects.toThrow(JobParamsError);
    expect(queue.list()).toHaveLength(0);
  });

  it('after a reload a running job resumes from its checkpoint and queued jobs still run', async () => {
    const store = new MemoryJobStore();
    const now = Date.now();
    const params = {
      prompt: 'x',
      negativePrompt: '',
      frames: 9,
      height: 64,
      width: 64,
      steps: 5,
      guidance: 5,
      seed: 1,
      flowShift: 3,
      scheduler: 'folder' as const,
    };
    await store.put({
      id: 1,
      params,
      placement,
      status: 'running',
      createdAt: now,
      updatedAt: now,
      checkpoint: { step: 3, latent: Float32Array.of(1, 2) },
    });
    await store.put({
      id: 2,
      params: { ...params, seed: 2 },
      placement,
      status: 'queued',
      createdAt: now,
      updatedAt: now,
    });
    const log: string[] = [];
    const queue = await JobQueue.restore(store, fakeRunner(log));
    const [first, second] = await Promise.all([queue.settled(1), queue.settled(2)]);
    expect(log).toEqual(oneAtATime([1, 2]));
    expect(defined(first.result, "job 1's result").report.resumedFromStep).toBe(3);
    expect(defined(second.result, "job 2's result").report.resumedFromStep).toBe(0);
    expect((await store.all()).map((j) => j.status)).toEqual(['done', 'done']);
  });

  it('a failed job is kept with its error and the queue moves on', async () => {
    const log: string[] = [];
    const queue = await JobQueue.restore(new MemoryJobStore(), fakeRunner(log, 1));
    const a = await queue.submit({ prompt: 'a', steps: 1 }, placement);
    const b = await queue.submit({ prompt: 'b', steps: 1 }, placement);
    expect((await queue.settled(a.id)).error).toContain('boom');
    expect((await queue.settled(b.id)).status).toBe('done');
    expect(log).toEqual(oneAtATime([a.id, b.id]));
  });

  it('a failed job tried again runs from its checkpoint and is done; a dismissed one leaves the queue and the store (issue 36)', async () => {
    const log: string[] = [];
    let failing = true;
    const runner = fakeRunner(log);
    const store = new MemoryJobStore();
    const queue = await JobQueue.restore(store, async (job, hooks) => {
      if (!failing) return runner(job, hooks);
      hooks.onCheckpoint?.({ step: 2, latent: Float32Array.of(0) }); // two steps made before it failed
      throw new Error('no worker has joined');
    });
    const a = await queue.submit({ prompt: 'a', steps: 4 }, placement);
    const b = await queue.submit({ prompt: 'b', steps: 1 }, placement);
    expect((await queue.settled(a.id)).status).toBe('failed');
    expect((await queue.settled(b.id)).status).toBe('failed');
    await expect(queue.retry(a.id + 100)).rejects.toThrow(`no job ${a.id + 100}`);
    failing = false;
    const retried = await queue.retry(a.id);
    expect(retried.error).toBeUndefined(); // queued, and already taken up: the queue was idle
    const done = await queue.settled(a.id);
    expect(done.status).toBe('done');
    // resumed at step 2: the runner made steps 3 and 4 only
    expect((done.result?.report as unknown as { resumedFromStep: number }).resumedFromStep).toBe(2);
    await expect(queue.retry(a.id)).rejects.toThrow(
      `job ${a.id} is done: only a failed or cancelled job is tried again`,
    );
    await queue.remove(b.id);
    expect(queue.list().map((j) => j.id)).toEqual([a.id]);
    expect((await store.all()).map((j) => j.id)).toEqual([a.id]);
  });
});

describe('job queue: what the browser will not store, and jobs that never finish', () => {
  const quota = () => Object.assign(new Error('The quota has been exceeded.'), { name: 'QuotaExceededError' });
  /**
   * A store that refuses any job holding more than `capacity` bytes of videos and latents in all,
   * and says how much is left.
   */
  class FullStore extends MemoryJobStore {
    /** each write it took: the job and the bytes of its result */
    readonly written: [number, number][] = [];
    constructor(public capacity: number) {
      super();
    }
    private async held(except?: number) {
      return (await this.all()).filter((j) => j.id !== except).reduce((n, j) => n + resultBytes(j), 0);
    }
    override async put(job: StoredJob) {
      if ((await this.held(job.id)) + resultBytes(job) > this.capacity) throw quota();
      this.written.push([job.id, resultBytes(job)]);
      return super.put(job);
    }
    override async room() {
      return this.capacity - (await this.held());
    }
  }

  it("the final write refused: the oldest job's video makes room, the job is done in memory and in the store, and a storage event says so", async () => {
    const store = new FullStore(15);
    const queue = await JobQueue.restore(store, fakeRunner([]));
    const events: string[] = [];
    queue.on((e) => e.type === 'storage' && events.push(e.message));
    const first = await queue.settled((await queue.submit({ prompt: 'a', seed: 11, steps: 1 }, placement)).id); // video 2 B + latent 4 B
    const second = await queue.settled((await queue.submit({ prompt: 'b', seed: 1234567890, steps: 1 }, placement)).id); // video 10 B + latent 4 B
    expect([first.status, second.status]).toEqual(['done', 'done']);
    expect(events).toEqual([
      `job 2 was kept in this browser after removing the video and latent of job 1 (The quota has been exceeded.)`,
    ]);
    const stored = await store.all();
    expect(stored.map((j) => [j.id, j.status, j.result?.video?.size ?? null])).toEqual([
      [1, 'done', null],
      [2, 'done', 10],
    ]);
    expect(stored[0].storageNote).toBe('its video and latent were removed from this browser to make room for job 2');
    expect(defined(queue.list()[0].result, "job 1's result").video).not.toBeNull(); // this page still has it
  });

  it('no room even alone: the job is stored done without its video and latent, and settled() still resolves with them', async () => {
    const store = new FullStore(0);
    const queue = await JobQueue.restore(store, fakeRunner([]));
    const events: string[] = [];
    queue.on((e) => e.type === 'storage' && events.push(e.message));
    const job = await queue.settled((await queue.submit({ prompt: 'a', seed: 7, steps: 2 }, placement)).id);
    expect(job.status).toBe('done');
    expect(defined(job.result, "the job's result").video).not.toBeNull();
    expect(events).toEqual([
      'job 1 was kept without its video and latent: its video and latent could not be kept in this browser (The quota has been exceeded.): download the video before closing this page',
    ]);
    const [stored] = await store.all();
    const storedResult = defined(stored.result, "the stored job's result");
    expect([stored.status, storedResult.video, storedResult.latent.length]).toEqual(['done', null, 0]);
  });

  it('a job that would not fit even with every older result gone strips none of them: the browser says how much room is left (issue 17, #10)', async () => {
    const store = new FullStore(15);
    const queue = await JobQueue.restore(store, fakeRunner([]));
    const first = await queue.settled((await queue.submit({ prompt: 'a', seed: 11, steps: 1 }, placement)).id); // video 2 B + latent 4 B
    store.capacity = 10;
    const since = store.written.length;
    await queue.settled((await queue.submit({ prompt: 'b', seed: 1234567890, steps: 1 }, placement)).id); // video 10 B + latent 4 B: 14 > 10
    // job 1 was never written without its video and latent (without the estimate it was, then put back)
    expect(
      store.written
        .slice(since)
        .filter(([id]) => id === first.id)
        .map(([, bytes]) => bytes),
    ).not.toContain(0);
    expect((await store.all()).map((j) => [j.id, resultBytes(j), j.storageNote ?? null])).toEqual([
      [1, 6, null],
      [2, 0, expect.stringMatching(/download the video before closing this page/)],
    ]);
  });

  it(`a job that was running at ${MAX_ATTEMPTS} reloads is failed, not started again`, async () => {
    const store = new MemoryJobStore();
    const now = Date.now();
    const params = {
      prompt: 'x',
      negativePrompt: '',
      frames: 9,
      height: 64,
      width: 64,
      steps: 5,
      guidance: 5,
      seed: 1,
      flowShift: 3,
      scheduler: 'folder' as const,
    };
    await store.put({
      id: 1,
      params,
      placement,
      status: 'running',
      createdAt: now,
      updatedAt: now,
      attempts: MAX_ATTEMPTS,
    });
    const log: string[] = [];
    const queue = await JobQueue.restore(store, fakeRunner(log));
    const job = await queue.settled(1);
    expect(log).toEqual([]);
    expect(job).toMatchObject({
      status: 'failed',
      error: `the job was interrupted ${MAX_ATTEMPTS} times (a crash or a reload of the dashboard while it ran); it is not started again`,
    });
    expect((await store.all())[0].status).toBe('failed');
  });

  it('a job interrupted twice runs a third time, and the steps it makes start the count again', async () => {
    const store = new MemoryJobStore();
    const now = Date.now();
    const params = {
      prompt: 'x',
      negativePrompt: '',
      frames: 9,
      height: 64,
      width: 64,
      steps: 2,
      guidance: 5,
      seed: 1,
      flowShift: 3,
      scheduler: 'folder' as const,
    };
    await store.put({
      id: 1,
      params,
      placement,
      status: 'running',
      createdAt: now,
      updatedAt: now,
      attempts: MAX_ATTEMPTS - 1,
    });
    const job = await (await JobQueue.restore(store, fakeRunner([]))).settled(1);
    expect(job).toMatchObject({ status: 'done', attempts: 1 });
  });

  it('cancel: a queued job never starts, a running one stops at its next step', async () => {
    const log: string[] = [];
    const runner: RunJob = async (job, hooks) => {
      log.push(`start ${job.id}`);
      for (let step = 0; step < job.params.steps; step++) {
        hooks.signal?.throwIfAborted();
        await new Promise((r) => setTimeout(r, 5));
      }
      return { video: null, latent: new Float32Array(1), frames: null, report: {} as never };
    };
    const queue = await JobQueue.restore(new MemoryJobStore(), runner);
    const running = await queue.submit({ prompt: 'a', steps: 100 }, placement);
    const waiting = await queue.submit({ prompt: 'b', steps: 1 }, placement);
    await queue.cancel(waiting.id);
    await new Promise((r) => setTimeout(r, 20));
    await queue.cancel(running.id);
    const [a, b] = await Promise.all([queue.settled(running.id), queue.settled(waiting.id)]);
    expect([a.status, a.error, b.status, b.error]).toEqual(['cancelled', undefined, 'cancelled', undefined]);
    expect(log).toEqual([`start ${running.id}`]);
  });
});
