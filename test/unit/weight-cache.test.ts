import { createHash } from 'node:crypto';
import {
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statfsSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { checkLoadStatus, describeLoad, describeWeights } from '../../core/worker-api.ts';
import { passing } from '../../core/net/check.ts';
import { breakStaleLock, diskWeights } from '../../worker/node/disk-weights.ts';
import {
  browserStorage,
  ByteRangeSet,
  cachedModelFiles,
  fileVersion,
  keepWeightsIn,
  OPEN_TIMEOUT_MS,
  unkeptModelFiles,
  openHandles,
  stillKept,
  validatorOf,
  type StorageTurns,
} from '../../rank/weight-cache.ts';

describe('the ranges of a file a browser keeps', () => {
  it('merge where they touch or overlap, and cover only what was kept', () => {
    const kept = new ByteRangeSet();
    kept.add(8, 100);
    kept.add(200, 300);
    expect(kept.covers(8, 100)).toBe(true);
    expect(kept.covers(0, 8)).toBe(false);
    expect(kept.covers(90, 210)).toBe(false); // spans the gap
    kept.add(100, 200); // the gap, touching both
    expect(kept.ranges).toEqual([[8, 300]]);
    kept.add(0, 8);
    kept.add(250, 400);
    expect(kept.ranges).toEqual([[0, 400]]);
    expect(kept.bytes).toBe(400);
    expect(kept.covers(399, 400)).toBe(true);
    expect(kept.covers(399, 401)).toBe(false);
    expect(kept.covers(5, 5)).toBe(true); // nothing asked, nothing missing
    expect(new ByteRangeSet().covers(5, 5)).toBe(true);
    expect(new ByteRangeSet().covers(9, 5)).toBe(true);
    expect(new ByteRangeSet().covers(5, 6)).toBe(false);
  });

  it('stay sorted and apart when they do not touch', () => {
    const kept = new ByteRangeSet();
    for (const [b, e] of [
      [50, 60],
      [10, 20],
      [30, 40],
      [0, 0],
    ])
      kept.add(b, e);
    expect(kept.ranges).toEqual([
      [10, 20],
      [30, 40],
      [50, 60],
    ]);
    expect(kept.bytes).toBe(30);
  });
});

describe("a kept file is still the server's only while its URL, size and validator are", () => {
  const url = 'http://x/models/m/transformer/diffusion_pytorch_model.safetensors';
  const kept = { url, size: 1000, validator: '"v1"', ranges: [[0, 500]] as [number, number][] };
  it('keeps what it kept where all three are the same, and starts again where any differs', () => {
    expect(stillKept(kept, { url, size: 1000, validator: '"v1"' })).toEqual([[0, 500]]);
    // a fine-tune uploaded over it at the same size: only its ETag says so
    expect(stillKept(kept, { url, size: 1000, validator: '"v2"' })).toBeNull();
    expect(stillKept(kept, { url, size: 1001, validator: '"v1"' })).toBeNull();
    expect(stillKept(kept, { url: `${url}?x`, size: 1000, validator: '"v1"' })).toBeNull();
    expect(stillKept(null, { url, size: 1000, validator: '"v1"' })).toBeNull();
  });
  it('knows a version by its ETag, else its Last-Modified', () => {
    const headers = (h: Record<string, string>) => new Headers(h);
    expect(validatorOf(headers({ ETag: '"abc"', 'Last-Modified': 'Tue, 01 Dec 2026 10:00:00 GMT' }))).toBe('"abc"');
    expect(validatorOf(headers({ 'Last-Modified': 'Tue, 01 Dec 2026 10:00:00 GMT' }))).toBe(
      'Tue, 01 Dec 2026 10:00:00 GMT',
    );
    expect(validatorOf(headers({}))).toBe('');
  });
});

describe('a load as pages show it', () => {
  it('says how far, from where, how fast and how long is left', () => {
    const status = { bytes: 1.2e9, totalBytes: 5.68e9, networkBytes: 1.2e9, elapsedMs: 24_000, note: '' };
    expect(describeLoad(status)).toBe('1.20 GB of 5.68 GB from the network · 50.0 MB/s · 90 s left');
    expect(describeLoad({ ...status, elapsedMs: 48_000 })).toBe(
      '1.20 GB of 5.68 GB from the network · 25.0 MB/s · 3 min left',
    );
    expect(describeLoad({ ...status, networkBytes: 0, elapsedMs: 1_000 })).toBe(
      '1.20 GB of 5.68 GB from the browser cache · 1.20 GB/s · 4 s left',
    );
    expect(describeLoad({ ...status, networkBytes: 2e8, note: 'not kept in this browser: no room' })).toBe(
      '1.20 GB of 5.68 GB (200.0 MB from the network) · 50.0 MB/s · 90 s left (not kept in this browser: no room)',
    );
    expect(describeLoad({ ...status, bytes: 0, networkBytes: 0 })).toBe('0 of 5.68 GB');
    expect(describeLoad({ ...status, bytes: 5.68e9, networkBytes: 5.68e9 })).toBe(
      '5.68 GB of 5.68 GB from the network · 236.7 MB/s',
    );
  });

  it("and where a rank's weights came from", () => {
    expect(describeWeights({ networkBytes: 0, cacheBytes: 5.68e9, note: '' })).toBe(
      'weights: 5.68 GB from the browser cache',
    );
    expect(describeWeights({ networkBytes: 3e6, cacheBytes: 0, note: 'not kept in this browser: no room' })).toBe(
      'weights: 3.0 MB from the network (not kept in this browser: no room)',
    );
  });

  it("a pulse's load that is not one is dropped, not believed", () => {
    const status = { bytes: 1, totalBytes: 2, networkBytes: 1, elapsedMs: 5, note: '' };
    expect(passing(checkLoadStatus, status, 'load')).toEqual(status);
    expect(passing(checkLoadStatus, { ...status, bytes: -1 }, 'load')).toBeUndefined();
    expect(passing(checkLoadStatus, { ...status, note: 'x'.repeat(5000) }, 'load')).toBeUndefined();
    expect(passing(checkLoadStatus, 'loading', 'load')).toBeUndefined();
  });
});

describe("a kept file's handles, from the browser's storage", () => {
  afterEach(() => {
    vi.useRealTimers();
    vi.unstubAllGlobals();
  });

  it('are opened one file at a time; a file the storage does not open in time is given up on, the next one is not held up', async () => {
    vi.useFakeTimers();
    const asked: string[] = [];
    const closed: string[] = [];
    /** the storage of a browser that never answers for `stuck`'s data file */
    const stuck = 'b.bin';
    const file = (name: string) => ({
      createSyncAccessHandle: () => {
        asked.push(name);
        const handle = { close: () => closed.push(name) };
        return name === stuck ? new Promise(() => {}) : Promise.resolve(handle);
      },
    });
    const dir = { getFileHandle: (name: string) => Promise.resolve(file(name)) };
    vi.stubGlobal('navigator', { storage: { getDirectory: () => Promise.resolve({ getDirectoryHandle: () => dir }) } });
    const turns: StorageTurns = { last: Promise.resolve() };
    const [a, b, c] = ['a', 'b', 'c'].map((name) => openHandles(name, turns));
    const bOutcome = b.then(
      () => 'opened',
      (e: unknown) => (e as Error).message,
    );
    await expect(a).resolves.toHaveLength(2);
    await vi.advanceTimersByTimeAsync(OPEN_TIMEOUT_MS - 1);
    // c waits for b's turn to end
    expect(asked).toEqual(['a.json', 'a.bin', 'b.json', 'b.bin']);
    await vi.advanceTimersByTimeAsync(1);
    expect(await bOutcome).toBe(`the browser's storage did not open a file within ${OPEN_TIMEOUT_MS / 1000} s`);
    // b's handle that did open is closed, so that the file is free for the next load
    expect(closed).toEqual(['b.json']);
    await expect(c).resolves.toHaveLength(2);
    expect(asked.slice(4)).toEqual(['c.json', 'c.bin']);
    expect(vi.getTimerCount()).toBe(0); // no deadline is left running for the files that opened
  });

  it('a handle the storage gives only after the file was given up on is closed as it comes', async () => {
    vi.useFakeTimers();
    const closed: string[] = [];
    const file = (name: string) => ({
      createSyncAccessHandle: () =>
        new Promise((resolve) =>
          setTimeout(
            () => resolve({ close: () => closed.push(name) }),
            name.endsWith('.bin') ? 2 * OPEN_TIMEOUT_MS : 0,
          ),
        ),
    });
    const dir = { getFileHandle: (name: string) => Promise.resolve(file(name)) };
    vi.stubGlobal('navigator', { storage: { getDirectory: () => Promise.resolve({ getDirectoryHandle: () => dir }) } });
    const outcome = openHandles('slow', { last: Promise.resolve() }).catch((e: unknown) => (e as Error).message);
    await vi.advanceTimersByTimeAsync(OPEN_TIMEOUT_MS);
    expect(await outcome).toMatch(/did not open a file within 10 s/);
    expect(closed).toEqual(['slow.json']);
    await vi.advanceTimersByTimeAsync(OPEN_TIMEOUT_MS);
    expect(closed).toEqual(['slow.json', 'slow.bin']);
  });
});

/**
 * A browser for cachedModelFiles: a server of files (ETag, else Last-Modified) answering Range requests (or, where a
 * file says so, ignoring them), which must pass the HTTP cache, and an origin private file system of `quota` bytes
 * whose sync access handles are counted open and shut, and Web Locks.
 */
function fakeBrowser({ quota = 1e9, usage = 0 } = {}) {
  const served = new Map<
    string,
    {
      bytes: Uint8Array;
      etag?: string;
      lastModified?: string;
      /** the size its Content-Range (or, ignoring ranges, its Content-Length) gives, where not its own; null: none */
      size?: string | null;
      /** answers a range with the whole file, as a server without Range support does */
      ignoresRange?: boolean;
    }
  >();
  const requests: string[] = [];
  const disk = new Map<string, Uint8Array>();
  const open = new Set<string>();
  const locksAsked: string[] = [];
  const held = new Map<string, Promise<unknown>>();
  const state = { failWrites: false, pageOnly: false };
  const fetch = (url: string, init?: RequestInit): Promise<Response> => {
    const file = served.get(url);
    const range = (init?.headers as Record<string, string> | undefined)?.Range;
    // a range the HTTP cache answered could be of a version it kept, not the server's now
    if (range && init?.cache !== 'no-store') throw new Error(`${url} ${range} was asked for through the HTTP cache`);
    requests.push(`GET ${url}${range ? ` ${range}` : ''}`);
    if (!file) return Promise.resolve(new Response(null, { status: 404 }));
    const version = {
      ...(file.etag && { ETag: file.etag }),
      ...(file.lastModified && { 'Last-Modified': file.lastModified }),
    };
    const size = file.size === undefined ? String(file.bytes.length) : file.size;
    if (!range || file.ignoresRange)
      return Promise.resolve(
        new Response(file.bytes.slice(), { headers: { ...version, ...(size !== null && { 'Content-Length': size }) } }),
      );
    const [b, e] = range.replace('bytes=', '').split('-').map(Number);
    const part = file.bytes.slice(b, e + 1);
    const headers = { ...version, 'Content-Range': `bytes ${b}-${b + part.length - 1}/${size ?? '*'}` };
    return Promise.resolve(new Response(part, { status: 206, headers }));
  };
  const syncHandle = (name: string) => {
    if (open.has(name)) throw new Error(`${name} is open in another handle`);
    open.add(name);
    const data = () => disk.get(name) ?? new Uint8Array(0);
    return {
      read(buffer: Uint8Array, { at }: { at: number }) {
        const part = data().subarray(at, at + buffer.length);
        buffer.set(part);
        return part.length;
      },
      write(buffer: Uint8Array, { at }: { at: number }) {
        if (state.failWrites) throw new Error('QuotaExceededError');
        if (at + buffer.length > data().length) {
          const grown = new Uint8Array(at + buffer.length);
          grown.set(data());
          disk.set(name, grown);
        }
        data().set(buffer, at);
        return buffer.length;
      },
      truncate(size: number) {
        disk.set(name, data().slice(0, size));
      },
      flush() {},
      close() {
        open.delete(name);
      },
    };
  };
  /** as OPFS: a file or folder that is not there is made only when asked to create it */
  const notFound = (name: string) => Promise.reject(new DOMException(`${name} not found`, 'NotFoundError'));
  const dir = {
    getFileHandle(name: string, options?: { create?: boolean }) {
      if (!options?.create && !disk.has(name)) return notFound(name);
      if (!disk.has(name)) disk.set(name, new Uint8Array(0));
      return Promise.resolve(state.pageOnly ? {} : { createSyncAccessHandle: () => Promise.resolve(syncHandle(name)) });
    },
  };
  const folders = new Set<string>();
  const navigator = {
    storage: {
      getDirectory: () =>
        Promise.resolve({
          getDirectoryHandle(name: string, options?: { create?: boolean }) {
            if (!options?.create && !folders.has(name)) return notFound(name);
            folders.add(name);
            return Promise.resolve(dir);
          },
        }),
      estimate: () => Promise.resolve({ quota, usage }),
    },
    locks: {
      request(name: string, hold: () => Promise<void>) {
        locksAsked.push(name);
        const turn = (held.get(name) ?? Promise.resolve()).then(hold);
        held.set(name, turn);
        return turn;
      },
    },
  };
  vi.stubGlobal('fetch', fetch);
  vi.stubGlobal('navigator', navigator);
  return { served, requests, disk, open, locksAsked, state, navigator };
}

describe("a folder on this machine's files, nothing kept (unkeptModelFiles)", () => {
  it('counts every byte read by range as fetched, whole files not, and says nothing of a cache', async () => {
    const bytes = Uint8Array.from({ length: 100 }, (_, i) => i);
    const files = unkeptModelFiles({
      read: () => Promise.resolve(bytes),
      readRange: (_path, begin, end) => Promise.resolve(bytes.slice(begin, end)),
    });
    expect(await files.readRange('w.safetensors', 10, 30)).toEqual(bytes.slice(10, 30));
    expect(await files.readRange('w.safetensors', 0, 5)).toEqual(bytes.slice(0, 5));
    expect(await files.read('config.json')).toBe(bytes);
    expect(files.source()).toEqual({ networkBytes: 25, cacheBytes: 0, note: '' });
    await expect(files.close()).resolves.toBeUndefined();
  });
});

describe("a model folder's weights kept in the browser (cachedModelFiles)", () => {
  afterEach(() => vi.unstubAllGlobals());
  const url = 'http://x/m/transformer/w.safetensors';
  const path = 'transformer/w.safetensors';
  const bytesOf = (n: number, salt = 0) => Uint8Array.from({ length: n }, (_, i) => (i * 7 + salt) & 255);
  /** A browser whose server holds one file of 1000 bytes, version "v1". */
  const servingOneFile = () => {
    const browser = fakeBrowser();
    const weights = bytesOf(1000);
    browser.served.set(url, { bytes: weights, etag: '"v1"' });
    return { browser, weights };
  };
  /** byte for byte (toEqual walks megabytes slowly) */
  const same = (a: Uint8Array, b: Uint8Array) => a.length === b.length && a.every((v, i) => v === b[i]);

  it('a first load fetches each range once and keeps it; a second load of the folder reads it from disk, asking the server only whether it changed', async () => {
    const { browser, weights } = servingOneFile();
    const first = cachedModelFiles('http://x/m/');
    expect(await first.readRange(path, 0, 100)).toEqual(weights.slice(0, 100));
    expect(await first.readRange(path, 100, 300)).toEqual(weights.slice(100, 300));
    expect(await first.readRange(path, 50, 250)).toEqual(weights.slice(50, 250)); // kept: from disk
    expect(await first.readRange(path, 900, 2000)).toEqual(weights.slice(900)); // the file ends at 1000
    expect(await first.readRange(path, 300, 300)).toEqual(new Uint8Array(0));
    expect(first.source()).toEqual({ networkBytes: 400, cacheBytes: 200, note: '' });
    await first.close();
    expect(browser.open.size).toBe(0);
    expect(browser.requests).toEqual([
      `GET ${url} bytes=0-0`,
      `GET ${url} bytes=0-99`,
      `GET ${url} bytes=100-299`,
      `GET ${url} bytes=900-999`,
    ]);
    browser.requests.length = 0;
    const second = cachedModelFiles('http://x/m');
    expect(await second.readRange(path, 0, 300)).toEqual(weights.slice(0, 300));
    expect(await second.readRange(path, 900, 1000)).toEqual(weights.slice(900));
    expect(await second.readRange(path, 250, 350)).toEqual(weights.slice(250, 350)); // half kept: all fetched
    expect(second.source()).toEqual({ networkBytes: 100, cacheBytes: 400, note: '' });
    await second.close();
    expect(browser.requests).toEqual([`GET ${url} bytes=0-0`, `GET ${url} bytes=250-349`]);
    // one lock per folder, named by the first half of its URL's SHA-256, the same for either spelling of the URL
    const folderKey = createHash('sha256').update('http://x/m').digest('hex').slice(0, 32);
    expect(browser.locksAsked).toEqual([`ditswarm-weights/${folderKey}`, `ditswarm-weights/${folderKey}`]);
    expect(browser.open.size).toBe(0);
  });

  it("a load's files share the folder's one lock, each file kept apart", async () => {
    const browser = fakeBrowser();
    const [a, b] = [bytesOf(400), bytesOf(300, 5)];
    browser.served.set(url, { bytes: a, etag: '"a"' });
    browser.served.set('http://x/m/vae/v.safetensors', { bytes: b, etag: '"b"' });
    const first = cachedModelFiles('http://x/m');
    expect(await first.readRange(path, 0, 400)).toEqual(a);
    expect(await first.readRange('vae/v.safetensors', 0, 300)).toEqual(b);
    expect(await first.readRange(path, 100, 200)).toEqual(a.slice(100, 200));
    expect(first.source()).toEqual({ networkBytes: 700, cacheBytes: 100, note: '' });
    expect(browser.locksAsked).toHaveLength(1);
    expect(browser.open.size).toBe(4); // two handles a file, held until close()
    await first.close();
    expect(browser.open.size).toBe(0);
    const second = cachedModelFiles('http://x/m');
    expect(await second.readRange('vae/v.safetensors', 0, 300)).toEqual(b);
    expect(await second.readRange(path, 0, 400)).toEqual(a);
    expect(second.source()).toEqual({ networkBytes: 0, cacheBytes: 700, note: '' });
    await second.close();
  });

  it('a file changed on the server (another ETag at the same size, or Last-Modified where there is none) is fetched again', async () => {
    const browser = fakeBrowser();
    browser.served.set(url, { bytes: bytesOf(1000), etag: '"v1"' });
    const first = cachedModelFiles('http://x/m');
    await first.readRange(path, 0, 500);
    await first.close();
    const tuned = bytesOf(1000, 1);
    browser.served.set(url, { bytes: tuned, etag: '"v2"' });
    const second = cachedModelFiles('http://x/m');
    expect(await second.readRange(path, 0, 500)).toEqual(tuned.slice(0, 500));
    expect(second.source()).toEqual({ networkBytes: 500, cacheBytes: 0, note: '' });
    await second.close();
    // kept under "v2" from here
    const third = cachedModelFiles('http://x/m');
    expect(await third.readRange(path, 0, 500)).toEqual(tuned.slice(0, 500));
    expect(third.source().cacheBytes).toBe(500);
    await third.close();
    browser.served.set(url, { bytes: tuned, lastModified: 'Tue, 01 Dec 2026 10:00:00 GMT' });
    const fourth = cachedModelFiles('http://x/m');
    await fourth.readRange(path, 0, 500);
    expect(fourth.source()).toMatchObject({ networkBytes: 500, cacheBytes: 0 });
    await fourth.close();
    // a smaller version: what was kept of the old one is dropped, not left taking room
    browser.served.set(url, { bytes: tuned.slice(0, 300), etag: '"v3"' });
    const fifth = cachedModelFiles('http://x/m');
    await fifth.readRange(path, 0, 100);
    await fifth.close();
    const data = [...browser.disk].find(([name]) => name.endsWith('.bin'));
    expect(data?.[1]).toEqual(tuned.slice(0, 100));
  });

  it('whole files (configs) come from the network as they are, nothing kept', async () => {
    const browser = fakeBrowser();
    browser.served.set('http://x/m/model_index.json', { bytes: new TextEncoder().encode('{}'), etag: '"c"' });
    const files = cachedModelFiles('http://x/m');
    expect(new TextDecoder().decode(await files.read('model_index.json'))).toBe('{}');
    expect(browser.requests).toEqual(['GET http://x/m/model_index.json']);
    expect(files.source()).toEqual({ networkBytes: 0, cacheBytes: 0, note: '' });
    await files.close();
    expect(browser.locksAsked).toEqual([]);
  });

  it('without an origin private file system, Web Locks or synchronous handles, every byte comes from the network and the source says why', async () => {
    const weights = bytesOf(300);
    for (const [browserHas, why] of [
      [{}, 'this browser has no origin private file system or Web Locks'],
      [{ storage: {}, locks: {} }, 'this browser has no origin private file system or Web Locks'],
      ['no locks', 'this browser has no origin private file system or Web Locks'],
      ['a page', 'this page has no synchronous file access (only a Web Worker has)'],
    ] as const) {
      const browser = fakeBrowser();
      browser.served.set(url, { bytes: weights, etag: '"v1"' });
      if (browserHas === 'a page') browser.state.pageOnly = true;
      else if (browserHas === 'no locks') vi.stubGlobal('navigator', { storage: browser.navigator.storage });
      else vi.stubGlobal('navigator', browserHas);
      const files = cachedModelFiles('http://x/m');
      expect(await files.readRange(path, 0, 100)).toEqual(weights.slice(0, 100));
      expect(await files.readRange(path, 0, 100)).toEqual(weights.slice(0, 100));
      expect(files.source(), JSON.stringify(browserHas)).toEqual({
        networkBytes: 200,
        cacheBytes: 0,
        note: `not kept in this browser: ${why}`,
      });
      await files.close();
      expect(browser.open.size).toBe(0);
    }
  });

  it("a file's size and version come from its first byte, asked for past the HTTP cache; a server that ignores Range gives them in its whole answer, whose body is left unread", async () => {
    const browser = fakeBrowser();
    browser.served.set(url, { bytes: bytesOf(1000), etag: '"v1"' });
    expect(await fileVersion(url)).toEqual({ size: 1000, validator: '"v1"' });
    expect(browser.requests).toEqual([`GET ${url} bytes=0-0`]);
    let cancelled = false;
    const whole = new ReadableStream<Uint8Array>({
      pull: (c) => c.enqueue(new Uint8Array(1 << 20)), // as long as anyone reads
      cancel: () => void (cancelled = true),
    });
    const lastModified = 'Tue, 01 Dec 2026 10:00:00 GMT';
    vi.stubGlobal('fetch', () =>
      Promise.resolve(
        new Response(whole, { headers: { 'Content-Length': '5000000000', 'Last-Modified': lastModified } }),
      ),
    );
    expect(await fileVersion(url)).toEqual({ size: 5e9, validator: lastModified });
    expect(cancelled).toBe(true);
    // and its weights are kept all the same
    const ignoring = fakeBrowser();
    ignoring.served.set(url, { bytes: bytesOf(300), etag: '"v1"', ignoresRange: true });
    const files = cachedModelFiles('http://x/m');
    expect(await files.readRange(path, 10, 20)).toEqual(bytesOf(300).slice(10, 20));
    await files.close();
    const again = cachedModelFiles('http://x/m');
    expect(await again.readRange(path, 10, 20)).toEqual(bytesOf(300).slice(10, 20));
    expect(again.source()).toEqual({ networkBytes: 0, cacheBytes: 10, note: '' });
    await again.close();
  });

  it('a server that gives no size for a file, in its range or its whole answer, has it read from the network, saying so', async () => {
    const browser = fakeBrowser();
    const other = 'http://x/m/transformer/w2.safetensors';
    browser.served.set(url, { bytes: bytesOf(300), etag: '"v1"', size: null });
    browser.served.set(other, { bytes: bytesOf(300), etag: '"v1"', size: null, ignoresRange: true });
    const files = cachedModelFiles('http://x/m');
    expect(await files.readRange(path, 0, 10)).toEqual(bytesOf(10));
    expect(await files.readRange('transformer/w2.safetensors', 0, 10)).toEqual(bytesOf(10));
    expect(files.source().note).toBe(
      `not kept in this browser: the server gave no size for ${url} (HTTP 206); ` +
        `not kept in this browser: the server gave no size for ${other} (HTTP 200)`,
    );
    await files.close();
    browser.served.clear();
    browser.served.set('http://x/m/other.safetensors', { bytes: bytesOf(300), etag: '"v1"' });
    const missing = cachedModelFiles('http://x/m');
    await expect(missing.readRange(path, 0, 10)).rejects.toThrow(`${url}: not found`);
    expect(missing.source().note).toBe(`not kept in this browser: the server gave no size for ${url} (HTTP 404)`);
    await missing.close();
  });

  it('a file the storage has no room for is read from the network, saying how much it needs and how much there is; what is kept counts', async () => {
    const mb = 1e6;
    const weights = bytesOf(3 * mb);
    const tight = fakeBrowser({ quota: 3 * mb, usage: 1 * mb });
    tight.served.set(url, { bytes: weights, etag: '"v1"' });
    const files = cachedModelFiles('http://x/m');
    expect(await files.readRange(path, 0, 10)).toEqual(weights.slice(0, 10));
    expect(files.source().note).toBe(
      `not kept in this browser: ${path} needs 3.0 MB more and this browser lets the page store 2.0 MB`,
    );
    await files.close();
    expect(tight.open.size).toBe(0);
    const full = fakeBrowser({ quota: 2 * mb, usage: 2.5 * mb });
    full.served.set(url, { bytes: weights, etag: '"v1"' });
    const none = cachedModelFiles('http://x/m');
    await none.readRange(path, 0, 10);
    expect(none.source().note).toMatch(/lets the page store 0\.0 MB$/);
    await none.close();
    // a first million kept, then room for exactly the two missing
    const roomy = fakeBrowser();
    roomy.served.set(url, { bytes: weights, etag: '"v1"' });
    const first = cachedModelFiles('http://x/m');
    await first.readRange(path, 0, mb);
    await first.close();
    const exact = fakeBrowser({ quota: 2 * mb, usage: 0 });
    exact.served.set(url, { bytes: weights, etag: '"v1"' });
    for (const [name, bytes] of roomy.disk) exact.disk.set(name, bytes);
    const second = cachedModelFiles('http://x/m');
    expect(same(await second.readRange(path, 0, mb), weights.subarray(0, mb))).toBe(true);
    expect(same(await second.readRange(path, mb, 3 * mb), weights.subarray(mb))).toBe(true);
    expect(second.source()).toEqual({ networkBytes: 2 * mb, cacheBytes: mb, note: '' });
    await second.close();
  });

  it('a file kept whole reads from disk even where the disk is now full', async () => {
    const roomy = fakeBrowser();
    const weights = bytesOf(1000);
    roomy.served.set(url, { bytes: weights, etag: '"v1"' });
    const first = cachedModelFiles('http://x/m');
    await first.readRange(path, 0, 1000);
    await first.close();
    const full = fakeBrowser({ quota: 100, usage: 200 });
    full.served.set(url, { bytes: weights, etag: '"v1"' });
    for (const [name, bytes] of roomy.disk) full.disk.set(name, bytes);
    const second = cachedModelFiles('http://x/m');
    expect(await second.readRange(path, 0, 1000)).toEqual(weights);
    expect(second.source()).toEqual({ networkBytes: 0, cacheBytes: 1000, note: '' });
    await second.close();
  });

  it('the list of kept ranges is rewritten whole, also where it grows shorter as ranges merge', async () => {
    const { browser, weights } = servingOneFile();
    for (const [begin, end] of [
      [0, 100],
      [200, 300],
      [400, 500],
    ]) {
      const files = cachedModelFiles('http://x/m');
      await files.readRange(path, begin, end);
      await files.close();
    }
    const merge = cachedModelFiles('http://x/m');
    await merge.readRange(path, 100, 200);
    await merge.readRange(path, 300, 400);
    await merge.close();
    const meta = [...browser.disk].find(([name]) => name.endsWith('.json'))?.[1];
    expect(JSON.parse(new TextDecoder().decode(meta))).toMatchObject({ ranges: [[0, 500]] });
    const last = cachedModelFiles('http://x/m');
    expect(await last.readRange(path, 0, 500)).toEqual(weights.slice(0, 500));
    expect(last.source()).toMatchObject({ networkBytes: 0, cacheBytes: 500 });
    await last.close();
  });

  it('a tab closed mid-load keeps what it had saved: the list of kept ranges is saved each 64 MiB read', async () => {
    const browser = fakeBrowser();
    const mib64 = 64 << 20;
    browser.served.set(url, { bytes: new Uint8Array(mib64 + 1000), etag: '"v1"' });
    const files = cachedModelFiles('http://x/m');
    const saved = () => {
      const meta = [...browser.disk].find(([name]) => name.endsWith('.json'))?.[1];
      return (JSON.parse(new TextDecoder().decode(meta)) as { ranges: number[][] }).ranges;
    };
    await files.readRange(path, 0, 1000);
    expect(saved()).toEqual([]); // as the file was opened
    await files.readRange(path, 1000, mib64 - 10);
    expect(saved()).toEqual([]); // 10 bytes short of 64 MiB
    await files.readRange(path, mib64 - 10, mib64);
    expect(saved()).toEqual([[0, mib64]]);
    await files.readRange(path, mib64, mib64 + 1000);
    expect(saved()).toEqual([[0, mib64]]); // the count starts again
    await files.close();
    expect(saved()).toEqual([[0, mib64 + 1000]]);
  });

  it('a write that fails (a full disk) still gives the bytes; the rest comes from the network, what was kept stays kept', async () => {
    const { browser, weights } = servingOneFile();
    const files = cachedModelFiles('http://x/m');
    await files.readRange(path, 0, 100);
    browser.state.failWrites = true;
    expect(await files.readRange(path, 100, 200)).toEqual(weights.slice(100, 200));
    expect(await files.readRange(path, 100, 200)).toEqual(weights.slice(100, 200));
    expect(await files.readRange(path, 0, 100)).toEqual(weights.slice(0, 100));
    expect(files.source()).toEqual({
      networkBytes: 300,
      cacheBytes: 100,
      note: 'not kept in this browser: a write to its storage failed, the rest came from the network',
    });
    await expect(files.close()).resolves.toBeUndefined(); // nothing more is written to a full disk
    expect(browser.open.size).toBe(0);
    browser.state.failWrites = false;
    const next = cachedModelFiles('http://x/m');
    await next.readRange(path, 0, 200);
    expect(next.source()).toMatchObject({ networkBytes: 200 }); // 0-100 was kept, but the range asked is 0-200
    await next.close();
    const last = cachedModelFiles('http://x/m');
    await last.readRange(path, 0, 200);
    expect(last.source()).toMatchObject({ networkBytes: 0, cacheBytes: 200 });
    await last.close();
  });

  it('after a failed write the file stays off the disk for the rest of the load, even where the disk has room again', async () => {
    const { browser, weights } = servingOneFile();
    const files = cachedModelFiles('http://x/m');
    await files.readRange(path, 0, 100);
    browser.state.failWrites = true;
    await files.readRange(path, 100, 200);
    browser.state.failWrites = false;
    // a range read twice after the failure comes from the network both times: nothing more was written
    expect(await files.readRange(path, 200, 300)).toEqual(weights.slice(200, 300));
    expect(await files.readRange(path, 200, 300)).toEqual(weights.slice(200, 300));
    expect(files.source()).toMatchObject({ networkBytes: 400, cacheBytes: 0 });
    await files.close();
  });

  it('a kept file whose list of ranges was cut short by a closed tab starts again', async () => {
    const { browser } = servingOneFile();
    const first = cachedModelFiles('http://x/m');
    await first.readRange(path, 0, 500);
    await first.close();
    const meta = [...browser.disk.keys()].find((name) => name.endsWith('.json')) ?? '';
    expect(JSON.parse(new TextDecoder().decode(browser.disk.get(meta)))).toEqual({
      url,
      size: 1000,
      validator: '"v1"',
      ranges: [[0, 500]],
    });
    browser.disk.set(meta, browser.disk.get(meta)?.slice(0, 20) ?? new Uint8Array());
    const second = cachedModelFiles('http://x/m');
    await second.readRange(path, 0, 500);
    expect(second.source()).toMatchObject({ networkBytes: 500, cacheBytes: 0 });
    await second.close();
    browser.disk.set(meta, new TextEncoder().encode(JSON.stringify({ url, size: 1000, validator: '"v1"' })));
    const third = cachedModelFiles('http://x/m');
    await third.readRange(path, 0, 500);
    expect(third.source()).toMatchObject({ networkBytes: 500, cacheBytes: 0 });
    await third.close();
  });

  it('two tabs load one folder in turn: the second waits for the first to close, then reads what it kept', async () => {
    const { browser, weights } = servingOneFile();
    const first = cachedModelFiles('http://x/m');
    await first.readRange(path, 0, 500);
    const second = cachedModelFiles('http://x/m');
    let read = false;
    const reading = second.readRange(path, 0, 500).then((bytes) => ((read = true), bytes));
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(read).toBe(false);
    await first.close();
    expect(await reading).toEqual(weights.slice(0, 500));
    expect(second.source()).toEqual({ networkBytes: 0, cacheBytes: 500, note: '' });
    // a read still on its way after close() takes no lock again and comes from the network
    await second.close();
    const asked = browser.locksAsked.length;
    expect(await second.readRange(path, 0, 10)).toEqual(weights.slice(0, 10));
    expect(second.source()).toEqual({ networkBytes: 10, cacheBytes: 500, note: '' });
    expect(browser.locksAsked.length).toBe(asked);
    expect(browser.open.size).toBe(0);
  });
});

describe("a worker process's weights kept in a folder on disk (worker/node/disk-weights.ts)", () => {
  const url = 'http://x/m/transformer/w.safetensors';
  const path = 'transformer/w.safetensors';
  const bytesOf = (n: number, salt = 0) => Uint8Array.from({ length: n }, (_, i) => (i * 7 + salt) & 255);
  let dir = '';
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'ditswarm-disk-weights-'));
    keepWeightsIn(diskWeights({ cacheDir: dir }));
  });
  afterEach(() => {
    keepWeightsIn(browserStorage);
    vi.unstubAllGlobals();
    rmSync(dir, { recursive: true, force: true });
  });

  it("are kept by the browser's rules: a second load reads them from the folder; a new ETag fetches them again; a lock file held while a load runs", async () => {
    const browser = fakeBrowser(); // its server alone: no browser storage is touched
    vi.stubGlobal('navigator', undefined);
    browser.served.set(url, { bytes: bytesOf(1000), etag: '"v1"' });
    const first = cachedModelFiles('http://x/m');
    expect(await first.readRange(path, 0, 600)).toEqual(bytesOf(600));
    expect(readdirSync(dir).filter((f) => f.endsWith('.lock'))).toHaveLength(1);
    await first.close();
    expect(first.source()).toEqual({ networkBytes: 600, cacheBytes: 0, note: '' });
    expect(readdirSync(dir).filter((f) => f.endsWith('.lock'))).toEqual([]);
    const data = readdirSync(dir).filter((f) => f.endsWith('.bin'));
    expect(data).toHaveLength(1);
    expect(new Uint8Array(readFileSync(join(dir, data[0])))).toEqual(bytesOf(600));

    const second = cachedModelFiles('http://x/m');
    expect(await second.readRange(path, 100, 500)).toEqual(bytesOf(1000).slice(100, 500));
    expect(await second.readRange(path, 500, 1000)).toEqual(bytesOf(1000).slice(500));
    expect(second.source()).toEqual({ networkBytes: 500, cacheBytes: 400, note: '' });
    await second.close();

    browser.served.set(url, { bytes: bytesOf(1000, 3), etag: '"v2"' });
    const third = cachedModelFiles('http://x/m');
    expect(await third.readRange(path, 0, 1000)).toEqual(bytesOf(1000, 3));
    expect(third.source()).toEqual({ networkBytes: 1000, cacheBytes: 0, note: '' });
    await third.close();
  });

  it('a lock file left by a process that died is taken over; one held by a live process waits for it', async () => {
    const browser = fakeBrowser();
    vi.stubGlobal('navigator', undefined);
    browser.served.set(url, { bytes: bytesOf(100), etag: '"v1"' });
    const folderKey = createHash('sha256').update('http://x/m').digest('hex').slice(0, 32);
    const lock = join(dir, `ditswarm-weights-${folderKey}.lock`);
    writeFileSync(lock, '2147483646'); // no such process
    const files = cachedModelFiles('http://x/m');
    expect(await files.readRange(path, 0, 100)).toEqual(bytesOf(100));
    await files.close();
    writeFileSync(lock, String(process.pid)); // this very process, as another loader of the folder would be
    const waiting = cachedModelFiles('http://x/m');
    let read = false;
    const reading = waiting.readRange(path, 0, 100).then(() => (read = true));
    await new Promise((r) => setTimeout(r, 700));
    expect(read).toBe(false);
    rmSync(lock);
    await reading;
    expect(waiting.source().cacheBytes).toBe(100);
    await waiting.close();
  });

  it('a lock left by a dead process is broken by one process at a time, and one made since by a live process kept', () => {
    const lock = join(dir, 'folder.lock');
    const takeover = `${lock}.takeover`;
    writeFileSync(lock, '2147483646'); // no such process
    writeFileSync(takeover, '2147483645'); // another process breaking it at this moment
    breakStaleLock(lock);
    expect(existsSync(lock)).toBe(true);
    // that process died within its takeover 6 s ago: the takeover is cleared, the lock broken at the next look
    const sixSecondsAgo = new Date(Date.now() - 6_000);
    utimesSync(takeover, sixSecondsAgo, sixSecondsAgo);
    breakStaleLock(lock);
    expect([existsSync(lock), existsSync(takeover)]).toEqual([true, false]);
    breakStaleLock(lock);
    expect([existsSync(lock), existsSync(takeover)]).toEqual([false, false]);
    // seen dead, then made by a live process before this one's takeover: kept
    writeFileSync(lock, String(process.pid));
    breakStaleLock(lock);
    expect(readFileSync(lock, 'utf8')).toBe(String(process.pid));
  });

  it('a file the disk has no room for is read from the network, saying where', async () => {
    const browser = fakeBrowser();
    vi.stubGlobal('navigator', undefined);
    const free = statfsSync(dir).bavail * statfsSync(dir).bsize;
    const huge = { bytes: bytesOf(10), etag: '"v1"', size: String(free * 2) };
    browser.served.set(url, huge);
    const files = cachedModelFiles('http://x/m');
    await files.readRange(path, 0, 10);
    expect(files.source().note).toMatch(
      new RegExp(`^not kept in ${dir}: ${path} needs .* more and ${dir} has .* free$`),
    );
    await files.close();
  });
});
