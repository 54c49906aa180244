// The API's queue: jobs run one at a time in the order they were accepted, on the coordinator (coordinator-host.ts).
// The database (job-db.ts) is written before anything is answered or announced, so a server killed at any moment
// restarts with every accepted job: the queued ones wait as they did, the one that was running runs again.

import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { AutomationProgress, JobOverrides, JobResult } from '../../app/automation.ts';
import { Emitter } from '../../core/events.ts';
import { CoordinatorLost, type Coordinator } from './coordinator-host.ts';
import type { JobFiles } from './job-files.ts';
import { DiskFullError, isFinal, type JobChange, type JobDb, type VideoJob } from './job-db.ts';
import type { VideoRequest } from './video-request.ts';

/** runs of one job that its coordinator page did not survive, before it is given up: it may be what ends the page */
export const MAX_ATTEMPTS = 3;

/** A call the queue refuses as things stand: the API answers `status`. */
export class QueueError extends Error {
  override name = 'QueueError';
  constructor(
    message: string,
    readonly status: 404 | 409 | 429 | 503 | 507,
  ) {
    super(message);
  }
}

/** the ids accept() makes, and the only ones a job is looked up by */
const JOB_ID = /^video_[0-9a-f]{24}$/;

export interface VideoJobsOptions {
  /** queued jobs at most; one more is refused (429) */
  maxQueued: number;
  /** whether a worker has joined: a job is refused (503) while none has */
  hasWorkers: () => Promise<boolean>;
  log: (line: string) => void;
}

export class VideoJobs {
  private readonly changes = new Emitter<VideoJob>((e) => console.error('video job listener failed', e));
  private running: { id: string; controller: AbortController } | null = null;
  /**
   * The queued and running jobs as last written: what status polls read. A read of SQLite costs a poll ~0.2 ms of a
   * core the job's workers share; the database stays what a restart reads.
   */
  private readonly unfinished = new Map<string, VideoJob>();
  private pumping = false;

  constructor(
    private readonly db: JobDb,
    readonly files: JobFiles,
    private readonly coordinator: Coordinator,
    private readonly options: VideoJobsOptions,
  ) {}

  /** Takes up what the last run of the server left: the running job runs again, first, and the queue after it. */
  start(): void {
    for (const job of this.db.unfinished()) {
      this.unfinished.set(job.id, job);
      if (job.status === 'in_progress')
        this.update(job, {
          status: 'queued',
          phase: 'interrupted by a restart of the server; runs again',
          progress: 0,
        });
    }
    void this.pump();
  }

  /** Accepts a job: on the disk before this returns, with `reference`, the image it was given, where it has one. */
  async accept(request: VideoRequest, reference?: Uint8Array): Promise<VideoJob> {
    if (!(await this.options.hasWorkers()))
      throw new QueueError('no worker has joined this swarm: open the worker link (GET /v1/swarm) on a machine', 503);
    // the count and the insert with no await between: POSTs that waited on the swarm together cannot all see room
    if (this.db.countQueued() >= this.options.maxQueued)
      throw new QueueError(
        `the queue is full (${this.options.maxQueued} jobs wait): try again once some have finished`,
        429,
      );
    const id = `video_${randomBytes(12).toString('hex')}`; // of JOB_ID's form, by which get() finds it
    if (reference) this.files.writeReference(id, reference);
    let job: VideoJob;
    try {
      job = this.db.insert({
        id,
        status: 'queued',
        request,
        createdAt: Date.now(),
        startedAt: null,
        completedAt: null,
        progress: 0,
        phase: null,
        etaMs: null,
        error: null,
        report: null,
        attempts: 0,
        pageJob: null,
      });
    } catch (e) {
      this.files.remove(id);
      throw e;
    }
    this.unfinished.set(job.id, job);
    this.changes.emit(job);
    void this.pump();
    return job;
  }

  get(id: string): VideoJob | null {
    // SQLite's driver reads a bound text up to its first NUL: `<id>\0garbage` would find the job `<id>`
    if (!JOB_ID.test(id)) return null;
    return this.unfinished.get(id) ?? this.db.get(id);
  }

  list(options: { limit: number; after?: string }): VideoJob[] {
    return this.db.list(options);
  }

  /** Calls `listener` with the job at each change; returns the way to stop. */
  watch(id: string, listener: (job: VideoJob) => void): () => void {
    return this.changes.on((job) => job.id === id && listener(job));
  }

  /** Cancels a queued or running job (the running one stops at its next step). */
  cancel(id: string): VideoJob {
    const job = this.existing(id);
    if (isFinal(job.status))
      throw new QueueError(`${id} is ${job.status}: only a queued or running job is cancelled`, 409);
    if (this.running?.id === id) this.running.controller.abort();
    return this.update(job, {
      status: 'cancelled',
      completedAt: Date.now(),
      etaMs: null,
      error: { code: 'cancelled', message: 'cancelled by a DELETE' },
    });
  }

  /** Deletes a finished job and its files. */
  remove(id: string): void {
    const job = this.existing(id);
    if (!isFinal(job.status))
      throw new QueueError(`${id} is ${job.status}: cancel it first (DELETE cancels a queued or running job)`, 409);
    this.files.remove(id);
    this.db.delete(id);
  }

  /** The job, or a QueueError that answers 404. */
  existing(id: string): VideoJob {
    const job = this.get(id);
    if (!job) throw new QueueError(`no video ${id}`, 404);
    return job;
  }

  /** What the coordinator is given for a job: its overrides, and the image it was given where it has one. */
  private overridesOf(job: VideoJob): JobOverrides {
    const reference = job.request.inputReference;
    const path = reference && this.files.path(job.id, 'reference');
    if (!reference || !path) return job.request.overrides;
    return { ...job.request.overrides, image: { type: reference.type, base64: readFileSync(path).toString('base64') } };
  }

  private update(job: VideoJob, change: JobChange): VideoJob {
    this.db.update(job.id, change);
    const next = { ...job, ...change };
    if (isFinal(next.status)) this.unfinished.delete(next.id);
    else this.unfinished.set(next.id, next);
    this.changes.emit(next);
    return next;
  }

  private async pump(): Promise<void> {
    if (this.pumping) return;
    this.pumping = true;
    try {
      for (let job = this.db.unfinished().at(0); job; job = this.db.unfinished().at(0)) await this.runOne(job);
    } finally {
      this.pumping = false;
    }
  }

  private async runOne(queued: VideoJob): Promise<void> {
    const controller = new AbortController();
    this.running = { id: queued.id, controller };
    let job = this.update(queued, {
      status: 'in_progress',
      startedAt: Date.now(),
      attempts: queued.attempts + 1,
      phase: 'starting',
      progress: 0,
    });
    const live = () => this.get(job.id)?.status === 'in_progress';
    /** what the run tells as it goes: not once it was cancelled; a full disk costs the job the figure, not its run */
    const note = (change: JobChange) => {
      try {
        if (live()) job = this.update(job, change);
      } catch (e) {
        this.options.log(`api: ${job.id}: ${Object.keys(change).join(', ')} not written: ${(e as Error).message}`);
      }
    };
    try {
      const result = await this.coordinator.run(this.overridesOf(job), {
        signal: controller.signal,
        resume: job.pageJob,
        onPageJob: (pageJob) => pageJob !== job.pageJob && note({ pageJob }),
        onProgress: (p) => note(progressOf(p)),
      });
      if (!live()) return; // cancelled as it finished
      this.keep(job, result);
    } catch (e) {
      if (!live()) return; // cancelled: its page job stopped with an error that says so
      const message = (e as Error).message;
      if (e instanceof CoordinatorLost && job.attempts < MAX_ATTEMPTS) {
        this.options.log(`api: ${job.id}: ${message}; it runs again`);
        this.update(job, { status: 'queued', phase: `${message}; runs again`, progress: 0, etaMs: null });
      } else
        this.update(job, {
          status: 'failed',
          completedAt: Date.now(),
          etaMs: null,
          error: {
            code: e instanceof CoordinatorLost ? 'interrupted' : 'job_failed',
            message:
              e instanceof CoordinatorLost
                ? `${message}, for the ${MAX_ATTEMPTS}th time: it is not run again`
                : message,
          },
        });
    } finally {
      this.running = null;
    }
  }

  /** The files first, then the job says it is done: a completed job always has its files. */
  private keep(job: VideoJob, result: JobResult): void {
    try {
      this.files.write(job.id, result);
      this.update(job, {
        status: 'completed',
        completedAt: Date.now(),
        progress: 100,
        phase: null,
        etaMs: 0,
        report: result.report,
      });
    } catch (e) {
      if (!(e instanceof DiskFullError)) throw e;
      this.files.remove(job.id);
      this.update(job, {
        status: 'failed',
        completedAt: Date.now(),
        etaMs: null,
        error: { code: 'storage_full', message: e.message },
      });
    }
  }
}

/** 0–100 as a job's steps go; what is under way; what is left. */
function progressOf(p: AutomationProgress): JobChange {
  if ('step' in p)
    return {
      // the VAE and the file after the last step: 99 until the job is kept
      progress: Math.min(99, Math.floor((100 * p.step) / p.steps)),
      phase: `step ${p.step} of ${p.steps}`,
      etaMs: Math.round(p.etaMs),
    };
  return {
    phase: p.detail ? `${p.phase}: ${p.detail}` : p.phase,
    ...('left' in p && !p.left.atLeast && { etaMs: Math.round(p.left.ms) }),
  };
}
