// Weights before the first job (issue 36): the published 1.3B folder's layout (make-model --preset
// wan2.1-t2v-1.3b, seeded random weights, written on demand outside the repository) served by this machine's server
// to worker tabs of a new browser profile, which preload it as they join; then the same tabs reloaded, which preload
// it from their browser's cache. Per tab: how long its load took, how fast its weights were read (from the server,
// or the cache) and how many bytes came from where; then how long the first job's placing took on the tabs that hold
// the model. Writes bench/out/load.json.
//
//   npm run bench -- load [--model DIR] [--workers 2]

import { parseArgs } from 'node:util';
import type { Page } from '@playwright/test';
import type { JobOverrides } from '../app/automation.ts';
import { FULL_SIZE_MODEL_DIR } from '../server/model-folder.ts';
import { LOCAL_MODEL_PATH } from '../server/serve.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import {
  ensureFullSizeModel,
  isMain,
  log,
  machine,
  randomPromptEmbeds,
  round,
  TEXT_TOKENS,
  versions,
  waitForQuietMachine,
  writeReport,
  SMOKE_MODEL_DIR,
} from './lib.ts';

/** the bound: a server on the same machine delivers the weights at this rate or faster, on a quiet machine */
const MIN_NETWORK_MB_S = 200;
/** the bound on the first job's placing phase once the weights are preloaded */
const MAX_PLACING_S = 10;
/** a preload of GBs on a busy machine: minutes */
const PRELOAD_WAIT_MS = 30 * 60_000;

export interface LoadOptions {
  model: string;
  workers: number;
}

/** `npm run bench -- --smoke`: the bundled model on one tab */
export const SMOKE_LOAD: LoadOptions = { model: SMOKE_MODEL_DIR, workers: 1 };

/** One tab's preload, as its page told it: how long, at what read rate, from where. */
interface TabLoad {
  loadS: number;
  /** the read rate the page showed last (its weights read, over the time reading them) */
  readMBs: number;
  networkGB: number;
  cacheGB: number;
}

const sum = (values: number[]) => values.reduce((a, b) => a + b, 0);

/** `1.23 GB` or `456.7 MB` as pages print them, in GB */
const gigabytes = (amount: string, unit: string) => Number(amount) / (unit === 'GB' ? 1 : 1000);

/** Waits until the tab's page says its preload finished, and reads what it said of it. */
async function preloaded(page: Page, after: number): Promise<TabLoad> {
  const ready = await page.waitForFunction(
    (from) => window.ditswarmWorkerHistory.slice(from).find((line) => /model preloaded on/.test(line)),
    after,
    { timeout: PRELOAD_WAIT_MS, polling: 500 },
  );
  const line = (await ready.jsonValue()) as string;
  const history: string[] = await page.evaluate(() => window.ditswarmWorkerHistory);
  const lastRead = history.filter((l) => l.startsWith('loading: ') && l.includes('/s')).at(-1) ?? '';
  const rate = /· ([\d.]+) (MB|GB)\/s/.exec(lastRead);
  const loaded = /model preloaded on \w+ in (\d+) ms/.exec(line);
  const from = (where: string) => {
    const match = new RegExp(`([\\d.]+) (MB|GB) from the ${where}`).exec(line);
    return match ? round(gigabytes(match[1], match[2]), 3) : 0;
  };
  return {
    loadS: loaded ? round(Number(loaded[1]) / 1000, 1) : NaN,
    readMBs: rate ? round(gigabytes(rate[1], rate[2]) * 1000, 1) : NaN,
    networkGB: from('network'),
    cacheGB: from('browser cache'),
  };
}

export async function runLoad(o: LoadOptions) {
  await ensureFullSizeModel(o.model);
  const started = Date.now();
  const quiet = await waitForQuietMachine();
  const swarm = await startLocalSwarm({
    modelFolders: { [LOCAL_MODEL_PATH]: o.model },
    defaultModel: LOCAL_MODEL_PATH,
    log,
  });
  const machineAtStart = machine(swarm.browserVersion);
  try {
    // this bench measures the preload of whatever model it is given, a small one too
    await swarm.dashboard.evaluate(() => window.ditswarm.preloadFrom(0));
    // the tabs join at once, as a person opening the worker link on a machine would
    log(`load: ${o.workers} worker tab(s) of a new profile join and preload ${o.model} (load ${quiet.loadAverage1m})…`);
    const joinedAt = Date.now();
    const pages = await Promise.all(Array.from({ length: o.workers }, () => swarm.addWorker()));
    const fromServer = await Promise.all(pages.map((page) => preloaded(page, 0)));
    const firstS = round((Date.now() - joinedAt) / 1000, 1);
    log(`load: from the server: ${JSON.stringify(fromServer)}; all loaded ${firstS} s after joining`);

    log('load: the tabs reloaded preload from their browser cache…');
    const reloadedAt = Date.now();
    await Promise.all(pages.map((page) => page.reload()));
    // a reloaded page's history starts again
    const fromCache = await Promise.all(pages.map((page) => preloaded(page, 0)));
    const againS = round((Date.now() - reloadedAt) / 1000, 1);
    log(`load: from the cache: ${JSON.stringify(fromCache)}; all loaded ${againS} s after reloading`);

    // the first job once the weights are in: its placing phase is the rehearsal and the placement alone
    log('load: the first job on the preloaded tabs…');
    const firstJob: JobOverrides = {
      prompt: 'random prompt embeddings',
      promptEmbeds: randomPromptEmbeds(o.model),
      outputType: 'latent',
      frames: 5,
      height: 32,
      width: 32,
      steps: 1,
      guidance: 1,
      seed: 42,
      backend: 'swarm',
      workers: o.workers,
      model: LOCAL_MODEL_PATH,
    };
    const { report } = await swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), firstJob);
    const job = {
      placingS: round(report.phasesMs.placing / 1000, 1),
      /** of it, the placement (rehearsal, initWorker, loadModel of the model held), before prepareJob and the probe */
      placedS: round((report.setupMs - report.phasesMs.encoding) / 1000, 1),
      ranks: report.placement.layout.world,
      ep: report.placement.ep,
      modelInMemory: report.workers.map((w) => w.inMemory),
    };
    log(`load: the first job placed in ${job.placingS} s`);

    const fastestNetwork = Math.max(...fromServer.map((t) => t.readMBs));
    return {
      benchmark: 'load',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: {
        model: o.model,
        layout: 'Wan-AI/Wan2.1-T2V-1.3B-Diffusers (make-model --preset wan2.1-t2v-1.3b)',
        workers: o.workers,
        server: 'this machine (npm start --model DIR serves the folder by Range requests)',
      },
      machine: { ...machineAtStart, loadAverage1mAtEnd: machine().loadAverage1m },
      versions: versions(),
      fromServer: { tabs: fromServer, allLoadedS: firstS },
      fromCache: { tabs: fromCache, allLoadedS: againS },
      firstJob: {
        config: { ...firstJob, promptEmbeds: `[1, ${TEXT_TOKENS}, text_dim], seeded normals × 0.2` },
        ...job,
      },
      meets: {
        [`the weights arrive from the server at ${MIN_NETWORK_MB_S} MB/s or faster`]:
          fastestNetwork >= MIN_NETWORK_MB_S,
        'tabs of one browser fetch the weights from the server once, and share the copy kept':
          sum(fromServer.map((t) => t.networkGB)) <= 1.01 * Math.max(...fromServer.map((t) => t.networkGB + t.cacheGB)),
        'reloaded tabs read every weight from the browser cache': fromCache.every(
          (t) => t.networkGB === 0 && t.cacheGB > 0,
        ),
        [`the first job after the preload is placed in under ${MAX_PLACING_S} s, on the model the tabs hold`]:
          job.placingS < MAX_PLACING_S && job.modelInMemory.every(Boolean),
      },
    };
  } finally {
    await swarm.close();
  }
}

export function parseLoadArgs(args: string[]): LoadOptions {
  const { values } = parseArgs({
    args,
    options: {
      model: { type: 'string', default: FULL_SIZE_MODEL_DIR },
      workers: { type: 'string', default: '2' },
    },
  });
  const workers = Number(values.workers);
  if (!Number.isInteger(workers) || workers < 1) throw new Error(`--workers must be a whole number ≥ 1`);
  return { model: values.model, workers };
}

if (isMain(import.meta)) writeReport('load.json', await runLoad(parseLoadArgs(process.argv.slice(2))));
