// The VAE tiles a worker decodes (coordinator/vae-decoding.ts hands out a folder's tiles): the
// decoder's weights come through the browser's weight cache (post_quant_conv's and the decoder's
// tensors only, 290 MB of the published 508 MB) and stay while the folder and EP do; one tile is
// open at a time, its causal caches kept between the calls that bring its latent frames.
import { openWanVae } from '../core/model/wan-vae.ts';
import type { DecodedTile, DecodeTileArgs, ExecutionProvider, LoadStatus } from '../core/worker-api.ts';
import type { FolderFiles } from './text-layers.ts';
import { onnxVaeDecoder, type VaeTileDecoder, type VaeTileStream } from './vae-decoder.ts';
import { cachedModelFiles } from './weight-cache.ts';

export function vaeTiles(folder: FolderFiles = cachedModelFiles): {
  /** `onLoad` hears how far the reading of the decoder's weights is, where this call reads them */
  decode(
    args: Omit<DecodeTileArgs, 'ep'> & { ep: ExecutionProvider },
    onLoad?: (status: LoadStatus) => void,
  ): Promise<DecodedTile>;
} {
  let model: { key: string; decoder: VaeTileDecoder } | null = null;
  let open: { tile: string; stream: VaeTileStream } | null = null;
  return {
    async decode({ modelUrl, ep, tile, from, last, shape, latent }, onLoad) {
      const key = `${modelUrl} ${ep}`;
      if (model?.key !== key) {
        open?.stream.close();
        open = null;
        await model?.decoder.release();
        model = null;
        const started = performance.now();
        const files = folder(modelUrl);
        try {
          const vae = await openWanVae(files);
          const tensors = await vae.decoderTensors(undefined, (bytes, totalBytes) => {
            const { networkBytes, note } = files.source();
            onLoad?.({ bytes, totalBytes, networkBytes, note, elapsedMs: performance.now() - started });
          });
          model = { key, decoder: await onnxVaeDecoder(vae.config, tensors, ep) };
        } finally {
          await files.close();
        }
      }
      if (latent.length !== shape.reduce((a, b) => a * b, 1))
        throw new Error(
          `a tile's latent [${shape.join(',')}] needs ${shape.reduce((a, b) => a * b, 1)} values, got ${latent.length}`,
        );
      if (from === 0) {
        open?.stream.close();
        open = { tile, stream: model.decoder.open(shape[2], shape[3]) };
      } else if (open?.tile !== tile || open.stream.done !== from) {
        throw new Error(
          `tile ${tile} from latent frame ${from}: this worker has ` +
            (open ? `tile ${open.tile} open at latent frame ${open.stream.done}` : 'no tile open') +
            '; start the tile again from 0',
        );
      }
      const started = performance.now();
      const frames = await open.stream.next({ shape, data: latent });
      const { cacheBytes } = open.stream;
      // the tile's last latent frames: its caches (hundreds of MB on the GPU) go now, not at the next tile
      if (last) {
        open.stream.close();
        open = null;
      }
      return {
        frames: frames.data,
        shape: [frames.frames, frames.channels, frames.height, frames.width],
        computeMs: performance.now() - started,
        cacheBytes,
        weightBytes: model.decoder.weightBytes,
      };
    },
  };
}
