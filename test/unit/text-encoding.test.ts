import { placeTextLayers } from '../../coordinator/planner.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeIds, openUmt5, padPromptEmbeds, umt5LayerReference } from '../../core/model/umt5.ts';
import { Umt5Tokenizer } from '../../core/model/umt5-tokenizer.ts';
import { readJson } from '../../core/model/files.ts';
import { maxAbsDiff } from '../../core/tensor.ts';
import { umt5Encoding, type PromptCache, type TextHost } from '../../coordinator/text-encoding.ts';
import { textLayers } from '../../rank/text-layers.ts';
import { folderFiles, writeUmt5Folder } from '../../server/model-folder.ts';

// umT5's layout at a small width, three layers so that one, two and three workers split them differently
const CONFIG = {
  architectures: ['UMT5EncoderModel'],
  model_type: 'umt5',
  d_model: 64,
  d_kv: 8,
  num_heads: 8,
  d_ff: 96,
  num_layers: 3,
  relative_attention_num_buckets: 32,
  relative_attention_max_distance: 128,
  layer_norm_epsilon: 1e-6,
  feed_forward_proj: 'gated-gelu',
  dense_act_fn: 'gelu_new',
};
const PROMPT = 'a red ball moving right on the green square';
let dir: string;

/** Workers' stand-ins that run their layers as a worker's engine does (rank/text-layers.ts), from the folder. */
function hosts(count: number): TextHost[] {
  return Array.from({ length: count }, (_, i) => {
    const layers = textLayers(() => ({ ...folderFiles(dir), close: async () => {} }));
    return { id: `worker-${i}`, api: { encodeText: (args) => layers.encode({ ...args, ep: 'wasm' }) } };
  });
}

/** The planner's runs of the layers on these hosts, none of them measured: as even as the count allows. */
const runsOn = (workers: TextHost[]) => (numLayers: number) =>
  Promise.resolve(
    placeTextLayers(
      workers.map((host) => ({ host, measurement: null })),
      numLayers,
    ).map(({ worker, from, to }) => ({ host: worker.host, from, to })),
  );

function mapCache(): PromptCache & { size(): number } {
  const entries = new Map<string, { hidden: Float32Array; truncated: boolean }>();
  return {
    get: (k) => Promise.resolve(entries.get(k)),
    put: (k, v) => {
      entries.set(k, v);
      return Promise.resolve();
    },
    size: () => entries.size,
  };
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'ditswarm-text-'));
  await writeUmt5Folder(dir, CONFIG, { seed: '7', maxShardBytes: 80_000 });
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('a prompt through umT5 on the swarm', () => {
  it('split over 1, 2 and 3 workers equals one worker; each runs its own layers; the reference agrees within 1e-3', async () => {
    const files = folderFiles(dir);
    const encodeOn = (count: number) =>
      umt5Encoding({
        modelUrl: 'model',
        files,
        maxLength: 16,
        runs: runsOn(hosts(count)),
        ep: 'wasm',
        timeoutMs: 60_000,
      }).encode(PROMPT);
    const [one, two, three] = [await encodeOn(1), await encodeOn(2), await encodeOn(3)];
    expect(one.report.layers.map(({ worker, from, to }) => [worker, from, to])).toEqual([['worker-0', 0, 3]]);
    expect(two.report.layers.map(({ worker, from, to }) => [worker, from, to])).toEqual([
      ['worker-0', 0, 2],
      ['worker-1', 2, 3],
    ]);
    expect(three.report.layers.map(({ worker, from, to }) => [worker, from, to])).toEqual([
      ['worker-0', 0, 1],
      ['worker-1', 1, 2],
      ['worker-2', 2, 3],
    ]);
    const scale = one.embeds.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    expect(maxAbsDiff(two.embeds, one.embeds) / scale).toBeLessThan(1e-5);
    expect(maxAbsDiff(three.embeds, one.embeds) / scale).toBeLessThan(1e-5);

    // the prompt's rows, then zeros to the max length; the plain-TS reference of every layer agrees
    const encoder = await openUmt5(files);
    const { ids } = new Umt5Tokenizer(await readJson(files, 'tokenizer/tokenizer.json')).encode(PROMPT, 16);
    expect(one.report).toMatchObject({ source: 'encoded', tokens: ids.length, truncated: false });
    const reference = padPromptEmbeds(
      await encodeIds(encoder, ids, (w, h, b) => Promise.resolve(umt5LayerReference(encoder.config, w, h, b))),
      64,
      16,
    );
    expect(maxAbsDiff(one.embeds, reference) / scale).toBeLessThan(1e-3);
    expect(one.embeds.subarray(ids.length * 64).every((v) => v === 0)).toBe(true);
    expect(one.embeds.subarray(0, ids.length * 64).some((v) => v === 0)).toBe(false);
  });

  it('a repeated prompt comes from the cache; a worker keeps the layers it ran and reads none the second time', async () => {
    const cache = mapCache();
    const workers = hosts(2);
    const encoding = umt5Encoding({
      modelUrl: 'model',
      files: folderFiles(dir),
      maxLength: 16,
      runs: runsOn(workers),
      ep: 'wasm',
      timeoutMs: 60_000,
      cache,
    });
    const first = await encoding.encode(PROMPT);
    expect(first.report.source).toBe('encoded');
    expect(first.report.layers.map((l) => l.layersRead)).toEqual([2, 1]);
    const again = await encoding.encode(PROMPT);
    expect(again.report).toMatchObject({ source: 'cache', layers: [] });
    expect(again.embeds).toEqual(first.embeds);
    expect(cache.size()).toBe(1);
    const other = await encoding.encode('the blue cat');
    expect(other.report.source).toBe('encoded');
    expect(other.report.layers.map((l) => l.layersRead)).toEqual([0, 0]); // held from the first prompt
  });

  it('a prompt longer than the max length is cut to it, still ending in </s>, and the report says so', async () => {
    const long = Array.from({ length: 30 }, () => 'red').join(' ');
    const { report, embeds } = await umt5Encoding({
      modelUrl: 'model',
      files: folderFiles(dir),
      maxLength: 16,
      runs: runsOn(hosts(1)),
      ep: 'wasm',
      timeoutMs: 60_000,
    }).encode(long);
    expect(report).toMatchObject({ tokens: 16, truncated: true });
    expect(embeds.length).toBe(16 * 64);
  });

  it('a worker that returns poisoned or misshapen hidden states fails the encoding by name', async () => {
    const liar = (hidden: (h: Float32Array) => Float32Array): TextHost[] => [
      {
        id: 'liar',
        api: { encodeText: (args) => Promise.resolve({ hidden: hidden(args.hidden), layerMs: [1], layersRead: 0 }) },
      },
    ];
    const encode = (workers: TextHost[]) =>
      umt5Encoding({
        modelUrl: 'model',
        files: folderFiles(dir),
        maxLength: 16,
        runs: runsOn(workers),
        ep: 'wasm',
        timeoutMs: 60_000,
      }).encode(PROMPT);
    await expect(encode(liar((h) => h.map(() => NaN)))).rejects.toThrow(
      "worker liar returned the text encoder's layers 0–2 as",
    );
    await expect(encode(liar((h) => h.subarray(1)))).rejects.toThrow(
      /worker liar returned the text encoder's layers 0–2 as \d+ values, not \d+/,
    );
    await expect(encode([])).rejects.toThrow('no worker to run the text encoder on');
  });
});
