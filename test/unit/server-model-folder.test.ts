import { createHash } from 'node:crypto';
import http from 'node:http';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { WebSocket } from 'ws';
import { defined } from '../../core/defined.ts';
import { openCheckpoint } from '../../core/model/checkpoint.ts';
import { fetchModelFiles, type FolderListing } from '../../core/model/files.ts';
import { TRANSFORMER_WEIGHTS_NAME } from '../../core/model/transformer.ts';
import { loadWanPipelineParts, SCHEDULER_CONFIG } from '../../core/model/wan-pipeline.ts';
import { VAE_CONFIG } from '../../core/model/wan-vae.ts';
import { MODEL_FILE_CSP } from '../../server/model-route.ts';
import { PUBLIC_DIR } from '../../server/app-build.ts';
import {
  LOCAL_MODEL_PATH,
  localModelDir,
  LORA_PATH,
  servedLoras,
  servedModel,
  startServer,
  type RunningServer,
} from '../../server/serve.ts';

// What a served model folder can do on the dashboard's origin (issue 33, finding 7): its files come
// as bytes, never as pages that run there, and nothing outside the folder comes through a symlink.
let server: RunningServer;
let scratch: string;

beforeAll(async () => {
  scratch = mkdtempSync(join(tmpdir(), 'ditswarm-served-'));
  const folder = join(scratch, 'model');
  mkdirSync(join(folder, 'vae'), { recursive: true });
  writeFileSync(join(folder, 'readme.html'), '<script>fetch("/steal?" + localStorage.length)</script>');
  writeFileSync(join(folder, 'vae/config.json'), '{"z_dim": 16}');
  writeFileSync(join(folder, '.env'), 'TOKEN=not for pages');
  writeFileSync(join(scratch, 'secret.txt'), 'not the model');
  symlinkSync(join(scratch, 'secret.txt'), join(folder, 'leak.txt'));
  symlinkSync(scratch, join(folder, 'up'));
  symlinkSync(join(folder, 'vae/config.json'), join(folder, 'config-link.json'));
  server = await startServer({ port: 0, quiet: true, modelFolders: { '/models/t': folder } });
});
afterAll(async () => {
  await server.close();
  rmSync(scratch, { recursive: true, force: true });
});

const get = (path: string, headers: Record<string, string> = {}) =>
  fetch(new URL(path, server.url), { headers }).then(async (r) => ({
    status: r.status,
    headers: r.headers,
    body: await r.text(),
  }));

describe("a served model folder's files", () => {
  it('come as application/octet-stream with nosniff and a CSP that runs nothing, an .html file too', async () => {
    for (const path of ['/models/t/readme.html', '/models/t/vae/config.json']) {
      const { status, headers } = await get(path);
      expect(status).toBe(200);
      expect(headers.get('content-type')).toBe('application/octet-stream');
      expect(headers.get('x-content-type-options')).toBe('nosniff');
      expect(headers.get('content-security-policy')).toBe(MODEL_FILE_CSP);
    }
    expect(MODEL_FILE_CSP).toMatch(/default-src 'none'/);
    expect(MODEL_FILE_CSP).toMatch(/sandbox/);
  });

  it('still serve byte ranges (the loaders read shards tensor by tensor)', async () => {
    const { status, body } = await get('/models/t/vae/config.json', { Range: 'bytes=1-6' });
    expect(status).toBe(206);
    expect(body).toBe('"z_dim');
  });

  it('are refused (403) through a symlink that leads out of the folder; one that stays inside serves', async () => {
    expect((await get('/models/t/leak.txt')).status).toBe(403);
    expect((await get('/models/t/up/secret.txt')).status).toBe(403);
    const inside = await get('/models/t/config-link.json');
    expect([inside.status, inside.body]).toEqual([200, '{"z_dim": 16}']);
    expect((await get('/models/t/missing.json')).status).toBe(404);
  });

  it("give their SHA-256 to a request that asks (Want-Repr-Digest: a worker process's --model-dir), range or not", async () => {
    const sha256 = `sha-256=:${createHash('sha256').update('{"z_dim": 16}').digest('base64')}:`;
    for (const want of ['sha-256=10', 'sha-512=3, sha-256=1', 'SHA-256=5'])
      expect((await get('/models/t/vae/config.json', { 'Want-Repr-Digest': want })).headers.get('repr-digest')).toBe(
        sha256,
      );
    const ranged = await get('/models/t/vae/config.json', { 'Want-Repr-Digest': 'sha-256=10', Range: 'bytes=1-6' });
    expect([ranged.status, ranged.body, ranged.headers.get('repr-digest')]).toEqual([206, '"z_dim', sha256]);
    // not asked, or asked for nothing it has (0: not wanted): no hashing
    for (const want of [null, 'sha-256=0', 'sha-512=10', 'sha-2560=1'])
      expect(
        (await get('/models/t/vae/config.json', want ? { 'Want-Repr-Digest': want } : {})).headers.has('repr-digest'),
      ).toBe(false);
    // the folder's rules first: nothing outside it is hashed
    const leak = await get('/models/t/leak.txt', { 'Want-Repr-Digest': 'sha-256=10' });
    expect([leak.status, leak.headers.has('repr-digest')]).toEqual([403, false]);
    expect((await get('/models/t/missing.json', { 'Want-Repr-Digest': 'sha-256=10' })).status).toBe(404);
    // the bundled models too
    const bundled = await get('/models/tiny-wan/model_index.json', { 'Want-Repr-Digest': 'sha-256=10' });
    expect(bundled.headers.get('repr-digest')).toBe(
      `sha-256=:${createHash('sha256').update(bundled.body).digest('base64')}:`,
    );
  });
});

describe("a model folder's listing (GET <folder>/), which pages read before any optional file", () => {
  const listing = async (path: string) => {
    const { status, headers, body } = await get(path);
    return { status, headers, files: status === 200 ? (JSON.parse(body) as FolderListing).files : null };
  };

  it('names every file the folder serves with its size, at any depth: a symlink that stays inside, no dotfile, nothing outside', async () => {
    const { status, headers, files } = await listing('/models/t/');
    expect(status).toBe(200);
    expect(headers.get('content-type')).toMatch(/^application\/json/);
    expect(headers.get('x-content-type-options')).toBe('nosniff');
    expect(headers.get('content-security-policy')).toBe(MODEL_FILE_CSP);
    expect(files).toEqual([
      { path: 'config-link.json', size: 13 },
      { path: 'readme.html', size: 55 },
      { path: 'vae/config.json', size: 13 },
    ]);
    expect((await listing('/models/t/vae/')).files).toEqual([{ path: 'config.json', size: 13 }]);
    // what the folder does not serve it does not list
    expect((await listing('/models/t/up/')).status).toBe(403);
    expect((await listing('/models/t/missing/')).status).toBe(404);
    expect((await listing('/models/t/vae/config.json/')).status).toBe(404);
  });

  it("lists the bundled models too: the demo's files, and no scheduler/ or checkpoint index it lacks", async () => {
    const dir = join(PUBLIC_DIR, 'models/tiny-wan-demo');
    const onDisk = readdirSync(dir, { recursive: true, encoding: 'utf8' })
      .filter((path) => statSync(join(dir, path)).isFile())
      .map((path) => ({ path, size: statSync(join(dir, path)).size }))
      .sort((a, b) => (a.path < b.path ? -1 : 1));
    const { status, files } = await listing('/models/tiny-wan-demo/');
    expect(status).toBe(200);
    expect(files).toEqual(onDisk);
    expect(files?.map((f) => f.path)).toContain('transformer/diffusion_pytorch_model.safetensors');
    expect(files?.map((f) => f.path)).not.toContain(SCHEDULER_CONFIG);
  });
});

describe('a page reading a model folder of its own server (fetchModelFiles)', () => {
  afterEach(() => vi.unstubAllGlobals());
  /** fetch, recording each request and its status */
  const recording = () => {
    const seen: string[] = [];
    const real = globalThis.fetch;
    vi.stubGlobal('fetch', async (url: string, init?: RequestInit) => {
      const response = await real(url, init);
      seen.push(`${new URL(url).pathname} ${response.status}`);
      return response;
    });
    return seen;
  };
  const openDemo = async () => {
    const files = fetchModelFiles(new URL('/models/tiny-wan-demo/', server.url).href);
    const parts = await loadWanPipelineParts(files);
    const checkpoint = await openCheckpoint(files, 'transformer', TRANSFORMER_WEIGHTS_NAME);
    return { solver: parts.solver.kind, flowShift: parts.flowShift, source: checkpoint.source };
  };

  it('asks for no file the listing lacks: the demo opens without a single 404', async () => {
    vi.stubGlobal('location', { origin: new URL(server.url).origin });
    const seen = recording();
    const opened = await openDemo();
    expect(seen.filter((r) => !/ 20[06]$/.test(r))).toEqual([]);
    expect(seen[0]).toBe('/models/tiny-wan-demo/ 200'); // the listing, once, before any file
    expect(seen.filter((r) => r.endsWith('/ 200'))).toHaveLength(1);
    expect(opened.source).toBe('transformer/diffusion_pytorch_model.safetensors');
  });

  it('asks for each optional file of a folder on another host (no listing there), and finds the same', async () => {
    vi.stubGlobal('location', { origin: 'http://dashboard.example' });
    const seen = recording();
    const probed = await openDemo();
    expect(seen).toContain(`/models/tiny-wan-demo/${SCHEDULER_CONFIG} 404`);
    expect(seen).toContain(`/models/tiny-wan-demo/transformer/${TRANSFORMER_WEIGHTS_NAME}.safetensors.index.json 404`);
    expect(seen.filter((r) => r.endsWith('/ 200'))).toEqual([]);
    vi.stubGlobal('location', { origin: new URL(server.url).origin });
    expect(await openDemo()).toEqual(probed);
  });
});

describe("the server's Origin check", () => {
  const upgrade = (origin: string) =>
    new Promise<number | 'open'>((resolve) => {
      const ws = new WebSocket(`${server.url.replace('http', 'ws')}/relay`, { headers: { Origin: origin } });
      ws.once('open', () => {
        ws.close();
        resolve('open');
      });
      ws.once('unexpected-response', (_req, res) => resolve(defined(res.statusCode, 'the status of a response')));
      ws.once('error', () => {});
    });
  const corsFor = (origin: string) =>
    new Promise<string | undefined>((resolve, reject) => {
      http
        .get({ host: '127.0.0.1', port: server.port, path: '/peerjs/x/id', headers: { Origin: origin } }, (res) => {
          res.resume();
          resolve(res.headers['access-control-allow-origin']);
        })
        .on('error', reject);
    });

  it('compares the port: a page another server of this machine serves (another port) is not one of its own', async () => {
    const otherPort = server.port === 1 ? 2 : server.port - 1;
    expect(await upgrade(`http://localhost:${otherPort}`)).toBe(403);
    expect(await upgrade('http://localhost')).toBe(403);
    expect(await upgrade(`http://localhost:${server.port}`)).not.toBe(403);
    expect(await upgrade(`http://127.0.0.1:${server.port}`)).not.toBe(403);
    expect(await corsFor(`http://localhost:${otherPort}`)).toBeUndefined();
    expect(await corsFor(`http://localhost:${server.port}`)).toBe(`http://localhost:${server.port}`);
  });
});

describe('--model PATH|URL (servedModel), refused before the server starts where it names no model', () => {
  it('serves a model folder, passes a URL or a bundled model as given, and says what to give for anything else', () => {
    const model = join(scratch, 'published');
    mkdirSync(join(model, 'transformer'), { recursive: true });
    writeFileSync(join(model, 'transformer/config.json'), '{}');
    expect(servedModel(model)).toEqual({ modelFolders: { [LOCAL_MODEL_PATH]: model }, defaultModel: LOCAL_MODEL_PATH });
    expect(servedModel('https://example.org/Wan2.1-T2V-1.3B-Diffusers')).toEqual({
      defaultModel: 'https://example.org/Wan2.1-T2V-1.3B-Diffusers',
    });
    expect(servedModel('/models/tiny-wan')).toEqual({ defaultModel: '/models/tiny-wan' });
    expect(servedModel(undefined)).toEqual({});
    expect(() => servedModel('/no/such/folder')).toThrow(
      /^--model \/no\/such\/folder: no such folder on this machine, and no http\(s\) URL: give the model folder/,
    );
    expect(() => servedModel(join(scratch, 'secret.txt'))).toThrow(/secret\.txt is a file: give the model folder/);
    expect(() => servedModel(join(scratch, 'model'))).toThrow(
      /is no model folder: it has no transformer\/config\.json/,
    );
  });

  it("finds on this machine the folder of the model pages run unless told another (the API's default size)", () => {
    const model = join(scratch, 'published');
    expect(localModelDir(servedModel(model))).toBe(model);
    expect(localModelDir(servedModel('/models/tiny-wan'))).toBe(join(PUBLIC_DIR, 'models/tiny-wan'));
    expect(localModelDir(servedModel(undefined))).toBe(join(PUBLIC_DIR, 'models/tiny-wan-demo'));
    expect(localModelDir(servedModel('https://example.org/Wan2.1-T2V-1.3B-Diffusers'))).toBeNull();
  });

  it('a command that runs one part asks the folder for that part alone: npm run decode serves a folder holding only vae/', () => {
    const vaeOnly = join(scratch, 'vae-only');
    mkdirSync(join(vaeOnly, 'vae'), { recursive: true });
    writeFileSync(join(vaeOnly, VAE_CONFIG), '{}');
    expect(servedModel(vaeOnly, VAE_CONFIG)).toEqual({
      modelFolders: { [LOCAL_MODEL_PATH]: vaeOnly },
      defaultModel: LOCAL_MODEL_PATH,
    });
    expect(() => servedModel(vaeOnly)).toThrow(
      /no transformer\/config\.json; give the model folder \(the one holding model_index\.json and transformer\//,
    );
    const transformerOnly = join(scratch, 'published');
    expect(() => servedModel(transformerOnly, VAE_CONFIG)).toThrow(
      /it has no vae\/config\.json; give the model folder \(the one holding model_index\.json and vae\//,
    );
  });
});

describe('--lora FILE[:STRENGTH] (servedLoras): each file served alone, and every job starts with it', () => {
  it('serves the file as bytes with ranges, nothing beside it, lists it in /models.json, and refuses what is no file', async () => {
    const folder = join(scratch, 'loras');
    mkdirSync(folder, { recursive: true });
    writeFileSync(join(folder, 'style.safetensors'), 'lora bytes');
    writeFileSync(join(folder, 'private.txt'), 'not an adapter');
    const served = servedLoras([`${join(folder, 'style.safetensors')}:0.8`]);
    expect(served).toEqual({
      loraFiles: { [`${LORA_PATH}/0/style.safetensors`]: join(folder, 'style.safetensors') },
      defaultLoras: [{ url: `${LORA_PATH}/0/style.safetensors`, strength: 0.8 }],
    });
    expect(() => servedLoras([join(folder, 'missing.safetensors')])).toThrow(
      /missing\.safetensors is no file on this machine; give a LoRA's \.safetensors file/,
    );
    expect(() => servedLoras([folder])).toThrow(/is no file on this machine/);
    expect(servedLoras([])).toEqual({});
    // an adapter at a URL is not served: the workers fetch it from there (/models.json names it, so they may)
    expect(servedLoras(['https://hf.example/distill.safetensors:1.5'])).toEqual({
      loraFiles: {},
      defaultLoras: [{ url: 'https://hf.example/distill.safetensors', strength: 1.5 }],
    });
    const lora = await startServer({ port: 0, quiet: true, ...served });
    try {
      const at = (path: string, headers: Record<string, string> = {}) => fetch(new URL(path, lora.url), { headers });
      const whole = await at(`${LORA_PATH}/0/style.safetensors`);
      expect([whole.status, await whole.text()]).toEqual([200, 'lora bytes']);
      expect(whole.headers.get('content-type')).toBe('application/octet-stream');
      expect(whole.headers.get('content-security-policy')).toBe(MODEL_FILE_CSP);
      const range = await at(`${LORA_PATH}/0/style.safetensors`, { Range: 'bytes=5-9' });
      expect([range.status, await range.text()]).toEqual([206, 'bytes']);
      expect((await at(`${LORA_PATH}/0/private.txt`)).status).toBe(404);
      expect(await (await at('/models.json')).json()).toEqual({ default: null, loras: served.defaultLoras });
    } finally {
      await lora.close();
    }
  });
});
