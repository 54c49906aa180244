// A worker that holds one pipeline stage, through the real runtime and engine: it loads only its
// stage's blocks from the model folder over HTTP, says how many weight bytes it holds, hands its
// hidden state on (or takes the stage before's), and refuses a hidden state that is not one of its
// forward's, saying what is wrong, without computing from it.
import { readFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join, normalize } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { BlockRange, HiddenState } from '../../core/model/blocks.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { inProcess, type Remote } from '../../core/net/rpc.ts';
import { maxAbsDiff } from '../../core/tensor.ts';
import { WORKER_CONTRACT, type ExecuteArgs, type LoadedModel, type WorkerApi } from '../../core/worker-api.ts';
import { createEngine } from '../../rank/engine.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { WorkerRuntime } from '../../rank/runtime.ts';
import { ExchangePhase } from '../../rank/ulysses.ts';
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

/** A worker of its own engine, as the coordinator calls it: through the contract's checks, prepared for job 1. */
async function worker(
  blocks?: BlockRange,
): Promise<{ api: Remote<WorkerApi>; runtime: WorkerRuntime; loaded: LoadedModel }> {
  const runtime = new WorkerRuntime(createEngine(), {
    connectMesh: () => Promise.resolve(memoryExchanges(1)[0]),
    describe: describeInProcess(),
  });
  const api = inProcess<WorkerApi>(runtime, WORKER_CONTRACT, 'worker');
  await api.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's' });
  const loaded = await api.loadModel({ modelUrl, ep: 'wasm', ...(blocks && { blocks }) });
  await api.prepareJob({ job: 1, texts: [text()], latentShape: LATENT_SHAPE });
  return { api, runtime, loaded };
}

function text(): Float32Array {
  return Float32Array.from({ length: TEXT_ROWS * textDim }, (_, i) => Math.sin(i * 0.37));
}

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
    const workers = [await worker(FIRST), await worker(LAST), await worker()];
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

  it("the first stage hands its hidden state on, the last takes it: the whole model's rows to the bit", async () => {
    const handed = await first.executeModel(forward(patches()));
    expect(handed.rows.length).toBe(0);
    const hidden = handed.hidden as HiddenState;
    expect([hidden.x.length, hidden.temb.length, hidden.tproj.length, hidden.context.length]).toEqual([
      4 * dim,
      dim,
      6 * dim,
      TEXT_ROWS * dim,
    ]);
    const staged = await last.executeModel(forward(EMPTY, hidden));
    expect(staged.hidden).toBeUndefined();
    const expected = await whole.executeModel(forward(patches()));
    expect(staged.rows.length).toBe(expected.rows.length);
    expect(maxAbsDiff(staged.rows, expected.rows)).toBe(0);
  });

  it('a hidden state that is not one of its forward is refused, saying what is wrong, and the worker runs on', async () => {
    const { hidden } = await first.executeModel(forward(patches()));
    const good = hidden as HiddenState;
    const refusals: [ExecuteArgs, string | RegExp][] = [
      [forward(EMPTY, { ...good, x: good.x.subarray(dim) }), `its x has ${3 * dim} values, not 4×${dim}`],
      [forward(EMPTY, { ...good, tproj: good.tproj.map((v, i) => (i === 5 ? NaN : v)) }), 'its tproj has NaN'],
      [forward(EMPTY, { ...good, temb: good.temb.map(() => Infinity) }), 'its temb has NaN or infinite values'],
      [forward(EMPTY, { ...good, context: new Float32Array(dim) }), `its context has ${dim} values, not 3×${dim}`],
      [forward(EMPTY), "needs the stage before's hidden state: this rank holds blocks 1–1 of 2"],
      [forward(patches(), good), 'given patches beside the hidden state'],
      // the contract's checks: what no Float32Array is does not reach the runtime
      [forward(EMPTY, { ...good, x: [1, 2, 3] as unknown as Float32Array }), /hidden\.x: expected a Float32Array/],
    ];
    for (const [args, why] of refusals) await expect(last.executeModel(args)).rejects.toThrow(why);
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
    const rows = (await last.executeModel(forward(EMPTY, good))).rows;
    expect(rows.length).toBe(4 * 64);
    expect(await last.recompute(forward(EMPTY, good))).toMatchObject({ rows });
    const recomputed = await first.recompute(forward(patches()));
    expect(recomputed.rows).toHaveLength(0);
    expect(recomputed.hidden).toEqual(good);
  });

  it("a peer's tensor for a block the stage does not hold is refused from its header", () => {
    const tag = { job: 1, step: 0, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 };
    expect(lastRuntime.judgeTensor(0, tag, 4)).toBe('tensor for block 0, but this rank holds blocks 1–1');
    expect(lastRuntime.judgeTensor(0, { ...tag, block: 1 }, 4)).toMatch(/^phase 0 tensor of 4 bytes; the plan says/);
    // a mesh probe's tensors name block 0 whatever the stage
    expect(lastRuntime.judgeTensor(0, { ...tag, phase: ExchangePhase.Probe }, 12)).toMatch(
      /^phase 2 tensor of 12 bytes/,
    );
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
