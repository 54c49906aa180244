import { afterEach, describe, expect, it, vi } from 'vitest';
import { checkLoadStatus, describeLoad, describeWeights } from '../../core/worker-api.ts';
import { passing } from '../../core/net/check.ts';
import {
  ByteRangeSet,
  OPEN_TIMEOUT_MS,
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
  });
});
