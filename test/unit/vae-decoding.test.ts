import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  decoderHeadNames,
  decoderOutputBound,
  decoderWeightShapes,
  openWanVae,
  VAE_CONFIG,
  VAE_WEIGHTS,
  type WanVaeConfig,
} from '../../core/model/wan-vae.ts';
import { decodeTileReference } from '../../core/model/wan-vae-reference.ts';
import { blendTiles, cutTile, tilesOf } from '../../core/model/wan-vae-tiling.ts';
import { defined } from '../../core/defined.ts';
import { SeededRandom } from '../../core/random.ts';
import { tensorRuns, writeSafetensors, type TensorMap } from '../../core/safetensors.ts';
import { openCheckpoint } from '../../core/model/checkpoint.ts';
import { maxAbsDiff, sizeOf, type Tensor } from '../../core/tensor.ts';
import { describeLoad, type DecodeTileArgs, type LoadStatus } from '../../core/worker-api.ts';
import {
  chooseTiling,
  describeDecodeProgress,
  largestTileTensorBytes,
  tiledDecoding,
  type TileHost,
} from '../../coordinator/vae-decoding.ts';
import { vaeTiles } from '../../rank/vae-tiles.ts';
import { unkeptModelFiles } from '../../rank/weight-cache.ts';
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

type Harm = 'fail' | 'nan' | 'short' | 'paint' | 'huge' | null;

/**
 * The workers' calls, one at a time: in this process they share one onnxruntime wasm instance, which fails calls that
 * interleave on different sessions ("null function or function signature mismatch"); pages each have their own.
 */
let runtime: Promise<unknown> = Promise.resolve();

/**
 * A worker decoding tiles with the real decoder, as a page's engine does; `harm` rewrites a reply: paint sets the
 * first half of its values to 0.9 (within what the decoder can make), huge one value to 1e30.
 */
function worker(id: string, harm?: (args: DecodeTileArgs, call: number) => Harm): TileHost {
  const files = folderFiles(dir);
  const tiles = vaeTiles(() => unkeptModelFiles(files));
  let calls = 0;
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
  async function decodeTile(args: DecodeTileArgs) {
    const what = harm?.(args, calls++);
    if (what === 'fail') throw new Error(`worker ${id} is gone`);
    const got = await tiles.decode({ ...args, ep: 'wasm' });
    if (what === 'nan') got.frames.fill(NaN, 0, 10);
    if (what === 'short') return { ...got, frames: got.frames.subarray(1) };
    if (what === 'paint') got.frames.fill(0.9, 0, got.frames.length / 2);
    if (what === 'huge') got.frames[7] = 1e30;
    return got;
  }
}

/** Convictions, by worker id: each takes its worker out of the hosts, as the swarm's ban does. */
let convicted: { id: string; why: string }[] = [];

const decodeOn = (hosts: TileHost[], random?: () => number) =>
  tiledDecoding({
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
    tiling: TILING,
    random,
  });

/** The latent decoded on `hosts`, by the real VAE, whose decoding always has a video (a stand-in's has none). */
const decodeVideo = async (hosts: TileHost[], random?: () => number) => {
  convicted = [];
  const { video, report } = await decodeOn(hosts, random).decode(latent);
  return { video: defined(video, "the real VAE's video"), report };
};

describe("diffusers' tiles of a latent (tilesOf)", () => {
  const diffusers = { tile: 256, stride: 192 };
  it('are one where the latent fits one tile (32 × 32 at 256 pixels), as _decode decides; past it, the grid', () => {
    expect(tilesOf(32, 32, diffusers)).toEqual([{ row: 0, col: 0, y: 0, x: 0, height: 32, width: 32 }]);
    expect(tilesOf(32, 20, diffusers)).toHaveLength(1);
    // a row or column more: tiles every 24 latent rows, each up to 32
    expect(tilesOf(33, 32, diffusers).map((t) => [t.y, t.height, t.x, t.width])).toEqual([
      [0, 32, 0, 32],
      [0, 32, 24, 8],
      [24, 9, 0, 32],
      [24, 9, 24, 8],
    ]);
  });
});

// the folder's hooks in a describe, not at the file's top: Stryker counts a failed file-level hook as no failed test
describe("a narrow VAE's folder", () => {
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
    it('one worker decodes every tile in turn, to the reference tiles blended; no other worker could check them', async () => {
      const { video, report } = await decodeVideo([worker('a')]);
      expect(report.checks.map((c) => c.verdict)).toEqual(Array(9).fill('unchecked'));
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

    it('three workers share the tiles and make the same video, each tile checked by another worker', async () => {
      const { video, report } = await decodeVideo([worker('a'), worker('b'), worker('c')]);
      expect(report.ranks.map((r) => r.tiles).reduce((a, b) => a + b)).toBe(9);
      expect(report.ranks.filter((r) => r.tiles > 0).length).toBeGreaterThan(1);
      expect(maxAbsDiff(video.data, alone)).toBe(0);
      expect(report.checks).toHaveLength(9);
      expect(new Set(report.checks.map((c) => c.tile)).size).toBe(9);
      for (const check of report.checks) {
        expect(check.verdict).toBe('agreed');
        expect(check.checker).not.toBe(check.worker);
        expect(check.difference).toBe(0);
      }
    });

    it('a worker that fails mid-tile loses its tile to the others; one that returns NaN, too few values or values no decoder makes is convicted too: the video is the same', async () => {
      for (const harm of ['fail', 'nan', 'short', 'huge'] as const) {
        const { video, report } = await decodeVideo([
          worker('bad', (_, call) => (call === 0 ? harm : null)),
          worker('good'),
        ]);
        expect(report.retried).toBe(1);
        expect(convicted.map((c) => c.id)).toEqual(harm === 'fail' ? [] : ['bad']);
        if (harm === 'huge') expect(convicted[0].why).toMatch(/came with 1\.00e\+30 in channel \d, beyond the ±/);
        expect(
          defined(
            report.ranks.find((r) => r.worker === 'good'),
            'the good worker',
          ).tiles,
        ).toBeGreaterThan(0);
        expect(maxAbsDiff(video.data, alone)).toBe(0);
      }
    });

    it('a lone worker lost mid-decode costs a re-placement: its tile goes to the worker the next placement gives, and the video is the same (issue 34)', async () => {
      convicted = [];
      const lost = worker('lost', () => 'fail');
      const hosts = [lost];
      const judged: string[] = [];
      const { video, report } = await tiledDecoding({
        modelUrl: 'test',
        files: folderFiles(dir),
        config: cfg,
        tileHosts: () => Promise.resolve({ hosts, maxBufferBytes: Infinity }),
        convict: () => {
          throw new Error('nobody lied');
        },
        // its tab closed: the swarm lets it go, and another page joins
        lost(host, among, error) {
          judged.push(`${host.id} of ${among.map((h) => h.id).join()}: ${error.message}`);
          hosts.splice(0, hosts.length, worker('joined'));
          return Promise.resolve(true);
        },
        ep: 'wasm',
        timeoutMs: 60_000,
        tiling: TILING,
      }).decode(latent);
      expect(judged).toEqual(['lost of lost: worker lost is gone']);
      expect(report.retried).toBe(1);
      expect(report.ranks.map((r) => [r.worker, r.tiles])).toEqual([
        ['lost', 0],
        ['joined', 9],
      ]);
      expect(maxAbsDiff(defined(video, 'the video').data, alone)).toBe(0);
    });

    it('with the lost worker gone and nobody to place its tiles on, the decoding fails saying who failed and why nobody was placed', async () => {
      let round = 0;
      const error = await tiledDecoding({
        modelUrl: 'test',
        files: folderFiles(dir),
        config: cfg,
        tileHosts: () =>
          round++
            ? Promise.reject(new Error('0 workers joined within 1 s but 1 is needed'))
            : Promise.resolve({ hosts: [worker('lost', () => 'fail')], maxBufferBytes: Infinity }),
        convict: () => {},
        lost: () => Promise.resolve(true),
        ep: 'wasm',
        timeoutMs: 60_000,
        tiling: TILING,
      })
        .decode(latent)
        .catch((e: unknown) => e);
      expect((error as Error).message).toBe(
        'no worker left to decode the video on: 0 workers joined within 1 s but 1 is needed ' +
          '(worker lost: VAE tile 0,0 worker lost is gone)',
      );
    });

    it('a lone worker that returns poisoned frames is convicted, and the decoding fails naming it and the tile', async () => {
      convicted = [];
      const error = await decodeOn([worker('bad', () => 'nan')])
        .decode(latent)
        .catch((e: unknown) => e);
      expect((error as Error).message).toBe(
        'no worker to decode the video on: open a worker page, or ask for the latent (outputType "latent") ' +
          '(let go for wrong results: worker bad: VAE tile 0,0 came with NaN or infinite values (latent frames 0–1))',
      );
      expect(convicted.map((c) => c.id)).toEqual(['bad']);
    });

    it("a worker that paints its tiles, or its checks of others' tiles, is convicted by a checker and a third, and banned; the video is the honest one", async () => {
      for (const random of [() => 0, () => 0.99]) {
        const { video, report } = await decodeVideo([worker('a'), worker('liar', () => 'paint'), worker('c')], random);
        expect(maxAbsDiff(video.data, alone)).toBe(0);
        expect(convicted.map((c) => c.id)).toEqual(['liar']);
        // every check the liar took part in before it was let go convicted it alone, by a third's recomputation
        const verdicts = report.checks.filter((c) => c.verdict !== 'agreed');
        expect(verdicts.length).toBeGreaterThan(0);
        for (const v of verdicts) {
          expect(v.verdict).toMatchObject({ convicted: ['liar'] });
          expect([v.worker, v.checker]).toContain('liar');
          expect(v.third).not.toBeNull();
        }
        // no tile the liar decoded went into the video; every tile in it was checked
        expect(report.ranks.find((r) => r.worker === 'liar')?.tiles ?? 0).toBe(0);
        const stood = report.checks.filter(
          (c) => c.verdict === 'agreed' || (typeof c.verdict === 'object' && !c.verdict.convicted.includes(c.worker)),
        );
        expect(stood.map((c) => c.tile).sort()).toEqual(
          tilesOf(7, 8, TILING)
            .map((t) => `${t.row},${t.col}`)
            .sort(),
        );
      }
    });

    it("the decoder's output bound holds every honest tile's values, and is what its head can produce", async () => {
      const bound = decoderOutputBound(
        cfg,
        await (await openWanVae(folderFiles(dir))).decoderTensors(decoderHeadNames(cfg)),
      );
      expect(bound).toHaveLength(3);
      const tiles = tilesOf(7, 8, TILING);
      for (const t of tiles) {
        const frames = decodeTileReference(cfg, tensors, cutTile(latent, t));
        const plane = frames.height * frames.width;
        frames.data.forEach((v, i) => expect(Math.abs(v)).toBeLessThanOrEqual(bound[Math.floor(i / plane) % 3]));
      }
      // a bound from the head alone: conv_out's bias and its taps of a unit vector scaled by √C·γ
      const head = defined(tensors.get('decoder.conv_out.bias'), 'the bias').data;
      bound.forEach((b, o) => expect(b).toBeGreaterThan(Math.abs(head[o])));
      expect(Math.max(...bound)).toBeLessThan(1e3);
    });

    it("a run of a tile's latent frames continues only the tile that is open, where it stopped; after its last frames the tile is closed", async () => {
      const files = folderFiles(dir);
      const tiles = vaeTiles(() => unkeptModelFiles(files));
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

  describe('openWanVae', () => {
    it("counts the decoder's bytes in the file, and reads only the tensors asked for", async () => {
      const vae = await openWanVae(folderFiles(dir));
      const params = [...decoderWeightShapes(cfg).values()].reduce((n, shape) => n + sizeOf(shape), 0);
      expect(vae.decoderBytes).toBe(4 * params);
      const names = decoderHeadNames(cfg);
      const head = await vae.decoderTensors(names);
      expect([...head.keys()].sort()).toEqual([...names].sort());
      names.forEach((name) => expect(head.get(name)?.data).toEqual(tensors.get(name)?.data));
    });

    it('refuses a vae/ whose file holds only the encoder, saying whose it is not', async () => {
      const encoderOnly = mkdtempSync(join(tmpdir(), 'ditswarm-vae-encoder-'));
      try {
        mkdirSync(join(encoderOnly, 'vae'));
        copyFileSync(join(dir, VAE_CONFIG), join(encoderOnly, VAE_CONFIG));
        const conv1 = { shape: [1], data: Float32Array.of(1) };
        writeFileSync(join(encoderOnly, VAE_WEIGHTS), writeSafetensors(new Map([['encoder.conv1.weight', conv1]])));
        await expect(openWanVae(folderFiles(encoderOnly))).rejects.toThrow(
          `${VAE_WEIGHTS} holds no decoder tensors (decoder.*, post_quant_conv.*): it is not AutoencoderKLWan's, as ${VAE_CONFIG} says`,
        );
      } finally {
        rmSync(encoderOnly, { recursive: true, force: true });
      }
    });
  });

  describe("the decoder's weights, read in a worker's first call (issue 36)", () => {
    it("a worker says how far its reading is, up to the decoder's bytes, and reads them once; the coordinator's news, from its pulse, too", async () => {
      const tiles = vaeTiles(() => unkeptModelFiles(folderFiles(dir)));
      const part = cutTile(latent, { row: 0, col: 0, y: 0, x: 0, height: 4, width: 4 });
      const args = { modelUrl: 'test', ep: 'wasm' as const, tile: '0,0', from: 0, last: true, shape: part.shape };
      const seen: LoadStatus[] = [];
      await tiles.decode({ ...args, latent: part.data }, (s) => seen.push(s));
      // float32 in the file: the decoder's tensors as read, counted apart from the loader
      const decoderBytes = [...tensors.values()].reduce((n, t) => n + t.data.byteLength, 0);
      // a run of neighbouring tensors at a time, as the file lays them out
      const vae = await openCheckpoint(folderFiles(dir), 'vae', 'diffusion_pytorch_model');
      const runs = tensorRuns([...vae.tensors.values()].filter((e) => tensors.has(e.name)));
      expect(runs.length).toBeGreaterThan(1);
      expect(seen).toHaveLength(runs.length);
      expect(seen.every((s) => s.totalBytes === decoderBytes)).toBe(true);
      expect(seen.map((s) => s.bytes)).toEqual([...seen.map((s) => s.bytes)].sort((a, b) => a - b));
      expect(seen.at(-1)?.bytes).toBe(decoderBytes);
      // every byte read counts as fetched in a folder that keeps nothing: the tensors' and the header's
      expect(defined(seen.at(-1), 'the last status').networkBytes).toBeGreaterThan(decoderBytes);
      // the decoder stays while the folder and EP do: the next tile reads nothing
      seen.length = 0;
      await tiles.decode({ ...args, tile: '0,1', latent: part.data }, (s) => seen.push(s));
      expect(seen).toEqual([]);

      const load = { bytes: 1e8, totalBytes: 2.9e8, networkBytes: 1e8, elapsedMs: 1000, note: '' };
      const honest = worker('reading');
      const reading: TileHost = {
        id: 'reading',
        pulse: { load },
        api: {
          // a call that takes long enough for the coordinator's news to look at the pulse
          decodeTile: async (a, timeoutMs) => {
            await new Promise((r) => setTimeout(r, 1300));
            return honest.api.decodeTile(a, timeoutMs);
          },
        },
      };
      const news: string[] = [];
      await decodeOn([reading, worker('checker')], () => 0).decode(latent, {
        onProgress: (p) => news.push(describeDecodeProgress(p)),
      });
      expect(news).toContain(`tile 0 of 9; worker reading reading the decoder's weights: ${describeLoad(load)}`);
      expect(news.at(-1)).toBe('tile 9 of 9');
    });
  });
});
