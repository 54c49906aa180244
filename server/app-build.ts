import { readdirSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { build } from 'vite';

const REPO_ROOT = resolve(import.meta.dirname, '..');
export const DIST_DIR = resolve(REPO_ROOT, 'dist');
/** what the build copies into dist/ as it is: the bundled models among it */
export const PUBLIC_DIR = resolve(REPO_ROOT, 'public');

// Everything the bundle is made from; a change in any of them means dist/ is out of date.
const SOURCES = ['app', 'coordinator', 'worker', 'rank', 'core', 'public', 'vite.config.ts'];
const BUILT_PAGES = ['index.html', 'worker.html', 'api.html', 'trust.html'];

/** Builds the app with the repo's vite.config.ts unless dist/ is newer than every source. */
export async function ensureAppBuilt({ force = false, quiet = false } = {}): Promise<'built' | 'up to date'> {
  if (!force && !isBuildStale()) return 'up to date';
  await build({ configFile: resolve(REPO_ROOT, 'vite.config.ts'), logLevel: quiet ? 'warn' : 'info' });
  return 'built';
}

export function isBuildStale(): boolean {
  const builtAt = Math.min(...BUILT_PAGES.map((page) => mtimeOrZero(resolve(DIST_DIR, page))));
  return builtAt === 0 || newestSourceMtime() > builtAt;
}

function newestSourceMtime(): number {
  return Math.max(0, ...SOURCES.map((source) => newestMtimeIn(resolve(REPO_ROOT, source))));
}

// Directory mtimes count too, so deleting or renaming a source file also triggers a rebuild.
// node_modules and dot folders are skipped: tools write caches there (vitest under app/).
function newestMtimeIn(path: string): number {
  let stats;
  try {
    stats = statSync(path);
  } catch {
    return 0;
  }
  if (!stats.isDirectory()) return stats.mtimeMs;
  let newest = stats.mtimeMs;
  for (const entry of readdirSync(path)) {
    if (entry === 'node_modules' || entry.startsWith('.')) continue;
    newest = Math.max(newest, newestMtimeIn(resolve(path, entry)));
  }
  return newest;
}

function mtimeOrZero(path: string): number {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return 0;
  }
}
