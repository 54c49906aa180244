// A job's prompts through its folder's text encoder, and where that happened. The published
// folders' umT5-XXL encoder is 22.7 GB, more than any tab holds: the coordinator tokenizes the
// prompt and reads its embedding rows and the final norm (a few KB, by Range requests), and the 24
// layers run on the swarm's workers, split into contiguous runs, the [T, 4096] hidden state passed
// from one worker to the next through the coordinator (16 KB a token). A lone worker runs them all,
// streaming the layers it cannot keep. Encoded prompts are kept by model, prompt and max length
// (PromptCache: the dashboard's IndexedDB), so a repeated prompt is not encoded twice.
// The tiny models' stand-in encoder runs here, in the coordinator's page.

import { MissingFile, readJson, type ModelFiles } from '../core/model/files.ts';
import type { TextEncoder } from '../core/model/text-encoder.ts';
import { Umt5Tokenizer } from '../core/model/umt5-tokenizer.ts';
import { openUmt5, padPromptEmbeds, umt5FinalNorm } from '../core/model/umt5.ts';
import { once } from '../core/model/wan-pipeline.ts';
import type { Remote } from '../core/net/rpc.ts';
import type { ExecutionProvider, WorkerApi } from '../core/worker-api.ts';

/** How one prompt became its embedding, for the report. */
export interface PromptEncoding {
  /** given by the caller (promptEmbeds), encoded now, or found encoded in the cache */
  source: 'given' | 'encoded' | 'cache';
  /** the prompt's tokens, </s> included (null: given, or the stand-in's) */
  tokens: number | null;
  /** longer than the max length: cut to it, as the pipeline does */
  truncated: boolean;
  ms: number;
  /** which worker ran which layers [from, to), how long their compute took, how many it had to read */
  layers: { worker: string; from: number; to: number; computeMs: number; layersRead: number }[];
}

/** Encoded prompts by key: the last hidden state [T, d_model] before padding, and whether it was cut. */
export interface PromptCache {
  get(key: string): Promise<{ hidden: Float32Array; truncated: boolean } | undefined>;
  put(key: string, value: { hidden: Float32Array; truncated: boolean }): Promise<void>;
}

export interface TextEncoding {
  /** the prompt as the transformer reads it, [max length, text_dim], and how it was made */
  encode(
    prompt: string,
    onProgress?: (detail: string) => void,
  ): Promise<{ embeds: Float32Array; report: PromptEncoding }>;
}

/** A worker that can run text encoder layers: its id and its API. */
export interface TextHost {
  id: string;
  api: Pick<Remote<WorkerApi>, 'encodeText'>;
}

export interface Umt5EncodingOptions {
  modelUrl: string;
  files: ModelFiles;
  maxLength: number;
  /** which workers run which of the `numLayers` layers, in order (waits for at least one worker: planner.ts) */
  runs(numLayers: number): Promise<{ host: TextHost; from: number; to: number }[]>;
  ep: ExecutionProvider | 'auto';
  /** how long one worker's run of layers may take: reading them is GBs */
  timeoutMs: number;
  cache?: PromptCache;
}

/** The stand-in encoder of the tiny models, in this page. */
export function standInEncoding(load: () => Promise<TextEncoder>): TextEncoding {
  return {
    async encode(prompt) {
      const started = performance.now();
      const embeds = (await load()).encode(prompt);
      return {
        embeds,
        report: { source: 'encoded', tokens: null, truncated: false, ms: performance.now() - started, layers: [] },
      };
    },
  };
}

export function umt5Encoding(o: Umt5EncodingOptions): TextEncoding {
  const open = once(async () => {
    try {
      const [encoder, tokenizerJson, tokenizerConfig] = await Promise.all([
        openUmt5(o.files),
        readJson(o.files, 'tokenizer/tokenizer.json'),
        readJson(o.files, 'tokenizer/tokenizer_config.json').catch(() => ({})),
      ]);
      return {
        encoder,
        tokenizer: new Umt5Tokenizer(tokenizerJson, tokenizerConfig),
        finalNorm: await encoder.finalNorm(),
      };
    } catch (e) {
      // a folder of configs without the encoder's weights (or its tokenizer) cannot encode: say what to give instead
      throw e instanceof MissingFile
        ? new MissingFile(
            `the text encoder (umT5) cannot run: ${e.message}; give the prompt's embeddings instead ` +
              '(promptEmbeds [L, text_dim]; --prompt-embeds FILE with npm run generate)',
          )
        : e;
    }
  });
  return {
    async encode(prompt, onProgress) {
      const started = performance.now();
      const { encoder, tokenizer, finalNorm } = await open();
      const { config } = encoder;
      const { ids, truncated } = tokenizer.encode(prompt, o.maxLength);
      const key = `${o.modelUrl}\n${o.maxLength}\n${prompt}`;
      const report = (source: PromptEncoding['source'], layers: PromptEncoding['layers']): PromptEncoding => ({
        source,
        tokens: ids.length,
        truncated,
        ms: performance.now() - started,
        layers,
      });
      const cached = await o.cache?.get(key).catch(() => undefined);
      if (cached && cached.hidden.length === ids.length * config.dModel)
        return { embeds: padPromptEmbeds(cached.hidden, config.dModel, o.maxLength), report: report('cache', []) };

      let hidden = await encoder.tokenRows(ids);
      const runs = await o.runs(config.numLayers);
      if (!runs.length)
        throw new Error('no worker to run the text encoder on: open a worker page, or give the prompt embeddings');
      const layers: PromptEncoding['layers'] = [];
      // contiguous runs of layers: the hidden state crosses once per worker
      for (const { host, from, to } of runs) {
        onProgress?.(`text encoder layers ${from + 1}–${to} of ${config.numLayers} on worker ${host.id}`);
        const ran = await host.api.encodeText(
          { modelUrl: o.modelUrl, ep: o.ep, from, to, tokens: ids.length, hidden },
          o.timeoutMs,
        );
        if (ran.hidden.length !== hidden.length || !ran.hidden.every(Number.isFinite)) {
          const wrong = ran.hidden.length === hidden.length ? ' with NaN or infinite ones' : `, not ${hidden.length}`;
          throw new Error(
            `worker ${host.id} returned the text encoder's layers ${from}–${to - 1} ` +
              `as ${ran.hidden.length} values${wrong}`,
          );
        }
        hidden = ran.hidden;
        layers.push({
          worker: host.id,
          from,
          to,
          computeMs: ran.layerMs.reduce((a, b) => a + b, 0),
          layersRead: ran.layersRead,
        });
      }
      hidden = umt5FinalNorm(config, finalNorm, hidden);
      // a full or missing cache costs a re-encode, nothing more
      await o.cache?.put(key, { hidden, truncated }).catch(() => {});
      return { embeds: padPromptEmbeds(hidden, config.dModel, o.maxLength), report: report('encoded', layers) };
    },
  };
}
