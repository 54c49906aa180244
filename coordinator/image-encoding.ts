// The image of an image-to-video job as the latent its first frame is held to: the image made the
// VAE's input here (core/model/image-condition.ts: diffusers' resize and normalisation), encoded on
// one worker by the folder's VAE encoder (rank/vae-images.ts), and the reply judged here before
// anything uses it: exactly the latent the asked size makes ([z_dim, 1, H/16, W/16]; Wan2.1's H/8),
// every value finite and within what the encoder can produce from any image (encodedLatentBound).
// A reply that is not is a PartBreach naming its worker: the caller lets it go and asks another.
// One image is one call, untiled, as diffusers' pipeline encodes it; no second worker checks it
// (a few seconds of one worker's time, once a job).

import type { ModelFiles } from '../core/model/files.ts';
import { imageConditionVideo, type RgbaImage } from '../core/model/image-condition.ts';
import { encodedLatentBound, encoderHeadNames, openWanVae, spatialScale } from '../core/model/wan-vae.ts';
import type { Remote } from '../core/net/rpc.ts';
import { sizeOf, type Tensor } from '../core/tensor.ts';
import type { ExecutionProvider, WorkerApi } from '../core/worker-api.ts';
import { watchLoad, type LoadingHost } from './load-news.ts';
import { PartBreach } from './part-check.ts';

/**
 * float32 rounding of quant_conv's and conv_out's sums may carry an honest value a little past the encoder's exact
 * bound: far less than this fraction of it
 */
const LATENT_BOUND_SLACK = 1e-3;

/** A worker that can encode an image: its id and its API; its pulse says how far its reading of the weights is. */
export interface ImageEncodingHost extends LoadingHost {
  id: string;
  api: Pick<Remote<WorkerApi>, 'encodeImage'>;
}

/** A worker's encoded image that no honest encoder makes (its size, NaN, beyond the bound): its sender, by id. */
export class ImageEncodingBreach extends PartBreach {
  override name = 'ImageEncodingBreach';
  constructor(
    readonly worker: string,
    readonly why: string,
  ) {
    super(`worker ${worker}'s encoded image ${why}; let it go and encode on another worker`);
  }
}

export interface ImageConditionOptions<H extends ImageEncodingHost = ImageEncodingHost> {
  host: H;
  modelUrl: string;
  /** the folder: its vae/ holds the encoder, whose head bounds what the latent may hold */
  files: ModelFiles;
  /** the image as a canvas holds it (ImageData) */
  image: RgbaImage;
  /** the job's video size: the image is stretched to it, as diffusers' pipeline does */
  height: number;
  width: number;
  ep: ExecutionProvider | 'auto';
  /** how long the call may take: the first reads the encoder's weights */
  timeoutMs: number;
  /** how far the worker's reading of the encoder's weights is, in describeLoad's words */
  onLoading?: (news: string) => void;
}

export interface ImageCondition {
  /** the image's latent [z_dim, 1, height/16, width/16], normalised as the pipeline conditions with it */
  latent: Tensor;
  /** who encoded it and what it cost */
  report: { worker: string; ms: number; computeMs: number; weightBytes: number };
}

/**
 * An image-to-video job's image, encoded on `host` into the latent of its first frame (diffusers'
 * WanImageToVideoPipeline.prepare_latents: the posterior's mode, (latent − latents_mean) / latents_std).
 * Throws an Error for a size the VAE cannot take or an image that cannot be read, before any call;
 * an ImageEncodingBreach for a reply no honest worker sends; the call's own error where it fails.
 */
export async function encodeImageCondition<H extends ImageEncodingHost>(
  o: ImageConditionOptions<H>,
): Promise<ImageCondition> {
  const started = performance.now();
  const vae = await openWanVae(o.files);
  const { config: cfg } = vae;
  const scale = spatialScale(cfg);
  if (o.height % scale || o.width % scale || o.height < scale || o.width < scale)
    throw new Error(
      `this VAE encodes an image into latent pixels of ${scale}×${scale}: ` +
        `the video's ${o.width}×${o.height} must be multiples of ${scale} each way`,
    );
  const video = imageConditionVideo(o.image, { height: o.height, width: o.width });
  const expected = [cfg.zDim, 1, o.height / scale, o.width / scale];
  const bound = encodedLatentBound(cfg, await vae.encoderTensors(undefined, encoderHeadNames(cfg))).map(
    (b) => b * (1 + LATENT_BOUND_SLACK),
  );
  const stopLoadNews =
    o.onLoading &&
    watchLoad(o.host, (load) => o.onLoading?.(`worker ${o.host.id} reading the VAE encoder's weights: ${load}`));
  const got = await o.host.api
    .encodeImage({ modelUrl: o.modelUrl, ep: o.ep, shape: video.shape, video: video.data }, o.timeoutMs)
    .finally(stopLoadNews);
  if (got.shape.join() !== expected.join() || got.latent.length !== sizeOf(expected))
    throw new ImageEncodingBreach(
      o.host.id,
      `came as [${got.shape.join()}] with ${got.latent.length} values, not the [${expected.join()}] ` +
        `of a ${o.width}×${o.height} image`,
    );
  checkLatent(o.host.id, got.latent, expected[2] * expected[3], bound);
  return {
    latent: { shape: expected, data: got.latent },
    report: {
      worker: o.host.id,
      ms: performance.now() - started,
      computeMs: got.computeMs,
      weightBytes: got.weightBytes,
    },
  };
}

/** A latent [z_dim, 1, h, w] is finite and within the encoder's bound in each channel. */
function checkLatent(worker: string, latent: Float32Array, plane: number, bound: number[]): void {
  for (let i = 0; i < latent.length; i++) {
    const v = latent[i];
    const channel = Math.floor(i / plane);
    if (!Number.isFinite(v)) throw new ImageEncodingBreach(worker, `came with ${v} in channel ${channel}`);
    if (Math.abs(v) > bound[channel])
      throw new ImageEncodingBreach(
        worker,
        `came with ${v.toExponential(2)} in channel ${channel}, beyond the ±${bound[channel].toExponential(2)} ` +
          'the encoder can produce',
      );
  }
}
