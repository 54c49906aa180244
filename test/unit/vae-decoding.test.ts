import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openWanVae, type WanVaeConfig } from '../../core/model/wan-vae.ts';
import { decodeTileReference } from '../../core/model/wan-vae-reference.ts';
import { blendTiles, cutTile, tilesOf } from '../../core/model/wan-vae-tiling.ts';
import { defined } from '../../core/defined.ts';
import { SeededRandom } from '../../core/random.ts';
import type { TensorMap } from '../../core/safetensors.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import type { DecodeTileArgs } from '../../core/worker-api.ts';
import { chooseTiling, largestTileTensorBytes, tiledDecoding, type TileHost } from '../../coordinator/vae-decoding.ts';
import { vaeTiles } from '../../rank/vae-tiles.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { writeWanVaeFolder } from '../../server/model-folder.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';

// Tiles of a narrow VAE (base 8) on workers in this process: small tiles (4 latent pixels every 3)
// so that a latent of 7×8 makes nine of them.
const TILING = { tile: 32, stride: 24 };

let dir: string;
let cfg: WanVaeConfig;
let tensors: TensorMap;
const latent: Tensor = { shape: [16, 2, 7, 8], data: new SeededRandom(4).normals(16 * 2 * 7 * 8) };

/** A worker decoding tiles with the real decoder, as a page's engine does. */
function worker(id: string, harm?: (args: DecodeTileArgs, call: number) => 'fail' | 'nan' | 'short' | null): TileHost {
  const files = folderFiles(dir);
  const tiles = vaeTiles(() => ({ ...files, close: async () => {} }));
  let calls = 0;
  return {
    id,
    api: {
      async decodeTile(args) {
        const what = harm?.(args, calls++);
        if (what === 'fail') throw new Error(`worker ${id} is gone`);
        const got = await tiles.decode({ ...args, ep: 'wasm' });
        if (what === 'nan') got.frames.fill(NaN, 0, 10);
        if (what === 'short') return { ...got, frames: got.frames.subarray(1) };
        return got;
      },
    },
  };
}

const decodeOn = (hosts: TileHost[]) =>
  tiledDecoding({
    modelUrl: 'test',
    files: folderFiles(dir),
    config: cfg,
    tileHosts: () => Promise.resolve({ hosts, maxBufferBytes: Infinity }),
    ep: 'wasm',
    timeoutMs: 60_000,
    tiling: TILING,
  });

/** The latent decoded on `hosts`, by the real VAE, whose decoding always has a video (a stand-in's has none). */
const decodeVideo = async (hosts: TileHost[]) => {
  const { video, report } = await decodeOn(hosts).decode(latent);
  return { video: defined(video, "the real VAE's video"), report };
};

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'ditswarm-vae-tiles-'));
  await writeWanVaeFolder(dir, { ...WAN21_T2V_1_3B.vae, base_dim: 8 }, { seed: '3' });
  const vae = await openWanVae(folderFiles(dir));
  cfg = vae.config;
  tensors = await vae.decoderTensors();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('tiled decoding on workers', () => {
  let alone: Float32Array;
  it('one worker decodes every tile in turn, to the reference tiles blended', async () => {
    const { video, report } = await decodeVideo([worker('a')]);
    expect(video.shape).toEqual([3, 5, 56, 64]);
    const tiles = tilesOf(7, 8, TILING);
    expect(report).toMatchObject({
      where: 'workers',
      tiles: tiles.length,
      retried: 0,
      ranks: [{ worker: 'a', tiles: tiles.length }],
    });
    const expected = blendTiles(
      tiles,
      tiles.map((t) => decodeTileReference(cfg, tensors, cutTile(latent, t))),
      7,
      8,
      TILING,
    );
    expect(maxAbsDiff(video.data, expected.data)).toBeLessThan(1e-4);
    alone = video.data;
  });

  it('three workers share the tiles and make the same video', async () => {
    const { video, report } = await decodeVideo([worker('a'), worker('b'), worker('c')]);
    expect(report.ranks.map((r) => r.tiles).reduce((a, b) => a + b)).toBe(9);
    expect(report.ranks.filter((r) => r.tiles > 0).length).toBeGreaterThan(1);
    expect(maxAbsDiff(video.data, alone)).toBe(0);
  });

  it('a worker that fails mid-tile, or returns NaN or too few values, loses its tile to the others: the video is the same', async () => {
    for (const harm of ['fail', 'nan', 'short'] as const) {
      const { video, report } = await decodeVideo([
        worker('bad', (_, call) => (call === 0 ? harm : null)),
        worker('good'),
      ]);
      expect(report.retried).toBe(1);
      expect(
        defined(
          report.ranks.find((r) => r.worker === 'good'),
          'the good worker',
        ).tiles,
      ).toBeGreaterThan(0);
      expect(maxAbsDiff(video.data, alone)).toBe(0);
    }
  });

  it('a lone worker that returns poisoned frames fails the decoding, naming it and the tile', async () => {
    const error = await decodeOn([worker('bad', () => 'nan')])
      .decode(latent)
      .catch((e: unknown) => e);
    expect((error as Error).message).toBe(
      "no worker could decode VAE tile 0,0: worker bad: returned tile 0,0's latent frames 0–1 with NaN or infinite values",
    );
  });

  it("a run of a tile's latent frames continues only the tile that is open, where it stopped; after its last frames the tile is closed", async () => {
    const files = folderFiles(dir);
    const tiles = vaeTiles(() => ({ ...files, close: async () => {} }));
    const part = cutTile(latent, { row: 0, col: 0, y: 0, x: 0, height: 4, width: 4 });
    const frame = (t: number) => ({
      shape: [16, 1, 4, 4],
      latent: part.data.filter((_, i) => Math.floor(i / 16) % 2 === t),
    });
    const args = { modelUrl: 'test', ep: 'wasm' as const, tile: 'x', last: false };
    await tiles.decode({ ...args, from: 0, ...frame(0) });
    await expect(tiles.decode({ ...args, tile: 'y', from: 1, ...frame(1) })).rejects.toThrow(
      'tile y from latent frame 1: this worker has tile x open at latent frame 1; start the tile again from 0',
    );
    await expect(tiles.decode({ ...args, from: 2, ...frame(1) })).rejects.toThrow('tile x from latent frame 2');
    // in two runs, the frames one run makes
    const second = await tiles.decode({ ...args, from: 1, last: true, ...frame(1) });
    const whole = decodeTileReference(cfg, tensors, part);
    expect(second.shape).toEqual([4, 3, 32, 32]);
    expect(maxAbsDiff(second.frames, whole.data.subarray(3 * 32 * 32))).toBeLessThan(1e-4);
    await expect(tiles.decode({ ...args, from: 2, ...frame(1) })).rejects.toThrow('this worker has no tile open');
  });
});

describe("the tiles' size", () => {
  it("is diffusers' where the workers' buffers hold it, halved where they do not", () => {
    const full = { ...cfg, baseDim: 96, decoderBaseDim: 96 };
    // the last upsampling's output at 256 pixels: 4 frames × 192 channels × 256² × 4 bytes
    expect(largestTileTensorBytes(full, 32)).toBe(4 * 4 * 192 * 256 * 256);
    expect(chooseTiling(full, Infinity)).toMatchObject({ tile: 256, stride: 192, why: "diffusers' tiles" });
    expect(chooseTiling(full, 128 * 2 ** 20)).toMatchObject({
      tile: 128,
      stride: 96,
      why: "diffusers' 256-pixel tiles need a 192 MiB buffer; the workers allow 128 MiB",
    });
  });
});
