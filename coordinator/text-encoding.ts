// A job's prompts through its folder's text encoder, and where that happened. The published
// folders' umT5-XXL encoder is 22.7 GB, more than any tab holds: the coordinator tokenizes the
// prompt and reads its embedding rows and the final norm (a few KB, by Range requests), and the 24
// layers run on the swarm's workers, split into contiguous runs, the [T, 4096] hidden state passed
// from one worker to the next through the coordinator (16 KB a token). A lone worker runs them all,
// streaming the layers it cannot keep. Each run is recomputed by another worker before its states
// go on (part-check.ts): umT5's layers cost little next to the DiT's forwards, so all of them are
// checked, not a sample. A worker a check convicts is let go and banned, its entries of the cache
// purged, and the prompt encoded again without it. Encoded prompts are kept by model, prompt and
// max length (PromptCache: the dashboard's IndexedDB), so a repeated prompt is not encoded twice;
// only an encoding whose every run a check agreed with is kept.
// The tiny models' stand-in encoder runs here, in the coordinator's page.

import { INSTEAD_OF } from '../core/job.ts';
import { MissingFile, readJson, type ModelFiles } from '../core/model/files.ts';
import type { TextEncoder } from '../core/model/text-encoder.ts';
import { Umt5Tokenizer } from '../core/model/umt5-tokenizer.ts';
import { openUmt5, padPromptEmbeds, umt5FinalNorm } from '../core/model/umt5.ts';
import { once } from '../core/model/wan-pipeline.ts';
import type { Remote } from '../core/net/rpc.ts';
import type { EncodeTextArgs, ExecutionProvider, WorkerApi } from '../core/worker-api.ts';
import { watchLoad, type LoadingHost } from './load-news.ts';
import { checkPart, PartBreach, type PartCheck } from './part-check.ts';

/** A run of layers a check judged (or a reply that convicted its worker at once), for the report. */
export type TextCheck = PartCheck & { from: number; to: number };

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
  /** each run's check, those of encodings a conviction threw away included */
  checks: TextCheck[];
}

/** An encoded prompt: the last hidden state [T, d_model] before padding, whether it was cut, and who made it. */
export interface CachedPrompt {
  hidden: Float32Array;
  truncated: boolean;
  /** the workers that computed or checked it: a conviction of any of them purges the entry */
  workers: string[];
}

/** Encoded prompts by key. */
export interface PromptCache {
  get(key: string): Promise<CachedPrompt | undefined>;
  put(key: string, value: CachedPrompt): Promise<void>;
  /** drops every entry `worker` computed or checked */
  purge(worker: string): Promise<void>;
}

export interface TextEncoding {
  /** the prompt as the transformer reads it, [max length, text_dim], and how it was made */
  encode(
    prompt: string,
    onProgress?: (detail: string) => void,
  ): Promise<{ embeds: Float32Array; report: PromptEncoding }>;
  /** the tokens the workers' layers would run for `prompt` (0: none, it is cached or encoded in this page) */
  tokensToRun(prompt: string): Promise<number>;
}

/** A worker that can run text encoder layers: its id and its API. */
/** A worker that can run the text encoder's layers; its pulse says how far the reading of their weights is. */
export interface TextHost extends LoadingHost {
  id: string;
  api: Pick<Remote<WorkerApi>, 'encodeText'>;
}

export interface Umt5EncodingOptions<H extends TextHost = TextHost> {
  modelUrl: string;
  files: ModelFiles;
  maxLength: number;
  /**
   * which workers run which of the `numLayers` layers from `from` on, in order (waits for at least one worker:
   * planner.ts)
   */
  runs(numLayers: number, from: number): Promise<{ host: H; from: number; to: number }[]>;
  /** lets go and bans a worker a check convicted: the next `runs` leave it out */
  convict(host: H, why: string): void;
  /**
   * a run failed: whether its worker is lost (it left, or does not answer), which costs a re-placement of the layers
   * left on the live workers (Placer.lostOutsideSteps); false: the failure is the job's (none: every failure is)
   */
  lost?(host: H, among: H[], error: Error): Promise<boolean>;
  ep: ExecutionProvider | 'auto';
  /** how long one worker's run of layers may take: reading them is GBs */
  timeoutMs: number;
  cache?: PromptCache;
  /** uniform in [0, 1), drawing who checks whom: a CSPRNG unless a test gives its own */
  random?: () => number;
}

/**
 * encodings of one prompt, each after a conviction, before it fails: each conviction lets a worker go, so only a
 * swarm of liars uses them up
 */
export const MAX_TEXT_ENCODINGS = 4;

/**
 * The largest hidden state a run of umT5's layers can hand on: the next layer's RMSNorm squares it,
 * and in float32 a larger one's square is infinite.
 */
export const MAX_TEXT_STATE = Math.sqrt(3.4028234663852886e38);

/** The stand-in encoder of the tiny models, in this page. */
export function standInEncoding(load: () => Promise<TextEncoder>): TextEncoding {
  return {
    async encode(prompt) {
      const started = performance.now();
      const embeds = (await load()).encode(prompt);
      return {
        embeds,
        report: {
          source: 'encoded',
          tokens: null,
          truncated: false,
          ms: performance.now() - started,
          layers: [],
          checks: [],
        },
      };
    },
    tokensToRun: () => Promise.resolve(0),
  };
}

/** A run's reply, as the contract and the model allow it; else a PartBreach saying what was wrong. */
function checkedHidden(hidden: Float32Array, expected: number): Float32Array {
  if (hidden.length !== expected) throw new PartBreach(`came as ${hidden.length} values, not ${expected}`);
  if (!hidden.every(Number.isFinite)) throw new PartBreach('came with NaN or infinite values');
  if (hidden.some((v) => Math.abs(v) > MAX_TEXT_STATE))
    throw new PartBreach(`came with values beyond ±${MAX_TEXT_STATE.toExponential(1)}, which no layer hands on`);
  return hidden;
}

/** The layers' last hidden state, who ran which and who computed or checked it. */
interface LayersRan {
  hidden: Float32Array;
  layers: PromptEncoding['layers'];
  workers: string[];
  /** every run had a check (none was 'unchecked' for want of another worker) */
  everyRunChecked: boolean;
  convicted?: never;
}

export function umt5Encoding<H extends TextHost>(o: Umt5EncodingOptions<H>): TextEncoding {
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
        ? new MissingFile(`the text encoder (umT5) cannot run: ${e.message}; ${INSTEAD_OF.textEncoder}`)
        : e;
    }
  });
  /** The layers' hidden state on the workers, each run checked; the convictions instead where a check made any. */
  const runLayers = async (
    tokenRows: Float32Array,
    tokens: number,
    numLayers: number,
    checks: TextCheck[],
    onProgress?: (detail: string) => void,
  ): Promise<LayersRan | { convicted: { host: H; why: string }[] } | null> => {
    const layers: PromptEncoding['layers'] = [];
    const workers = new Set<string>();
    let hidden = tokenRows;
    let everyRunChecked = true;
    const runs = [...(await o.runs(numLayers, 0))];
    if (!runs.length) return null;
    let hosts = [...new Map(runs.map((r) => [r.host.id, r.host])).values()];
    // contiguous runs of layers: the hidden state crosses once per worker, and goes on only once checked
    for (let run = runs.shift(); run; run = runs.shift()) {
      const { host, from, to } = run;
      const running = `text encoder layers ${from + 1}–${to} of ${numLayers} on worker ${host.id}`;
      onProgress?.(running);
      // umT5-XXL's layers are 0.77 GB each: while the worker reads them, its pulse says how far it is
      const stopLoadNews =
        onProgress && watchLoad(host, (load) => onProgress(`${running}, reading their weights: ${load}`));
      const args: EncodeTextArgs = { modelUrl: o.modelUrl, ep: o.ep, from, to, tokens, hidden };
      const what = `${to - from === 1 ? `layer ${from}` : `layers ${from}–${to - 1}`} of the text encoder`;
      let ran;
      try {
        ran = await host.api.encodeText(args, o.timeoutMs);
      } catch (e) {
        if (!(await o.lost?.(host, hosts, e as Error))) throw e;
        // the layers left go to the live workers, from the state this run was given
        runs.splice(0, runs.length, ...(await o.runs(numLayers, from)));
        if (!runs.length) return null;
        hosts = [...new Map(runs.map((r) => [r.host.id, r.host])).values()];
        continue;
      } finally {
        stopLoadNews?.();
      }
      try {
        checkedHidden(ran.hidden, hidden.length);
      } catch (e) {
        if (!(e instanceof PartBreach)) throw e;
        const why = `${what} ${e.message}`;
        const verdict = { convicted: [host.id], why };
        checks.push({ worker: host.id, checker: null, third: null, difference: null, verdict, from, to });
        return { convicted: [{ host, why }] };
      }
      const checked = await checkPart({
        what,
        worker: host,
        part: ran.hidden,
        hosts,
        recompute: async (checker) =>
          checkedHidden((await checker.api.encodeText(args, o.timeoutMs)).hidden, hidden.length),
        random: o.random,
      });
      checks.push({ ...checked.check, from, to });
      // a conviction, or a check left undecided: encoded again (without the convicted)
      if (!checked.stands || checked.convicted.length) return { convicted: checked.convicted };
      everyRunChecked &&= checked.check.verdict !== 'unchecked';
      for (const id of [checked.check.worker, checked.check.checker, checked.check.third]) if (id) workers.add(id);
      hidden = ran.hidden;
      layers.push({
        worker: host.id,
        from,
        to,
        computeMs: ran.layerMs.reduce((a, b) => a + b, 0),
        layersRead: ran.layersRead,
      });
    }
    return { hidden, layers, workers: [...workers], everyRunChecked };
  };
  /** the prompt's tokens, its key in the cache, and its encoding where the cache holds one of them */
  const lookUp = async (prompt: string) => {
    const { encoder, tokenizer } = await open();
    const { ids, truncated } = tokenizer.encode(prompt, o.maxLength);
    const key = `${o.modelUrl}\n${o.maxLength}\n${prompt}`;
    const found = await o.cache?.get(key).catch(() => undefined);
    const cached = found && found.hidden.length === ids.length * encoder.config.dModel ? found : undefined;
    return { ids, truncated, key, cached };
  };
  return {
    tokensToRun: async (prompt) => {
      const { ids, cached } = await lookUp(prompt);
      return cached ? 0 : ids.length;
    },
    async encode(prompt, onProgress) {
      const started = performance.now();
      const { encoder, finalNorm } = await open();
      const { config } = encoder;
      const { ids, truncated, key, cached } = await lookUp(prompt);
      const checks: TextCheck[] = [];
      const report = (source: PromptEncoding['source'], layers: PromptEncoding['layers']): PromptEncoding => ({
        source,
        tokens: ids.length,
        truncated,
        ms: performance.now() - started,
        layers,
        checks,
      });
      if (cached)
        return { embeds: padPromptEmbeds(cached.hidden, config.dModel, o.maxLength), report: report('cache', []) };

      const tokenRows = await encoder.tokenRows(ids);
      const letGo: string[] = [];
      for (let encoding = 1; ; encoding++) {
        const ran = await runLayers(tokenRows, ids.length, config.numLayers, checks, onProgress);
        if (!ran)
          throw new Error(
            'no worker to run the text encoder on: open a worker page, or give the prompt embeddings' +
              (letGo.length ? ` (let go for wrong results: ${letGo.join('; ')})` : ''),
          );
        if (ran.convicted) {
          for (const { host, why } of ran.convicted) {
            letGo.push(`worker ${host.id}: ${why}`);
            // what it computed or vouched for earlier is not to be trusted either
            await o.cache?.purge(host.id).catch(() => {});
            o.convict(host, why);
          }
          if (encoding === MAX_TEXT_ENCODINGS)
            throw new Error(
              `the prompt was encoded ${MAX_TEXT_ENCODINGS} times and each time a check of its layers convicted a ` +
                `worker or could not decide: ${letGo.join('; ') || 'the workers that could have decided failed'}`,
            );
          continue;
        }
        const hidden = umt5FinalNorm(config, finalNorm, ran.hidden);
        // a full or missing cache costs a re-encode, nothing more; states no other worker checked are not kept
        if (ran.everyRunChecked) await o.cache?.put(key, { hidden, truncated, workers: ran.workers }).catch(() => {});
        return {
          embeds: padPromptEmbeds(hidden, config.dModel, o.maxLength),
          report: report('encoded', ran.layers),
        };
      }
    },
  };
}
