// A latent through a Wan folder's VAE (AutoencoderKLWan, Wan2.1's or Wan2.2's), for parity checks
// against diffusers like `npm run forward` and `npm run encode-prompt`: starts the server and
// Chromium with N worker tabs, and decodes the latent on them in diffusers' tiles as a job's video
// is decoded (coordinator/vae-decoding.ts). Writes the video [1, 3, 1 + 4(T−1), s·h, s·w] in
// [−1, 1] (s = 8, Wan2.2's 16), as AutoencoderKLWan.decode returns it, and with --out a WebM of it.
//
//   npm run decode -- --model DIR --latent F.safetensors --output V.safetensors [--out video.webm]
//     [--workers N]

import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';
import type { AutomationProgress } from '../../app/automation.ts';
import { defined } from '../../core/defined.ts';
import { isWanVaeConfig, parseWanVaeConfig, VAE_CONFIG, type WanVaeConfig } from '../../core/model/wan-vae.ts';
import { readSafetensors, writeSafetensors } from '../../core/safetensors.ts';
import { CACHE_ROOT } from '../model-folder.ts';
import { localModelDir, servedOr } from '../serve.ts';
import { pageError, startLocalSwarm } from './browser-swarm.ts';
import { DECODE_OPTIONS } from './flags.ts';

const USAGE = [
  'usage: npm run decode -- --model DIR --latent F.safetensors --output V.safetensors [--out video.webm] [--workers N]',
  "  --latent   a safetensors file holding the transformer's latent [1, z, T, h, w] (or [z, T, h, w]; z is the " +
    'VAE\'s z_dim: 16, Wan2.2\'s 48): its tensor "latent", or its only one',
  '  --output   where to write "video" [1, 3, 1 + 4(T−1), s·h, s·w] in [−1, 1] (s = 8, Wan2.2\'s 16)',
  '  --out      also a WebM of it, as the dashboard shows it',
  '  --workers  worker tabs to decode the tiles on (default 1)',
].join('\n');

/** a port of its own: the browser keeps the VAE's weights per origin (as generate's) */
const DECODE_PORT = 5191;

function fail(message: string): never {
  console.error(`decode: ${message}`);
  process.exit(1);
}

let parsed;
try {
  parsed = parseArgs({
    options: DECODE_OPTIONS,
  });
} catch (e) {
  fail(`${(e as Error).message}\n${USAGE}`);
}
const { values } = parsed;
if (!values.model) fail(`--model is required: a folder with vae/ (AutoencoderKLWan)\n${USAGE}`);
if (!values.latent) fail(`--latent is required\n${USAGE}`);
if (!values.output) fail(`--output is required\n${USAGE}`);
const workers = Number(values.workers);
if (!Number.isInteger(workers) || workers < 1) fail(`--workers must be a whole number ≥ 1, got ${values.workers}`);

let tensors;
try {
  tensors = readSafetensors(new Uint8Array(readFileSync(values.latent)), values.latent);
} catch (e) {
  fail(`--latent ${values.latent}: ${(e as Error).message}`);
}
const latent = tensors.get('latent') ?? (tensors.size === 1 ? [...tensors.values()][0] : undefined);
if (!latent) fail(`--latent ${values.latent} has no tensor "latent" (it has ${[...tensors.keys()].join(', ')})`);
const shape = latent.shape.length === 5 && latent.shape[0] === 1 ? latent.shape.slice(1) : latent.shape;
if (shape.length !== 4)
  fail(
    `--latent ${values.latent}: the latent must be [1, C, T, h, w] or [C, T, h, w], got [${latent.shape.join(',')}]`,
  );
if (!latent.data.every(Number.isFinite)) fail(`--latent ${values.latent}: the latent holds NaN or infinite values`);

const { modelFolders, defaultModel: modelUrl } = servedOr({ model: values.model, needs: VAE_CONFIG }, fail);
/** The folder's AutoencoderKLWan config where the folder is on this machine; null for a URL or a stand-in VAE. */
function localWanVae(): WanVaeConfig | null {
  const folder = localModelDir({ modelFolders, defaultModel: modelUrl });
  if (!folder) return null;
  try {
    const json: unknown = JSON.parse(readFileSync(join(folder, VAE_CONFIG), 'utf8'));
    return isWanVaeConfig(json) ? parseWanVaeConfig(json, VAE_CONFIG) : null;
  } catch (e) {
    fail(`--model ${values.model}: ${(e as Error).message}`);
  }
}
// a latent the folder's VAE cannot take is refused here, before Chromium starts, in the VAE's own terms
const vae = localWanVae();
if (vae && shape[0] !== vae.zDim)
  fail(
    `--latent ${values.latent}: the latent [${shape.join(',')}] has ${shape[0]} channels, and ` +
      `${values.model}'s VAE (z_dim ${vae.zDim}) decodes [${vae.zDim}, T, h, w]: give a latent made for this VAE`,
  );
const tty = process.stderr.isTTY;
const swarm = await startLocalSwarm({
  workers,
  profileDir: join(CACHE_ROOT, 'browser'),
  modelFolders,
  port: DECODE_PORT,
  log: values.verbose ? console.error : () => {},
}).catch((e: unknown) => fail(`could not start the server and Chromium: ${(e as Error).message}`));
try {
  await swarm.dashboard.exposeFunction('ditswarmProgress', (p: AutomationProgress) => {
    if (!('phase' in p) || p.phase !== 'decoding' || !p.detail) return;
    if (tty) process.stderr.write(`\r\x1b[Kdecode: ${p.detail}`);
    else console.error(`decode: ${p.detail}`);
  });
  const base64 = Buffer.from(latent.data.buffer, latent.data.byteOffset, latent.data.byteLength).toString('base64');
  const result = await swarm.dashboard.evaluate((args) => window.ditswarm.decode(args), {
    model: modelUrl,
    latent: { shape, base64 },
    webm: values.out !== undefined,
  });
  if (tty) process.stderr.write('\n');
  const bytes = Buffer.from(result.video.base64, 'base64');
  const video = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  const write = (path: string, data: Uint8Array) => {
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, data);
  };
  write(
    values.output,
    writeSafetensors(new Map([['video', { shape: [1, ...result.video.shape], data: video }]]), {
      latent: values.latent,
    }),
  );
  if (values.out) write(values.out, Buffer.from(defined(result.webm, 'the WebM --out asked for'), 'base64'));
  const r = result.report;
  const tiling = defined(r.tiling, "the tiling of a decode on the workers (a stand-in's fails before)");
  const ranks = r.ranks.map(
    (k: { worker: string; tiles: number; computeMs: number; cacheBytes: number }) =>
      `${k.worker.slice(-6)}: ${k.tiles} tile(s), ${(k.computeMs / 1000).toFixed(1)} s, ` +
      `caches ${(k.cacheBytes / 2 ** 20).toFixed(0)} MiB`,
  );
  console.error(
    `decode: wrote ${[values.output, ...(values.out ? [values.out] : [])].join(', ')}: ` +
      `video [1, ${result.video.shape.join(', ')}] from ${r.tiles} tile(s) of ${tiling.tile} px ` +
      `every ${tiling.stride} in ${(r.ms / 1000).toFixed(1)} s (${ranks.join('; ')})`,
  );
} catch (e) {
  if (tty) process.stderr.write('\n');
  await swarm.close();
  fail(pageError(e));
}
await swarm.close();
