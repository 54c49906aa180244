import { describe, expect, it } from 'vitest';
import { JobQueue, type RunJob } from '../../coordinator/job-queue.ts';
import { MemoryJobStore, type JobPlacement } from '../../coordinator/job-store.ts';
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
      return { video: new Blob([String(job.params.seed)]), latent: Float32Array.of(job.params.seed), frames: null as never, report: { resumedFromStep: start } as never };
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
    const jobs = await Promise.all(Array.from({ length: 20 }, (_, i) => queue.submit({ prompt: `job ${i}`, seed: 1000 + i, steps: 3 }, placement)));
    const settled = await Promise.all(jobs.map((j) => queue.settled(j.id)));
    expect(log).toEqual(oneAtATime(jobs.map((j) => j.id))); // each job ends before the next starts
    expect(settled.every((j) => j.status === 'done')).toBe(true);
    expect(new Set(settled.map((j) => j.result!.latent[0])).size).toBe(20);
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
    const params = { prompt: 'x', negativePrompt: '', frames: 9, height: 64, width: 64, steps: 5, guidance: 5, seed: 1, flowShift: 3 };
    await store.put({ id: 1, params, placement, status: 'running', createdAt: now, updatedAt: now, checkpoint: { step: 3, latent: Float32Array.of(1, 2) } });
    await store.put({ id: 2, params: { ...params, seed: 2 }, placement, status: 'queued', createdAt: now, updatedAt: now });
    const log: string[] = [];
    const queue = await JobQueue.restore(store, fakeRunner(log));
    const [first, second] = await Promise.all([queue.settled(1), queue.settled(2)]);
    expect(log).toEqual(oneAtATime([1, 2]));
    expect(first.result!.report.resumedFromStep).toBe(3);
    expect(second.result!.report.resumedFromStep).toBe(0);
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
});
