// What an image-to-video job's first latent frame must be, computed in Node: the image encoded by the TI2V folder's
// VAE as a worker encodes it (rank/vae-images.ts, on onnxruntime-web's wasm here), to hold the tabs' latents to.
import { encodeImageCondition, type ImageEncodingHost } from '../../coordinator/image-encoding.ts';
import { defined } from '../../core/defined.ts';
import { vaeImages } from '../../rank/vae-images.ts';
import { unkeptModelFiles } from '../../rank/weight-cache.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { decodePng } from '../../server/png.ts';
import { TINY_TI2V_MODEL_PATH } from './global-setup.ts';

/** `png`'s latent [48, 1, h, w] by global-setup's tiny TI2V folder, for a video of `size`. */
export async function nodeEncodedImage(
  png: Uint8Array,
  size: { height: number; width: number },
): Promise<Float32Array> {
  const dir = defined(process.env.DITSWARM_TI2V_DIR, "global-setup's TI2V folder");
  const images = vaeImages(() => unkeptModelFiles(folderFiles(dir)));
  const host: ImageEncodingHost = {
    id: 'node',
    pulse: null,
    api: { encodeImage: (args) => images.encode({ ...args, ep: 'wasm' }) },
  };
  const { latent } = await encodeImageCondition({
    host,
    modelUrl: TINY_TI2V_MODEL_PATH,
    files: folderFiles(dir),
    image: decodePng(png, 'the test image'),
    height: size.height,
    width: size.width,
    ep: 'wasm',
    timeoutMs: 60_000,
  });
  return latent.data;
}

/** The first frame [C, H, W] of a latent [C, T, H, W]. */
export function firstFrameOf(latent: Float32Array, [C, T, H, W]: number[]): Float32Array {
  const frame = new Float32Array(C * H * W);
  for (let c = 0; c < C; c++) frame.set(latent.subarray(c * T * H * W, c * T * H * W + H * W), c * H * W);
  return frame;
}
