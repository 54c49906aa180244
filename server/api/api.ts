// `npm start -- --api`: the video API on this server. Its router is mounted before the server listens (calls wait
// until the coordinator is up); `start` then opens the coordinator page and the local worker tabs, and the queue
// takes up what the database holds.

import { chmodSync, mkdirSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import type express from 'express';
import { loadWanPipelineParts } from '../../core/model/wan-pipeline.ts';
import { folderFiles } from '../model-folder.ts';
import type { Origins } from '../origins.ts';
import { loadApiKey, type ApiKey } from './api-key.ts';
import { hostCoordinator, type CoordinatorHost } from './coordinator-host.ts';
import { JobDb } from './job-db.ts';
import { JobFiles } from './job-files.ts';
import { videoApi, type ApiParts } from './routes.ts';
import { VideoJobs } from './video-jobs.ts';

export interface ApiSettings {
  /** the database, the videos, the key and the browser's profile */
  dataDir: string;
  /** worker tabs this server opens on its own machine */
  localWorkers: number;
  /** queued jobs at most (429 past it) */
  maxQueued: number;
  requestsPerMinute: number;
  /** hosts besides this server that a job's model and LoRA files may be read from (--allow-model-host) */
  modelHosts?: readonly string[];
  /** DITSWARM_API_KEY */
  keyFromEnv?: string;
  /** the server's --model, which a job runs on unless it names another */
  model?: string;
  /** the folder on this machine that jobs run on unless they name another model; null where it is a URL */
  defaultModelDir: string | null;
  log: (line: string) => void;
}

export interface VideoApi {
  key: ApiKey;
  /** mount at /v1 */
  router: (origins: Origins) => express.Router;
  /** opens the coordinator on the server at `serverUrl`, then runs the queue */
  start: (serverUrl: string) => Promise<CoordinatorHost>;
  close: () => Promise<void>;
}

/** where the API keeps its jobs unless --data says (they are no cache: the videos are the user's) */
export const DEFAULT_DATA_DIR = join(process.env.XDG_DATA_HOME ?? join(homedir(), '.local/share'), 'ditswarm');

export const DEFAULTS = { localWorkers: 0, maxQueued: 100, requestsPerMinute: 1200 } as const;

/**
 * Makes `dataDir` its owner's alone, and what this process writes from now on too: the key, the job database and its
 * journal, the videos, the browser's profile (which holds the swarm's join link) are nobody else's to read.
 */
function keepPrivate(dataDir: string): void {
  process.umask(0o077);
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  chmodSync(dataDir, 0o700);
}

export function prepareApi(settings: ApiSettings): VideoApi {
  keepPrivate(settings.dataDir);
  const key = loadApiKey(settings.dataDir, settings.keyFromEnv);
  // opened before the server listens: a database another running server holds refuses this one before it serves
  const db = JobDb.open(settings.dataDir, settings.log);
  let resolveParts: (parts: ApiParts) => void = () => {};
  const parts = new Promise<ApiParts>((resolve) => (resolveParts = resolve));
  let host: CoordinatorHost | null = null;
  return {
    key,
    router: (origins) => videoApi(parts, { key: key.key, origins, requestsPerMinute: settings.requestsPerMinute }),
    async start(serverUrl) {
      host = await hostCoordinator({
        serverUrl,
        profileDir: join(settings.dataDir, 'browser'),
        localWorkers: settings.localWorkers,
        log: settings.log,
      });
      const coordinator = host;
      const jobs = new VideoJobs(db, new JobFiles(join(settings.dataDir, 'videos')), coordinator, {
        maxQueued: settings.maxQueued,
        hasWorkers: async () => (await coordinator.swarm()).workers.length > 0,
        log: settings.log,
      });
      jobs.start();
      resolveParts({
        jobs,
        coordinator,
        model: settings.model,
        defaultSize: await defaultSizeOf(settings),
        modelHosts: settings.modelHosts ?? [],
      });
      return coordinator;
    },
    async close() {
      await host?.close();
      db.close();
    },
  };
}

/** "WxH" of the default model's default job (what a job without a size gets), where its folder is on this machine. */
async function defaultSizeOf({ defaultModelDir, log }: ApiSettings): Promise<string | null> {
  if (defaultModelDir === null) return null;
  try {
    const { defaults } = await loadWanPipelineParts(folderFiles(defaultModelDir));
    return `${defaults.width}x${defaults.height}`;
  } catch (e) {
    log(`api: the default model's size is not known (${(e as Error).message}): a refused size names the others`);
    return null;
  }
}
