// A prompt through the text encoder of a Wan2.1 folder (umT5-XXL's encoder, text_encoder/), for
// parity checks against transformers like `npm run forward`: writes last_hidden_state [T, d_model]
// for the prompt's T token ids and prompt_embeds [max length, d_model], the rows padded with zeros
// as WanPipeline hands them to the transformer. Layers are read one at a time (the encoder is
// 22.7 GB); each layer's time is printed.
//
//   npm run encode-prompt -- --model DIR (--prompt TEXT | --input-ids 1,2,3) --output F.safetensors
//     [--backend onnx|reference] [--max-length 512]

import { mkdir, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { readJson } from '../../core/model/files.ts';
import { encodeIds, openUmt5, padPromptEmbeds, umt5LayerReference, type Umt5LayerFn } from '../../core/model/umt5.ts';
import { Umt5Tokenizer } from '../../core/model/umt5-tokenizer.ts';
import { writeSafetensors } from '../../core/safetensors.ts';
import { folderFiles } from '../model-folder.ts';
import { defined } from '../../core/defined.ts';
import { ENCODE_PROMPT_OPTIONS } from './flags.ts';

const USAGE = `usage: npm run encode-prompt -- --model DIR (--prompt TEXT | --input-ids 1,2,3) --output F.safetensors
         [--backend onnx|reference] [--max-length 512]`;
/** Errors whose message is the whole story; anything else is a bug and keeps its stack. */
const USER_ERRORS = new Set([
  'UsageError',
  'ModelConfigError',
  'SafetensorsError',
  'MissingFile',
  'UnsupportedTokenizer',
]);

class UsageError extends Error {
  override name = 'UsageError';
}
function usage(message: string): never {
  throw new UsageError(`${message}\n${USAGE}`);
}

async function run(): Promise<void> {
  let parsed;
  try {
    parsed = parseArgs({
      options: ENCODE_PROMPT_OPTIONS,
    });
  } catch (e) {
    return usage((e as Error).message);
  }
  const { values } = parsed;
  if (!values.model) usage('--model is required: a folder with text_encoder/ (and tokenizer/ for --prompt)');
  if (!values.output) usage('--output is required');
  if ((values.prompt === undefined) === (values['input-ids'] === undefined))
    usage('give --prompt or --input-ids, one of them');
  if (values.backend !== 'onnx' && values.backend !== 'reference')
    usage(`--backend must be onnx or reference, got ${JSON.stringify(values.backend)}`);
  const maxLength = Number(values['max-length']);
  if (!Number.isInteger(maxLength) || maxLength < 1)
    usage(`--max-length must be a whole number ≥ 1, got ${values['max-length']}`);

  const files = folderFiles(values.model);
  const encoder = await openUmt5(files);
  const { config } = encoder;
  let ids: number[];
  if (values['input-ids'] !== undefined) {
    ids = values['input-ids'].split(',').map(Number);
    if (!ids.length || !ids.every(Number.isInteger))
      usage(`--input-ids must be comma-separated whole numbers, got ${values['input-ids']}`);
    if (ids.length > maxLength) usage(`--input-ids has ${ids.length} ids, more than --max-length ${maxLength}`);
  } else {
    const tokenizerConfig = await readJson(files, 'tokenizer/tokenizer_config.json').catch(() => ({}));
    const tokens = new Umt5Tokenizer(await readJson(files, 'tokenizer/tokenizer.json'), tokenizerConfig).encode(
      defined(values.prompt, '--prompt, given --input-ids is not'),
      maxLength,
    );
    if (tokens.truncated)
      console.error(
        `encode-prompt: the prompt has ${tokens.tokens} tokens; the pipeline keeps ${maxLength} (the last one </s>)`,
      );
    ids = tokens.ids;
  }

  let runLayer: Umt5LayerFn = (weights, hidden, buckets) =>
    Promise.resolve(umt5LayerReference(config, weights, hidden, buckets));
  if (values.backend === 'onnx') {
    const ort = await import('onnxruntime-web');
    ort.env.wasm.numThreads = 1; // as each worker engine runs
    runLayer = (await (await import('../../rank/umt5-layers.ts')).onnxUmt5Layers(config, 'wasm')).run;
  }
  const layerMs: number[] = [];
  const started = performance.now();
  const last = await encodeIds(encoder, ids, runLayer, (layer, ms) => {
    layerMs.push(ms);
    console.error(`encode-prompt: layer ${layer + 1} of ${config.numLayers}: ${ms.toFixed(0)} ms`);
  });
  const ms = performance.now() - started;
  const d = config.dModel;
  const output = new Map([
    ['last_hidden_state', { shape: [ids.length, d], data: last }],
    ['prompt_embeds', { shape: [maxLength, d], data: padPromptEmbeds(last, d, maxLength) }],
  ]);
  await mkdir(dirname(values.output), { recursive: true });
  await writeFile(values.output, writeSafetensors(output, { input_ids: ids.join(',') }));
  const peakGiB = (process.resourceUsage().maxRSS * 1024) / 2 ** 30;
  const perLayer = layerMs.reduce((a, b) => a + b, 0) / layerMs.length;
  console.log(
    `encode-prompt: ${ids.length} tokens through ${config.numLayers} layers on ${values.backend} ` +
      `in ${ms.toFixed(0)} ms (${perLayer.toFixed(0)} ms per layer computing) → ${values.output}; ` +
      `peak resident memory ${peakGiB.toFixed(2)} GiB`,
  );
}

try {
  await run();
} catch (e) {
  const error = e instanceof Error ? e : undefined;
  console.error(`encode-prompt: ${error && USER_ERRORS.has(error.name) ? error.message : (error?.stack ?? String(e))}`);
  process.exit(1);
}
