// A job's latent through its folder's VAE, and where that happened. Wan2.1's decoder (AutoencoderKLWan)
// decodes on the swarm's workers in diffusers' spatial tiles (wan-vae-tiling.ts: 256-pixel tiles every 192
// pixels, blended): the tiles are independent, so the live workers take them from one queue (a
// faster worker takes more), each a few latent frames per call with its causal caches kept between
// calls; the coordinator blends them. A worker that fails or leaves loses only its tile, which goes
// back to the queue for the others. Tiles are the same whoever decodes them, so any number of
// workers gives the same video. The tiny models' stand-in decoders run here, in the coordinator's page.

import { MissingFile, type ModelFiles } from '../core/model/files.ts';
import {
  decoderPlan,
  framesOfChunk,
  joinFrames,
  openWanVae,
  type Frames,
  type WanVaeConfig,
} from '../core/model/wan-vae.ts';
import {
  blendTiles,
  cutTile,
  TILE_PIXELS,
  TILE_STRIDE_PIXELS,
  tilesOf,
  type Tiling,
} from '../core/model/wan-vae-tiling.ts';
import type { DecodedVideo } from '../core/model/vae-decoder.ts';
import type { Remote } from '../core/net/rpc.ts';
import { sizeOf, type Tensor } from '../core/tensor.ts';
import { MAX_MESSAGE_FLOATS, type ExecutionProvider, type WorkerApi } from '../core/worker-api.ts';

/** How the latent became frames, for the report. */
export interface DecodeReport {
  /** the stand-in decoder in this page, or AutoencoderKLWan's tiles on the workers */
  where: 'coordinator' | 'workers';
  /** tile and stride in video pixels, and why smaller than diffusers' where they are */
  tiling: (Tiling & { why: string }) | null;
  tiles: number;
  ms: number;
  /**
   * each worker's share: tiles decoded, compute time, bytes of frames it sent, its decoder's weights
   * and a tile's causal caches
   */
  ranks: {
    worker: string;
    tiles: number;
    computeMs: number;
    bytesSent: number;
    weightBytes: number;
    cacheBytes: number;
  }[];
  /** tiles started again on another worker after theirs failed or left */
  retried: number;
}

export interface DecodeProgress {
  tilesDone: number;
  tiles: number;
}

export interface DecodeOptions {
  /** where the workers compute (the job's EP); the decoding's own otherwise */
  ep?: ExecutionProvider | 'auto';
  onProgress?: (p: DecodeProgress) => void;
}

export interface DecodeResult {
  frames: DecodedVideo;
  video: Tensor | null;
  report: DecodeReport;
}

export interface VideoDecoding {
  /** refuses what cannot decode (a folder without the VAE's weights, say) before a job starts */
  ready(): Promise<void>;
  /**
   * latent [z, T, h, w] → frames in [0, 1] for the video file, the VAE's own output [3, F, H, W] in
   * [−1, 1] (null for a stand-in), and how it went
   */
  decode(latent: Tensor, options?: DecodeOptions): Promise<DecodeResult>;
}

/** A worker that can decode VAE tiles: its id and its API. */
export interface TileHost {
  id: string;
  api: Pick<Remote<WorkerApi>, 'decodeTile'>;
}

export interface TiledDecodingOptions {
  modelUrl: string;
  /** the folder, read here only to check that its vae/ holds the decoder's weights */
  files: ModelFiles;
  config: WanVaeConfig;
  /** the workers to decode on and the largest buffer each of them allows (waits for at least one: planner.ts) */
  tileHosts(): Promise<{ hosts: TileHost[]; maxBufferBytes: number }>;
  /** unless a decode asks for another */
  ep: ExecutionProvider | 'auto';
  /** how long one call may take: the first reads the decoder's weights */
  timeoutMs: number;
  /** tiles other than diffusers' (tests: many tiles of a small latent) */
  tiling?: Tiling;
}

/** The stand-in decoders of the tiny models, in this page. */
export function standInDecoding(load: () => Promise<(latent: Tensor) => DecodedVideo>): VideoDecoding {
  return {
    async ready() {
      await load();
    },
    async decode(latent) {
      const started = performance.now();
      const frames = (await load())(latent);
      return {
        frames,
        video: null,
        report: {
          where: 'coordinator',
          tiling: null,
          tiles: 1,
          ms: performance.now() - started,
          ranks: [],
          retried: 0,
        },
      };
    },
  };
}

/** The largest tensor a tile's later chunk makes: an upsampling's output (4 frames, twice the side), in bytes. */
export function largestTileTensorBytes(cfg: WanVaeConfig, tileLatentPixels: number): number {
  const frames = framesOfChunk(cfg, false);
  let side = tileLatentPixels;
  let largest = 0;
  for (const layer of decoderPlan(cfg).layers)
    if (layer.kind === 'upsample') largest = Math.max(largest, 4 * frames * layer.dim * (side *= 2) ** 2);
  return largest;
}

/** diffusers' tiles, halved (tile and stride) until a tile's largest tensor fits the workers' buffers. */
export function chooseTiling(cfg: WanVaeConfig, maxBufferBytes: number): Tiling & { why: string } {
  let tiling = { tile: TILE_PIXELS, stride: TILE_STRIDE_PIXELS };
  while (tiling.tile > 64 && largestTileTensorBytes(cfg, tiling.tile / 8) > maxBufferBytes)
    tiling = { tile: tiling.tile / 2, stride: tiling.stride / 2 };
  const why =
    tiling.tile === TILE_PIXELS
      ? "diffusers' tiles"
      : `diffusers' ${TILE_PIXELS}-pixel tiles need a ` +
        `${(largestTileTensorBytes(cfg, TILE_PIXELS / 8) / 2 ** 20).toFixed(0)} MiB buffer; ` +
        `the workers allow ${(maxBufferBytes / 2 ** 20).toFixed(0)} MiB`;
  return { ...tiling, why };
}

export function tiledDecoding(o: TiledDecodingOptions): VideoDecoding {
  const decodeTiles = async (latent: Tensor, { ep = o.ep, onProgress }: DecodeOptions) => {
    const started = performance.now();
    const [C, T, h, w] = latent.shape;
    if (C !== o.config.zDim || latent.data.length !== sizeOf(latent.shape))
      throw new Error(
        `the VAE decodes latents [${o.config.zDim}, T, h, w], ` +
          `got [${latent.shape.join()}] with ${latent.data.length} values`,
      );
    const placed = await o.tileHosts();
    // tiles shrink until the workers' smallest buffer holds them
    const tiling = o.tiling ? { ...o.tiling, why: 'as asked' } : chooseTiling(o.config, placed.maxBufferBytes);
    const tiles = tilesOf(h, w, tiling);
    const decoded = new Array<Frames>(tiles.length);
    const queue = tiles.map((_, i) => i);
    const ranks = new Map<string, DecodeReport['ranks'][number]>();
    let retried = 0;
    let tilesDone = 0;
    const failures: string[] = [];

    /** one tile on one worker, a few latent frames per call: the frames of a call fit one message */
    const decodeOn = async (host: TileHost, index: number, rank: DecodeReport['ranks'][number]) => {
      const tile = tiles[index];
      const part = cutTile(latent, tile);
      const perLatentFrame = 3 * framesOfChunk(o.config, false) * 64 * tile.height * tile.width;
      const step = Math.max(1, Math.floor(MAX_MESSAGE_FLOATS / perLatentFrame));
      const parts: Frames[] = [];
      const plane = C * tile.height * tile.width;
      for (let from = 0; from < T; from += step) {
        const n = Math.min(step, T - from);
        const frames = new Float32Array(plane * n);
        for (let c = 0; c < C; c++)
          frames.set(
            part.data.subarray(
              (c * T + from) * tile.height * tile.width,
              (c * T + from + n) * tile.height * tile.width,
            ),
            c * n * tile.height * tile.width,
          );
        const got = await host.api.decodeTile(
          {
            modelUrl: o.modelUrl,
            ep,
            tile: `${tile.row},${tile.col}`,
            from,
            last: from + n === T,
            shape: [C, n, tile.height, tile.width],
            latent: frames,
          },
          o.timeoutMs,
        );
        const expected = [
          from === 0 ? 1 + framesOfChunk(o.config, false) * (n - 1) : framesOfChunk(o.config, false) * n,
          3,
          8 * tile.height,
          8 * tile.width,
        ];
        const what = `tile ${tile.row},${tile.col}'s latent frames ${from}–${from + n - 1}`;
        if (got.shape.join() !== expected.join() || got.frames.length !== sizeOf(expected))
          throw new Error(
            `returned ${what} as [${got.shape.join()}] with ${got.frames.length} values, not [${expected.join()}]`,
          );
        if (!got.frames.every(Number.isFinite)) throw new Error(`returned ${what} with NaN or infinite values`);
        parts.push({ frames: expected[0], channels: 3, height: expected[2], width: expected[3], data: got.frames });
        rank.computeMs += got.computeMs;
        rank.bytesSent += got.frames.byteLength;
        rank.weightBytes = got.weightBytes;
        rank.cacheBytes = Math.max(rank.cacheBytes, got.cacheBytes);
      }
      decoded[index] = joinFrames(parts);
    };

    const worker = async (host: TileHost) => {
      const rank = ranks.get(host.id) ?? {
        worker: host.id,
        tiles: 0,
        computeMs: 0,
        bytesSent: 0,
        weightBytes: 0,
        cacheBytes: 0,
      };
      ranks.set(host.id, rank);
      for (let index = queue.shift(); index !== undefined; index = queue.shift()) {
        try {
          await decodeOn(host, index, rank);
        } catch (e) {
          // this worker is done with: its tile goes back for the others
          queue.unshift(index);
          retried++;
          failures.push(`worker ${host.id}: ${(e as Error).message}`);
          return;
        }
        rank.tiles++;
        onProgress?.({ tilesDone: ++tilesDone, tiles: tiles.length });
      }
    };
    // every live worker takes tiles; when all of them failed with tiles left, those still live are asked again
    for (let round = 0; queue.length; round++) {
      const { hosts } = round === 0 ? placed : await o.tileHosts();
      if (!hosts.length)
        throw new Error(
          'no worker to decode the video on: open a worker page, or ask for the latent (outputType "latent")',
        );
      const before = queue.length;
      await Promise.all(hosts.map(worker));
      if (queue.length && queue.length === before)
        throw new Error(
          `no worker could decode VAE tile ${tiles[queue[0]].row},${tiles[queue[0]].col}: ` +
            failures.slice(-hosts.length).join('; '),
        );
    }
    const video = blendTiles(tiles, decoded, h, w, tiling);
    return {
      video,
      report: {
        where: 'workers' as const,
        tiling,
        tiles: tiles.length,
        ms: performance.now() - started,
        ranks: [...ranks.values()],
        retried,
      },
    };
  };
  return {
    async ready() {
      try {
        await openWanVae(o.files);
      } catch (e) {
        throw e instanceof MissingFile
          ? new MissingFile(
              `the VAE cannot decode: ${e.message}; ask for the latent instead ` +
                "(outputType 'latent'; --output-type latent with npm run generate)",
            )
          : e;
      }
    },
    async decode(latent, options = {}) {
      const { video, report } = await decodeTiles(latent, options);
      return { frames: displayFrames(video), video, report };
    },
  };
}

/** A video [3, F, H, W] in [−1, 1] as the frames a video file shows, [0, 1] (diffusers' postprocess_video). */
export function displayFrames(video: Tensor): DecodedVideo {
  const [, count, height, width] = video.shape;
  return { count, height, width, rgb: video.data.map((v) => Math.min(1, Math.max(0, v / 2 + 0.5))) };
}
