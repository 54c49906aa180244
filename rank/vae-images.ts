// The images a worker encodes for image-to-video jobs (coordinator/image-encoding.ts asks): the VAE
// encoder's weights (encoder.* and quant_conv.*) come through the browser's weight cache and stay
// while the folder and EP do, as the decoder's do for tiles (vae-tiles.ts); one image a call, whole.
import { spatialScale, openWanVae } from '../core/model/wan-vae.ts';
import { sizeOf } from '../core/tensor.ts';
import type { EncodedImage, EncodeImageArgs, ExecutionProvider, LoadStatus } from '../core/worker-api.ts';
import type { FolderFiles } from './text-layers.ts';
import { onnxVaeEncoder, type VaeEncoder } from './vae-encoder.ts';
import { cachedModelFiles } from './weight-cache.ts';

export function vaeImages(folder: FolderFiles = cachedModelFiles): {
  /** `onLoad` hears how far the reading of the encoder's weights is, where this call reads them */
  encode(
    args: Omit<EncodeImageArgs, 'ep'> & { ep: ExecutionProvider },
    onLoad?: (status: LoadStatus) => void,
  ): Promise<EncodedImage>;
} {
  let model: { key: string; encoder: VaeEncoder; scale: number } | null = null;
  return {
    async encode({ modelUrl, ep, shape, video }, onLoad) {
      const key = `${modelUrl} ${ep}`;
      if (model?.key !== key) {
        await model?.encoder.release();
        model = null;
        const started = performance.now();
        const files = folder(modelUrl);
        try {
          const vae = await openWanVae(files);
          const tensors = await vae.encoderTensors((bytes, totalBytes) => {
            const { networkBytes, note } = files.source();
            onLoad?.({ bytes, totalBytes, networkBytes, note, elapsedMs: performance.now() - started });
          });
          model = { key, encoder: await onnxVaeEncoder(vae.config, tensors, ep), scale: spatialScale(vae.config) };
        } finally {
          await files.close();
        }
      }
      const [channels, frames, height, width] = shape;
      if (channels !== 3 || frames !== 1 || height % model.scale || width % model.scale)
        throw new Error(
          `this VAE encodes an image [3, 1, H, W] with H and W multiples of ${model.scale}, got [${shape.join(',')}]`,
        );
      if (video.length !== sizeOf(shape))
        throw new Error(`an image [${shape.join(',')}] needs ${sizeOf(shape)} values, got ${video.length}`);
      const started = performance.now();
      const latent = await model.encoder.encode({ shape, data: video });
      return {
        latent: latent.data,
        shape: latent.shape,
        computeMs: performance.now() - started,
        weightBytes: model.encoder.weightBytes,
      };
    },
  };
}
