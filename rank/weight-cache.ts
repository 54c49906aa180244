// A worker keeps the weights it fetched: a model folder over HTTP whose weight files are kept in
// the origin private file system (OPFS), or a worker process's folder on disk (WeightStorage), so
// a reload, a second job or another worker tab of the same browser reads them from disk instead of
// the network. Files fill range by range as the loader
// reads them (the loader's own reads are the download, with its progress; a tab closed mid-way
// keeps what it had), through a synchronous access handle — which only a dedicated Web Worker has,
// where the engine runs. A file is known by its URL; its size and validator (ETag, else
// Last-Modified: the content hash where the server gives one) are checked on every load, and a
// file that changed is fetched again. One tab at a time loads from a folder (one Web Lock per
// folder, held from the first read to close(): a lock per file, taken in whatever order a load
// reaches its shards, let two tabs each hold a shard the other waited for): a second tab loading
// the same model waits and then reads what the first kept.
import { boundedBody, fetchModelFiles, type ModelFiles } from '../core/model/files.ts';
import { formatBytes, type WeightsSource } from '../core/worker-api.ts';

const CACHE_DIR = 'ditswarm-weights';
/** the list of kept ranges is saved after this many new bytes (and when the load ends) */
const SAVE_EVERY_BYTES = 64 << 20;

/** [begin, end) ranges of a file that are kept, merged where they touch. */
export class ByteRangeSet {
  constructor(readonly ranges: [number, number][] = []) {}

  covers(begin: number, end: number): boolean {
    return end <= begin || this.ranges.some(([b, e]) => b <= begin && end <= e);
  }

  add(begin: number, end: number): void {
    if (end <= begin) return;
    const merged: [number, number][] = [];
    for (const [b, e] of this.ranges) {
      if (e < begin || end < b) merged.push([b, e]);
      else [begin, end] = [Math.min(b, begin), Math.max(e, end)];
    }
    merged.push([begin, end]);
    this.ranges.splice(0, this.ranges.length, ...merged.sort((x, y) => x[0] - y[0]));
  }

  get bytes(): number {
    return this.ranges.reduce((sum, [b, e]) => sum + e - b, 0);
  }
}

/** What a kept file is: its identity on the server and the ranges of it on disk. */
export interface KeptMeta {
  url: string;
  size: number;
  validator: string;
  ranges: [number, number][];
}

/** What tells one version of a file from another on its server: its ETag, else its Last-Modified. */
export const validatorOf = (headers: Pick<Headers, 'get'>): string =>
  headers.get('ETag') ?? headers.get('Last-Modified') ?? '';

/**
 * The ranges of a kept file that still hold the server's bytes: all it kept where its URL, size and validator are the
 * server's now; null where any differs (a file re-uploaded at the same size, a fine-tune, starts again).
 */
export function stillKept(meta: KeptMeta | null, now: Omit<KeptMeta, 'ranges'>): [number, number][] | null {
  return meta?.url === now.url && meta.size === now.size && meta.validator === now.validator ? meta.ranges : null;
}

/** A model folder's files over HTTP, weights kept in the browser; `close()` ends a load (saves and unlocks). */
export interface CachedModelFiles extends ModelFiles {
  source(): WeightsSource;
  close(): Promise<void>;
}

/**
 * A folder's files read as they are, nothing kept: a folder on this machine (Node, tests). Every byte read counts as
 * fetched.
 */
export function unkeptModelFiles(files: ModelFiles): CachedModelFiles {
  const source: WeightsSource = { networkBytes: 0, cacheBytes: 0, note: '' };
  return {
    read: (path) => files.read(path),
    async readRange(path, begin, end) {
      const bytes = await files.readRange(path, begin, end);
      source.networkBytes += bytes.byteLength;
      return bytes;
    },
    source: () => ({ ...source }),
    close: () => Promise.resolve(),
  };
}

/** One file's place in the cache during a load, or why it has none (then it is read from the network). */
export type KeptFile = { read(begin: number, end: number): Promise<Uint8Array>; close(): Promise<void> };

/**
 * Where weights are kept: a browser's OPFS under Web Locks (browserStorage), or a folder on disk
 * (worker/node/disk-weights.ts). A kept file is two files, its kept ranges and its data, read and
 * written synchronously (in the engine's thread).
 */
export interface WeightStorage {
  /** where, for notes: "in this browser" */
  readonly where: string;
  /** holds `name` (a folder's turn) until the returned function is called; throws where nothing can be kept */
  lock(name: string): Promise<() => void>;
  /** a kept file's handles: its kept ranges (`<name>.json`) and its data (`<name>.bin`), made where missing */
  open(name: string, take: (handle: SyncHandle) => SyncHandle): Promise<[SyncHandle, SyncHandle]>;
  /** why `bytes` more cannot be stored, or null where they can */
  noRoomFor(bytes: number): Promise<string | null>;
  /**
   * the file at `url` (`path` in its folder) read from a copy this machine already has, where it is the server's
   * (a worker process's --model-dir); null where there is none, and `note` says why one was not taken
   */
  localCopy?(url: string, path: string, source: WeightsSource, note: (why: string) => void): Promise<KeptFile | null>;
}

/** The browser's OPFS; its Web Locks let one tab at a time load a folder. */
export const browserStorage: WeightStorage = {
  where: 'in this browser',
  lock(name) {
    // both are missing from a page that is no secure context (plain http on a LAN)
    const { storage, locks } = navigator as Partial<Pick<Navigator, 'storage' | 'locks'>>;
    if (!storage || !('getDirectory' in storage) || !locks)
      return Promise.reject(new Error('this browser has no origin private file system or Web Locks'));
    return new Promise((locked) => {
      void locks.request(name, () => new Promise<void>((unlock) => locked(unlock)));
    });
  },
  async open(name, take) {
    const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle(CACHE_DIR, { create: true });
    const sync = async (file: FileSystemFileHandle): Promise<SyncHandle> => {
      if (!('createSyncAccessHandle' in file))
        throw new Error('this page has no synchronous file access (only a Web Worker has)');
      return take(await (file as SyncFileHandle).createSyncAccessHandle());
    };
    const meta = await sync(await dir.getFileHandle(`${name}.json`, { create: true }));
    return [meta, await sync(await dir.getFileHandle(`${name}.bin`, { create: true }))];
  },
  async noRoomFor(bytes) {
    const { quota = 0, usage = 0 } = await navigator.storage.estimate();
    return quota - usage < bytes ? `this browser lets the page store ${formatBytes(Math.max(0, quota - usage))}` : null;
  },
};

let storage: WeightStorage = browserStorage;

/** Where this thread's engine keeps weights from now on (a worker process: a folder on disk). */
export function keepWeightsIn(where: WeightStorage): void {
  storage = where;
}

/**
 * The folder at `baseUrl` with its weights kept in OPFS. Where the browser has no OPFS or Web Locks
 * (or no synchronous access handles: a page rather than a Web Worker), every file comes from the
 * network and `source().note` says why.
 */
export function cachedModelFiles(baseUrl: string): CachedModelFiles {
  const network = fetchModelFiles(baseUrl);
  const base = baseUrl.replace(/\/$/, '');
  // Stryker disable next-line StringLiteral: source() always writes note from notes; this one is never read
  const source: WeightsSource = { networkBytes: 0, cacheBytes: 0, note: '' };
  const notes = new Set<string>();
  const kept = new Map<string, Promise<KeptFile>>();
  let folderLock: Promise<(() => void) | null> | null = null;
  const opening: StorageTurns = { last: Promise.resolve() };
  let closed = false;
  const fromNetwork = (path: string): KeptFile => ({
    read: async (begin, end) => {
      const bytes = await network.readRange(path, begin, end);
      source.networkBytes += bytes.byteLength;
      return bytes;
    },
    close: async () => {},
  });
  const keptIn = storage;
  const keep = async (path: string): Promise<KeptFile> => {
    try {
      const local = await keptIn.localCopy?.(`${base}/${path}`, path, source, (why) => notes.add(why));
      if (local) return local;
      folderLock ??= fileKey(base).then((key) => keptIn.lock(`${CACHE_DIR}/${key}`));
      await folderLock;
      return await keepFile(`${base}/${path}`, network, path, source, keptIn, opening, () =>
        notes.add(`not kept ${keptIn.where}: a write to its storage failed, the rest came from the network`),
      );
    } catch (e) {
      notes.add(`not kept ${keptIn.where}: ${(e as Error).message}`);
      return fromNetwork(path);
    }
  };
  return {
    read: (path) => network.read(path),
    async readRange(path, begin, end) {
      // a read still on its way after close() (a load that failed with reads in flight) takes no lock again
      if (closed) return fromNetwork(path).read(begin, end);
      let file = kept.get(path);
      if (!file) kept.set(path, (file = keep(path)));
      return (await file).read(begin, end);
    },
    source: () => ({ ...source, note: [...notes].join('; ') }),
    async close() {
      closed = true;
      try {
        await Promise.all([...kept.values()].map(async (file) => (await file).close()));
      } finally {
        kept.clear();
        // Stryker disable next-line ArrowFunction: a folder lock that failed is null or undefined alike to ?.()
        (await folderLock?.catch(() => null))?.();
        folderLock = null;
      }
    },
  };
}

export type SyncHandle = {
  read(buffer: Uint8Array, options: { at: number }): number;
  write(buffer: Uint8Array, options: { at: number }): number;
  truncate(size: number): void;
  flush(): void;
  close(): void;
};
type SyncFileHandle = FileSystemFileHandle & { createSyncAccessHandle(): Promise<SyncHandle> };

/**
 * A file's size and validator on its server now, from its first byte asked for by range (a HEAD would do, but
 * Chromium reports every HEAD that fetch() makes as aborted, an error in the console of each load).
 */
export async function fileVersion(url: string): Promise<{ size: number; validator: string }> {
  const first = await fetch(url, { headers: { Range: 'bytes=0-0' }, cache: 'no-store' });
  // 206: "bytes 0-0/<size>"; 416: an empty file, "bytes */0"; 200: a server that ignores Range, whose body is not read
  const total =
    first.status === 206 || first.status === 416
      ? /\/(\d+)$/.exec(first.headers.get('Content-Range') ?? '')?.[1]
      : first.ok
        ? first.headers.get('Content-Length')
        : null;
  // the byte read, so that the request ends as it should (a server that sends more is cut off: the size is what counts)
  if (first.status === 206) await boundedBody(first, 1, url).catch(() => {});
  else await first.body?.cancel();
  if (total == null || !/^\d+$/.test(total))
    throw new Error(`the server gave no size for ${url} (HTTP ${first.status})`);
  return { size: Number(total), validator: validatorOf(first.headers) };
}

/**
 * One file of a folder whose lock the caller holds; `onWriteFailed` hears of a write that failed (the
 * file goes on from the network).
 */
async function keepFile(
  url: string,
  network: ModelFiles,
  path: string,
  source: WeightsSource,
  keptIn: WeightStorage,
  opening: StorageTurns,
  onWriteFailed: () => void,
): Promise<KeptFile> {
  const { size, validator } = await fileVersion(url);
  const name = await fileKey(url);
  const handles = await openHandles(name, opening, keptIn);
  const [metaHandle, data] = handles;
  try {
    const meta = readMeta(metaHandle);
    const kept = stillKept(meta, { url, size, validator });
    const ranges = new ByteRangeSet(kept ?? []);
    if (!kept) data.truncate(0);
    const missing = size - ranges.bytes;
    const noRoom = missing > 0 ? await keptIn.noRoomFor(missing) : null;
    if (noRoom) throw new Error(`${path} needs ${formatBytes(missing)} more and ${noRoom}`);
    const save = () => {
      data.flush();
      const json = new TextEncoder().encode(
        JSON.stringify({ url, size, validator, ranges: ranges.ranges } satisfies KeptMeta),
      );
      metaHandle.truncate(0);
      metaHandle.write(json, { at: 0 });
      metaHandle.flush();
    };
    save();
    let unsaved = 0;
    let writable = true;
    return {
      async read(begin, end) {
        end = Math.min(end, size);
        if (ranges.covers(begin, end)) {
          const bytes = new Uint8Array(Math.max(0, end - begin));
          data.read(bytes, { at: begin });
          source.cacheBytes += bytes.byteLength;
          return bytes;
        }
        const bytes = await network.readRange(path, begin, end);
        source.networkBytes += bytes.byteLength;
        if (!writable) return bytes;
        try {
          data.write(bytes, { at: begin });
          ranges.add(begin, begin + bytes.byteLength);
          if ((unsaved += bytes.byteLength) >= SAVE_EVERY_BYTES) {
            save();
            unsaved = 0;
          }
        } catch {
          // the disk filled up, say: the bytes are here all the same, and what was kept stays kept
          writable = false;
          onWriteFailed();
        }
        return bytes;
      },
      close() {
        try {
          if (writable) save();
        } finally {
          for (const handle of handles) handle.close();
        }
        return Promise.resolve();
      },
    };
  } catch (e) {
    for (const handle of handles) handle.close();
    throw e;
  }
}

/**
 * Turns at the browser's storage, one file opened at a time: Chromium was seen to leave one of some fifty handles
 * asked for at once (a sharded checkpoint's files) unanswered, which hung the load.
 */
export type StorageTurns = { last: Promise<unknown> };

/** the longest the browser's storage may take to open a file's handles before the file is read from the network */
export const OPEN_TIMEOUT_MS = 10_000;

/**
 * A kept file's two handles (its kept ranges, then its data), opened when the files before it were; an error where
 * the storage refuses or does not answer within OPEN_TIMEOUT_MS of its turn (then what it opened, now or later, is
 * closed, so that the file stays free for the next load).
 */
export async function openHandles(
  name: string,
  turns: StorageTurns,
  keptIn: WeightStorage = browserStorage,
): Promise<[SyncHandle, SyncHandle]> {
  const inTime = async (): Promise<[SyncHandle, SyncHandle]> => {
    const got: SyncHandle[] = [];
    let givenUp = false;
    const take = (handle: SyncHandle): SyncHandle => {
      if (givenUp) handle.close();
      else got.push(handle);
      return handle;
    };
    const open = () => keptIn.open(name, take);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`the browser's storage did not open a file within ${OPEN_TIMEOUT_MS / 1000} s`)),
        OPEN_TIMEOUT_MS,
      );
    });
    try {
      return await Promise.race([open(), late]);
    } catch (e) {
      givenUp = true;
      for (const handle of got) handle.close();
      throw e;
    } finally {
      clearTimeout(timer);
    }
  };
  const handles = turns.last.then(inTime);
  turns.last = handles.catch(() => {});
  return handles;
}

function readMeta(handle: SyncHandle): KeptMeta | null {
  const bytes = new Uint8Array(64 << 10);
  const length = handle.read(bytes, { at: 0 });
  try {
    const meta = JSON.parse(new TextDecoder().decode(bytes.subarray(0, length))) as KeptMeta;
    return Array.isArray(meta.ranges) ? meta : null;
  } catch {
    return null; // new, or saved by a tab that closed while writing it: start the file again
  }
}

async function fileKey(url: string): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(url)));
  return [...digest.subarray(0, 16)].map((b) => b.toString(16).padStart(2, '0')).join('');
}
