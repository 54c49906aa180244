// A worker process keeps the weights it fetched in a folder on disk (`npm run worker -- LINK --cache DIR`), by the
// rules a tab keeps them in its browser by (rank/weight-cache.ts: a file known by its URL, its size and its ETag or
// Last-Modified, filled range by range). Worker processes of one machine may share the folder: a folder's turn is a
// lock file holding its process's id, taken over from a process that died holding it. A model folder the machine
// already has (`--model-dir DIR`) is read instead of the server's, file by file, where the file's size and SHA-256
// are the server's (its Repr-Digest: server/model-route.ts).
import {
  closeSync,
  statSync,
  constants,
  fsyncSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readFileSync,
  readSync,
  statfsSync,
  unlinkSync,
  writeSync,
} from 'node:fs';
import { join, resolve } from 'node:path';
import { formatBytes, type WeightsSource } from '../../core/worker-api.ts';
import type { KeptFile, SyncHandle, WeightStorage } from '../../rank/weight-cache.ts';
import { KeptDigests, reprDigest } from '../../server/file-digest.ts';

/** how often a process waiting for a folder another process is loading looks again */
const LOCK_RETRY_MS = 500;
/** a takeover is a few system calls: one this old was left by a process that died within it */
const STALE_TAKEOVER_MS = 5_000;

export interface DiskWeightsOptions {
  /** where the weights fetched are kept; null: nowhere, every load fetches them */
  cacheDir: string | null;
  /** a model folder this machine has, in the published layout; null: none */
  modelDir?: string | null;
}

export function diskWeights({ cacheDir, modelDir = null }: DiskWeightsOptions): WeightStorage {
  const dir = cacheDir ?? '';
  if (cacheDir) mkdirSync(cacheDir, { recursive: true });
  // the model folder's digests, kept for the next start where there is a cache folder to keep them in
  const kept = cacheDir ? new KeptDigests(join(cacheDir, 'model-dir-digests.json')) : undefined;
  return {
    where: cacheDir ? `in ${cacheDir}` : 'on this machine',
    lock: (name) =>
      cacheDir
        ? lockFile(join(dir, `${name.replaceAll('/', '-')}.lock`))
        : Promise.reject(new Error("this worker was started with --cache '', which keeps nothing")),
    open: (name, take) =>
      Promise.resolve([take(fileHandle(join(dir, `${name}.json`))), take(fileHandle(join(dir, `${name}.bin`)))]),
    noRoomFor(bytes) {
      const { bavail, bsize } = statfsSync(dir);
      const free = bavail * bsize;
      return Promise.resolve(free < bytes ? `${dir} has ${formatBytes(free)} free` : null);
    },
    localCopy: (url, path, source, note) =>
      modelDir ? localCopy(join(modelDir, path), url, source, note, kept) : Promise.resolve(null),
  };
}

/** The file at `file` in place of the server's at `url`, where its size and SHA-256 are the server's. */
async function localCopy(
  file: string,
  url: string,
  source: WeightsSource,
  note: (why: string) => void,
  kept?: KeptDigests,
): Promise<KeptFile | null> {
  let size: number;
  try {
    size = statSync(file).size;
  } catch {
    return null; // not in the folder: the server's, as for anyone
  }
  const head = await fetch(url, { method: 'HEAD', cache: 'no-store', headers: { 'Want-Repr-Digest': 'sha-256=10' } });
  const served = Number(head.headers.get('Content-Length'));
  const digest = /sha-256=:[^:]+:/.exec(head.headers.get('Repr-Digest') ?? '')?.[0];
  const refused = !head.ok
    ? `the server answered HTTP ${head.status}`
    : served !== size
      ? `it has ${size} bytes and the server's ${served}`
      : !digest
        ? 'the server gave no SHA-256 of its file to check it by'
        : (await reprDigest(resolve(file), kept)) !== digest
          ? "its SHA-256 is not the server's"
          : null;
  if (refused) {
    note(`${file} not used: ${refused}`);
    return null;
  }
  const fd = openSync(file, 'r');
  return {
    read(begin, end) {
      const bytes = new Uint8Array(Math.max(0, Math.min(end, size) - begin));
      readSync(fd, bytes, 0, bytes.byteLength, begin);
      source.cacheBytes += bytes.byteLength;
      return Promise.resolve(bytes);
    },
    close() {
      closeSync(fd);
      return Promise.resolve();
    },
  };
}

function fileHandle(path: string): SyncHandle {
  const fd = openSync(path, constants.O_RDWR | constants.O_CREAT);
  return {
    read: (buffer, { at }) => readSync(fd, buffer, 0, buffer.byteLength, at),
    write: (buffer, { at }) => writeSync(fd, buffer, 0, buffer.byteLength, at),
    truncate: (size) => ftruncateSync(fd, size),
    flush: () => fsyncSync(fd),
    close: () => closeSync(fd),
  };
}

/** Holds the lock file at `path` until the returned function is called. */
async function lockFile(path: string): Promise<() => void> {
  for (;;) {
    const release = createLock(path);
    if (release) return release;
    if (holderAlive(path)) await new Promise((r) => setTimeout(r, LOCK_RETRY_MS));
    else breakStaleLock(path);
  }
}

/** The lock file at `path` created with this process's id, and how to remove it; null where it exists. */
function createLock(path: string): (() => void) | null {
  let fd: number;
  try {
    fd = openSync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST') return null;
    throw e;
  }
  writeSync(fd, String(process.pid));
  closeSync(fd);
  return () => unlinkSync(path);
}

/**
 * Removes the lock file at `path` where its holder died, one process at a time (under `path.takeover`): two that saw
 * it dead at once would each remove it, the second removing the lock the first had just made, and both would hold
 * the folder. A takeover left by a process that died within it is cleared once it is STALE_TAKEOVER_MS old.
 */
export function breakStaleLock(path: string): void {
  const takeover = `${path}.takeover`;
  const release = createLock(takeover);
  if (!release) {
    try {
      if (Date.now() - statSync(takeover).mtimeMs > STALE_TAKEOVER_MS) unlinkSync(takeover);
    } catch {
      // released meanwhile
    }
    return;
  }
  try {
    // seen again under the takeover: another process may have broken it and made its own since
    if (!holderAlive(path)) unlinkSync(path);
  } finally {
    release();
  }
}

/** whether the process whose id the lock file holds still runs (a file being written, or unreadable, counts as held) */
function holderAlive(path: string): boolean {
  let pid: number;
  try {
    pid = Number(readFileSync(path, 'utf8'));
  } catch {
    return true;
  }
  if (!Number.isInteger(pid) || pid <= 0) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}
