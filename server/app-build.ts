import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';

/** The folder of the package.json above `dir`: the checkout, or where npm installed the package (dist/lib/… there). */
function packageRoot(dir: string): string {
  for (let at = dir; ; at = dirname(at)) {
    if (existsSync(resolve(at, 'package.json'))) return at;
    if (dirname(at) === at)
      throw new Error(`no package.json above ${dir}: ditswarm's files are not where npm put them`);
  }
}

const REPO_ROOT = packageRoot(import.meta.dirname);
/** the built app the server serves: built from the sources in a checkout, shipped built in the package */
export const DIST_DIR = resolve(REPO_ROOT, 'dist/app');
/** the app's build configuration: a checkout has it, and builds; an installed package has none, and serves its build */
const VITE_CONFIG = resolve(REPO_ROOT, 'vite.config.ts');
/** what the build copies into the app as it is, the bundled models among it (the package holds the built copy) */
export const PUBLIC_DIR = existsSync(VITE_CONFIG) ? resolve(REPO_ROOT, 'public') : DIST_DIR;

// Everything the bundle is made from; a change in any of them means dist/ is out of date.
const SOURCES = ['app', 'coordinator', 'worker', 'rank', 'core', 'public', 'vite.config.ts'];
const BUILT_PAGES = ['index.html', 'worker.html', 'api.html', 'trust.html'];

/**
 * Builds the app with the repo's vite.config.ts unless dist/app/ is newer than every source. An installed package
 * serves the app it was packed with: it has neither the sources nor vite (a devDependency).
 */
export async function ensureAppBuilt({ force = false, quiet = false } = {}): Promise<'built' | 'up to date'> {
  if (!existsSync(VITE_CONFIG)) {
    const missing = BUILT_PAGES.filter((page) => !existsSync(resolve(DIST_DIR, page)));
    if (missing.length)
      throw new Error(`the built app in ${DIST_DIR} lacks ${missing.join(', ')}: install the ditswarm package again`);
    return 'up to date';
  }
  if (!force && !isBuildStale()) return 'up to date';
  const { build } = await import('vite');
  await build({ configFile: VITE_CONFIG, logLevel: quiet ? 'warn' : 'info' });
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
