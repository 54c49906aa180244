// Which server has the job database open. node-sqlite3-wasm locks a database with a directory beside it
// (`jobs.sqlite.lock`, made when a statement starts to read or write and removed when it ends): the directory names
// no holder, and one left by a killed process stays, so every later open answers "database is locked". The server
// that opens the database therefore writes who it is to `jobs.sqlite.owner` first; the next one refuses while that
// process runs, and otherwise takes the database over and removes the lock it left.

import { linkSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';

/** The process that holds the database: its pid, and its start as the kernel counts it (a reused pid is another). */
export interface DbHolder {
  pid: number;
  /** /proc/<pid>/stat's start time (clock ticks since boot); null where the system has no /proc */
  start: string | null;
}

/** The database is open in a process that still runs: the server refuses to start beside it. */
export class DatabaseInUse extends Error {
  override name = 'DatabaseInUse';
  constructor(
    readonly path: string,
    readonly holder: DbHolder,
  ) {
    super(
      `the job database ${path} is open in another API server, pid ${holder.pid}, which is still running: ` +
        `stop it (kill ${holder.pid}) or give this server another --data folder`,
    );
  }
}

/** What a start found of a server that ended without closing the database; null where the last one closed it. */
export interface Recovered {
  /** the process that held it, where it wrote who it was */
  holder: DbHolder | null;
  /** whether it left SQLite's lock behind (removed now) */
  lock: boolean;
}

export interface DbOwnership {
  recovered: Recovered | null;
  /** gives the database up: the next server opens it without a word */
  release(): void;
}

/** The start time of process `pid`, or null where it is not known (no /proc, or no such process). */
function startOf(pid: number | 'self'): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // the fields after the command's name, which may hold spaces and parentheses; the start is the 22nd field
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? null;
  } catch {
    return null;
  }
}

function isRunning({ pid, start }: DbHolder): boolean {
  try {
    process.kill(pid, 0);
  } catch (e) {
    // EPERM: it runs, as another user
    if ((e as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  // a pid the kernel gave to another process since the holder ended
  const now = startOf(pid);
  return start === null || now === null || now === start;
}

function readHolder(file: string): DbHolder | null {
  try {
    const holder = JSON.parse(readFileSync(file, 'utf8')) as Partial<DbHolder>;
    return typeof holder.pid === 'number' ? { pid: holder.pid, start: holder.start ?? null } : null;
  } catch {
    return null;
  }
}

/**
 * Takes the database at `path` for this process: throws DatabaseInUse where a running process holds it; takes over
 * one a dead process held, removing SQLite's lock it left. Call before the database is opened.
 */
export function ownDatabase(path: string): DbOwnership {
  const ownerFile = `${path}.owner`;
  const me: DbHolder = { pid: process.pid, start: startOf('self') };
  // written whole under another name, then linked: the owner file is never seen half written, and the link fails
  // where another server made its own in the meantime
  const mine = `${ownerFile}.${process.pid}`;
  writeFileSync(mine, JSON.stringify(me), { mode: 0o600 });
  let stale: { holder: DbHolder | null } | null = null;
  try {
    for (;;) {
      try {
        linkSync(mine, ownerFile);
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      }
      const holder = readHolder(ownerFile);
      if (holder && isRunning(holder)) throw new DatabaseInUse(path, holder);
      stale = { holder };
      rmSync(ownerFile, { force: true });
    }
  } finally {
    rmSync(mine, { force: true });
  }
  // nothing else opens the database now: a lock beside it is a dead process's
  let lock = true;
  try {
    rmdirSync(`${path}.lock`);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    lock = false;
  }
  return {
    recovered: stale || lock ? { holder: stale?.holder ?? null, lock } : null,
    release() {
      if (readHolder(ownerFile)?.pid === me.pid) rmSync(ownerFile, { force: true });
    },
  };
}

/** The line a start says about what it recovered. */
export function recoveredLine(path: string, { holder, lock }: Recovered): string {
  const who = holder ? `the API server with pid ${holder.pid}, which no longer runs (killed?),` : 'a server that';
  return (
    `api: ${who} did not close the job database ${path}; taken over` +
    (lock ? `, and its lock (${path}.lock) removed: SQLite rolls back any write it left unfinished` : '')
  );
}
