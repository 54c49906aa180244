import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { browserStorage, cachedModelFiles, keepWeightsIn } from '../../rank/weight-cache.ts';
import { KeptDigests, reprDigest } from '../../server/file-digest.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';
import { diskWeights } from '../../worker/node/disk-weights.ts';

// A worker process given a model folder it already has (--model-dir) reads each file of it whose size and SHA-256 are
// the server's (the server's Repr-Digest), and downloads the rest, saying why it did not take its own copy.
let server: RunningServer;
let scratch: string;
const bytesOf = (n: number, salt = 0) => Uint8Array.from({ length: n }, (_, i) => (i * 7 + salt) & 255);
const served = { same: bytesOf(1000), tuned: bytesOf(1000), longer: bytesOf(1000), elsewhere: bytesOf(1000) };

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), 'ditswarm-model-dir-'));
  for (const side of ['server', 'local']) mkdirSync(join(scratch, side, 'transformer'), { recursive: true });
  for (const [name, bytes] of Object.entries(served)) writeFileSync(join(scratch, 'server/transformer', name), bytes);
  writeFileSync(join(scratch, 'local/transformer/same'), served.same);
  writeFileSync(join(scratch, 'local/transformer/tuned'), bytesOf(1000, 1)); // a fine-tune: the same size
  writeFileSync(join(scratch, 'local/transformer/longer'), bytesOf(1001));
  server = await startServer({ port: 0, quiet: true, modelFolders: { '/models/m': join(scratch, 'server') } });
});
afterAll(async () => {
  await server.close();
  rmSync(scratch, { recursive: true, force: true });
});
afterEach(() => keepWeightsIn(browserStorage));

describe("a worker process's own copy of a model folder (--model-dir)", () => {
  it("is read where a file's size and SHA-256 are the server's; the rest comes from the server, saying why", async () => {
    keepWeightsIn(diskWeights({ cacheDir: null, modelDir: join(scratch, 'local') }));
    const read = async (name: keyof typeof served) => {
      const files = cachedModelFiles(`${server.url}/models/m`);
      const bytes = await files.readRange(`transformer/${name}`, 100, 600);
      await files.close();
      expect(bytes, name).toEqual(served[name].slice(100, 600));
      return files.source();
    };
    expect(await read('same')).toEqual({ networkBytes: 0, cacheBytes: 500, note: '' });
    const local = join(scratch, 'local/transformer');
    expect(await read('tuned')).toEqual({
      networkBytes: 500,
      cacheBytes: 0,
      note:
        `${join(local, 'tuned')} not used: its SHA-256 is not the server's; ` +
        "not kept on this machine: this worker was started with --cache '', which keeps nothing",
    });
    expect((await read('longer')).note).toMatch(/longer not used: it has 1001 bytes and the server's 1000;/);
    // not in its folder: downloaded, as by any worker, and nothing to say of its folder
    expect((await read('elsewhere')).note).not.toMatch(/not used/);
  });

  it('is not read where the server gives no SHA-256 of its file', async () => {
    const origin = server.url;
    keepWeightsIn(diskWeights({ cacheDir: null, modelDir: join(scratch, 'local') }));
    const realFetch = globalThis.fetch;
    // a server that ignores Want-Repr-Digest (an older ditswarm, a plain file server)
    globalThis.fetch = (input, init) => {
      const headers = new Headers(init?.headers);
      headers.delete('Want-Repr-Digest');
      return realFetch(input, { ...init, headers });
    };
    try {
      const files = cachedModelFiles(`${origin}/models/m`);
      expect(await files.readRange('transformer/same', 0, 10)).toEqual(served.same.slice(0, 10));
      await files.close();
      expect(files.source()).toMatchObject({ networkBytes: 10, cacheBytes: 0 });
      expect(files.source().note).toMatch(/same not used: the server gave no SHA-256 of its file to check it by/);
    } finally {
      globalThis.fetch = realFetch;
    }
  });

  it("keeps its files' SHA-256 in the cache folder for the next start, each while its file's size and time hold", async () => {
    const cacheDir = join(scratch, 'cache');
    keepWeightsIn(diskWeights({ cacheDir, modelDir: join(scratch, 'local') }));
    const files = cachedModelFiles(`${server.url}/models/m`);
    expect(await files.readRange('transformer/same', 0, 10)).toEqual(served.same.slice(0, 10));
    await files.close();
    expect(files.source()).toMatchObject({ networkBytes: 0, cacheBytes: 10 });

    // the next start reads them back: the same file's digest without hashing it
    const keptFile = join(cacheDir, 'model-dir-digests.json');
    const same = join(scratch, 'local/transformer/same');
    const { size, mtimeMs } = statSync(same);
    const digest = createHash('sha256').update(served.same).digest('base64');
    expect(new KeptDigests(keptFile).get(same, size, mtimeMs)).toBe(`sha-256=:${digest}:`);
    // a file changed since (another time, another size) is hashed again
    expect(new KeptDigests(keptFile).get(same, size, mtimeMs + 1)).toBeUndefined();
    expect(new KeptDigests(keptFile).get(same, size + 1, mtimeMs)).toBeUndefined();
    // a digest kept is taken as the file's: a first hash lasts while size and time say it is the same file
    const twin = join(scratch, 'twin');
    writeFileSync(twin, served.same);
    const kept = new KeptDigests(join(scratch, 'twin-digests.json'));
    const twinStat = statSync(twin);
    kept.set(twin, twinStat.size, twinStat.mtimeMs, 'sha-256=:kept:');
    expect(await reprDigest(twin, kept)).toBe('sha-256=:kept:');
    // a kept file broken by a crash is none: the files are hashed again
    writeFileSync(keptFile, '{"truncated');
    expect(new KeptDigests(keptFile).get(same, size, mtimeMs)).toBeUndefined();
  });
});
