// Where the dashboard keeps its jobs so that a reload loses nothing: parameters, status, the
// latent after the last completed step, and the finished video. IndexedDB in a page; an
// in-memory twin for tests.

import { openDB, type IDBPDatabase } from 'idb';
import type { JobParams } from '../core/job.ts';
import type { SamplerCheckpoint } from '../core/sampler.ts';
import type { Backend } from './backends.ts';
import type { GenerateReport, GenerateRequest } from './pipeline.ts';
import type { PlacementRequest } from './placement.ts';

export type JobStatus = 'queued' | 'running' | 'done' | 'failed' | 'cancelled';

/** A job that will not run again: it finished, failed or was cancelled. */
export const isSettled = (status: JobStatus): boolean =>
  status === 'done' || status === 'failed' || status === 'cancelled';

/**
 * What a stored job asks of placement: its request as the planner takes it (PlacementRequest), with the
 * backend and the model folder; `workers` is its Ulysses degree (of each group with CFG parallel).
 */
export type JobPlacement = Omit<PlacementRequest, 'ulyssesDegree'> & {
  backend: Backend;
  workers: number | 'auto';
  /** URL of the model folder; the bundled default model unless set */
  model?: string;
};

/**
 * What a job is given beyond its parameters: prompt embeddings instead of prompts, the latent instead of a video, an
 * image to start from: kept with the job, so that it runs again whole after a reload.
 */
export type JobInputs = Pick<GenerateRequest, 'promptEmbeds' | 'negativePromptEmbeds' | 'outputType' | 'image'>;

export interface StoredJob {
  id: number;
  params: JobParams;
  placement: JobPlacement;
  inputs?: JobInputs;
  status: JobStatus;
  createdAt: number;
  updatedAt: number;
  /** `step` steps done; `latent` after them (and UniPC's history, to continue it) */
  checkpoint?: SamplerCheckpoint;
  error?: string;
  /** video null: the job asked for the latent only, or the browser had no room to keep it (storageNote says) */
  result?: { video: Blob | null; latent: Float32Array; report: GenerateReport };
  /** times it started: a start that a reload or a crash interrupted counts too */
  attempts?: number;
  /** what of it this browser could not keep, and why */
  storageNote?: string;
}

export interface JobStore {
  all(): Promise<StoredJob[]>;
  put(job: StoredJob): Promise<void>;
  delete(id: number): Promise<void>;
  /**
   * bytes it can still take, as far as the browser says: below 0 where it holds more than its quota
   * now allows; null where the browser does not say
   */
  room(): Promise<number | null>;
}

/** The bytes a job's video and latent take in a store. */
export const resultBytes = (job: StoredJob): number =>
  job.result ? (job.result.video?.size ?? 0) + job.result.latent.byteLength : 0;

export class MemoryJobStore implements JobStore {
  private readonly jobs = new Map<number, StoredJob>();
  all() {
    return Promise.resolve([...this.jobs.values()].sort((a, b) => a.id - b.id).map((j) => structuredClone(j)));
  }
  put(job: StoredJob) {
    this.jobs.set(job.id, structuredClone(job));
    return Promise.resolve();
  }
  room(): Promise<number | null> {
    return Promise.resolve(null);
  }
  delete(id: number) {
    this.jobs.delete(id);
    return Promise.resolve();
  }
}

/** The browser's storage manager: none on a page that is not a secure context. */
const storage = (): Partial<StorageManager> | undefined => (navigator as { storage?: Partial<StorageManager> }).storage;

/** The dashboard's IndexedDB database of jobs. */
export const JOB_DATABASE = 'ditswarm';

export class IdbJobStore implements JobStore {
  private constructor(private readonly db: IDBPDatabase) {}

  static async open(name = JOB_DATABASE): Promise<IdbJobStore> {
    const db = await openDB(name, 1, {
      upgrade(db) {
        db.createObjectStore('jobs', { keyPath: 'id' });
      },
    });
    // finished videos are worth keeping: ask the browser not to evict them under storage pressure
    void storage()
      ?.persist?.()
      .catch(() => false);
    return new IdbJobStore(db);
  }

  async all(): Promise<StoredJob[]> {
    return (await this.db.getAll('jobs')) as StoredJob[];
  }
  async put(job: StoredJob): Promise<void> {
    await this.db.put('jobs', job);
  }
  async delete(id: number): Promise<void> {
    await this.db.delete('jobs', id);
  }
  async room(): Promise<number | null> {
    // the origin's whole quota and usage (the workers' weight cache counts too): what any write may still take
    const { quota, usage } = (await storage()?.estimate?.()) ?? {};
    return quota !== undefined && usage !== undefined ? quota - usage : null;
  }
}
