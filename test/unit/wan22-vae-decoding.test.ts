// Wan2.2's VAE (z48, is_residual, 2×2 patches: 16 video pixels a latent pixel) decoded in tiles on
// workers, as vae-decoding.test.ts holds Wan2.1's: the tiles are cut and blended at the folder's own
// spatial scale, a worker's frames are its 12 patch channels, checked against the decoder's bound in
// each, and the video is the reference's, whoever decodes which tile.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chooseTiling, largestTileTensorBytes, tiledDecoding, type TileHost } from '../../coordinator/vae-decoding.ts';
import { defined } from '../../core/defined.ts';
import { decodedFramesShape, openWanVae, spatialScale, type WanVaeConfig } from '../../core/model/wan-vae.ts';
import { decodeTileReference, decodeWanVaeReference } from '../../core/model/wan-vae-reference.ts';
import { blendTiles, cutTile, tilesOf, type Tiling } from '../../core/model/wan-vae-tiling.ts';
import type { TensorMap } from '../../core/safetensors.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import type { DecodeTileArgs } from '../../core/worker-api.ts';
import { vaeTiles } from '../../rank/vae-tiles.ts';
import { unkeptModelFiles } from '../../rank/weight-cache.ts';
import { folderFiles, writeWanVaeFolder } from '../../server/model-folder.ts';
import { SEED, seededLatent, TINY_VAE22_CONFIG } from '../reference/make-wan-vae-fixture.ts';

// Small tiles (4 latent pixels every 3, 64 video pixels every 48 at Wan2.2's 16) so that a latent
// of 7×8 makes nine of them; at Wan2.1's 8 the same pixels would be one tile of 8 latent pixels.
const TILING: Tiling = { tile: 64, stride: 48 };
const [H, W] = [7, 8];

let dir: string;
let cfg: WanVaeConfig;
let tensors: TensorMap;
const latent: Tensor = seededLatent(SEED, [48, 2, H, W]);

/** The workers' calls one at a time: in this process they share one onnxruntime wasm instance. */
let runtime: Promise<unknown> = Promise.resolve();

/** A worker decoding tiles as a page's engine does; `harm` rewrites a reply's frames. */
function worker(id: string, harm?: (args: DecodeTileArgs, frames: Float32Array) => void): TileHost {
  const files = folderFiles(dir);
  const tiles = vaeTiles(() => unkeptModelFiles(files));
  const decodeTile = async (args: DecodeTileArgs) => {
    const got = await tiles.decode({ ...args, ep: 'wasm' });
    harm?.(args, got.frames);
    return got;
  };
  return {
    id,
    pulse: null,
    api: {
      decodeTile(args) {
        const turn = runtime.then(() => decodeTile(args));
        runtime = turn.catch(() => {});
        return turn;
      },
    },
  };
}

let convicted: { id: string; why: string }[] = [];

async function decodeOn(hosts: TileHost[], tiling = TILING) {
  convicted = [];
  const { video, report } = await tiledDecoding({
    modelUrl: 'test',
    files: folderFiles(dir),
    config: cfg,
    tileHosts: () => Promise.resolve({ hosts, maxBufferBytes: Infinity }),
    convict(host, why) {
      convicted.push({ id: host.id, why });
      hosts.splice(hosts.indexOf(host), 1);
    },
    ep: 'wasm',
    timeoutMs: 60_000,
    tiling,
  }).decode(latent);
  return { video: defined(video, "the real VAE's video"), report };
}

describe("Wan2.2's VAE decoded in tiles on workers", () => {
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ditswarm-vae22-tiles-'));
    await writeWanVaeFolder(dir, TINY_VAE22_CONFIG, { seed: SEED });
    const vae = await openWanVae(folderFiles(dir));
    cfg = vae.config;
    tensors = await vae.decoderTensors();
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  let alone: Float32Array;
  it("one worker decodes every tile, 16 video pixels a latent pixel, to the reference's tiles blended in their patches", async () => {
    expect(spatialScale(cfg)).toBe(16);
    const { video, report } = await decodeOn([worker('a')]);
    const tiles = tilesOf(H, W, TILING, 2);
    expect(tiles).toHaveLength(9);
    expect(report).toMatchObject({ where: 'workers', tiles: 9, retried: 0, ranks: [{ worker: 'a', tiles: 9 }] });
    expect(video.shape).toEqual([3, 5, 16 * H, 16 * W]);
    const expected = blendTiles(
      tiles,
      tiles.map((t) => decodeTileReference(cfg, tensors, cutTile(latent, t))),
      H,
      W,
      TILING,
      2,
    );
    expect(maxAbsDiff(video.data, expected.data)).toBeLessThan(1e-4);
    alone = video.data;
  });

  it('three workers share the tiles and make the same video to the bit, each tile checked by another worker', async () => {
    const { video, report } = await decodeOn([worker('a'), worker('b'), worker('c')]);
    expect(report.ranks.map((r) => r.tiles).reduce((a, b) => a + b)).toBe(9);
    expect(report.ranks.filter((r) => r.tiles > 0).length).toBeGreaterThan(1);
    expect(report.checks.map((c) => [c.verdict, c.difference])).toEqual(Array(9).fill(['agreed', 0]));
    expect(maxAbsDiff(video.data, alone)).toBe(0);
  });

  it("one tile over the whole latent equals the whole latent decoded in one process (diffusers' _decode)", async () => {
    const whole = { tile: 16 * W, stride: 12 * W };
    const { video, report } = await decodeOn([worker('a')], whole);
    expect(report.tiles).toBe(1);
    const reference = decodeWanVaeReference(cfg, tensors, latent);
    expect(video.shape).toEqual(reference.shape);
    expect(maxAbsDiff(video.data, reference.data)).toBeLessThan(1e-4);
  });

  it("a reply beyond the decoder's bound in one of its 12 patch channels convicts its worker; the video is the same", async () => {
    const [, channels, h, w] = decodedFramesShape(cfg, { frames: 2, height: 4, width: 4, first: true });
    expect(channels).toBe(12);
    const plane = h * w;
    let harmed = false;
    const { video } = await decodeOn([
      worker('bad', (_, frames) => {
        if (harmed) return;
        harmed = true;
        // its first reply, tile 0,0's: patch channel 7 of the first frame, past the three an RGB check reads
        frames[7 * plane + 5] = 1e30;
      }),
      worker('good'),
    ]);
    expect(convicted.map((c) => c.id)).toEqual(['bad']);
    expect(convicted[0].why).toMatch(/^VAE tile 0,0 came with 1\.00e\+30 in channel 7, beyond the ±/);
    expect(maxAbsDiff(video.data, alone)).toBe(0);
  });

  it("tiles shrink at Wan2.2's scale: a 256-pixel tile is 16 latent pixels, its largest tensor 128 MiB at full width", () => {
    const full = { ...cfg, baseDim: 160, decoderBaseDim: 256 };
    // the last upsampling's output: 4 frames × 512 channels × (16 · 8)² pixels × 4 bytes
    expect(largestTileTensorBytes(full, 16)).toBe(4 * 4 * 512 * 128 * 128);
    expect(chooseTiling(full, Infinity)).toMatchObject({ tile: 256, stride: 192, why: "diffusers' tiles" });
    expect(chooseTiling(full, 128 * 2 ** 20)).toMatchObject({ tile: 256, stride: 192 });
    expect(chooseTiling(full, 100 * 2 ** 20)).toMatchObject({
      tile: 128,
      stride: 96,
      why: "diffusers' 256-pixel tiles need a 128 MiB buffer; the workers allow 100 MiB",
    });
  });
});
