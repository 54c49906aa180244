// The API's jobs, kept in SQLite (node-sqlite3-wasm: SQLite compiled to WebAssembly with a file-system VFS, so
// it installs anywhere without a native build) under the server's data folder; the videos and latents are
// files beside it (job-files.ts). Every write is synchronous=FULL: a job answered with 202 is on the disk. Every
// statement runs to its end before its call returns, so SQLite holds no lock between calls: a server killed while
// idle leaves none, and one killed mid-write leaves one that the next start removes (db-owner.ts).

import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import sqlite from 'node-sqlite3-wasm';
import { ownDatabase, recoveredLine, type DbOwnership } from './db-owner.ts';
import type { VideoRequest } from './video-request.ts';

export const VIDEO_STATUSES = ['queued', 'in_progress', 'completed', 'failed', 'cancelled'] as const;
export type VideoStatus = (typeof VIDEO_STATUSES)[number];

/** A job that will not run again. */
export const isFinal = (status: VideoStatus): boolean =>
  status === 'completed' || status === 'failed' || status === 'cancelled';

export interface JobError {
  /** what kind of failure: 'job_failed', 'interrupted', 'storage_full', 'cancelled' */
  code: string;
  message: string;
}

export interface VideoJob {
  id: string;
  /** the order jobs were accepted in, which is the order they run in */
  seq: number;
  status: VideoStatus;
  request: VideoRequest;
  createdAt: number;
  startedAt: number | null;
  completedAt: number | null;
  /** 0–100 */
  progress: number;
  /** what is under way ('encoding', 'step 3 of 20', …) */
  phase: string | null;
  /** what is left by the coordinator's estimate; null where it has none */
  etaMs: number | null;
  error: JobError | null;
  /** the coordinator's report of the finished job (GenerateReport) */
  report: unknown;
  /** runs started: a run a crash or a restart interrupted counts too */
  attempts: number;
  /**
   * the coordinator page's id for the job's run: a run a restart or a crash interrupted goes on from the page's last
   * checkpoint of it; null before its first run
   */
  pageJob: number | null;
}

/** A write the disk refused for want of room: the API answers 507 and keeps what it had. */
export class DiskFullError extends Error {
  override name = 'DiskFullError';
}

const isDiskFull = (e: unknown) => /SQLITE_FULL|database or disk is full|ENOSPC/i.test(String(e));

type Row = Record<string, sqlite.SQLiteValue>;

const SCHEMA = `
  CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    completed_at INTEGER,
    progress INTEGER NOT NULL DEFAULT 0,
    phase TEXT,
    eta_ms INTEGER,
    error TEXT,
    report TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    page_job INTEGER
  );
  CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, seq);
`;

/** The fields of a job that change as it runs. */
export type JobChange = Partial<
  Pick<
    VideoJob,
    | 'status'
    | 'startedAt'
    | 'completedAt'
    | 'progress'
    | 'phase'
    | 'etaMs'
    | 'error'
    | 'report'
    | 'attempts'
    | 'pageJob'
  >
>;

const COLUMNS: Record<keyof JobChange, string> = {
  status: 'status',
  startedAt: 'started_at',
  completedAt: 'completed_at',
  progress: 'progress',
  phase: 'phase',
  etaMs: 'eta_ms',
  error: 'error',
  report: 'report',
  attempts: 'attempts',
  pageJob: 'page_job',
};
const JSON_FIELDS = new Set<keyof JobChange>(['error', 'report']);

export class JobDb {
  /** prepared once: a status poll reads a job, and preparing the statement each time costs most of the read */
  private readonly byId: sqlite.Statement;

  private constructor(
    private readonly db: sqlite.Database,
    private readonly owner: DbOwnership,
  ) {
    this.byId = db.prepare('SELECT * FROM jobs WHERE id = ?');
  }

  /**
   * Opens (or makes) `dir`/jobs.sqlite for this process alone: throws DatabaseInUse where a running server has it
   * open; takes over one a killed server left, saying so to `log`.
   */
  static open(dir: string, log: (line: string) => void = () => {}): JobDb {
    mkdirSync(dir, { recursive: true });
    const path = join(dir, 'jobs.sqlite');
    const owner = ownDatabase(path);
    if (owner.recovered) log(recoveredLine(path, owner.recovered));
    let db: sqlite.Database | null = null;
    try {
      db = new sqlite.Database(path);
      // the journal is deleted once a write is done, and every write waits for the disk
      db.exec('PRAGMA journal_mode = DELETE; PRAGMA synchronous = FULL;');
      db.exec(SCHEMA);
      // a database made before jobs kept their page's id
      const columns = db.all('PRAGMA table_info(jobs)') as Row[];
      if (!columns.some((c) => c.name === 'page_job')) db.exec('ALTER TABLE jobs ADD COLUMN page_job INTEGER');
      return new JobDb(db, owner);
    } catch (e) {
      if (db?.isOpen) db.close();
      owner.release();
      throw e;
    }
  }

  close(): void {
    if (!this.db.isOpen) return;
    this.byId.finalize();
    this.db.close();
    this.owner.release();
  }

  /** Writes a new job; throws DiskFullError where the disk has no room (nothing is then stored). */
  insert(job: Omit<VideoJob, 'seq'>): VideoJob {
    const { lastInsertRowid } = this.write(() =>
      this.db.run('INSERT INTO jobs (id, status, request, created_at, progress, attempts) VALUES (?, ?, ?, ?, ?, ?)', [
        job.id,
        job.status,
        JSON.stringify(job.request),
        job.createdAt,
        job.progress,
        job.attempts,
      ]),
    );
    return { ...job, seq: Number(lastInsertRowid) };
  }

  update(id: string, change: JobChange): void {
    const keys = Object.keys(change) as (keyof JobChange)[];
    if (!keys.length) return;
    const values = keys.map((k) => {
      const v = change[k];
      return JSON_FIELDS.has(k) ? (v === null || v === undefined ? null : JSON.stringify(v)) : (v as sqlite.JSValue);
    });
    this.write(() =>
      this.db.run(`UPDATE jobs SET ${keys.map((k) => `${COLUMNS[k]} = ?`).join(', ')} WHERE id = ?`, [...values, id]),
    );
  }

  delete(id: string): void {
    this.write(() => this.db.run('DELETE FROM jobs WHERE id = ?', [id]));
  }

  get(id: string): VideoJob | null {
    // all(), not get(): get() leaves the statement stepped once, not ended, and SQLite keeps its read lock (and
    // node-sqlite3-wasm its lock directory) until the statement's next use; run to its end, it gives both up
    const row = (this.byId.all([id]) as Row[]).at(0);
    return row ? fromRow(row) : null;
  }

  /** Newest first: `limit` jobs accepted before the job `after` (from the newest without it). */
  list({ limit, after }: { limit: number; after?: string }): VideoJob[] {
    const before = after === undefined ? null : this.get(after)?.seq;
    if (before === undefined) return [];
    const rows =
      before === null
        ? this.db.all('SELECT * FROM jobs ORDER BY seq DESC LIMIT ?', [limit])
        : this.db.all('SELECT * FROM jobs WHERE seq < ? ORDER BY seq DESC LIMIT ?', [before, limit]);
    return (rows as Row[]).map(fromRow);
  }

  /** The jobs still to run or running, oldest first. */
  unfinished(): VideoJob[] {
    return (this.db.all("SELECT * FROM jobs WHERE status IN ('queued', 'in_progress') ORDER BY seq") as Row[]).map(
      fromRow,
    );
  }

  countQueued(): number {
    const row = this.db.get("SELECT COUNT(*) AS n FROM jobs WHERE status = 'queued'") as Row;
    return Number(row.n);
  }

  private write<T>(write: () => T): T {
    try {
      return write();
    } catch (e) {
      if (isDiskFull(e)) throw new DiskFullError(`the disk holding the job database is full: ${(e as Error).message}`);
      throw e;
    }
  }
}

function fromRow(row: Row): VideoJob {
  const json = (v: sqlite.SQLiteValue) => (v === null ? null : (JSON.parse(String(v)) as unknown));
  const num = (v: sqlite.SQLiteValue) => (v === null ? null : Number(v));
  return {
    id: String(row.id),
    seq: Number(row.seq),
    status: String(row.status) as VideoStatus,
    request: json(row.request) as VideoRequest,
    createdAt: Number(row.created_at),
    startedAt: num(row.started_at),
    completedAt: num(row.completed_at),
    progress: Number(row.progress),
    phase: row.phase === null ? null : String(row.phase),
    etaMs: num(row.eta_ms),
    error: json(row.error) as JobError | null,
    report: json(row.report),
    attempts: Number(row.attempts),
    pageJob: num(row.page_job),
  };
}
