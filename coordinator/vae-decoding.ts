// A job's latent through its folder's VAE, and where that happened. AutoencoderKLWan (Wan2.1's, or
// Wan2.2's, whose 2×2 patches are blended before they are unfolded, as diffusers does) decodes on
// the swarm's workers in diffusers' spatial tiles (wan-vae-tiling.ts: 256-pixel tiles every 192
// pixels, blended): the tiles are independent, so the live workers take them from one queue (a
// faster worker takes more), each a few latent frames per call with its causal caches kept between
// calls; the coordinator blends them. A worker that fails or leaves loses only its tile, which goes
// back to the queue for the others. Tiles are the same whoever decodes them, so any number of
// workers gives the same video; that also lets each tile be checked: another worker, drawn by a
// CSPRNG, decodes it again and a third decides a disagreement (part-check.ts). The VAE costs little
// next to the DiT's forwards, so every tile is checked, and a tile enters the video only once a
// check agreed with it; a reply beyond what the decoder can produce (decoderOutputBound) convicts
// its sender outright. A convicted worker is let go and banned, and its tiles decoded again.
// The tiny models' stand-in decoders run here, in the coordinator's page.

import { INSTEAD_OF } from '../core/job.ts';
import { MissingFile, type ModelFiles } from '../core/model/files.ts';
import {
  decodedFramesShape,
  decoderHeadNames,
  decoderOutputBound,
  decoderPlan,
  framesOfChunk,
  joinFrames,
  openWanVae,
  spatialScale,
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
import type { ExecutionProvider, WorkerApi } from '../core/worker-api.ts';
import { once } from '../core/model/wan-pipeline.ts';
import { watchLoad, type LoadingHost } from './load-news.ts';
import { itemsPerMessage } from './message-sizes.ts';
import { checkPart, PartBreach, type PartCheck } from './part-check.ts';

/** A tile a check judged (or a reply that convicted its worker at once), for the report. */
export type TileCheck = PartCheck & { tile: string };

/**
 * float32 rounding of conv_out's sums may carry an honest value a little past the decoder's exact bound: far less than
 * this fraction of it
 */
const OUTPUT_BOUND_SLACK = 1e-3;

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
  /** tiles started again on another worker after theirs failed, left or was convicted */
  retried: number;
  /** each tile's check, and the replies that convicted their worker at once */
  checks: TileCheck[];
}

export interface DecodeProgress {
  tilesDone: number;
  tiles: number;
  /** a worker reading the decoder's weights, and how far it is (describeLoad's words) */
  loading?: string;
}

/** A decoding's progress as news: the tiles in the video, and a worker's reading of the decoder's weights. */
export const describeDecodeProgress = ({ tilesDone, tiles, loading }: DecodeProgress): string =>
  `tile ${tilesDone} of ${tiles}${loading ? `; ${loading}` : ''}`;

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

/** A worker that can decode VAE tiles: its id and its API; its pulse says how far its reading of the weights is. */
export interface TileHost extends LoadingHost {
  id: string;
  api: Pick<Remote<WorkerApi>, 'decodeTile'>;
}

export interface TiledDecodingOptions<H extends TileHost = TileHost> {
  modelUrl: string;
  /** the folder: its vae/ must hold the decoder's weights, and its head's bound what a tile may hold */
  files: ModelFiles;
  config: WanVaeConfig;
  /** the workers to decode on and the largest buffer each of them allows (waits for at least one: planner.ts) */
  tileHosts(): Promise<{ hosts: H[]; maxBufferBytes: number }>;
  /** lets go and bans a worker a check convicted: the next `tileHosts` leave it out */
  convict(host: H, why: string): void;
  /**
   * a call failed: whether its worker is lost (it left, or does not answer), which costs a re-placement, its tiles
   * going to the live workers (Placer.lostOutsideSteps); none: a failed worker only sits out the round
   */
  lost?(host: H, among: H[], error: Error): Promise<boolean>;
  /** uniform in [0, 1), drawing who checks which tile: a CSPRNG unless a test gives its own */
  random?: () => number;
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
          checks: [],
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

/**
 * diffusers' tiles, halved (tile and stride) until a tile's largest tensor fits the workers' buffers; a tile of
 * so many video pixels is that many over the VAE's spatial scale in latent pixels (8, Wan2.2's 16).
 */
export function chooseTiling(cfg: WanVaeConfig, maxBufferBytes: number): Tiling & { why: string } {
  const latentPixels = (videoPixels: number) => videoPixels / spatialScale(cfg);
  let tiling = { tile: TILE_PIXELS, stride: TILE_STRIDE_PIXELS };
  while (tiling.tile > 64 && largestTileTensorBytes(cfg, latentPixels(tiling.tile)) > maxBufferBytes)
    tiling = { tile: tiling.tile / 2, stride: tiling.stride / 2 };
  const why =
    tiling.tile === TILE_PIXELS
      ? "diffusers' tiles"
      : `diffusers' ${TILE_PIXELS}-pixel tiles need a ` +
        `${(largestTileTensorBytes(cfg, latentPixels(TILE_PIXELS)) / 2 ** 20).toFixed(0)} MiB buffer; ` +
        `the workers allow ${(maxBufferBytes / 2 ** 20).toFixed(0)} MiB`;
  return { ...tiling, why };
}

export function tiledDecoding<H extends TileHost>(o: TiledDecodingOptions<H>): VideoDecoding {
  /** per channel the decoder makes (RGB, or RGB per patch pixel), the largest magnitude an honest value can have */
  const outputBound = once(async () =>
    decoderOutputBound(o.config, await (await openWanVae(o.files)).decoderTensors(decoderHeadNames(o.config))).map(
      (b) => b * (1 + OUTPUT_BOUND_SLACK),
    ),
  );
  const decodeTiles = async (latent: Tensor, { ep = o.ep, onProgress }: DecodeOptions) => {
    const started = performance.now();
    const [C, T, h, w] = latent.shape;
    if (C !== o.config.zDim || latent.data.length !== sizeOf(latent.shape))
      throw new Error(
        `the VAE decodes latents [${o.config.zDim}, T, h, w], ` +
          `got [${latent.shape.join()}] with ${latent.data.length} values`,
      );
    const placed = await o.tileHosts();
    const bound = await outputBound();
    // tiles shrink until the workers' smallest buffer holds them
    const tiling = o.tiling ? { ...o.tiling, why: 'as asked' } : chooseTiling(o.config, placed.maxBufferBytes);
    const tiles = tilesOf(h, w, tiling, o.config.patchSize);
    const decoded = new Array<Frames>(tiles.length);
    const queue = tiles.map((_, i) => i);
    const ranks = new Map<string, DecodeReport['ranks'][number]>();
    const checks: TileCheck[] = [];
    const convicted = new Map<string, string>();
    let retried = 0;
    let tilesDone = 0;
    /** workers lost in this round: their tiles wait for the next round's workers */
    let lostInRound = 0;
    const failures: string[] = [];
    /** each worker's last call: a worker holds one tile open at a time, so its decodes and checks take turns */
    const busy = new Map<string, Promise<unknown>>();
    const rankOf = (host: H) => {
      const rank = ranks.get(host.id) ?? {
        worker: host.id,
        tiles: 0,
        computeMs: 0,
        bytesSent: 0,
        weightBytes: 0,
        cacheBytes: 0,
      };
      ranks.set(host.id, rank);
      return rank;
    };
    const convict = (host: H, why: string) => {
      if (convicted.has(host.id)) return;
      convicted.set(host.id, why);
      o.convict(host, why);
    };
    const nameOf = (index: number) => `${tiles[index].row},${tiles[index].col}`;

    /**
     * One tile on one worker, a few latent frames per call (the frames of a call fit one message), once the worker is
     * done with its other tile; a PartBreach where a reply is not what the decoder makes.
     */
    const decodeOn = (host: H, index: number): Promise<Frames> => {
      const run = async () => {
        const rank = rankOf(host);
        const tile = tiles[index];
        const part = cutTile(latent, tile);
        const framesShape = (frames: number, first: boolean) =>
          decodedFramesShape(o.config, { frames, height: tile.height, width: tile.width, first });
        const step = itemsPerMessage(sizeOf(framesShape(1, false)));
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
          // the decoder's weights are read in the worker's first call (0.3 GB of Wan's VAE): its pulse says how far
          const stopLoadNews =
            onProgress &&
            watchLoad(host, (load) =>
              onProgress({
                tilesDone,
                tiles: tiles.length,
                loading: `worker ${host.id} reading the decoder's weights: ${load}`,
              }),
            );
          const got = await host.api
            .decodeTile(
              {
                modelUrl: o.modelUrl,
                ep,
                tile: nameOf(index),
                from,
                last: from + n === T,
                shape: [C, n, tile.height, tile.width],
                latent: frames,
              },
              o.timeoutMs,
            )
            .finally(stopLoadNews);
          const expected = framesShape(n, from === 0);
          const what = `latent frames ${from}–${from + n - 1}`;
          if (got.shape.join() !== expected.join() || got.frames.length !== sizeOf(expected))
            throw new PartBreach(
              `came as [${got.shape.join()}] with ${got.frames.length} values, not [${expected.join()}] (${what})`,
            );
          const [frameCount, channels, height, width] = expected;
          checkFrames(got.frames, height * width, bound, what);
          parts.push({ frames: frameCount, channels, height, width, data: got.frames });
          rank.computeMs += got.computeMs;
          rank.bytesSent += got.frames.byteLength;
          rank.weightBytes = got.weightBytes;
          rank.cacheBytes = Math.max(rank.cacheBytes, got.cacheBytes);
        }
        return joinFrames(parts);
      };
      const turn = (busy.get(host.id) ?? Promise.resolve()).then(run);
      busy.set(
        host.id,
        turn.catch(() => {}),
      );
      return turn;
    };

    /** A decoded tile enters the video once another worker's decoding of it agrees; else it goes back to the queue. */
    const checkTile = async (host: H, index: number, frames: Frames, pool: H[]) => {
      const checked = await checkPart({
        what: `VAE tile ${nameOf(index)}`,
        worker: host,
        part: frames.data,
        hosts: pool.filter((p) => !convicted.has(p.id)),
        recompute: async (checker) => (await decodeOn(checker, index)).data,
        random: o.random,
      });
      checks.push({ ...checked.check, tile: nameOf(index) });
      for (const c of checked.convicted) convict(c.host, c.why);
      if (!checked.stands) {
        queue.push(index);
        retried++;
        return;
      }
      decoded[index] = frames;
      rankOf(host).tiles++;
      onProgress?.({ tilesDone: ++tilesDone, tiles: tiles.length });
    };

    const worker = async (host: H, pool: H[], pending: Promise<void>[]) => {
      for (let index = queue.shift(); index !== undefined; index = queue.shift()) {
        if (convicted.has(host.id)) {
          queue.unshift(index);
          return;
        }
        let frames: Frames;
        try {
          frames = await decodeOn(host, index);
        } catch (e) {
          // this worker is done with: its tile goes back for the others
          queue.unshift(index);
          retried++;
          const why = `VAE tile ${nameOf(index)} ${(e as Error).message}`;
          failures.push(`worker ${host.id}: ${why}`);
          if (!(e instanceof PartBreach)) {
            if (await o.lost?.(host, pool, e as Error)) lostInRound++;
          } else {
            checks.push({
              worker: host.id,
              checker: null,
              third: null,
              difference: null,
              verdict: { convicted: [host.id], why },
              tile: nameOf(index),
            });
            convict(host, why);
          }
          return;
        }
        pending.push(checkTile(host, index, frames, pool));
      }
    };
    // every live worker takes tiles; when all of them failed with tiles left, those still live are asked again
    for (let round = 0; queue.length; round++) {
      let next: typeof placed;
      try {
        next = round === 0 ? placed : await o.tileHosts();
      } catch (e) {
        // nobody left to decode on: the job fails saying who failed and why
        if (!failures.length) throw e;
        throw new Error(`no worker left to decode the video on: ${(e as Error).message} (${failures.join('; ')})`, {
          cause: e,
        });
      }
      const hosts = next.hosts.filter((host) => !convicted.has(host.id));
      lostInRound = 0;
      if (!hosts.length)
        throw new Error(
          'no worker to decode the video on: open a worker page, or ask for the latent (outputType "latent")' +
            (convicted.size
              ? ` (let go for wrong results: ${[...convicted].map(([id, why]) => `worker ${id}: ${why}`).join('; ')})`
              : ''),
        );
      const [doneBefore, convictedBefore] = [tilesDone, convicted.size];
      const pending: Promise<void>[] = [];
      await Promise.all(hosts.map((host) => worker(host, hosts, pending)));
      await Promise.all(pending);
      if (queue.length && tilesDone === doneBefore && convicted.size === convictedBefore && !lostInRound)
        throw new Error(
          `no worker could decode VAE tile ${nameOf(queue[0])}: ` + failures.slice(-hosts.length).join('; '),
        );
    }
    const video = blendTiles(tiles, decoded, h, w, tiling, o.config.patchSize);
    return {
      video,
      report: {
        where: 'workers' as const,
        tiling,
        tiles: tiles.length,
        ms: performance.now() - started,
        ranks: [...ranks.values()],
        retried,
        checks,
      },
    };
  };
  return {
    async ready() {
      try {
        await openWanVae(o.files);
      } catch (e) {
        throw e instanceof MissingFile ? new MissingFile(`the VAE cannot decode: ${e.message}; ${INSTEAD_OF.vae}`) : e;
      }
    },
    async decode(latent, options = {}) {
      const { video, report } = await decodeTiles(latent, options);
      return { frames: displayFrames(video), video, report };
    },
  };
}

/**
 * Frames [F, C, H, W] of a tile are finite and within what the decoder can produce in each of its C channels
 * (`bound`: 3, or Wan2.2's 12 patch channels).
 */
function checkFrames(frames: Float32Array, plane: number, bound: number[], what: string): void {
  for (let i = 0; i < frames.length; i++) {
    const v = frames[i];
    if (!Number.isFinite(v)) throw new PartBreach(`came with NaN or infinite values (${what})`);
    const channel = Math.floor(i / plane) % bound.length;
    if (Math.abs(v) > bound[channel])
      throw new PartBreach(
        `came with ${v.toExponential(2)} in channel ${channel}, beyond the ±${bound[channel].toExponential(2)} ` +
          `the decoder can produce (${what})`,
      );
  }
}

/** A video [3, F, H, W] in [−1, 1] as the frames a video file shows, [0, 1] (diffusers' postprocess_video). */
export function displayFrames(video: Tensor): DecodedVideo {
  const [, count, height, width] = video.shape;
  return { count, height, width, rgb: video.data.map((v) => Math.min(1, Math.max(0, v / 2 + 0.5))) };
}
