// coordinator/video.ts in headless Chromium (Debian's, or $CHROMIUM): frames in, a WebM that
// <video> plays (finite duration, right size) and that holds every frame.
// Self-contained: bundles the module with Vite's JS API and serves it from a
// throwaway localhost server (WebCodecs needs a secure context), so it does
// not depend on the app server.

import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { extname, join, resolve } from 'node:path';
import { chromium, expect, test, type Browser, type Page } from '@playwright/test';
import { build } from 'vite';
import type * as VideoModule from '../../coordinator/video.ts';
import { chromiumExecutable } from '../../server/chromium.ts';

const root = resolve(import.meta.dirname, '../..');
let dir = '';
// unset where beforeAll failed before making them
let server: Server | undefined;
let browser: Browser | undefined;
let page: Page;

declare global {
  interface Window {
    video: typeof VideoModule;
  }
}

const page_html = `<!doctype html><meta charset="utf-8"><title>video</title>
<script type="module">import * as video from './video.js'; window.video = video; document.title = 'ready';</script>`;

test.beforeAll(async () => {
  test.setTimeout(180_000);
  dir = await mkdtemp(join(tmpdir(), 'ditswarm-video-'));
  await build({
    configFile: false, // the app's config builds the pages; here only the module is wanted
    logLevel: 'warn',
    root,
    build: {
      lib: { entry: join(root, 'coordinator/video.ts'), formats: ['es'], fileName: () => 'video.js' },
      outDir: dir,
      emptyOutDir: false,
      minify: false,
      target: 'es2022',
    },
  });
  await writeFile(join(dir, 'index.html'), page_html);

  const types: Record<string, string> = { '.html': 'text/html', '.js': 'text/javascript' };
  const serve = async (req: IncomingMessage, res: ServerResponse) => {
    const name = new URL(req.url ?? '/', 'http://x').pathname.slice(1) || 'index.html';
    try {
      const body = await readFile(join(dir, name.replaceAll('..', '')));
      res.writeHead(200, { 'content-type': types[extname(name)] ?? 'application/octet-stream' });
      res.end(body);
    } catch {
      res.writeHead(404).end();
    }
  };
  server = createServer((req, res) => void serve(req, res));
  const listening = server;
  await new Promise<void>((ok) => listening.listen(0, '127.0.0.1', ok));
  const { port } = listening.address() as AddressInfo;

  // the executable every ditswarm browser uses; only the flags this page needs (no WebGPU: the
  // software adapter's flags change how <video> decodes an odd-sized frame)
  browser = await chromium.launch({
    executablePath: chromiumExecutable(),
    args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update'],
  });
  page = await browser.newPage();
  // 127.0.0.1 is a secure context, which VideoEncoder requires.
  await page.goto(`http://127.0.0.1:${port}/`);
  await expect(page).toHaveTitle('ready');
});

test.afterAll(async () => {
  await browser?.close();
  await new Promise((ok) => (server ? server.close(ok) : ok(undefined)));
  if (dir) await rm(dir, { recursive: true, force: true });
});

for (const { codec, width, height } of [
  { codec: 'vp8', width: 64, height: 64 },
  { codec: 'vp9', width: 80, height: 48 },
  { codec: 'vp8', width: 63, height: 47 },
] as const) {
  test(`${codec}: 9 frames of ${width}×${height} become a WebM that <video> plays for 9/16 s at that size and seeks to the right frame`, async () => {
    const result = await page.evaluate(
      async ({ codec, width, height }) => {
        // Moving colour gradient, [3, T, H, W]: red rises along x, green along y, blue with time.
        const count = 9;
        const rgb = new Float32Array(3 * count * height * width);
        const plane = height * width;
        for (let t = 0; t < count; t++) {
          for (let y = 0; y < height; y++) {
            for (let x = 0; x < width; x++) {
              const i = t * plane + y * width + x;
              rgb[i] = ((x + 4 * t) % width) / (width - 1);
              rgb[count * plane + i] = y / (height - 1);
              rgb[2 * count * plane + i] = t / (count - 1);
            }
          }
        }
        const progress: number[] = [];
        const blob = await window.video.encodeWebM(
          { count, height, width, rgb },
          { codec, onProgress: (done, total) => progress.push(done / total) },
        );
        const probe = await window.video.probeWebM(blob);

        const el = document.createElement('video');
        el.muted = true;
        el.src = URL.createObjectURL(blob);
        await new Promise((ok, fail) => {
          el.onloadedmetadata = ok;
          el.onerror = () => fail(new Error(`video error ${el.error?.code}: ${el.error?.message}`));
        });
        // Seek into frame 4 and read it back. (Drawing right at loadeddata gives a
        // transparent canvas in headless Chromium: no frame has been presented yet.)
        const t = 4;
        el.currentTime = (t + 0.5) / 16;
        await new Promise((ok) => (el.onseeked = ok));
        const canvas = document.createElement('canvas');
        canvas.width = width;
        canvas.height = height;
        const ctx = canvas.getContext('2d');
        if (!ctx) throw new Error('the canvas has no 2D context');
        const cx = width / 2;
        const cy = height / 2;
        const expected = [
          (((cx + 4 * t) % width) / (width - 1)) * 255,
          (cy / (height - 1)) * 255,
          (t / (count - 1)) * 255,
        ];
        // 'seeked' can come before the frame is presented on a busy machine: read it until it shows
        // (up to 3 s); a video that never shows frame 4 still fails below
        let centre: number[] = [];
        for (let tries = 0; tries < 30; tries++) {
          ctx.drawImage(el, 0, 0);
          centre = Array.from(ctx.getImageData(cx, cy, 1, 1).data.slice(0, 3));
          if (centre.every((v, c) => Math.abs(v - expected[c]) < 24)) break;
          await new Promise((r) => setTimeout(r, 100));
        }
        URL.revokeObjectURL(el.src);
        return {
          type: blob.type,
          bytes: blob.size,
          probe,
          progress,
          duration: el.duration,
          videoWidth: el.videoWidth,
          videoHeight: el.videoHeight,
          centre,
          expected,
        };
      },
      { codec, width, height },
    );

    expect(result.type).toBe('video/webm');
    expect(result.bytes).toBeGreaterThan(0);
    expect(result.progress).toHaveLength(9);
    expect(result.progress.at(-1)).toBe(1);
    expect(result.probe).toMatchObject({ codec, frameCount: 9, width, height });
    expect(result.probe.durationSeconds).toBeCloseTo(9 / 16, 2);
    // A WebM without Segment Duration/Cues reports Infinity here: this is the check that it has them.
    expect(Number.isFinite(result.duration)).toBe(true);
    expect(result.duration).toBeCloseTo(9 / 16, 2);
    expect(result.videoWidth).toBe(width);
    expect(result.videoHeight).toBe(height);
    // Lossy codec + 4:2:0 chroma: within ~10% of full scale.
    for (let c = 0; c < 3; c++) expect(Math.abs(result.centre[c] - result.expected[c])).toBeLessThan(24);
  });
}

test('frames whose rgb length does not match [3, count, height, width] are rejected with the expected size', async () => {
  const message = await page.evaluate(async () => {
    try {
      await window.video.encodeWebM({ count: 2, height: 16, width: 16, rgb: new Float32Array(100) });
      return 'no error';
    } catch (err) {
      return (err as Error).message;
    }
  });
  expect(message).toContain('[3, 2, 16, 16] needs 1536');
});
