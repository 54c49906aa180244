// Wan2.1's VAE decoder (AutoencoderKLWan) at its published width, on seeded random weights in the
// published layout (make-model --preset wan2.1-few-layers, written on demand outside the repository):
//   parity  the ONNX graphs (WASM, in Node) against the plain TypeScript reference for latents of
//           1, 2 and 3 frames at 4×4 and 6×10 latent pixels (1, 5 and 9 video frames), the bound 1e-3
//   tile    one of diffusers' 256-pixel tiles decoded on worker tabs in Chromium (WASM), as a job's
//           video is: time per chunk, its causal caches, the decoder's weights and the renderer's peak
//           memory; and what that makes a 480p, 81-frame video cost on one tab
// Writes bench/out/vae.json.
//
//   npm run bench -- vae [--model DIR] [--only parity|tile] [--tile-frames 2]

import { cpSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import * as ort from 'onnxruntime-web';
import { cacheBytes, decoderPlan, openWanVae } from '../core/model/wan-vae.ts';
import { decodeTileReference } from '../core/model/wan-vae-reference.ts';
import { tilesOf, TILE_PIXELS, TILE_STRIDE_PIXELS } from '../core/model/wan-vae-tiling.ts';
import { SeededRandom } from '../core/random.ts';
import { maxAbsDiff, type Tensor } from '../core/tensor.ts';
import { largestTileTensorBytes } from '../coordinator/vae-decoding.ts';
import { onnxVaeDecoder } from '../rank/vae-decoder.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import { FEW_LAYERS_MODEL_DIR, folderFiles, writeWanVaeFolder } from '../server/model-folder.ts';
import { WAN21_T2V_1_3B } from '../server/wan21-layout.ts';
import { LOCAL_MODEL_PATH } from '../server/serve.ts';
import {
  ensureFolder,
  ensurePreset,
  OUT_DIR,
  SMOKE_MODEL_DIR,
  isMain,
  log,
  machine,
  rendererPeaks,
  round,
  versions,
  waitForQuietMachine,
  writeReport,
} from './lib.ts';

/** the bound: the graphs against the reference on the full-width VAE */
const MAX_ABS_ERROR = 1e-3;

export interface VaeBenchOptions {
  model: string;
  parts: ('parity' | 'tile')[];
  /** latent frames of the timed tile: 1 + 4(n−1) video frames */
  tileFrames: number;
}

/**
 * `npm run bench -- --smoke`'s model: the bundled tiny model with Wan2.1's VAE in its layout at base width 8 (the
 * unit tests' narrow VAE), written on demand. A whole folder, not `vae/` alone: a decode still opens the folder's
 * other configs.
 */
const SMOKE_VAE_DIR = join(OUT_DIR, 'models/smoke-wan-vae');
export const SMOKE_VAE: VaeBenchOptions = { model: SMOKE_VAE_DIR, parts: ['parity', 'tile'], tileFrames: 1 };

/** Writes the smoke run's model into SMOKE_VAE_DIR unless it is there. */
export function ensureSmokeVae(): Promise<void> {
  return ensureFolder(SMOKE_VAE_DIR, 'vae/diffusion_pytorch_model.safetensors', async (into) => {
    cpSync(SMOKE_MODEL_DIR, into, { recursive: true });
    rmSync(join(into, 'vae/diffusion_pytorch_model.safetensors'));
    await writeWanVaeFolder(into, { ...WAN21_T2V_1_3B.vae, base_dim: 8 }, { seed: 'smoke' });
  });
}

const latentOf = (shape: number[], seed: number): Tensor => ({
  shape,
  data: new SeededRandom(seed).normals(shape.reduce((a, b) => a * b, 1)),
});

async function parity(model: string) {
  const vae = await openWanVae(folderFiles(model));
  const tensors = await vae.decoderTensors();
  ort.env.wasm.numThreads = 1;
  const decoder = await onnxVaeDecoder(vae.config, tensors, 'wasm');
  const cases = [];
  try {
    for (const [h, w] of [
      [4, 4],
      [6, 10],
    ])
      for (const T of [1, 2, 3]) {
        const latent = latentOf([vae.config.zDim, T, h, w], 100 * T + h);
        let started = performance.now();
        const onnx = await decoder.decode(latent);
        const onnxMs = performance.now() - started;
        started = performance.now();
        const reference = decodeTileReference(vae.config, tensors, latent);
        const referenceMs = performance.now() - started;
        const maxAbs = maxAbsDiff(onnx.data, reference.data);
        const scale = reference.data.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
        const c = {
          latent: latent.shape,
          video: [3, onnx.frames, onnx.height, onnx.width],
          maxAbs,
          scale: round(scale),
          onnxMs: Math.round(onnxMs),
          referenceMs: Math.round(referenceMs),
          within: maxAbs <= MAX_ABS_ERROR,
        };
        log(
          `vae parity: latent [${c.latent.join(',')}] → video [${c.video.join(',')}]: ` +
            `max |onnx − reference| ${maxAbs.toExponential(2)} (values up to ${c.scale}); ` +
            `onnx ${c.onnxMs} ms, reference ${c.referenceMs} ms`,
        );
        cases.push(c);
      }
  } finally {
    await decoder.release();
  }
  return { bound: MAX_ABS_ERROR, cases, holds: cases.every((c) => c.within) };
}

async function tile(model: string, latentFrames: number) {
  const vae = await openWanVae(folderFiles(model));
  const cfg = vae.config;
  const side = TILE_PIXELS / 8;
  const latent = latentOf([cfg.zDim, latentFrames, side, side], 7);
  const load = await waitForQuietMachine();
  const swarm = await startLocalSwarm({ workers: 1, modelFolders: { [LOCAL_MODEL_PATH]: model }, log });
  try {
    const args = {
      model: LOCAL_MODEL_PATH,
      latent: { shape: latent.shape, base64: Buffer.from(latent.data.buffer).toString('base64') },
    };
    const run = () => swarm.dashboard.evaluate((a) => window.ditswarm.decode(a), args);
    const first = await run(); // reads the weights, builds the sessions
    const started = Date.now();
    const second = await run();
    const wallMs = Date.now() - started;
    const [rank] = second.report.ranks;
    const plan = decoderPlan(cfg);
    // a 480p video of 81 frames: 21 latent frames in diffusers' tiles of a 60×104 latent
    const tiles480p = tilesOf(60, 104, { tile: TILE_PIXELS, stride: TILE_STRIDE_PIXELS });
    // the first chunk makes one frame, every later one four: time per frame made, scaled to 81 frames
    const perVideoFrameMs = rank.computeMs / second.video.shape[1];
    const tilePixels = tiles480p.reduce((n, t) => n + t.height * t.width, 0);
    return {
      latent: latent.shape,
      video: second.video.shape,
      load,
      firstCallMs: Math.round(first.report.ms),
      wallMs,
      computeMs: Math.round(rank.computeMs),
      perVideoFrameMs: Math.round(perVideoFrameMs),
      cacheBytes: rank.cacheBytes,
      cacheBytesComputed: cacheBytes(plan, side, side),
      weightBytes: rank.weightBytes,
      largestTensorBytes: largestTileTensorBytes(cfg, side),
      rendererPeakBytes: rendererPeaks(),
      /** one tab alone: this tile's time per frame, times 81 frames, scaled by the latent pixels of 480p's tiles */
      projected480p81FramesOneTabS: round((perVideoFrameMs * 81 * tilePixels) / (side * side) / 1000, 0),
      tiles480p: tiles480p.length,
    };
  } finally {
    await swarm.close();
  }
}

export async function runVae(o: VaeBenchOptions) {
  await ensurePreset('wan2.1-few-layers', o.model, '4.3 GB');
  const started = Date.now();
  const report = {
    config: o,
    machine: machine(),
    parity: o.parts.includes('parity') ? await parity(o.model) : null,
    tile: o.parts.includes('tile') ? await tile(o.model, o.tileFrames) : null,
    versions: versions(),
    totalS: 0,
  };
  report.totalS = Math.round((Date.now() - started) / 1000);
  return report;
}

export function parseVaeArgs(args: string[]): VaeBenchOptions {
  const { values } = parseArgs({
    args,
    options: {
      model: { type: 'string', default: FEW_LAYERS_MODEL_DIR },
      only: { type: 'string' },
      'tile-frames': { type: 'string', default: '2' },
    },
  });
  const tileFrames = Number(values['tile-frames']);
  if (!Number.isInteger(tileFrames) || tileFrames < 1)
    throw new Error(`--tile-frames must be a whole number ≥ 1, got ${values['tile-frames']}`);
  if (values.only !== undefined && values.only !== 'parity' && values.only !== 'tile')
    throw new Error(`--only must be parity or tile, got ${values.only}`);
  return { model: values.model, parts: values.only ? [values.only] : ['parity', 'tile'], tileFrames };
}

if (isMain(import.meta)) writeReport('vae.json', await runVae(parseVaeArgs(process.argv.slice(2))));
