// `npm run build:lib`: the package's JavaScript in dist/lib (ESM, declarations, source maps), what its exports and its
// bin run (tsconfig.lib.json names the entries). tsc rewrites the imports' .ts to .js; a module's URL of a sibling
// (`new URL('./engine.worker.ts', import.meta.url)`: a Web Worker's or a thread's entry, which bundlers follow too)
// is no import, so this rewrites those after it.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const ROOT = resolve(import.meta.dirname, '../..');
const OUT = join(ROOT, 'dist/lib');
const SIBLING_URL = /new URL\('(\.{1,2}\/[^']+)\.ts', import\.meta\.url\)/g;

rmSync(OUT, { recursive: true, force: true });
const tsc = spawnSync(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.lib.json'], {
  cwd: ROOT,
  stdio: 'inherit',
});
if (tsc.status !== 0) process.exit(tsc.status ?? 1);

const emitted = readdirSync(OUT, { recursive: true, encoding: 'utf8' }).filter((file) => file.endsWith('.js'));
let rewritten = 0;
for (const file of emitted) {
  const path = join(OUT, file);
  const text = readFileSync(path, 'utf8');
  // the same length, .ts to .js: the source map's columns stay right
  const js = text.replace(SIBLING_URL, (_url, stem: string) => `new URL('${stem}.js', import.meta.url)`);
  if (js !== text) {
    writeFileSync(path, js);
    rewritten++;
  }
}
console.log(`dist/lib: ${emitted.length} modules, ${rewritten} of them with a sibling's URL pointed at its .js`);
