// The text encoder's layers a worker runs (coordinator/text-encoding.ts gives each worker a run of
// umT5's layers and passes the prompt's hidden states along). Weights come through the browser's
// weight cache, a layer at a time; a worker keeps the layers it ran while they fit
// HELD_LAYER_BYTES — with the transformer's 5.7 GB beside them — and reads the others again next
// time (from disk: the cache kept them). Float32 compute: T5's activations overflow float16.
import {
  openUmt5,
  relativePositionBuckets,
  runLayers,
  type Umt5Config,
  type Umt5LayerWeights,
} from '../core/model/umt5.ts';
import type { EncodedText, EncodeTextArgs, ExecutionProvider, LoadStatus } from '../core/worker-api.ts';
import { onnxUmt5Layers, type Umt5LayerRunner } from './umt5-layers.ts';
import { cachedModelFiles, type CachedModelFiles } from './weight-cache.ts';

/** umT5-XXL's layer is 0.77 GB: two or three of them stay */
export const HELD_LAYER_BYTES = 2.5e9;

/** A model folder's files for one call, closed after it (a page's: through its weight cache). */
export type FolderFiles = (modelUrl: string) => CachedModelFiles;

export function textLayers(folder: FolderFiles = cachedModelFiles): {
  /** `onLoad` hears how far the reading of the layers this worker does not hold has got, a layer at a time */
  encode(
    args: Omit<EncodeTextArgs, 'ep'> & { ep: ExecutionProvider },
    onLoad?: (status: LoadStatus) => void,
  ): Promise<EncodedText>;
} {
  let model: { key: string; config: Umt5Config; runner: Umt5LayerRunner; held: Map<number, Umt5LayerWeights> } | null =
    null;
  return {
    async encode({ modelUrl, ep, from, to, tokens, hidden }, onLoad) {
      const started = performance.now();
      const files = folder(modelUrl);
      try {
        const encoder = await openUmt5(files);
        const { config } = encoder;
        if (!(from < to && to <= config.numLayers))
          throw new Error(`the text encoder has layers 0–${config.numLayers - 1}: cannot run [${from}, ${to})`);
        if (hidden.length !== tokens * config.dModel)
          throw new Error(`hidden states must be [${tokens}, ${config.dModel}], got ${hidden.length} values`);
        const key = `${modelUrl} ${ep}`;
        if (model?.key !== key) {
          await model?.runner.release();
          model = { key, config, runner: await onnxUmt5Layers(config, ep), held: new Map() };
        }
        const { runner, held } = model;
        // a new run of layers for this worker: the ones it no longer runs go
        for (const layer of held.keys()) if (layer < from || layer >= to) held.delete(layer);
        const layerMs: number[] = [];
        let layersRead = 0;
        const toRead = Array.from({ length: to - from }, (_, i) => from + i).filter((layer) => !held.has(layer));
        const load = { bytes: 0, totalBytes: toRead.reduce((sum, layer) => sum + encoder.layerBytes(layer), 0) };
        const weightsOf = async (layer: number) => {
          const kept = held.get(layer);
          if (kept) return kept;
          const weights = await encoder.layer(layer);
          layersRead++;
          load.bytes += encoder.layerBytes(layer);
          const { networkBytes, note } = files.source();
          onLoad?.({ ...load, networkBytes, note, elapsedMs: performance.now() - started });
          const bytes = Object.values(weights).reduce((sum, w) => sum + w.byteLength, 0);
          if ((held.size + 1) * bytes <= HELD_LAYER_BYTES) held.set(layer, weights);
          return weights;
        };
        const buckets = relativePositionBuckets(tokens, config.numBuckets, config.maxDistance);
        hidden = await runLayers({ from, to }, hidden, buckets, weightsOf, runner.run, (_, ms) => layerMs.push(ms));
        return { hidden, layerMs, layersRead };
      } finally {
        await files.close();
      }
    },
  };
}
