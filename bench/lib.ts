// What every benchmark shares: the bench-size model, the probe page, where reports go and what
// they record about the machine.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, totalmem } from 'node:os';
import { dirname, extname, join, normalize, relative } from 'node:path';
import type { BrowserContext, Page } from '@playwright/test';
import { build } from 'vite';
import type { JobOverrides } from '../app/automation.ts';
import { parseWanConfig, type WanConfig } from '../core/model/config.ts';
import { SeededRandom } from '../core/random.ts';
import { LOCAL_MODEL_PATH } from '../server/serve.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';

import { CACHE_ROOT } from '../server/model-folder.ts';

export const ROOT = join(import.meta.dirname, '..');
export const OUT_DIR = join(ROOT, 'bench/out');
/** made on demand by `make-model --preset bench` into this git-ignored folder, never committed */
export const BENCH_MODEL_DIR = join(OUT_DIR, 'models/bench-wan');
const PAGES_DIR = join(OUT_DIR, 'pages');
/**
 * What `npm run bench -- --smoke` runs the full-size benches on: the bundled tiny model, whose transformer has the
 * published folder's layout at a small width.
 */
export const SMOKE_MODEL_DIR = join(ROOT, 'public/models/tiny-wan');
/** Where the server serves the bench model: as a folder on its machine, with Range (the loader reads by tensor). */
export const BENCH_MODEL_PATH = '/models/bench-wan';

export const log = (line: string) => console.error(`[bench] ${line}`);

/**
 * Writes a model folder whole or not at all, unless `dir` holds `done` (a file written last): `write` fills a folder
 * beside it, renamed to `dir` once written, so a run cut short leaves nothing a later run would take as the model.
 */
export async function ensureFolder(
  dir: string,
  done: string,
  write: (into: string) => void | Promise<void>,
): Promise<void> {
  if (existsSync(join(dir, done))) return;
  const partial = `${dir}.partial`;
  rmSync(partial, { recursive: true, force: true });
  try {
    await write(partial);
    rmSync(dir, { recursive: true, force: true });
    renameSync(partial, dir);
  } finally {
    rmSync(partial, { recursive: true, force: true });
  }
}

/** make-model's `preset` and `flags` into `dir` unless it is there (ensureFolder), saying what it writes. */
export function ensurePreset(preset: string, dir: string, size: string, flags: string[] = []): Promise<void> {
  return ensureFolder(dir, 'transformer/config.json', (into) => {
    log(`writing ${dir} (make-model --preset ${[preset, ...flags].join(' ')}, ${size})…`);
    const made = spawnSync(
      process.execPath,
      ['--import', 'tsx', 'server/cli/make-model.ts', '--preset', preset, ...flags, '--out', into],
      { cwd: ROOT, stdio: 'inherit' },
    );
    if (made.status !== 0) throw new Error(`make-model --preset ${preset} failed with status ${made.status}`);
  });
}

/** Writes the full-size model (make-model --preset wan2.1-t2v-1.3b, 5.7 GB) into `dir` unless it is there. */
export const ensureFullSizeModel = (dir: string): Promise<void> => ensurePreset('wan2.1-t2v-1.3b', dir, '5.7 GB');

/** Where a bench keeps the 14B's width with `layers` of its blocks, stored as bfloat16 as it is published. */
export const wan14bModelDir = (layers: number): string =>
  join(CACHE_ROOT, `models/wan2.1-t2v-14b-${layers}-layers-bf16`);

/** The 14B's width with `layers` blocks in `dir`, written first where it is wan14bModelDir's and not there yet. */
export async function ensureWan14b(dir: string, layers: number): Promise<void> {
  if (dir !== wan14bModelDir(layers)) return;
  await ensurePreset('wan2.1-t2v-14b', dir, `${layers} blocks of 0.70 GB in bfloat16`, [
    '--layers',
    String(layers),
    '--dtype',
    'bf16',
  ]);
}

/** rows of a prompt embedding: WanPipeline pads every prompt to 512 */
export const TEXT_TOKENS = 512;

/**
 * Seeded random prompt embeddings [1, TEXT_TOKENS, text_dim] for the model folder `dir`, as a job takes them: what a
 * bench of the transformer alone gives in place of the text encoder.
 */
export function randomPromptEmbeds(dir: string): { shape: number[]; base64: string } {
  const { text_dim: textDim } = JSON.parse(readFileSync(join(dir, 'transformer/config.json'), 'utf8')) as {
    text_dim: number;
  };
  const embeds = new SeededRandom(3).normals(TEXT_TOKENS * textDim, 0.2);
  return { shape: [1, TEXT_TOKENS, textDim], base64: Buffer.from(embeds.buffer).toString('base64') };
}

/**
 * The spot-check rate of a bench that times forwards: none. At any other rate every forward of a job's last step is
 * checked (FINAL_STEPS_CHECKED), a whole forward recomputed on one rank inside that step, which would hide the split
 * being measured. bench/spot-check-overhead.ts measures what checks cost.
 */
export const NO_SPOT_CHECKS = 0;

/**
 * A job of the transformer alone, as the full-size benches run it: random prompt embeddings (randomPromptEmbeds) in,
 * the latent out, unguided, on WASM, on the model folder the server serves at LOCAL_MODEL_PATH. No spot checks
 * (NO_SPOT_CHECKS).
 */
export function transformerJob(
  { frames, height, width, steps }: Pick<JobOverrides, 'frames' | 'height' | 'width' | 'steps'>,
  promptEmbeds: JobOverrides['promptEmbeds'],
  placement: JobOverrides,
): JobOverrides {
  return {
    prompt: 'random prompt embeddings',
    promptEmbeds,
    outputType: 'latent',
    frames,
    height,
    width,
    steps,
    guidance: 1,
    seed: 42,
    backend: 'swarm',
    ep: 'wasm',
    model: LOCAL_MODEL_PATH,
    spotCheckRate: NO_SPOT_CHECKS,
    ...placement,
  };
}

/**
 * What a bench of a model folder's transformer alone starts from (full-size, pooled): the transformer's config,
 * random prompt embeddings (randomPromptEmbeds), and `workers` fresh tabs of a swarm serving the folder at
 * LOCAL_MODEL_PATH; with when and on what machine it started.
 */
export async function transformerSwarm(model: string, workers: number, browserArgs: string[] = []) {
  const config = JSON.parse(readFileSync(join(model, 'transformer/config.json'), 'utf8')) as {
    num_layers: number;
    num_attention_heads: number;
    attention_head_dim: number;
  };
  const promptEmbeds = randomPromptEmbeds(model);
  const started = Date.now();
  const swarm = await startLocalSwarm({ workers, modelFolders: { [LOCAL_MODEL_PATH]: model }, browserArgs, log });
  return { config, promptEmbeds, started, swarm, machineAtStart: machine(swarm.browserVersion) };
}

/** A section's option: the model folder it runs on (benchModel), bench-wan where not given. */
export interface OnModel {
  model?: string;
}

/** The model a section runs on: its folder as reports name it, its transformer config, how the server serves it. */
export interface BenchModel {
  /** the folder, relative to the repository */
  path: string;
  config: WanConfig;
  /** the server's `modelFolders`: the folder at BENCH_MODEL_PATH */
  modelFolders: Record<string, string>;
}

/**
 * A section's model, served at BENCH_MODEL_PATH: bench-wan, written first if it is not there yet, or another folder
 * of the same layout (smoke runs take the bundled tiny model: the same code paths, in a fraction of the time).
 */
export async function benchModel(dir = BENCH_MODEL_DIR): Promise<BenchModel> {
  if (dir === BENCH_MODEL_DIR) await ensurePreset('bench', BENCH_MODEL_DIR, 'the bench model');
  const configPath = join(dir, 'transformer/config.json');
  return {
    path: relative(ROOT, dir),
    config: parseWanConfig(JSON.parse(readFileSync(configPath, 'utf8')), configPath),
    modelFolders: { [BENCH_MODEL_PATH]: dir },
  };
}

let benchPages: Promise<unknown> | null = null;

/** Builds bench/pages (probe page) with Vite into bench/out/pages, served under /bench/: once a run. */
export async function buildBenchPages(): Promise<void> {
  await (benchPages ??= build({
    configFile: false,
    root: join(ROOT, 'bench/pages'),
    base: '/bench/',
    logLevel: 'warn',
    build: { outDir: PAGES_DIR, emptyOutDir: true, target: 'es2022' },
    worker: { format: 'es' },
  }));
}

const CONTENT_TYPES: Record<string, string> = {
  '.html': 'text/html',
  '.js': 'text/javascript',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
};

async function serveFrom(context: BrowserContext, pattern: string, prefix: string, dir: string): Promise<void> {
  await context.route(pattern, async (route) => {
    const path = decodeURIComponent(new URL(route.request().url()).pathname).slice(prefix.length) || '/index.html';
    const file = normalize(join(dir, path));
    if (relative(dir, file).startsWith('..') || !existsSync(file))
      return route.fulfill({ status: 404, body: `not found: ${path}` });
    await route.fulfill({
      status: 200,
      path: file,
      headers: {
        'Content-Type': CONTENT_TYPES[extname(file)] ?? 'application/octet-stream',
        'Cross-Origin-Opener-Policy': 'same-origin',
        'Cross-Origin-Embedder-Policy': 'require-corp',
        'Cross-Origin-Resource-Policy': 'same-origin',
      },
    });
  });
}

/** Every page of the context gets the probe page under /bench/. */
export async function serveBenchPages(context: BrowserContext): Promise<void> {
  await serveFrom(context, '**/bench/**', '/bench', PAGES_DIR);
}

/** A probe page of the bench (window.bench), same origin as the app. */
export async function openProbePage(context: BrowserContext, origin: string): Promise<Page> {
  const page = await context.newPage();
  await page.goto(`${origin}/bench/index.html`);
  await page.waitForFunction(() => 'bench' in window, null, { timeout: 30_000 });
  return page;
}

export function machine(chromiumVersion?: string) {
  return {
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model ?? 'unknown',
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    node: process.version,
    chromium: chromiumVersion ?? null,
    platform: `${process.platform} ${process.arch}`,
    /** other processes compete for the same cores: a loaded machine measures slower */
    loadAverage1m: Number(loadavg()[0].toFixed(2)),
  };
}

/** Declared and installed versions of the project's dependencies. */
export function versions(): Record<string, { declared: string; installed: string | null }> {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    dependencies?: Record<string, string>;
    devDependencies?: Record<string, string>;
  };
  const out: Record<string, { declared: string; installed: string | null }> = {};
  for (const [name, declared] of Object.entries({ ...pkg.dependencies, ...pkg.devDependencies })) {
    const manifest = join(ROOT, 'node_modules', name, 'package.json');
    out[name] = {
      declared,
      installed: existsSync(manifest)
        ? (JSON.parse(readFileSync(manifest, 'utf8')) as { version: string }).version
        : null,
    };
  }
  return out;
}

export function writeReport(name: string, report: unknown): string {
  const path = join(OUT_DIR, name);
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, typeof report === 'string' ? report : JSON.stringify(report, null, 2) + '\n');
  log(`wrote ${relative(ROOT, path)}`);
  return path;
}

/**
 * Waits (up to maxWaitS, env BENCH_QUIET_WAIT_S) until the 1-minute load average is below `below`:
 * other processes on the same cores make every figure meaningless. Returns the load it started with.
 */
export async function waitForQuietMachine(
  below = 1.5,
  maxWaitS = Number(process.env.BENCH_QUIET_WAIT_S ?? 120),
): Promise<{ loadAverage1m: number; waitedS: number }> {
  const start = Date.now();
  while (loadavg()[0] >= below && Date.now() - start < maxWaitS * 1000) await new Promise((r) => setTimeout(r, 5000));
  const waitedS = round((Date.now() - start) / 1000, 0);
  if (loadavg()[0] >= below)
    log(
      `the machine is busy (load ${loadavg()[0].toFixed(2)} after ${waitedS} s): ` +
        'measuring anyway, figures will be slower',
    );
  return { loadAverage1m: Number(loadavg()[0].toFixed(2)), waitedS };
}

export { median } from '../core/median.ts';

export const round = (x: number, digits = 3): number => Number(x.toFixed(digits));

export function maxAbs(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) throw new Error(`cannot compare latents of ${a.length} and ${b.length} values`);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

export const latentFromBase64 = (b64: string): Float32Array => {
  const bytes = Buffer.from(b64, 'base64');
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
};

/** True when this module is the script node was started with (each bench runs alone or from run.ts). */
export const isMain = (meta: ImportMeta): boolean => {
  const script = process.argv.at(1);
  return script !== undefined && normalize(script) === meta.filename;
};

/** A process's parent pid; 0 where it is gone. */
function parentOf(pid: number): number {
  try {
    return Number(readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')[1]);
  } catch {
    return 0;
  }
}

/**
 * The pids of the renderer processes of browsers this process launched (Linux only: none elsewhere): other programs'
 * Chromium on a shared machine are not ours to measure.
 */
function ownRendererPids(): number[] {
  if (!existsSync('/proc/self/status')) return [];
  const ours = (pid: number) => {
    for (let p = parentOf(pid); p > 1; p = parentOf(p)) if (p === process.pid) return true;
    return false;
  };
  return readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p))
    .filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('--type=renderer');
      } catch {
        return false; // the process ended while being read
      }
    })
    .map(Number)
    .filter(ours);
}

/** what rendererOf has a page hold for a moment: far more than any other page's memory moves meanwhile */
const MARKER_BYTES = 256 << 20;

/**
 * The renderer process of `page` (Playwright does not say which process renders a page): of this process's browsers'
 * renderers, the one whose resident memory grows by most of MARKER_BYTES while the page holds that many bytes, which
 * it then lets go (collected at once where the browser exposes gc: `--js-flags=--expose-gc`); null off Linux or where
 * no process grew so.
 */
export async function rendererOf(page: Page): Promise<number | null> {
  const pids = ownRendererPids();
  const rss = () => pids.map((pid) => residentMemory(pid).now);
  const before = rss();
  await page.evaluate((bytes) => {
    (globalThis as { marker?: Uint8Array }).marker = new Uint8Array(bytes).fill(1);
  }, MARKER_BYTES);
  const grew = rss().map((now, i) => now - before[i]);
  await page.evaluate(() => {
    delete (globalThis as { marker?: Uint8Array }).marker;
    (globalThis as { gc?: () => void }).gc?.();
  });
  const most = Math.max(...grew);
  return most > 0.75 * MARKER_BYTES ? (pids[grew.indexOf(most)] ?? null) : null;
}

/** A process's resident memory now and at its peak since its last resetPeak, in bytes (VmRSS, VmHWM). */
export function residentMemory(pid: number): { now: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)?.[1] ?? NaN) * 1024;
  return { now: kb('VmRSS'), peak: kb('VmHWM') };
}

/** Starts a process's peak resident memory (VmHWM) again from what it holds now (Linux's clear_refs 5). */
export function resetPeak(pid: number): void {
  writeFileSync(`/proc/${pid}/clear_refs`, '5');
}

/** Peak resident memory (VmHWM) of each Chromium renderer process now, in bytes, largest first: Linux only. */
export function rendererPeaks(): number[] {
  if (!existsSync('/proc/self/status')) return [];
  const peaks: number[] = [];
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      if (!readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('--type=renderer')) continue;
      const kb = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
      if (kb) peaks.push(Number(kb) * 1024);
    } catch {
      // the process ended while being read
    }
  }
  return peaks.sort((a, b) => b - a);
}
