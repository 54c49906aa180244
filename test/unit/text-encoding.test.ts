import { placeTextLayers } from '../../coordinator/planner.ts';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { encodeIds, openUmt5, padPromptEmbeds, umt5LayerReference } from '../../core/model/umt5.ts';
import { Umt5Tokenizer } from '../../core/model/umt5-tokenizer.ts';
import { readJson } from '../../core/model/files.ts';
import { maxAbsDiff } from '../../core/tensor.ts';
import {
  MAX_TEXT_STATE,
  umt5Encoding,
  type CachedPrompt,
  type PromptCache,
  type TextHost,
  type Umt5EncodingOptions,
} from '../../coordinator/text-encoding.ts';
import { PART_TOLERANCE } from '../../coordinator/part-check.ts';
import { secureRandom } from '../../coordinator/spot-check.ts';
import { describeLoad, type EncodeTextArgs, type LoadStatus } from '../../core/worker-api.ts';
import { textLayers } from '../../rank/text-layers.ts';
import { unkeptModelFiles } from '../../rank/weight-cache.ts';
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

/**
 * Workers' stand-ins that run their layers as a worker's engine does (rank/text-layers.ts), from the folder; `lie`
 * rewrites what one sends back, given the call's arguments.
 */
function hosts(
  count: number,
  lie?: (i: number, args: EncodeTextArgs, hidden: Float32Array) => Float32Array,
): TextHost[] {
  return Array.from({ length: count }, (_, i) => {
    const layers = textLayers(() => unkeptModelFiles(folderFiles(dir)));
    const host: TextHost = {
      id: `worker-${i}`,
      pulse: null,
      api: {
        async encodeText(args) {
          // its pulse carries the load's progress, as a worker page's does
          const ran = await layers.encode({ ...args, ep: 'wasm' }, (load) => Object.assign(host, { pulse: { load } }));
          return lie ? { ...ran, hidden: lie(i, args, ran.hidden) } : ran;
        },
      },
    };
    return host;
  });
}

/** An encoding on `workers`, which a conviction takes the convicted out of (as the swarm's ban does). */
function encodingOn(workers: TextHost[], more: Partial<Umt5EncodingOptions> = {}) {
  const convicted: { id: string; why: string }[] = [];
  const encoding = umt5Encoding({
    modelUrl: 'model',
    files: folderFiles(dir),
    maxLength: 16,
    runs: runsOn(workers),
    convict(host, why) {
      convicted.push({ id: host.id, why });
      workers.splice(workers.indexOf(host), 1);
    },
    ep: 'wasm',
    timeoutMs: 60_000,
    ...more,
  });
  return { encoding, convicted };
}

/** The planner's runs of the layers from `from` on these hosts, none of them measured: as even as the count allows. */
const runsOn =
  (workers: TextHost[]) =>
  (numLayers: number, from = 0) =>
    Promise.resolve(
      placeTextLayers(
        workers.map((host) => ({ host, measurement: null })),
        numLayers - from,
      ).map(({ worker, from: start, to }) => ({ host: worker.host, from: from + start, to: from + to })),
    );

function mapCache(): PromptCache & { entries: Map<string, CachedPrompt> } {
  const entries = new Map<string, CachedPrompt>();
  return {
    entries,
    get: (k) => Promise.resolve(entries.get(k)),
    put: (k, v) => {
      entries.set(k, v);
      return Promise.resolve();
    },
    purge(worker) {
      for (const [k, v] of entries) if (v.workers.includes(worker)) entries.delete(k);
      return Promise.resolve();
    },
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
    const encodeOn = (count: number) => encodingOn(hosts(count)).encoding.encode(PROMPT);
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

  it('a repeated prompt comes from the cache, whose entry names the workers that computed and checked it', async () => {
    const cache = mapCache();
    const workers = hosts(2);
    const { encoding } = encodingOn(workers, { cache });
    const first = await encoding.encode(PROMPT);
    expect(first.report.source).toBe('encoded');
    expect(first.report.layers.map((l) => l.layersRead)).toEqual([2, 1]);
    const again = await encoding.encode(PROMPT);
    expect(again.report).toMatchObject({ source: 'cache', layers: [], checks: [] });
    expect(again.embeds).toEqual(first.embeds);
    expect(cache.entries.size).toBe(1);
    // each run was recomputed by the other worker: both made the entry
    expect([...cache.entries.values()][0].workers.sort()).toEqual(['worker-0', 'worker-1']);
    const other = await encoding.encode('the blue cat');
    expect(other.report.source).toBe('encoded');
    expect(cache.entries.size).toBe(2);
  });

  it("a worker's run says how far the reading of the layers it does not hold is; the coordinator's news, from its pulse, too", async () => {
    const layers = textLayers(() => unkeptModelFiles(folderFiles(dir)));
    const encoder = await openUmt5(folderFiles(dir));
    const layerBytes = [0, 1, 2].map((l) => encoder.layerBytes(l));
    expect(new Set(layerBytes).size).toBe(1);
    // the bytes of each layer's tensors in its shards' headers (float32): q, k, v, o, its own relative attention
    // bias (umT5's every layer has one), the two norms, wi_0, wi_1, wo
    const { d_model: d, d_kv: kv, num_heads: heads, d_ff: ff, relative_attention_num_buckets: buckets } = CONFIG;
    expect(layerBytes[0]).toBe(4 * (4 * d * heads * kv + buckets * heads + 2 * d + 3 * d * ff));
    const args = { modelUrl: 'model', ep: 'wasm' as const, tokens: 2, hidden: new Float32Array(2 * CONFIG.d_model) };
    const seen: LoadStatus[] = [];
    await layers.encode({ ...args, from: 0, to: 2 }, (s) => seen.push(s));
    expect(seen.map((s) => [s.bytes, s.totalBytes])).toEqual([
      [layerBytes[0], 2 * layerBytes[0]],
      [2 * layerBytes[0], 2 * layerBytes[0]],
    ]);
    // every byte read counts as fetched in a folder that keeps nothing: the layers' and their shards' headers
    expect(seen[1].networkBytes).toBeGreaterThan(2 * layerBytes[0]);
    // the layers it holds are not read again: only layer 2 is
    seen.length = 0;
    await layers.encode({ ...args, from: 0, to: 3 }, (s) => seen.push(s));
    expect(seen.map((s) => [s.bytes, s.totalBytes])).toEqual([[layerBytes[0], layerBytes[0]]]);

    const load = { bytes: 3e8, totalBytes: 7.7e8, networkBytes: 3e8, elapsedMs: 2000, note: '' };
    const reading: TextHost = {
      id: 'reading',
      pulse: { load },
      api: {
        // a run that takes long enough for the coordinator's news to look at the pulse
        encodeText: async (a) => {
          await new Promise((r) => setTimeout(r, 1300));
          return layers.encode({ ...a, ep: 'wasm' });
        },
      },
    };
    const news: string[] = [];
    await encodingOn([reading]).encoding.encode(PROMPT, (detail) => news.push(detail));
    expect(news).toEqual([
      'text encoder layers 1–3 of 3 on worker reading',
      `text encoder layers 1–3 of 3 on worker reading, reading their weights: ${describeLoad(load)}`,
    ]);
  });

  it('a prompt longer than the max length is cut to it, still ending in </s>, and the report says so', async () => {
    const long = Array.from({ length: 30 }, () => 'red').join(' ');
    const { report, embeds } = await encodingOn(hosts(1)).encoding.encode(long);
    expect(report).toMatchObject({ tokens: 16, truncated: true });
    expect(embeds.length).toBe(16 * 64);
  });

  it('a lone worker that returns poisoned, huge or misshapen hidden states is convicted by name, and nothing is encoded', async () => {
    for (const [lie, said] of [
      [(h: Float32Array) => h.map(() => NaN), 'came with NaN or infinite values'],
      [(h: Float32Array) => h.map(() => 3e38), 'came with values beyond ±1.8e+19, which no layer hands on'],
      [(h: Float32Array) => h.subarray(1), /came as \d+ values, not \d+/],
    ] as const) {
      const cache = mapCache();
      const { encoding, convicted } = encodingOn(
        hosts(1, (_, __, h) => lie(h)),
        { cache },
      );
      const error = (await encoding.encode(PROMPT).catch((e: unknown) => e)) as Error;
      expect(error.message).toContain('no worker to run the text encoder on');
      expect(error.message).toContain('let go for wrong results: worker worker-0: layers 0–2 of the text encoder');
      expect(error.message).toMatch(said);
      expect(convicted.map((c) => c.id)).toEqual(['worker-0']);
      expect(cache.entries.size).toBe(0);
    }
  });
});

describe('every run of the text encoder is checked by another worker', () => {
  /** the honest encoding, on two workers (any split gives the same states) */
  let honest: Float32Array;
  beforeAll(async () => {
    honest = (await encodingOn(hosts(2)).encoding.encode(PROMPT)).embeds;
  });
  /** the liar's states moved 13% */
  const moved = (h: Float32Array) => h.map((v) => v * 1.13);
  /** the runs' own layers on three workers: worker i runs layer i */
  const ownRun = (i: number, args: EncodeTextArgs) => args.from === i;

  it('a worker that lies about its own layers is convicted by its checker and a third, banned, and the prompt encoded without it equals the honest one', async () => {
    const cache = mapCache();
    const workers = hosts(3, (i, args, h) => (i === 2 && ownRun(i, args) ? moved(h) : h));
    const { encoding, convicted } = encodingOn(workers, { cache, random: () => 0 });
    const { embeds, report } = await encoding.encode(PROMPT);
    expect(embeds).toEqual(honest);
    expect(convicted.map((c) => c.id)).toEqual(['worker-2']);
    expect(convicted[0].why).toMatch(
      new RegExp(
        "^layer 2 of the text encoder by worker worker-2 differs from worker worker-0's recomputation " +
          'by 1\\.\\de-1 of its scale, and worker worker-1 recomputed it as worker worker-0 did$',
      ),
    );
    // the first encoding: runs 0 and 1 agreed, run 2 convicted; the second, on two workers, agreed
    expect(report.checks.map((c) => [c.worker, c.from, c.checker, c.third, c.verdict === 'agreed'])).toEqual([
      ['worker-0', 0, 'worker-1', null, true],
      ['worker-1', 1, 'worker-0', null, true],
      ['worker-2', 2, 'worker-0', 'worker-1', false],
      ['worker-0', 0, 'worker-1', null, true],
      ['worker-1', 2, 'worker-0', null, true],
    ]);
    expect(report.layers.map((l) => l.worker)).toEqual(['worker-0', 'worker-1']);
    expect([...cache.entries.values()].map((e) => e.workers.sort())).toEqual([['worker-0', 'worker-1']]);
    expect(cache.entries.get(`model\n16\n${PROMPT}`)).toBeDefined();
  });

  it("a checker that lies about a run it recomputes is convicted by the third, not the run's worker", async () => {
    const workers = hosts(3, (i, args, h) => (i === 2 && !ownRun(i, args) ? moved(h) : h));
    // the last free worker checks: worker-2 recomputes worker-0's run first
    const { encoding, convicted } = encodingOn(workers, { random: () => 0.99 });
    const { embeds, report } = await encoding.encode(PROMPT);
    expect(embeds).toEqual(honest);
    expect(convicted.map((c) => c.id)).toEqual(['worker-2']);
    expect(convicted[0].why).toContain(
      'worker worker-1 recomputed it as worker worker-0 did: the recomputation was wrong',
    );
    expect(report.checks[0]).toMatchObject({
      worker: 'worker-0',
      checker: 'worker-2',
      third: 'worker-1',
      verdict: { convicted: ['worker-2'] },
    });
  });

  it('a liar that sends states of a size no layer makes is convicted without a check, and its checks too', async () => {
    const huge = (h: Float32Array) => h.map((v, i) => (i === 0 ? 2 * MAX_TEXT_STATE : v));
    const { encoding, convicted } = encodingOn(
      hosts(3, (i, _, h) => (i === 1 ? huge(h) : h)),
      { random: () => 0.99 },
    );
    const { embeds, report } = await encoding.encode(PROMPT);
    expect(embeds).toEqual(honest);
    expect(convicted.map((c) => c.id)).toEqual(['worker-1']);
    expect(report.checks.some((c) => c.worker === 'worker-1' && c.checker === null)).toBe(true);
  });

  it('a disagreement whose third fails (it left, say) convicts nobody: the run is redone, and the liar caught then', async () => {
    let thirdFailed = false;
    const workers = hosts(3, (i, args, h) => {
      if (i === 2 && ownRun(i, args)) return moved(h);
      // worker-1's first recomputation of worker-2's layer: it is gone mid-call
      if (i === 1 && args.from === 2 && !thirdFailed) {
        thirdFailed = true;
        throw new Error('worker-1 left');
      }
      return h;
    });
    const { encoding, convicted } = encodingOn(workers, { random: () => 0 });
    const { embeds, report } = await encoding.encode(PROMPT);
    expect(embeds).toEqual(honest);
    expect(report.checks[2]).toMatchObject({
      worker: 'worker-2',
      checker: 'worker-0',
      third: null,
      verdict: 'undecided',
    });
    expect(report.checks[5]).toMatchObject({ worker: 'worker-2', verdict: { convicted: ['worker-2'] } });
    expect(convicted.map((c) => c.id)).toEqual(['worker-2']);
  });

  it('a worker whose tab closes during its own run is lost: the layers left run on the live workers from the state it was given, to the uninterrupted embedding (issue 34)', async () => {
    const uninterrupted = (await encodingOn(hosts(3), { random: () => 0 }).encoding.encode(PROMPT)).embeds;
    const gone = new Set<string>();
    const workers = hosts(3, (i, args, h) => {
      if (i !== 1 || !ownRun(i, args)) return h;
      gone.add('worker-1');
      throw new Error('could not send encodeText to worker worker-1: its link closed');
    });
    const judged: [string, string[], string][] = [];
    const { encoding, convicted } = encodingOn(workers, {
      random: () => 0,
      lost(host, among, error) {
        judged.push([host.id, among.map((h) => h.id), error.message]);
        if (gone.has(host.id)) workers.splice(workers.indexOf(host), 1);
        return Promise.resolve(gone.has(host.id));
      },
    });
    const { embeds, report } = await encoding.encode(PROMPT);
    expect(judged).toEqual([
      [
        'worker-1',
        ['worker-0', 'worker-1', 'worker-2'],
        'could not send encodeText to worker worker-1: its link closed',
      ],
    ]);
    // layer 0 done before the loss stays; layers 1 and 2 are placed again on the two live workers
    expect(report.layers.map(({ worker, from, to }) => [worker, from, to])).toEqual([
      ['worker-0', 0, 1],
      ['worker-0', 1, 2],
      ['worker-2', 2, 3],
    ]);
    expect(convicted).toEqual([]);
    expect(embeds).toEqual(uninterrupted);
  });

  it('a run that fails on a worker that is not lost fails the encoding as it came', async () => {
    const workers = hosts(2, (i, args, h) => {
      if (i === 1 && args.from === 2) throw new Error('out of memory'); // its own run, layer 2
      return h;
    });
    const lost = vi.fn(() => Promise.resolve(false));
    const { encoding } = encodingOn(workers, { random: () => 0, lost });
    await expect(encoding.encode(PROMPT)).rejects.toThrow('out of memory');
    expect(lost).toHaveBeenCalledTimes(1);
  });

  it("a worker convicted later takes the cached prompts it computed or checked with it; others' stay", async () => {
    const cache = mapCache();
    const workers = hosts(3);
    const { encoding } = encodingOn(workers, { cache, random: () => 0 });
    await encoding.encode(PROMPT);
    // two workers alone: worker-2 had no part in this one
    const pair = workers.slice(0, 2);
    await encodingOn(pair, { cache, random: () => 0 }).encoding.encode('the blue cat');
    expect(cache.entries.size).toBe(2);
    // worker-2 is caught lying about a run it recomputes for another prompt
    const liar = hosts(3, (i, args, h) => (i === 2 && !ownRun(i, args) ? moved(h) : h));
    const { encoding: again, convicted } = encodingOn(liar, { cache, random: () => 0.99 });
    await again.encode('a green cube');
    expect(convicted.map((c) => c.id)).toEqual(['worker-2']);
    expect([...cache.entries.keys()].map((k) => k.split('\n')[2]).sort()).toEqual(['a green cube', 'the blue cat']);
  });

  it("a lone worker's encoding, which no other worker could check, is used but not cached", async () => {
    const cache = mapCache();
    const { embeds, report } = await encodingOn(hosts(1), { cache }).encoding.encode(PROMPT);
    expect(embeds).toEqual(honest);
    expect(report.checks).toMatchObject([{ worker: 'worker-0', checker: null, verdict: 'unchecked' }]);
    expect(cache.entries.size).toBe(0);
  });

  it("checkers are drawn by the platform's CSPRNG unless a test gives its own, and agree within the float32 bound", async () => {
    const spy = vi.spyOn(crypto, 'getRandomValues');
    const { report } = await encodingOn(hosts(3)).encoding.encode(PROMPT);
    expect(spy).toHaveBeenCalled();
    spy.mockRestore();
    expect(report.checks.every((c) => c.verdict === 'agreed' && (c.difference ?? 1) <= PART_TOLERANCE)).toBe(true);
    const draws = Array.from({ length: 1000 }, secureRandom);
    expect(draws.every((x) => x >= 0 && x < 1)).toBe(true);
    expect(new Set(draws).size).toBeGreaterThan(990);
  });
});
