// `npm run worker`'s (`npx ditswarm worker`'s) flags: test/unit/docs.test.ts holds every flag the docs name to them.
import { join } from 'node:path';
import type { ParseArgsConfig } from 'node:util';
import { CACHE_ROOT } from '../../server/model-folder.ts';

/** where a worker process keeps the weights it fetched unless told */
export const DEFAULT_CACHE = join(CACHE_ROOT, 'worker-weights');

export const WORKER_OPTIONS = {
  threads: { type: 'string' },
  'model-memory': { type: 'string' },
  device: { type: 'string', default: 'auto' },
  cache: { type: 'string', default: DEFAULT_CACHE },
  'model-dir': { type: 'string' },
  ca: { type: 'string' },
  help: { type: 'boolean' },
} satisfies ParseArgsConfig['options'];
