// The dashboard's jobs, one at a time in the order they were submitted. Every change is written
// to the store before it is announced, so a reload finds the queue as it was: finished jobs keep
// their videos, an interrupted job resumes from its last completed step, queued ones still wait.
// A write the browser refuses (its storage full, say) loses nothing this page holds: the job goes
// on in memory, the oldest videos and latents make room, a finished job is kept without its video
// and latent if it must, and a 'storage' event says what happened and what to do. A job that keeps
// ending its page (a crash, a reload while it runs) is given up after MAX_ATTEMPTS starts.

import { defined } from '../core/defined.ts';
import { jobParams, type JobParams } from '../core/job.ts';
import type { GenerateRequest, GenerateResult, StepProgress } from './pipeline.ts';
import type { TimeLeft } from './estimate.ts';
import {
  isSettled,
  resultBytes,
  type JobInputs,
  type JobPlacement,
  type JobStore,
  type StoredJob,
} from './job-store.ts';
import { Emitter } from '../core/events.ts';

export type RunJob = (
  job: StoredJob,
  hooks: Pick<GenerateRequest, 'resume' | 'onCheckpoint' | 'onProgress' | 'onPhase' | 'onFailure' | 'signal'>,
) => Promise<GenerateResult>;

export type QueueEvent =
  | { type: 'changed'; job: StoredJob }
  | { type: 'progress'; job: StoredJob; progress: StepProgress }
  | { type: 'phase'; job: StoredJob; phase: string; detail?: string; left: TimeLeft }
  /** the job and what it kept are gone from the queue and the store */
  | { type: 'removed'; id: number }
  /** a write to the store failed: what was kept, what was not, what to do */
  | { type: 'storage'; job: StoredJob; message: string };

/**
 * starts of one job without a step done before it is given up: each start a reload or a crash interrupted before its
 * first checkpoint counts
 */
export const MAX_ATTEMPTS = 3;

export class JobQueue {
  private readonly jobs = new Map<number, StoredJob>();
  private readonly events = new Emitter<QueueEvent>((error) => {
    console.error('queue listener failed', error);
  });
  private readonly waiters = new Map<number, ((job: StoredJob) => void)[]>();
  private nextId = 1;
  private running = false;
  /** the store's writes, in order */
  private writes: Promise<void> = Promise.resolve();
  /** the running job's way to stop */
  private abort: { id: number; controller: AbortController } | null = null;

  private constructor(
    private readonly store: JobStore,
    private readonly run: RunJob,
  ) {}

  /** Loads the stored jobs and carries on with the unfinished ones. */
  static async restore(store: JobStore, run: RunJob): Promise<JobQueue> {
    const queue = new JobQueue(store, run);
    for (const job of await store.all()) {
      if (job.status === 'running' && (job.attempts ?? 0) >= MAX_ATTEMPTS) {
        // it ended the page every time it ran: running it again would too
        job.status = 'failed';
        job.error =
          `the job was interrupted ${job.attempts} times (a crash or a reload of the dashboard while it ran); ` +
          'it is not started again';
        await queue.save(job);
      } else if (job.status === 'running') job.status = 'queued'; // interrupted by a reload: resume from its checkpoint
      queue.jobs.set(job.id, job);
      queue.nextId = Math.max(queue.nextId, job.id + 1);
    }
    queue.pump();
    return queue;
  }

  list(): StoredJob[] {
    return [...this.jobs.values()].sort((a, b) => a.id - b.id);
  }

  on(listener: (e: QueueEvent) => void): () => void {
    return this.events.on(listener);
  }

  /** Validates (throwing JobParamsError, nothing queued) and queues a job. */
  async submit(
    input: Partial<Record<keyof JobParams, unknown>>,
    placement: JobPlacement,
    inputs?: JobInputs,
  ): Promise<StoredJob> {
    const params = jobParams(input);
    const now = Date.now();
    const job: StoredJob = {
      id: this.nextId++,
      params,
      placement,
      ...(inputs ? { inputs } : {}),
      status: 'queued',
      createdAt: now,
      updatedAt: now,
    };
    await this.save(job);
    this.pump();
    return job;
  }

  /** Resolves when the job is done or failed. */
  settled(id: number): Promise<StoredJob> {
    const job = this.jobs.get(id);
    if (!job) return Promise.reject(new Error(`no job ${id}`));
    if (isSettled(job.status)) return Promise.resolve(job);
    return new Promise((resolve) => this.waiters.set(id, [...(this.waiters.get(id) ?? []), resolve]));
  }

  /** Stops a job: a queued one never starts, a running one stops at its next step (its checkpoint stays). */
  async cancel(id: number): Promise<void> {
    const job = this.jobs.get(id);
    if (!job || isSettled(job.status)) return;
    if (job.status === 'running') {
      if (this.abort?.id === id) this.abort.controller.abort(new Error(`job ${id} was cancelled`));
      return;
    }
    job.status = 'cancelled';
    await this.save(job);
  }

  /**
   * Queues a failed or cancelled job again, from its checkpoint where it kept one (the steps it made are not made
   * again): what a person does once the swarm it lacked has joined, or its cause is fixed.
   */
  async retry(id: number): Promise<StoredJob> {
    const job = this.jobs.get(id);
    if (!job) throw new Error(`no job ${id}`);
    if (job.status !== 'failed' && job.status !== 'cancelled')
      throw new Error(`job ${id} is ${job.status}: only a failed or cancelled job is tried again`);
    job.status = 'queued';
    job.error = undefined;
    job.attempts = 0;
    await this.save(job);
    this.pump();
    return job;
  }

  async remove(id: number): Promise<void> {
    const job = this.jobs.get(id);
    if (!job || job.status === 'running') throw new Error(`job ${id} cannot be removed while it runs`);
    this.jobs.delete(id);
    await this.store.delete(id);
    this.events.emit({ type: 'removed', id });
  }

  /**
   * Writes the job, then announces it; a write the store refuses is reported, never thrown. Writes
   * go one after another (a checkpoint's, then the job's end), so none overtakes an earlier one.
   */
  private save(job: StoredJob): Promise<void> {
    job.updatedAt = Date.now();
    this.jobs.set(job.id, job);
    this.writes = this.writes.then(async () => {
      const written = job.status; // the job may move on while it is written
      await this.store.put(job).catch((e: unknown) => this.keepWhatFits(job, e as Error));
      this.emit({ type: 'changed', job });
      if (isSettled(written)) {
        for (const resolve of this.waiters.get(job.id) ?? []) resolve(job);
        this.waiters.delete(job.id);
      }
    });
    return this.writes;
  }

  /**
   * The store refused `job` (full, most likely): the oldest finished jobs' videos and latents make
   * room, then it is written again; a finished job is written without its own if it must, and then
   * the older ones get theirs back (a job too large to keep costs no other job its video).
   */
  private async keepWhatFits(job: StoredJob, error: Error): Promise<void> {
    const report = (message: string) => this.emit({ type: 'storage', job, message });
    const why = error.message || error.name;
    const withoutResult = (j: StoredJob, storageNote: string): StoredJob => ({
      ...j,
      result: { ...defined(j.result, 'the result being kept'), video: null, latent: new Float32Array(0) },
      storageNote,
    });
    // already kept without its video and latent, and said so: kept so again
    if (job.storageNote && job.result) return this.store.put(withoutResult(job, job.storageNote)).catch(() => {});
    const stripped: StoredJob[] = [];
    const older = this.list().filter((j) => j.id !== job.id && !j.storageNote && resultBytes(j) > 0);
    // a job that would not fit with every older result gone strips none of them (the disk may not take them back)
    const room = await this.store.room().catch(() => null);
    const fits = room === null || resultBytes(job) <= room + older.reduce((n, j) => n + resultBytes(j), 0);
    for (const old of fits ? older : []) {
      const note = `its video and latent were removed from this browser to make room for job ${job.id}`;
      try {
        await this.store.put(withoutResult(old, note));
        old.storageNote = note;
        stripped.push(old);
        await this.store.put(job);
        report(`job ${job.id} was kept in this browser after removing the video and latent of job ${old.id} (${why})`);
        return;
      } catch {
        // no room yet: the next oldest
      }
    }
    // it does not fit even so: the others get back what they gave up (what no longer fits stays noted)
    for (const old of stripped) {
      const note = old.storageNote;
      old.storageNote = undefined;
      await this.store.put(old).catch(() => (old.storageNote = note));
    }
    if (resultBytes(job) > 0) {
      const note =
        `its video and latent could not be kept in this browser (${why}): ` +
        'download the video before closing this page';
      try {
        await this.store.put(withoutResult(job, note));
        job.storageNote = note;
        report(`job ${job.id} was kept without its video and latent: ${note}`);
        return;
      } catch {
        // not even that
      }
    }
    report(
      `job ${job.id} could not be saved in this browser (${why}): it is kept until this page closes; ` +
        'free storage (remove finished jobs) to keep it',
    );
  }

  private emit(e: QueueEvent): void {
    this.events.emit(e);
  }

  private pump(): void {
    if (this.running) return;
    const next = this.list().find((j) => j.status === 'queued');
    if (!next) return;
    this.running = true;
    void this.execute(next).finally(() => {
      this.running = false;
      this.pump();
    });
  }

  private async execute(job: StoredJob): Promise<void> {
    job.status = 'running';
    job.attempts = (job.attempts ?? 0) + 1;
    const controller = new AbortController();
    this.abort = { id: job.id, controller };
    await this.save(job);
    try {
      const result = await this.run(job, {
        resume: job.checkpoint,
        signal: controller.signal,
        onCheckpoint: (checkpoint) => {
          job.checkpoint = checkpoint;
          job.attempts = 1; // it makes progress: a reload after this is not a crash that repeats
          void this.save(job); // never throws: a refused write is reported
        },
        onProgress: (progress) => this.emit({ type: 'progress', job, progress }),
        onPhase: (phase, detail, left) => this.emit({ type: 'phase', job, phase, detail, left }),
      });
      job.status = 'done';
      job.result = { video: result.video, latent: result.latent, report: result.report };
      job.checkpoint = undefined;
    } catch (e) {
      if (controller.signal.aborted) job.status = 'cancelled';
      else {
        job.status = 'failed';
        job.error = (e as Error).message;
      }
    }
    this.abort = null;
    await this.save(job);
  }
}
