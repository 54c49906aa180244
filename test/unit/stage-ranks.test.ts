// A worker that holds one pipeline stage, through the real runtime and engine: it loads only its
// stage's blocks from the model folder over HTTP, says how many weight bytes it holds, hands its
// hidden state on to the next stage's rank over their link (or takes the stage before's), and refuses
// a hidden state that is not one of its forward's, blaming its sender, without computing from it. The
// test is the wire between the two stages: it takes what the first hands on and gives the last what it likes.
import { readFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join, normalize } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { BlockRange, HiddenState } from '../../core/model/blocks.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { inProcess, type Remote } from '../../core/net/rpc.ts';
import { maxAbsDiff } from '../../core/tensor.ts';
import {
  WORKER_CONTRACT,
  type ExecuteArgs,
  type HandOffMesh,
  type LoadedModel,
  type WorkerApi,
} from '../../core/worker-api.ts';
import { createEngine } from '../../rank/engine.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { WorkerRuntime } from '../../rank/runtime.ts';
import { ExchangePhase, type PointToPoint } from '../../rank/ulysses.ts';
import { handOn, RECEIVER, SENDER, takeHandOff } from '../../rank/hand-off.ts';
import { ExchangeLedger } from '../../rank/exchange/ledger.ts';
import { newSigningKeys } from '../../core/net/signing.ts';
import { describeInProcess, tinyModelFiles } from './fixtures.ts';
import { EXACT_SETTINGS } from './in-process-executor.ts';

const PUBLIC_DIR = join(import.meta.dirname, '../../public');
/** the tiny model's two blocks, one a stage */
const FIRST: BlockRange = { from: 0, to: 1 };
const LAST: BlockRange = { from: 1, to: 2 };
const LATENT_SHAPE = [16, 1, 4, 4]; // 4 tokens
const TEXT_ROWS = 3;

let server: Server;
let modelUrl: string;
let wholeBytes: number;
let textDim: number;
let dim: number;

async function serveFolder(dir: string): Promise<Server> {
  const files = createServer((req, res) => {
    const path = normalize(decodeURIComponent(new URL(req.url ?? '/', 'http://127.0.0.1').pathname));
    readFile(join(dir, path)).then(
      (body) => res.end(body),
      () => res.writeHead(404).end(),
    );
  });
  await new Promise<void>((listening) => files.listen(0, '127.0.0.1', listening));
  return files;
}

/** A hand-off link's end of this worker, and the end the test holds (the other stage's rank, as the test plays it). */
const pair = (self: 0 | 1): HandOffMesh => ({
  rank: self,
  world: 2,
  peers: ['a', 'b'],
  session: `s.handoff.${self}`,
  signing: { secretKey: PAIR_KEYS[self].secretKey, publicKeys: PAIR_KEYS.map((k) => k.publicKey) },
});

/**
 * A worker of its own engine, as the coordinator calls it: through the contract's checks, prepared for job 1. A stage
 * after the first takes its hand-off from `before`'s sender end; one before the last hands on to `after`'s receiver.
 */
async function worker(
  blocks?: BlockRange,
  links: { before?: PointToPoint; after?: PointToPoint } = {},
): Promise<{ api: Remote<WorkerApi>; runtime: WorkerRuntime; loaded: LoadedModel }> {
  const runtime = new WorkerRuntime(createEngine(), {
    connectMesh: () => Promise.resolve(memoryExchanges(1)[0]),
    connectStages: () => Promise.resolve(links),
    describe: describeInProcess(),
  });
  const api = inProcess<WorkerApi>(runtime, WORKER_CONTRACT, 'worker');
  const stageLinks = {
    ...(links.before && { before: pair(RECEIVER) }),
    ...(links.after && { after: pair(SENDER) }),
  };
  const staged = (links.before || links.after) && { stageLinks };
  await api.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's', ...staged });
  const loaded = await api.loadModel({ modelUrl, ep: 'wasm', ...(blocks && { blocks }) });
  await api.prepareJob({ job: 1, texts: [text()], latentShape: LATENT_SHAPE });
  return { api, runtime, loaded };
}

function text(): Float32Array {
  return Float32Array.from({ length: TEXT_ROWS * textDim }, (_, i) => Math.sin(i * 0.37));
}

/**
 * The test's ends of the two stages' links, signed as the coordinator's keys have every pair sign (one key pair for
 * each end, the same for both links here): it takes what the first stage hands on, and hands the last its own.
 */
const PAIR_KEYS = [newSigningKeys(), newSigningKeys()];
const [firstHandsOn, testTakes] = memoryExchanges(2);
const [testHandsOn, lastTakes] = memoryExchanges(2);
testTakes.keepEvidence(new ExchangeLedger(RECEIVER, pair(RECEIVER).signing));
testHandsOn.keepEvidence(new ExchangeLedger(SENDER, pair(SENDER).signing));
/** the hand-off of job 1's first forward, to the tiny model's second block */
const handOffOf = { tag: { job: 1, step: 0, pass: 0 }, block: 1 };

const forward = (patches: Float32Array, hidden?: HiddenState): ExecuteArgs => ({
  job: 1,
  step: 0,
  pass: 0,
  timestep: 700,
  latentShape: LATENT_SHAPE,
  patches,
  ...(hidden && { hidden }),
});
const patches = () => Float32Array.from({ length: 4 * 64 }, (_, i) => Math.cos(i * 0.11));
const EMPTY = new Float32Array(0);

beforeAll(async () => {
  server = await serveFolder(PUBLIC_DIR);
  modelUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/models/tiny-wan`;
  const whole = await loadTransformer(tinyModelFiles);
  wholeBytes = [...whole.weights.values()].reduce((n, t) => n + t.data.byteLength, 0);
  ({ textDim, dim } = whole.config);
});
afterAll(() => new Promise<void>((closed) => server.close(() => closed())));

describe('a worker holding a pipeline stage', () => {
  let first: Remote<WorkerApi>;
  let last: Remote<WorkerApi>;
  let whole: Remote<WorkerApi>;
  let held: number[];
  let lastRuntime: WorkerRuntime;
  beforeAll(async () => {
    const workers = [
      await worker(FIRST, { after: firstHandsOn }),
      await worker(LAST, { before: lastTakes }),
      await worker(),
    ];
    [first, last, whole] = workers.map((w) => w.api);
    lastRuntime = workers[1].runtime;
    held = workers.map((w) => w.loaded.heldWeightBytes);
  }, 60_000);

  it("loads its stage's tensors alone and says how many bytes it holds: the two stages' add up to the whole model", async () => {
    expect(held[2]).toBe(wholeBytes);
    expect(held[0] + held[1]).toBe(wholeBytes);
    expect(held[0]).toBeLessThan(wholeBytes);
    expect(held[1]).toBeLessThan(wholeBytes / 2); // a block and the head; the embedders are the first stage's
    expect((await first.loadModel({ modelUrl, ep: 'wasm', blocks: FIRST })).inMemory).toBe(true);
    // another range is another model to the engine, not the one it holds
    const { api } = await worker(FIRST);
    const other = await api.loadModel({ modelUrl, ep: 'wasm', blocks: LAST });
    expect([other.inMemory, other.heldWeightBytes]).toEqual([false, held[1]]);
  }, 60_000);

  /** What the first stage hands on for job 1's first forward, as its link carries it. */
  async function handedOn(): Promise<HiddenState> {
    const handed = await first.executeModel(forward(patches()));
    expect(handed.rows.length).toBe(0);
    expect(handed.bytesSent).toBe(4 * (7 + TEXT_ROWS + 4) * dim); // its hand-off's payload
    return (await takeHandOff(testTakes, handOffOf, { dim, rows: 4, textRows: TEXT_ROWS })).hidden;
  }

  it("the first stage hands its hidden state on over its link, the last takes it: the whole model's rows to the bit", async () => {
    const hidden = await handedOn();
    expect([hidden.x.length, hidden.temb.length, hidden.tproj.length, hidden.context.length]).toEqual([
      4 * dim,
      dim,
      6 * dim,
      TEXT_ROWS * dim,
    ]);
    handOn(testHandsOn, handOffOf, hidden);
    const staged = await last.executeModel(forward(EMPTY));
    expect(staged.handOff?.bytes).toBe(4 * (7 + TEXT_ROWS + 4) * dim);
    const expected = await whole.executeModel(forward(patches()));
    expect(staged.rows.length).toBe(expected.rows.length);
    expect(maxAbsDiff(staged.rows, expected.rows)).toBe(0);
  });

  it("a hand-off that is not one of its forward is refused as its sender's lie, saying what is wrong, and the worker runs on", async () => {
    const good = await handedOn();
    // a hidden state the size of another share, or poisoned: the stage before's rank is blamed, at this rank's place
    const lies: [HiddenState, string][] = [
      [{ ...good, x: good.x.subarray(dim) }, 'tensor 0 of its hand-off has'],
      [{ ...good, x: new Float32Array(5 * dim) }, 'tensor 0 of its hand-off has'],
      [{ ...good, tproj: good.tproj.map((v, i) => (i === 5 ? NaN : v)) }, 'its tproj has NaN'],
      [{ ...good, temb: good.temb.map(() => Infinity) }, 'its temb has NaN or infinite values'],
    ];
    for (const [lie, why] of lies) {
      handOn(testHandsOn, handOffOf, lie);
      const refused = await last.executeModel(forward(EMPTY)).then(
        () => null,
        (e: unknown) => e,
      );
      expect(String(refused)).toContain(why);
      expect(refused).toMatchObject({ detail: { rank: 0, stage: 'before', cause: 'misbehaved' } });
    }
    // a hidden state from the coordinator, or patches, where the stage before hands on directly
    await expect(last.executeModel(forward(EMPTY, good))).rejects.toThrow(
      'given a hidden state, but the stage before hands it on directly',
    );
    handOn(testHandsOn, handOffOf, good);
    await expect(last.executeModel(forward(patches()))).rejects.toThrow('given patches beside the hidden state');
    await expect(first.executeModel(forward(patches(), good))).rejects.toThrow(
      'given a hidden state, but this rank holds blocks 0–0 of 2 and starts from the patches',
    );
    // a recomputation of its stage (a spot check's) is held to the same input; a stale or reused one needs every block
    await expect(last.recompute(forward(patches()))).rejects.toThrow(
      "recompute needs the stage before's hidden state: this rank holds blocks 1–1 of 2",
    );
    await expect(last.recompute({ ...forward(EMPTY, good), stale: true })).rejects.toThrow(
      'recompute runs the whole model, but this rank holds blocks 1–1 of 2 (a pipeline stage)',
    );
    // refused, not broken: the next well-formed hidden state is computed, and recomputed alike
    handOn(testHandsOn, handOffOf, good);
    const rows = (await last.executeModel(forward(EMPTY))).rows;
    expect(rows.length).toBe(4 * 64);
    expect(await last.recompute(forward(EMPTY, good))).toMatchObject({ rows });
    const recomputed = await first.recompute(forward(patches()));
    expect(recomputed.rows).toHaveLength(0);
    expect(recomputed.hidden).toEqual(good);
    // what the last stage was handed is kept, with its receipts, for a spot check
    const evidence = await last.handOffEvidence({ job: 1, step: 0, pass: 0 });
    expect(evidence.hidden).toEqual(good);
    expect(evidence.receipts.at(-1)).toMatchObject({ from: 0, block: 1, phase: ExchangePhase.HandOff, group: 0 });
  });

  it("a peer's tensor for a block the stage does not hold is refused from its header", () => {
    const tag = { job: 1, step: 0, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 };
    expect(lastRuntime.judgeTensor(0, tag, 4)).toBe('tensor for block 0, but this rank holds blocks 1–1');
    expect(lastRuntime.judgeTensor(0, { ...tag, block: 1 }, 4)).toMatch(/^phase 0 tensor of 4 bytes; the plan says/);
    // a mesh probe's tensors name block 0 whatever the stage
    expect(lastRuntime.judgeTensor(0, { ...tag, phase: ExchangePhase.Probe }, 12)).toMatch(
      /^phase 2 tensor of 12 bytes/,
    );
    // on its hand-off link: a hand-off to its first block alone, from the stage before, no larger than its share's
    const handOff = { ...tag, block: 1, phase: ExchangePhase.HandOff };
    const most = 4 * (7 + TEXT_ROWS + 4) * dim;
    expect(lastRuntime.judgeTensor(0, handOff, most, 'before')).toBeNull();
    expect(lastRuntime.judgeTensor(0, handOff, most + 4, 'before')).toMatch(/at most \d+ fit this rank's share/);
    expect(lastRuntime.judgeTensor(1, handOff, 4, 'before')).toBe('tensor from rank 1 of a hand-off link');
    expect(lastRuntime.judgeTensor(0, { ...handOff, block: 0 }, 4, 'before')).toMatch('hand-off to block 0');
    expect(lastRuntime.judgeTensor(0, { ...tag, block: 1 }, 4, 'before')).toBe('phase 0 tensor on a hand-off link');
    expect(lastRuntime.judgeTensor(0, handOff, 4, 'after')).toMatch('sends nothing back');
    expect(lastRuntime.judgeTensor(0, handOff, 4)).toBe('a hand-off on the mesh of its own stage');
  });

  it('a stage beyond the model is refused as it loads, saying which blocks there are', async () => {
    await expect(first.loadModel({ modelUrl, ep: 'wasm', blocks: { from: 1, to: 5 } })).rejects.toThrow(
      'the transformer has blocks 0–1: a stage cannot hold [1, 5)',
    );
    await expect(first.loadModel({ modelUrl, ep: 'wasm', blocks: { from: -1, to: 1 } })).rejects.toThrow(
      /blocks\.from: expected an integer in \[0, 1023\]/,
    );
  });
});
