// The dashboard's jobs, one at a time in the order they were submitted. Every change is written
// to the store before it is announced, so a reload finds the queue as it was: finished jobs keep
// their videos, an interrupted job resumes from its last completed step, queued ones still wait.

import { jobParams, type JobParams } from '../core/job.ts';
import type { GenerateRequest, GenerateResult, StepProgress } from './pipeline.ts';
import type { JobInputs, JobPlacement, JobStore, StoredJob } from './job-store.ts';

export type RunJob = (job: StoredJob, hooks: Pick<GenerateRequest, 'resume' | 'onCheckpoint' | 'onProgress' | 'onPhase' | 'onFailure'>) => Promise<GenerateResult>;

export type QueueEvent = { type: 'changed'; job: StoredJob } | { type: 'progress'; job: StoredJob; progress: StepProgress } | { type: 'phase'; job: StoredJob; phase: string; detail?: string };

export class JobQueue {
  private readonly jobs = new Map<number, StoredJob>();
  private readonly listeners = new Set<(e: QueueEvent) => void>();
  private readonly waiters = new Map<number, ((job: StoredJob) => void)[]>();
  private nextId = 1;
  private running = false;

  private constructor(
    private readonly store: JobStore,
    private readonly run: RunJob,
  ) {}

  /** Loads the stored jobs and carries on with the unfinished ones. */
  static async restore(store: JobStore, run: RunJob): Promise<JobQueue> {
    const queue = new JobQueue(store, run);
    for (const job of await store.all()) {
      if (job.status === 'running') job.status = 'queued'; // interrupted by a reload: resume from its checkpoint
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
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Validates (throwing JobParamsError, nothing queued) and queues a job. */
  async submit(input: Partial<Record<keyof JobParams, unknown>>, placement: JobPlacement, inputs?: JobInputs): Promise<StoredJob> {
    const params = jobParams(input);
    const now = Date.now();
    const job: StoredJob = { id: this.nextId++, params, placement, ...(inputs ? { inputs } : {}), status: 'queued', createdAt: now, updatedAt: now };
    await this.save(job);
    this.pump();
    return job;
  }

  /** Resolves when the job is done or failed. */
  settled(id: number): Promise<StoredJob> {
    const job = this.jobs.get(id);
    if (!job) return Promise.reject(new Error(`no job ${id}`));
    if (job.status === 'done' || job.status === 'failed') return Promise.resolve(job);
    return new Promise((resolve) => this.waiters.set(id, [...(this.waiters.get(id) ?? []), resolve]));
  }

  async remove(id: number): Promise<void> {
    const job = this.jobs.get(id);
    if (!job || job.status === 'running') throw new Error(`job ${id} cannot be removed while it runs`);
    this.jobs.delete(id);
    await this.store.delete(id);
  }

  private async save(job: StoredJob): Promise<void> {
    job.updatedAt = Date.now();
    this.jobs.set(job.id, job);
    await this.store.put(job);
    this.emit({ type: 'changed', job });
    if (job.status === 'done' || job.status === 'failed') {
      for (const resolve of this.waiters.get(job.id) ?? []) resolve(job);
      this.waiters.delete(job.id);
    }
  }

  private emit(e: QueueEvent): void {
    for (const listener of this.listeners) {
      try {
        listener(e);
      } catch (error) {
        console.error('queue listener failed', error);
      }
    }
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
    await this.save(job);
    try {
      const result = await this.run(job, {
        resume: job.checkpoint,
        onCheckpoint: (checkpoint) => {
          job.checkpoint = checkpoint;
          void this.save(job);
        },
        onProgress: (progress) => this.emit({ type: 'progress', job, progress }),
        onPhase: (phase, detail) => this.emit({ type: 'phase', job, phase, detail }),
      });
      job.status = 'done';
      job.result = { video: result.video, latent: result.latent, report: result.report };
      job.checkpoint = undefined;
    } catch (e) {
      job.status = 'failed';
      job.error = (e as Error).message;
    }
    await this.save(job);
  }
}
