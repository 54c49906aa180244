// A worker process keeps the weights it fetched in a folder on disk (`npm run worker -- LINK --cache DIR`), by the
// rules a tab keeps them in its browser by (rank/weight-cache.ts: a file known by its URL, its size and its ETag or
// Last-Modified, filled range by range). Worker processes of one machine may share the folder: a folder's turn is a
// lock file holding its process's id, taken over from a process that died holding it.
import {
  closeSync,
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
import { join } from 'node:path';
import { formatBytes } from '../../core/worker-api.ts';
import type { SyncHandle, WeightStorage } from '../../rank/weight-cache.ts';

/** how often a process waiting for a folder another process is loading looks again */
const LOCK_RETRY_MS = 500;

export function diskWeights(dir: string): WeightStorage {
  mkdirSync(dir, { recursive: true });
  return {
    where: `in ${dir}`,
    lock: (name) => lockFile(join(dir, `${name.replaceAll('/', '-')}.lock`)),
    open: (name, take) =>
      Promise.resolve([take(fileHandle(join(dir, `${name}.json`))), take(fileHandle(join(dir, `${name}.bin`)))]),
    noRoomFor(bytes) {
      const { bavail, bsize } = statfsSync(dir);
      const free = bavail * bsize;
      return Promise.resolve(free < bytes ? `${dir} has ${formatBytes(free)} free` : null);
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
    try {
      const fd = openSync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL);
      writeSync(fd, String(process.pid));
      closeSync(fd);
      return () => unlinkSync(path);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
    if (!holderAlive(path)) {
      unlinkSync(path);
      continue;
    }
    await new Promise((r) => setTimeout(r, LOCK_RETRY_MS));
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
