// What a peer sends can never hurt a page: 10,000+ random and mutated frames go to the frame
// decoder, to a worker's RPC dispatch, to a rank's mesh link and to the coordinator's RPC client,
// and hostile arguments to every worker method. Every frame is dropped for a stated reason or
// delivered whole, no request changes a prepared job, and what is held stays bounded. Then
// structured mutations, well-formed frames whose meaning is hostile: tensors between ranks,
// the rows a rank returns, the replies to every method and the heartbeat's pulse.
import { beforeAll, describe, expect, it, vi } from 'vitest';
import { defined } from '../../core/defined.ts';
import { ExchangePhase, type ExchangeTag } from '../../rank/ulysses.ts';
import { stringMatching } from './matchers.ts';
import { Link } from '../../core/net/link.ts';
import { ContractError, passing } from '../../core/net/check.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import type { WanModel } from '../../core/model/reference.ts';
import {
  COORDINATOR,
  HEADER_BYTES,
  payloadBytes,
  encodeFrames,
  readHeader,
  Reassembler,
  type DType,
  type FrameHeader,
  type Message,
  type TensorTag,
} from '../../core/net/protocol.ts';
import { packValue, remote, serve, unpackValue } from '../../core/net/rpc.ts';
import { watchHeartbeats } from '../../core/net/heartbeat.ts';
import { RankLayout } from '../../core/parallel.ts';
import {
  checkPulse,
  PeerLost,
  WORKER_CONTRACT,
  WORKER_METHODS,
  type ExecuteResult,
  type PingReply,
  type WorkerApi,
  type WorkerMethod,
} from '../../core/worker-api.ts';
import { WorkerError } from '../../coordinator/executor.ts';
import { SeededRandom } from '../../core/random.ts';
import { MAX_AHEAD, MeshExchange } from '../../rank/exchange/mesh.ts';
import { PROBE_FLOATS } from '../../rank/mesh-probe.ts';
import { referenceStages } from '../../rank/stages.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { WorkerRuntime } from '../../rank/runtime.ts';
import { judgeMeshFrame } from '../../worker/mesh.ts';
import { SinkChannel, stubEngine, tinyModelFiles, describeInProcess } from './fixtures.ts';
import { EXACT_SETTINGS, InProcessExecutor } from './in-process-executor.ts';

const FRAMES_PER_TARGET = 10_000;
const random = new SeededRandom(99);
const pick = <T>(items: T[]): T => items[Math.floor(random.uniform() * items.length)];

type ReplyBody = { type: 'reply'; id: number; ok: boolean; error?: string };

/** A channel that decodes what a worker sends back: its replies, by request id. */
class ReplyChannel extends SinkChannel {
  readonly replies = new Map<number, ReplyBody[]>();
  private readonly reassembler = new Reassembler();
  override send(data: ArrayBuffer) {
    const msg = this.reassembler.push(data);
    const body = msg?.kind === 'rpc' ? (msg.body as ReplyBody) : null;
    if (body?.type === 'reply') this.replies.set(body.id, [...(this.replies.get(body.id) ?? []), body]);
  }
  get all(): ReplyBody[] {
    return [...this.replies.values()].flat();
  }
}

/** Valid frames turned into hostile ones: truncated, bytes flipped, fields rewritten, or noise. */
function mutate(valid: ArrayBuffer[]): ArrayBuffer {
  const base = new Uint8Array(pick(valid).slice(0));
  const view = new DataView(base.buffer);
  switch (Math.floor(random.uniform() * 6)) {
    case 0:
      return base.slice(0, Math.floor(random.uniform() * base.length)).buffer;
    case 1:
      for (let i = 0; i < 1 + random.uniform() * 4; i++)
        base[Math.floor(random.uniform() * base.length)] = random.uniform() * 256;
      return base.buffer;
    case 2: {
      // a header field set to something else: dtype, from, ndim, ids, chunk index/count, stride,
      // total size, tag, shape
      const offset = pick([4, 5, 6, 8, 12, 16, 20, 24, 28, 32, 36, 38, 40, 44, 48]);
      if (offset <= 6) base[offset] = random.uniform() * 256;
      else if (offset >= 36 && offset <= 40) view.setUint16(offset, random.uniform() * 65536, true);
      else
        view.setUint32(
          offset,
          pick([0, 1, 2, 255, 65535, 2 ** 31, 2 ** 32 - 1, Math.floor(random.uniform() * 2 ** 32)]),
          true,
        );
      return base.buffer;
    }
    case 3:
      return Uint8Array.from({ length: Math.floor(random.uniform() * 400) }, () => random.uniform() * 256).buffer;
    case 4: {
      const longer = new Uint8Array(base.length + 1 + Math.floor(random.uniform() * 64));
      longer.set(base);
      return longer.buffer;
    }
    default:
      return base.buffer; // replays are hostile too
  }
}

/** One request as one frame (msgId = id), so each frame that survives mutation is a whole request. */
function requestFrame(id: number, method: string, args: unknown): ArrayBuffer {
  const { packed, tensors } = packValue(args);
  const frames = encodeFrames(
    { kind: 'rpc', from: COORDINATOR, body: { type: 'request', id, method, args: packed }, tensors },
    id,
  );
  if (frames.length !== 1) throw new Error(`request ${method} takes ${frames.length} frames; keep it to one`);
  return frames[0];
}

const settle = () => new Promise((r) => setTimeout(r, 20));

let model: WanModel;
beforeAll(async () => {
  model = await loadTransformer(tinyModelFiles);
});

function runtimeFor(rank: number, world: number) {
  const engine = stubEngine(referenceStages(model), model.config);
  const exchanges = memoryExchanges(world);
  return new WorkerRuntime(engine, {
    connectMesh: () => Promise.resolve(exchanges[rank]),
    describe: describeInProcess('node'),
  });
}

const LATENT = [16, 1, 14, 10]; // 35 tokens
/** Values per token of the tiny model's patches: 16 channels × 1·2·2. */
const PATCH_WIDTH = 64;

/** Rank 0 of 1 with the tiny model loaded and job 5 prepared (one text, 35 tokens). */
async function preparedRuntime(): Promise<WorkerRuntime> {
  const runtime = runtimeFor(0, 1);
  await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['w0'], session: 's' });
  await runtime.loadModel({ modelUrl: '/models/tiny-wan', ep: 'wasm' });
  await runtime.prepareJob({ job: 5, texts: [new Float32Array(32 * model.config.textDim)], latentShape: LATENT });
  return runtime;
}

/** What a runtime's job, its passes, its plan and its totals are, read through its public methods. */
async function observed(runtime: WorkerRuntime) {
  const tag: TensorTag = { job: 5, step: 0, pass: 0, block: 0, phase: 1, group: 0 };
  return {
    ping: await runtime.ping(),
    job: runtime.judgeTensor(0, { ...tag, job: 0 }, 0),
    passes: runtime.judgeTensor(0, { ...tag, pass: 9 }, 0),
    qkvBytes: runtime.judgeTensor(0, { ...tag, phase: 0 }, 0),
    outputBytes: runtime.judgeTensor(0, tag, 0),
  };
}

const PREPARED = {
  ping: {
    state: 'ready',
    rank: 0,
    totals: { steps: 0, bytesSent: 0, computeMs: 0, bytesDownloaded: 0, bytesKept: 0, deviceTensorsLeft: 0 },
  },
  job: 'tensor for job 0, but job 5 is running',
  passes: 'tensor for pass 9, but the job has 1',
  qkvBytes: 'phase 0 tensor of 0 bytes; the plan says 120960', // 3 · 35 tokens · 12 heads · 24 · 4 bytes
  outputBytes: 'phase 1 tensor of 0 bytes; the plan says 40320',
};

/** The runtime behind a wrapper that counts the calls that reach each method and the argument keys they carry. */
function counted(runtime: WorkerRuntime) {
  const calls: Partial<Record<WorkerMethod, number>> = {};
  const argKeys = new Set<string>();
  const wrapper = Object.fromEntries(
    WORKER_METHODS.map((method) => [
      method,
      (args: unknown) => {
        calls[method] = (calls[method] ?? 0) + 1;
        for (const key of Object.keys(args ?? {})) argKeys.add(key);
        return (runtime[method] as (a: unknown) => Promise<unknown>).call(runtime, args);
      },
    ]),
  ) as unknown as WorkerApi;
  const total = () => Object.values(calls).reduce((a, b) => a + b, 0);
  return { wrapper, calls, argKeys, total };
}

const rpcOnly = { accept: (h: { kind: string }) => (h.kind !== 'rpc' ? 'rpc only' : null) };

describe(`fuzz: ${FRAMES_PER_TARGET} hostile frames per target`, () => {
  it('the frame decoder drops each hostile frame for a stated reason (never an internal error), delivers only consistent messages, stays within its caps, and still takes an honest message', () => {
    const reassembler = new Reassembler({ maxMessageBytes: 1 << 20, maxOpenMessages: 16 });
    const tensor: Message = {
      kind: 'tensor',
      from: 1,
      tag: { job: 1, step: 2, pass: 0, block: 1, phase: 0, group: 0 },
      dtype: 'f32',
      shape: [4096],
      data: new Uint8Array(16384),
    };
    const rpc: Message = {
      kind: 'rpc',
      from: COORDINATOR,
      body: { type: 'request', id: 1, method: 'ping', args: {} },
      tensors: [new Float32Array(3000).map((_, i) => i)],
    };
    const small: Message = {
      kind: 'tensor',
      from: 1,
      tag: { job: 1, step: 2, pass: 0, block: 1, phase: 1, group: 0 },
      dtype: 'f16',
      shape: [8, 8],
      data: new Uint8Array(128),
    };
    const valid = [...encodeFrames(tensor, 1, 4096), ...encodeFrames(rpc, 2, 2048), ...encodeFrames(small, 3)];
    let peakHeld = 0;
    let peakOpen = 0;
    let badHeaders = 0;
    let droppedForTheirHeader = 0;
    const internalErrors: string[] = [];
    const inconsistent: Message[] = [];
    let delivered = 0;
    for (let i = 0; i < FRAMES_PER_TARGET; i++) {
      const frame = mutate(valid);
      // every other frame under a new message id, so that it is not turned away merely as part of a finished message
      if (i % 2 === 1 && frame.byteLength >= 12) new DataView(frame).setUint32(8, 1_000_000 + i, true);
      const headerFault = readHeader(new Uint8Array(frame));
      const before = reassembler.dropped;
      const msg = reassembler.push(frame);
      if (reassembler.dropped > before && reassembler.lastError.startsWith('internal error'))
        internalErrors.push(reassembler.lastError);
      if (typeof headerFault === 'string') {
        badHeaders++;
        if (msg === null && reassembler.dropped === before + 1 && reassembler.lastError === headerFault)
          droppedForTheirHeader++;
      }
      if (msg !== null) {
        delivered++;
        const size =
          msg.kind === 'tensor'
            ? payloadBytes(
                msg.shape.reduce((a, b) => a * b, 1),
                msg.dtype,
              )
            : 0;
        if (msg.kind === 'tensor' && msg.data.byteLength !== size) inconsistent.push(msg);
      }
      peakHeld = Math.max(peakHeld, reassembler.heldBytes);
      peakOpen = Math.max(peakOpen, reassembler.openMessages);
    }
    expect(internalErrors).toEqual([]);
    expect(badHeaders).toBeGreaterThan(FRAMES_PER_TARGET / 3);
    expect(droppedForTheirHeader).toBe(badHeaders);
    expect(inconsistent).toEqual([]);
    expect(delivered).toBeGreaterThanOrEqual(2);
    expect(reassembler.dropped).toBeGreaterThan(FRAMES_PER_TARGET / 2);
    expect(peakOpen).toBe(16);
    expect(peakHeld).toBeLessThanOrEqual(4 << 20);

    const honest = encodeFrames(rpc, 77_777, 2048).map((f) => reassembler.push(f));
    expect(honest.slice(0, -1)).toEqual(honest.slice(0, -1).map(() => null));
    expect(honest.at(-1)).toEqual(rpc);
  });

  it("mutated requests reach the worker's methods thousands of times, every reply is a refusal, and the prepared job, its plan and the totals do not change", async () => {
    const runtime = await preparedRuntime();
    expect(await observed(runtime)).toEqual(PREPARED);
    const { wrapper, calls, total } = counted(runtime);
    const channel = new ReplyChannel();
    const link = new Link(channel, rpcOnly);
    serve<WorkerApi>(link, 0, WORKER_CONTRACT, wrapper);
    const textDim = model.config.textDim;
    // Each passes the contract and is refused by the runtime; a flip or two cannot mend any of them.
    const refused: [WorkerMethod, unknown][] = [
      ['initWorker', { ...EXACT_SETTINGS, rank: 200, world: 2, peers: ['a', 'b'], session: 's' }], // rank ≥ world
      ['initWorker', { ...EXACT_SETTINGS, rank: 0, world: 2, peers: 'abcdefghijkl'.split(''), session: 's' }], // 12 peers for 2 ranks
      ['prepareJob', { job: 9, texts: [new Float32Array(textDim + 1)], latentShape: LATENT }], // not the text width
      ['probeMesh', { job: 99 }], // not the prepared job
      [
        'executeModel',
        {
          job: 5,
          step: 0,
          pass: 0,
          timestep: 500,
          latentShape: LATENT,
          patches: new Float32Array(35 * PATCH_WIDTH + 1),
        },
      ], // one patch value too many
      [
        'executeModel',
        { job: 99, step: 0, pass: 0, timestep: 500, latentShape: LATENT, patches: new Float32Array(35 * PATCH_WIDTH) },
      ], // not the prepared job
    ];
    for (let id = 0; id < FRAMES_PER_TARGET; id++) {
      const [method, args] = pick(refused);
      link.receive(mutate([requestFrame(id, method, args)]));
    }
    await settle();
    expect(link.stats.listenerErrors).toBe(0);
    expect(total()).toBeGreaterThan(FRAMES_PER_TARGET / 4);
    expect(Object.keys(calls).sort()).toEqual(['executeModel', 'initWorker', 'prepareJob', 'probeMesh']);
    expect(channel.all.filter((r) => r.ok)).toEqual([]);
    expect(channel.all.length).toBeGreaterThanOrEqual(total());
    expect(await observed(runtime)).toEqual(PREPARED);
  });

  it("a rank's mesh link refuses a tensor of another dtype by its header, before a byte of it is buffered, whatever its size", () => {
    const header = (dtype: DType): FrameHeader => ({
      kind: 'tensor',
      dtype,
      from: 1,
      tag: { job: 5, step: 0, pass: 0, block: 0, phase: 0, group: 0 },
      shape: [16],
      signed: false,
      msgId: 0,
      chunkIndex: 0,
      chunkCount: 1,
      chunkStride: 64,
      totalBytes: 64,
    });
    const anySize = () => null;
    expect(judgeMeshFrame(1, header('f16'), anySize, 'f32')).toEqual({
      refused: 'a f16 tensor on a f32 mesh',
      misbehaved: false,
    });
    expect(judgeMeshFrame(1, header('f32'), anySize, 'i8')).toEqual({
      refused: 'a f32 tensor on a i8 mesh',
      misbehaved: false,
    });
    expect(judgeMeshFrame(1, header('i8'), anySize, 'i8')).toBeNull();
  });

  it("a rank's mesh link (judgeMeshFrame with the runtime's judgeTensor) refuses each hostile tensor whole, and no mutation of them delivers anything but a tensor of the prepared job at its planned size", async () => {
    const runtime = runtimeFor(0, 2);
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 2, peers: ['a', 'b'], session: 's' });
    await runtime.loadModel({ modelUrl: 'x', ep: 'wasm' });
    await runtime.prepareJob({ job: 5, texts: [new Float32Array(32 * model.config.textDim)], latentShape: LATENT });
    const exchange = new MeshExchange(0, 2);
    const delivered: Message[] = [];
    let misbehaved = 0;
    const link = new Link(new SinkChannel(), {
      accept: (header) => {
        const verdict = judgeMeshFrame(1, header, (from, tag, bytes) => runtime.judgeTensor(from, tag, bytes), 'f32');
        if (verdict?.misbehaved) misbehaved++;
        return verdict?.refused ?? null;
      },
    });
    link.onMessage((m) => delivered.push(m));
    exchange.addPeer(1, link);
    // 35 tokens over 2 ranks: 18 for rank 0, 17 for rank 1; 12 heads / 2 ranks. Rank 1 sends q, k, v
    // of its 17 tokens for rank 0's heads, and the output of its heads for rank 0's 18 tokens.
    const [Sl, Sfrom] = [18, 17];
    const W = 6 * model.config.headDim;
    const { numLayers } = model.config;
    const tag = (t: Partial<TensorTag> = {}): TensorTag => ({
      job: 5,
      step: 0,
      pass: 0,
      block: 0,
      phase: 1,
      group: 0,
      ...t,
    });
    const tensor = (t: TensorTag, floats: number, from = 1): Message => ({
      kind: 'tensor',
      from,
      tag: t,
      dtype: 'f32',
      shape: [floats],
      data: new Uint8Array(floats * 4),
    });
    const hostile: [Message, RegExp][] = [
      [tensor(tag({ phase: 0 }), 3 * Sfrom * W, 0), /in the name of rank 0/],
      [tensor(tag({ job: 4 }), Sl * W), /tensor for job 4, but job 5 is running/],
      [tensor(tag({ block: numLayers }), Sl * W), /tensor for block 2 of 2/],
      [tensor(tag({ pass: 1 }), Sl * W), /tensor for pass 1, but the job has 1/], // pass ≥ texts.length
      [tensor(tag({ step: 1000 }), Sl * W), /tensor for step 1000/],
      [tensor(tag({ phase: 0 }), 3 * Sfrom * W + 1), /phase 0 tensor of 29380 bytes; the plan says 29376/],
      [tensor(tag(), Sl * W - 1), /phase 1 tensor of 10364 bytes; the plan says 10368/],
      [tensor(tag({ phase: 3 }), Sl * W), /unknown exchange phase 3/],
      [{ kind: 'rpc', from: 1, body: 'hello', tensors: [] }, /rank 1 sent a rpc message on the mesh/],
    ];
    const valid: ArrayBuffer[] = [];
    hostile.forEach(([message, reason], id) => {
      const frames = encodeFrames(message, id, 8192);
      const before = link.stats.framesDropped;
      for (const frame of frames) link.receive(frame);
      expect([id, link.stats.framesDropped - before, link.stats.lastDropReason]).toEqual([
        id,
        frames.length,
        expect.stringMatching(reason),
      ]);
      valid.push(...frames);
    });
    expect(delivered).toEqual([]);
    // each frame in another rank's name, and only those
    expect(misbehaved).toBe(encodeFrames(hostile[0][0], 0, 8192).length);

    // The rule as a spec, independent of judgeTensor: what may come through at all.
    const plannedBytes = (t: TensorTag) =>
      4 *
      (t.phase === 0 ? 3 * Sfrom * W : t.phase === 1 ? Sl * W : t.phase === 2 ? (PROBE_FLOATS[t.step] ?? NaN) : NaN);
    const allowed = (m: Message) =>
      m.kind === 'tensor' &&
      m.from === 1 &&
      m.tag.job === 5 &&
      m.tag.pass === 0 &&
      m.tag.block < numLayers &&
      m.tag.step < 1000 &&
      m.data.byteLength === plannedBytes(m.tag);
    for (let i = 0; i < FRAMES_PER_TARGET; i++) link.receive(mutate(valid));
    expect(delivered.filter((m) => !allowed(m))).toEqual([]);
    expect(link.stats.listenerErrors).toBe(0);
    expect(runtime.state).toBe('ready');
    // and the honest message still gets through afterwards
    const before = delivered.length;
    for (const frame of encodeFrames(tensor(tag(), Sl * W), 99_999, 8192)) link.receive(frame);
    expect(delivered.length - before).toBe(1);
  });

  it("the coordinator's RPC client: no hostile reply that decodes settles a call, a malformed reply to it rejects naming the worker and the field, one that does not decode rejects every call waiting, and the real reply resolves the next call", async () => {
    const link = new Link(new SinkChannel());
    const client = remote(link, COORDINATOR, WORKER_CONTRACT, 'worker w0');
    const pong: PingReply = {
      state: 'ready',
      rank: 0,
      totals: { steps: 1, bytesSent: 0, computeMs: 0, bytesDownloaded: 0, bytesKept: 0, deviceTensorsLeft: 0 },
    };
    const reply = (id: number, body: object): Message => ({
      kind: 'rpc',
      from: 0,
      body: { type: 'reply', id, ...body },
      tensors: [],
    });
    // near misses of a reply to call `id`, and replies to calls never made
    const noise = (id: number): Message[] => [
      reply(77, { ok: false, error: 'x' }),
      reply(id + 100, { ok: true, result: pong }),
      reply(id, { ok: 'yes', result: pong }), // ok is not a boolean
      { kind: 'rpc', from: 0, body: { type: 'request', id, ok: true, result: pong }, tensors: [] },
      { kind: 'rpc', from: 0, body: { type: 'request', id, method: 'ping', args: {} }, tensors: [] },
      { kind: 'rpc', from: 0, body: [id, pong], tensors: [] },
    ];
    let msgId = 0;
    // a message whose frames are whole but whose body does not decode fails the calls waiting (below): the storm
    // leaves out the mutants that would be one, alone or with others (a frame that declares more chunks)
    const decodes = (frame: ArrayBuffer) => {
      const header = readHeader(new Uint8Array(frame));
      if (typeof header === 'string') return true; // dropped by its header
      const alone = new Reassembler();
      alone.push(frame.slice(0));
      return header.chunkCount === 1 && alone.malformed === 0;
    };
    const storm = (id: number, frames: number) => {
      const before = link.stats.messagesReceived;
      for (let i = 0; i < frames; i++) {
        const frame = mutate(encodeFrames(pick(noise(id)), msgId++));
        if (decodes(frame)) link.receive(frame);
      }
      return link.stats.messagesReceived - before;
    };
    const outcome = <T>(p: Promise<T>) => {
      const o: { settled: boolean; promise: Promise<T> } = { settled: false, promise: p };
      p.then(
        () => (o.settled = true),
        () => (o.settled = true),
      );
      return o;
    };

    const first = outcome(client.ping({}, 60_000)); // call 1
    expect(storm(1, FRAMES_PER_TARGET / 2)).toBeGreaterThan(FRAMES_PER_TARGET / 10);
    await settle();
    expect(first.settled).toBe(false);
    for (const frame of encodeFrames(reply(1, { ok: true, result: { ...pong, state: 'dancing' } }), msgId++))
      link.receive(frame);
    const error = await first.promise.then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ContractError);
    expect((error as ContractError).message).toBe(
      'worker w0 answered ping with a malformed reply: reply.state: expected one of "idle", "initialized", "loading", "ready", "computing", got "dancing"',
    );

    const second = outcome(client.ping({}, 60_000)); // call 2
    expect(storm(2, FRAMES_PER_TARGET / 2)).toBeGreaterThan(FRAMES_PER_TARGET / 10);
    await settle();
    expect(second.settled).toBe(false);
    for (const frame of encodeFrames(reply(2, { ok: true, result: pong }), msgId++)) link.receive(frame);
    // too late for call 1: ignored
    for (const frame of encodeFrames(reply(1, { ok: true, result: pong }), msgId++)) link.receive(frame);
    await expect(second.promise).resolves.toEqual(pong);

    // a reply whose JSON is broken cannot be matched to its call: every call waiting fails at once, a breach
    const third = client.ping({}, 60_000);
    const [broken] = encodeFrames(reply(3, { ok: true, result: pong }), msgId++);
    new Uint8Array(broken)[HEADER_BYTES + 8] = 0x7f; // the JSON's opening brace
    link.receive(broken);
    await expect(third).rejects.toThrow(
      /^worker w0 sent a message that does not decode while ping waited: rpc message \d+: /,
    );
    await expect(third).rejects.toBeInstanceOf(ContractError);
    expect(link.stats.listenerErrors).toBe(0);
  });
});

// ------------------------------------------------------------------ hostile arguments

/** Values no field of any worker method should take, or that a field takes but the runtime must still refuse. */
const HOSTILE_VALUES: [string, unknown][] = [
  ['-1', -1],
  ['1.5', 1.5],
  ['NaN', NaN],
  ['Infinity', Infinity],
  ['2^53', 2 ** 53],
  ['a string', 'x'],
  ['an empty string', ''],
  ['true', true],
  ['null', null],
  ['[]', []],
  ['{}', {}],
  ['[1, 2, 3]', [1, 2, 3]],
  ['10,000 items', new Array(10_000).fill(7)],
  ['a Float32Array', new Float32Array(3)],
  ['an own __proto__ key', JSON.parse('{"__proto__": {"polluted": true}}')],
];

/** `fields` plus an own enumerable "__proto__" key holding `proto`, as JSON.parse makes one. */
function withOwnProto(fields: object, proto: unknown): object {
  const out = { ...fields };
  Object.defineProperty(out, '__proto__', { value: proto, enumerable: true, writable: true, configurable: true });
  return out;
}

/** Args as the worker receives them: packed, through JSON, unpacked. */
function overTheWire(args: unknown): unknown {
  const { packed, tensors } = packValue(args);
  // lib.d.ts types this string, but JSON.stringify(undefined) is undefined
  const json = JSON.stringify(packed) as string | undefined;
  return unpackValue(
    JSON.parse(json ?? 'null'),
    tensors.map((t) => t.slice()),
  );
}

describe('hostile arguments to every worker method', () => {
  it('are each refused where they are dispatched (the method’s contract or the method itself), every reply is an error, and the prepared job, its plan and the totals stay as they were', async () => {
    const runtime = await preparedRuntime();
    expect(await observed(runtime)).toEqual(PREPARED);
    const textDim = model.config.textDim;
    const patches = new Float32Array(35 * PATCH_WIDTH);
    const executable = { job: 5, step: 0, pass: 0, timestep: 500, latentShape: LATENT, patches };
    // Each method's base: contract-valid arguments the runtime refuses, for the methods that change
    // state; valid ones for the others, whose variants are sent only when the contract refuses them.
    const bases: Record<WorkerMethod, { args: Record<string, unknown>; runtimeRefuses: boolean }> = {
      describe: { args: {}, runtimeRefuses: false },
      ping: { args: {}, runtimeRefuses: false },
      pingEngine: { args: {}, runtimeRefuses: false },
      shutdown: { args: {}, runtimeRefuses: false },
      probeCompute: { args: { ep: 'wasm' }, runtimeRefuses: false },
      probeLink: { args: { payload: new Float32Array(4) }, runtimeRefuses: false },
      loadModel: { args: { modelUrl: '/models/tiny-wan', ep: 'wasm' }, runtimeRefuses: false },
      initWorker: {
        args: { ...EXACT_SETTINGS, rank: 200, world: 2, peers: ['a', 'b'], session: 's' },
        runtimeRefuses: true,
      },
      prepareJob: {
        args: { job: 9, texts: [new Float32Array(textDim + 1)], latentShape: LATENT },
        runtimeRefuses: true,
      },
      probeMesh: { args: { job: 99 }, runtimeRefuses: true },
      executeModel: { args: { ...executable, job: 99 }, runtimeRefuses: true },
      recompute: { args: { ...executable, job: 99 }, runtimeRefuses: true },
      exchangeEvidence: { args: { job: 5, step: 0, pass: 0 }, runtimeRefuses: false },
      // an unstaged rank was handed nothing to keep
      handOffEvidence: { args: { job: 5, step: 0, pass: 0 }, runtimeRefuses: true },
      recomputeExchanges: { args: { ...executable, job: 99, heads: [1, 1], headGroups: 1 }, runtimeRefuses: true },
      rehearse: {
        args: {
          modelUrl: '/models/tiny-wan',
          ep: 'wasm',
          latentShape: [15, 1, 14, 10],
          textTokens: 4,
          degrees: [1],
          forwards: 1,
        },
        runtimeRefuses: true,
      },
      preload: { args: { modelUrl: '/models/tiny-wan' }, runtimeRefuses: false },
      encodeText: {
        args: { modelUrl: '/models/tiny-wan', ep: 'wasm', from: 3, to: 1, tokens: 2, hidden: new Float32Array(8) },
        runtimeRefuses: true,
      },
      decodeTile: {
        args: {
          modelUrl: '/models/tiny-wan',
          ep: 'wasm',
          tile: 't',
          from: 3,
          last: true,
          shape: [16, 1, 2, 2],
          latent: new Float32Array(64),
        },
        runtimeRefuses: true,
      },
      encodeImage: {
        args: { modelUrl: '/models/tiny-wan', ep: 'wasm', shape: [3, 1, 2, 2], video: new Float32Array(5) },
        runtimeRefuses: true,
      },
    };
    const cases: [WorkerMethod, unknown][] = [];
    for (const method of WORKER_METHODS) {
      const { args } = bases[method];
      for (const [, value] of HOSTILE_VALUES) {
        cases.push([method, value]); // the whole argument
        for (const field of Object.keys(args)) cases.push([method, { ...args, [field]: value }]);
      }
      cases.push([method, { ...args, extra: 1, constructor: 'x' }]);
    }
    cases.push(
      // wrong job, pass, step, lengths and shapes, each alone
      ['executeModel', { ...executable, pass: 1 }], // the job has one text
      ['executeModel', { ...executable, pass: 2 }],
      ['executeModel', { ...executable, step: 10_000 }],
      ['executeModel', { ...executable, step: -1 }],
      ['executeModel', { ...executable, timestep: 1001 }],
      ['executeModel', { ...executable, latentShape: [16, 1, 8, 8] }], // 16 tokens, not 35
      ['executeModel', { ...executable, latentShape: [16, 1, 14, 10, 1] }],
      ['executeModel', { ...executable, patches: new Float32Array(34 * PATCH_WIDTH) }],
      ['prepareJob', { job: 6, texts: [new Float32Array(textDim)], latentShape: [15, 1, 14, 10] }], // 15 channels, not 16
      ['prepareJob', { job: 6, texts: [new Float32Array(0)], latentShape: LATENT }],
      ['prepareJob', { job: 6, texts: [1, 2, 3].map(() => new Float32Array(textDim)), latentShape: LATENT }],
      ['prepareJob', { job: 6, texts: [new Float32Array(textDim)], latentShape: [16, 1, 14, 2 ** 21] }],
      ['initWorker', { ...EXACT_SETTINGS, rank: 0, world: 2, peers: ['a'], session: 's' }],
      ['initWorker', { ...EXACT_SETTINGS, rank: 0, world: 0, peers: ['a'], session: 's' }],
      ['initWorker', { ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 'x'.repeat(257) }],
      ['initWorker', { ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['a'], session: 's', dtype: 'f64' }],
      ['initWorker', { rank: 0, world: 1, peers: ['a'], session: 's' }], // no settings
      ['probeLink', { payload: new Float32Array((1 << 20) + 1) }],
      ['loadModel', { modelUrl: 'x'.repeat(5000), ep: 'wasm' }],
      [
        'rehearse',
        { modelUrl: '/models/tiny-wan', ep: 'wasm', latentShape: LATENT, textTokens: 4, degrees: [5], forwards: 1 },
      ], // 5 does not divide the heads
      [
        'rehearse',
        {
          modelUrl: '/models/tiny-wan',
          ep: 'wasm',
          latentShape: [16, 1 << 10, 1 << 10, 1 << 10],
          textTokens: 4,
          degrees: [1],
          forwards: 1,
        },
      ], // 2^28 tokens: nothing is allocated for them
      // valid arguments hidden behind an own __proto__ key must not be read through it
      ['executeModel', withOwnProto({}, executable)],
      ['prepareJob', withOwnProto({}, { job: 6, texts: [new Float32Array(textDim)], latentShape: LATENT })],
      ['initWorker', withOwnProto({}, { rank: 0, world: 1, peers: ['a'], session: 's' })],
      ['loadModel', withOwnProto({}, bases.loadModel.args)],
      ['shutdown', withOwnProto({}, {})],
      ['ping', withOwnProto({}, {})],
    );

    // What the contract refuses on its own, judged here on the arguments as they arrive.
    const contractRefuses = (method: WorkerMethod, args: unknown) => {
      try {
        WORKER_CONTRACT[method].args(overTheWire(args) ?? {}, 'args');
        return false;
      } catch {
        return true;
      }
    };
    const hostile = cases.filter(([method, args]) => bases[method].runtimeRefuses || contractRefuses(method, args));
    const expectedCalls: Partial<Record<WorkerMethod, number>> = {};
    for (const [method, args] of hostile)
      if (!contractRefuses(method, args)) expectedCalls[method] = (expectedCalls[method] ?? 0) + 1;

    const { wrapper, calls, argKeys } = counted(runtime);
    const channel = new ReplyChannel();
    const link = new Link(channel, rpcOnly);
    serve<WorkerApi>(link, 0, WORKER_CONTRACT, wrapper);
    hostile.forEach(([method, args], id) => {
      const { packed, tensors } = packValue(args);
      for (const frame of encodeFrames(
        { kind: 'rpc', from: COORDINATOR, body: { type: 'request', id, method, args: packed }, tensors },
        id,
      ))
        link.receive(frame);
    });
    await vi.waitFor(() => expect(channel.replies.size).toBe(hostile.length));

    expect(hostile.length).toBeGreaterThan(400);
    expect(link.stats).toMatchObject({ messagesReceived: hostile.length, framesDropped: 0, listenerErrors: 0 });
    // one reply per request, every one a refusal
    expect(hostile.map((_, id) => channel.replies.get(id)?.map((r) => r.ok))).toEqual(hostile.map(() => [false]));
    // refused by its method's contract, or by the method itself: each request reached one of them
    const byContract = hostile.filter(([method], id) =>
      defined(defined(channel.replies.get(id), 'the replies')[0].error, 'the refusal').startsWith(
        `${method} arguments`,
      ),
    ).length;
    expect(calls).toEqual(expectedCalls);
    expect(byContract + Object.values(calls).reduce((a, b) => a + b, 0)).toBe(hostile.length);
    expect(Object.keys(expectedCalls).sort()).toEqual([
      'decodeTile',
      'encodeImage',
      'encodeText',
      'executeModel',
      'handOffEvidence',
      'initWorker',
      'prepareJob',
      'probeMesh',
      'recompute',
      'recomputeExchanges',
      'rehearse',
    ]);
    // only the contract's own fields reach a method
    expect([...argKeys].filter((k) => ['extra', 'constructor', '__proto__', 'polluted'].includes(k))).toEqual([]);
    expect(Object.prototype).not.toHaveProperty('polluted');

    expect(await observed(runtime)).toEqual(PREPARED);
    // and the served link still answers an honest call
    for (const frame of encodeFrames(
      { kind: 'rpc', from: COORDINATOR, body: { type: 'request', id: 1e6, method: 'ping', args: {} }, tensors: [] },
      1e6,
    ))
      link.receive(frame);
    await vi.waitFor(() =>
      expect(channel.replies.get(1e6)).toEqual([{ type: 'reply', id: 1e6, ok: true, result: PREPARED.ping }]),
    );
  });
});

// ------------------------------------------------------------------ structured mutations

// Hostile values that are well-formed where bytes are checked: the frames parse, the messages
// decode, and what is wrong is their meaning. Each is generated from an honest value and judged
// against the rule it breaks (issue 17: #3, #6, #8).

/** how many structured mutations each target gets */
const MUTATIONS = 400;

describe(`fuzz: ${MUTATIONS} structured mutations per target`, () => {
  it(`tensors between ranks — NaN or ±Infinity anywhere, future steps and blocks, past forwards, other jobs and dtypes, replays, another rank's name — are each refused and counted or blamed on their sender; at most ${MAX_AHEAD} are held ahead, and the next honest tensor arrives exact`, async () => {
    // rank 0's side of a P = 2 mesh, its link judging frames as a worker's does (job 5, 35 tokens)
    const runtime = runtimeFor(0, 2);
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 2, peers: ['a', 'b'], session: 's' });
    await runtime.loadModel({ modelUrl: '/models/tiny-wan', ep: 'wasm' });
    await runtime.prepareJob({ job: 5, texts: [new Float32Array(32 * model.config.textDim)], latentShape: LATENT });
    // 35 tokens over 2 ranks, 18 and 17; 12 heads, 6 each: rank 1 sends q, k, v of its 17 tokens
    // for rank 0's heads, and the output of its heads for rank 0's 18 tokens
    const floatsOf = (phase: number) => (phase === 0 ? 3 * 17 : 18) * 6 * model.config.headDim;
    type Kind =
      | 'nonfinite'
      | 'ahead'
      | 'replay'
      | 'past'
      | 'f16'
      | 'other job'
      | 'step 1000'
      | 'other block'
      | 'short'
      | 'spoofed';
    const kinds: Kind[] = [
      'nonfinite',
      'ahead',
      'ahead',
      'replay',
      'past',
      'f16',
      'other job',
      'step 1000',
      'other block',
      'short',
      'spoofed',
    ];
    const outcomes = { linkDrops: 0, refused: 0, held: 0, blamed: 0, delivered: 0 };
    const honestParts = [0, 1].map((phase) =>
      Float32Array.from({ length: floatsOf(phase) }, (_, i) => (i % 97) / 97 - 0.5),
    );

    for (let scenario = 0; scenario < MUTATIONS; scenario++) {
      const exchange = new MeshExchange(0, 2);
      const link = new Link(new SinkChannel(), {
        accept: (header) =>
          judgeMeshFrame(1, header, (from, tag, bytes) => runtime.judgeTensor(from, tag, bytes), 'f32')?.refused ??
          null,
      });
      exchange.addPeer(1, link);
      let msgId = 0;
      const send = (
        tag: TensorTag,
        values: Float32Array,
        { dtype = 'f32', from = 1, msg = msgId++ }: { dtype?: 'f32' | 'f16'; from?: number; msg?: number } = {},
      ) => {
        const shape = [dtype === 'f16' ? 2 * values.length : values.length];
        for (const frame of encodeFrames(
          {
            kind: 'tensor',
            from,
            tag,
            dtype,
            shape,
            data: new Uint8Array(values.buffer, values.byteOffset, values.byteLength),
          },
          msg,
        ))
          link.receive(frame);
      };
      const step = 2 + Math.floor(random.uniform() * 20);
      const now: ExchangeTag = { job: 5, step, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 };
      const next: ExchangeTag = { ...now, block: 1, phase: ExchangePhase.Output, group: 0 };
      const key = (t: TensorTag) => `${t.step}/${t.block}/${t.phase}`;
      const honest = (t: TensorTag) => honestParts[t.phase];
      const same = (a: Float32Array, b: Float32Array) =>
        Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
      // the forward rank 0 is in: its peer's part arrives and is taken
      const current = exchange.allToAll(now, [honest(now), honest(now)]);
      send(now, honest(now));
      expect(same((await current)[1], honest(now))).toBe(true);

      // then 1 to 8 hostile tensors, and what the rules say of each, in order
      const expected = { linkDrops: 0, refused: 0, held: new Set<string>(), blame: null as RegExp | null };
      const sent: TensorTag[] = [];
      for (let i = 0, n = 1 + Math.floor(random.uniform() * 8); i < n; i++) {
        const kind = pick(kinds);
        const ahead: TensorTag =
          random.uniform() < 0.8
            ? {
                ...now,
                step: step + 1 + Math.floor(random.uniform() * 50),
                block: Math.floor(random.uniform() * 2),
                phase: Math.floor(random.uniform() * 2),
                group: 0,
              }
            : { ...now, phase: 1 };
        let tag = kind === 'replay' && sent.length ? pick(sent) : ahead;
        let values = honest(tag);
        let options: { dtype?: 'f32' | 'f16'; from?: number } = {};
        if (kind === 'nonfinite') {
          values = values.slice();
          for (let k = 0, count = 1 + Math.floor(random.uniform() * 3); k < count; k++)
            values[Math.floor(random.uniform() * values.length)] = pick([NaN, Infinity, -Infinity]);
        } else if (kind === 'past') tag = { ...tag, step: Math.floor(random.uniform() * step) };
        else if (kind === 'other job') tag = { ...tag, job: pick([0, 4, 6, 2 ** 31]) };
        else if (kind === 'step 1000') tag = { ...tag, step: 1000 + Math.floor(random.uniform() * 1e6) };
        else if (kind === 'other block') tag = { ...tag, block: 2 + Math.floor(random.uniform() * 100) };
        else if (kind === 'short') values = values.subarray(0, values.length - 1 - Math.floor(random.uniform() * 64));
        else if (kind === 'f16')
          options = { dtype: 'f16' }; // the same bytes as twice as many float16 values
        else if (kind === 'spoofed') options = { from: 0 };
        send(tag, values, options);

        // the link judges the header: another job, step ≥ 1000, a block the model does not have,
        // another size, another rank's name, another dtype
        if (['other job', 'step 1000', 'other block', 'short', 'spoofed', 'f16'].includes(kind)) {
          expected.linkDrops++;
          continue;
        }
        // the exchange judges the tensor: a forward already past is refused whole
        if (tag.step < step) {
          expected.refused++;
          continue;
        }
        if (kind === 'nonfinite') {
          expected.blame = /^sent NaN or infinite values in step \d+, block \d; disconnected$/;
          continue;
        }
        if (expected.held.has(key(tag)))
          expected.blame = /^sent the tensor of step \d+, block \d, phase \d twice; disconnected$/;
        else if (expected.held.size >= MAX_AHEAD)
          expected.blame = new RegExp(`^sent ${MAX_AHEAD + 1} tensors ahead of this rank; disconnected$`);
        else {
          expected.held.add(key(tag));
          sent.push(tag);
        }
      }

      expect([scenario, exchange.framesDropped()]).toEqual([scenario, expected.linkDrops + expected.refused]);
      outcomes.linkDrops += expected.linkDrops;
      outcomes.refused += expected.refused;
      outcomes.held += expected.held.size;
      // a fifth tensor while four are held is a flood, the one this rank now waits for included
      if (!expected.blame && expected.held.size >= MAX_AHEAD)
        expected.blame = new RegExp(`^sent ${MAX_AHEAD + 1} tensors ahead of this rank; disconnected$`);
      const following = exchange.allToAll(next, [honest(next), honest(next)]);
      if (expected.blame) {
        send(next, honest(next));
        const error = await following.then(
          () => null,
          (e: unknown) => e,
        );
        expect(error).toBeInstanceOf(PeerLost);
        expect((error as PeerLost).detail).toEqual({
          rank: 1,
          cause: 'misbehaved',
          evidence: stringMatching(expected.blame),
        });
        outcomes.blamed++;
      } else {
        send(next, honest(next));
        expect(same((await following)[1], honest(next))).toBe(true);
        outcomes.delivered++;
      }
      expect(link.stats.listenerErrors).toBe(0);
    }
    // every rule was exercised, many times
    for (const count of Object.values(outcomes)) expect(count).toBeGreaterThan(MUTATIONS / 10);
  });

  it('rows a rank returns — NaN or ±Infinity anywhere, too few or too many values, none, another type — are each a breach by that rank, and nothing of them is gathered; its honest rows gather to the same output', async () => {
    // no spot checks (they recompute a forward now and then): each round is one forward, judged where its rows arrive
    const executor = new InProcessExecutor(
      {
        config: model.config,
        modelUrl: '/models/tiny-wan',
        layout: new RankLayout(2),
        rpcTimeoutMs: 10_000,
        spotCheckRate: 0,
      },
      stubEngine(referenceStages(model), model.config),
      'rpc',
    );
    await executor.initialize();
    const latent = { shape: LATENT, data: new SeededRandom(3).normals(16 * 14 * 10) };
    await executor.prepareJob(5, [new SeededRandom(4).normals(32 * model.config.textDim)], LATENT);
    // each rank computes its rows once; later calls answer them again, or as the mutation makes them
    const honest: ExecuteResult[] = [];
    const reply: (((rows: Float32Array) => unknown) | undefined)[] = [];
    executor.runtimes.forEach((runtime, rank) => {
      const compute = runtime.executeModel.bind(runtime);
      runtime.executeModel = async (args) => {
        honest[rank] ??= await compute(args);
        const make = reply[rank];
        return (make ? { ...honest[rank], rows: make(honest[rank].rows) } : honest[rank]) as ExecuteResult;
      };
    });
    const forward = () => executor.executeModel({ job: 5, step: 0, pass: 0, timestep: 500, latent });
    const expected = (await forward()).output.data;
    const rowWidth = 64;
    type Mutation = [what: RegExp, make: (rows: Float32Array) => unknown];
    const mutations: Mutation[] = [
      [
        /returned NaN or infinite values/,
        (rows) => {
          const out = rows.slice();
          for (let k = 0, n = 1 + Math.floor(random.uniform() * 4); k < n; k++)
            out[Math.floor(random.uniform() * out.length)] = pick([NaN, Infinity, -Infinity]);
          return out;
        },
      ],
      [
        /returned \d+ values; its share is 1[78]×64/,
        (rows) => rows.slice(0, rows.length - 1 - Math.floor(random.uniform() * 3 * rowWidth)),
      ],
      [
        /returned \d+ values; its share is 1[78]×64/,
        (rows) =>
          Float32Array.from(
            { length: rows.length + 1 + Math.floor(random.uniform() * 3 * rowWidth) },
            (_, i) => rows[i % rows.length],
          ),
      ],
      [/returned 0 values/, () => new Float32Array(0)],
      [
        /malformed reply: reply\.rows: expected a Float32Array/,
        (rows) => pick<unknown>([Array.from(rows), new Float64Array(rows), 'rows', null, {}, rows.length]),
      ],
    ];
    let breaches = 0;
    for (let round = 0; round < MUTATIONS; round++) {
      const rank = Math.floor(random.uniform() * 2);
      const honestRound = random.uniform() < 0.2;
      const [what, make] = pick(mutations);
      reply[rank] = honestRound ? undefined : make;
      const outcome = await forward().then(
        (r) => r.output.data,
        (e: unknown) => e,
      );
      reply[rank] = undefined;
      if (honestRound) {
        expect(outcome).toEqual(expected);
        continue;
      }
      expect(outcome).toBeInstanceOf(WorkerError);
      expect(outcome).toMatchObject({
        rank,
        method: 'executeModel',
        breach: true,
        remoteMessage: stringMatching(what),
      });
      breaches++;
    }
    expect(breaches).toBeGreaterThan(MUTATIONS / 2);
    await executor.shutdown({ graceMs: 100 });
  });

  // Honest replies of every worker method, as a worker sends them.
  const honestReplies: Record<WorkerMethod, unknown> = {
    describe: {
      ep: 'wasm',
      adapter: 'SwiftShader',
      softwareAdapter: true,
      threads: 2,
      memoryGiB: 8,
      userAgent: 'Chromium',
      cores: 2,
      machine: '0123456789abcdef0123456789abcdef',
    },
    probeCompute: { ep: 'wasm', flops: 2e10, softmaxRate: 3e8, stageMs: 0.4 },
    probeLink: { bytes: 524_288 },
    initWorker: { rank: 1, world: 2 },
    loadModel: {
      ep: 'wasm',
      adapter: 'cpu',
      inMemory: false,
      loadMs: 3_000,
      why: 'WASM: asked for by the job',
      weights: { networkBytes: 12e6, cacheBytes: 0, note: '' },
      maxBufferBytes: 1 << 28,
      weightType: 'float32',
      gpuWeightBytes: 0,
      heldWeightBytes: 12_000_000,
    },
    rehearse: { forwardMs: [120, 70] },
    preload: { ep: 'wasm', loadMs: 3_000 },
    encodeText: { hidden: Float32Array.from({ length: 8 }, (_, i) => i), layerMs: [3, 4], layersRead: 2 },
    decodeTile: {
      frames: Float32Array.from({ length: 12 }, (_, i) => -i),
      shape: [1, 3, 2, 2],
      computeMs: 9,
      cacheBytes: 100,
      weightBytes: 1000,
    },
    encodeImage: {
      latent: Float32Array.from({ length: 48 }, (_, i) => i / 8 - 3),
      shape: [48, 1, 1, 1],
      computeMs: 40,
      weightBytes: 1000,
    },
    prepareJob: { job: 5 },
    probeMesh: { rank: 1, bytesPerPeer: 1e6, smallBytes: 1e3, bytesSent: 1e6, smallMs: 2, largeMs: 200 },
    executeModel: {
      rows: Float32Array.from({ length: 64 }, (_, i) => i / 64),
      bytesSent: 4096,
      peakMemoryBytes: null,
      computeMs: 12,
      commMs: 3,
      overlapMs: 1,
      bytesDownloaded: 0,
      bytesKept: 0,
      deviceTensorsLeft: 0,
    },
    recompute: { rows: Float32Array.from({ length: 64 }, (_, i) => -i / 64), computeMs: 30 },
    exchangeEvidence: {
      receipts: [{ block: 0, phase: 0, group: 0, from: 1, digest: 'ab'.repeat(32), signature: 'cd'.repeat(64) }],
    },
    recomputeExchanges: {
      received: [[], [{ block: 0, phase: 0, group: 0, from: 0, digest: 'ab'.repeat(32), signature: '' }]],
    },
    handOffEvidence: {
      hidden: {
        x: Float32Array.from({ length: 8 }, (_, i) => i),
        temb: new Float32Array(4),
        tproj: new Float32Array(24),
        context: new Float32Array(8),
      },
      receipts: [{ block: 1, phase: 4, group: 0, from: 0, digest: 'ab'.repeat(32), signature: 'cd'.repeat(64) }],
    },
    ping: {
      state: 'ready',
      rank: 1,
      totals: { steps: 3, bytesSent: 10, computeMs: 5, bytesDownloaded: 0, bytesKept: 0, deviceTensorsLeft: 0 },
    },
    pingEngine: { waitedMs: 0.4 },
    shutdown: 'bye',
  };

  /** Every place in a value a mutation may go: its object fields and array items, by path. */
  function placesIn(value: unknown, path: (string | number)[] = []): (string | number)[][] {
    if (value instanceof Float32Array || value === null || typeof value !== 'object') return [path];
    const children = Array.isArray(value)
      ? value.map((v, i) => placesIn(v, [...path, i]))
      : Object.entries(value).map(([k, v]) => placesIn(v, [...path, k]));
    return [path, ...children.flat()];
  }

  const at = (value: unknown, path: (string | number)[]): unknown =>
    path.reduce<unknown>((v, k) => (v as Record<string | number, unknown>)[k], value);

  /**
   * The value with the thing at `path` replaced by one of another kind (a field of an object may
   * also be left out): what no check of its type may pass. Every field of every reply is required
   * (the nullable ones too), so leaving one out breaks it as well.
   */
  function retyped(value: unknown, path: (string | number)[]): unknown {
    const original = at(value, path);
    const other =
      typeof original === 'string'
        ? pick<unknown>([7, 'x'.repeat(10_000), [original], null])
        : typeof original === 'number'
          ? pick<unknown>(['seven', -1, [original], {}])
          : typeof original === 'boolean'
            ? pick<unknown>(['true', 1, null])
            : original instanceof Float32Array
              ? pick<unknown>([Array.from(original), 'tensor', original.length, {}])
              : Array.isArray(original)
                ? pick<unknown>(['not-an-array', {}, 3])
                : original === null
                  ? pick<unknown>(['null', -1, {}])
                  : pick<unknown>(['x', [], 0, null]);
    if (path.length === 0) return other;
    const copy = structuredClone(value) as Record<string | number, unknown>;
    const parent = at(copy, path.slice(0, -1)) as Record<string | number, unknown>;
    const leaf = defined(path.at(-1), 'the last key of a non-empty path');
    if (!Array.isArray(parent) && random.uniform() < 0.3) Reflect.deleteProperty(parent, leaf);
    else parent[leaf] = other;
    return copy;
  }

  /** The value with an unknown field added to one of its objects: what a check drops, not refuses. */
  function withExtra(value: unknown): unknown {
    const objects = placesIn(value).filter((p) => {
      const v = at(value, p);
      return v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof Float32Array);
    });
    if (!objects.length) return value;
    const copy = structuredClone(value);
    (at(copy, pick(objects)) as Record<string, unknown>)[pick(['extra', 'constructor', 'toString', '__hostile'])] = {
      nested: [1, 'x'],
    };
    return copy;
  }

  it('malformed replies to every worker method — a field missing or of another kind, at any depth — are refused where they arrive, naming the worker, the method and the field; unknown fields are dropped and the rest arrives whole', async () => {
    const link = new Link(new SinkChannel());
    const client = remote(link, COORDINATOR, WORKER_CONTRACT, 'worker w1');
    let callId = 0;
    let msgId = 0;
    const answer = async (method: WorkerMethod, result: unknown) => {
      const call = (client[method] as (args: unknown, timeoutMs?: number) => Promise<unknown>)({}, 5_000);
      const id = ++callId;
      const { packed, tensors } = packValue(result);
      for (const frame of encodeFrames(
        { kind: 'rpc', from: 1, body: { type: 'reply', id, ok: true, result: packed }, tensors },
        msgId++,
      ))
        link.receive(frame);
      return call.then(
        (value) => ({ value }),
        (error: unknown) => ({ error }),
      );
    };
    for (const method of WORKER_METHODS)
      expect([method, await answer(method, honestReplies[method])]).toEqual([method, { value: honestReplies[method] }]);

    let refused = 0;
    for (let i = 0; i < MUTATIONS * 2; i++) {
      const method = pick(WORKER_METHODS);
      const honest = honestReplies[method];
      if (random.uniform() < 0.2) {
        expect(await answer(method, withExtra(honest))).toEqual({ value: honest });
        continue;
      }
      const path = pick(placesIn(honest));
      const outcome = (await answer(method, retyped(honest, path))) as { error?: Error };
      expect(outcome.error).toBeInstanceOf(ContractError);
      const field = path.length
        ? `reply${path.map((k) => (typeof k === 'number' ? `[${k}]` : `.${k}`)).join('')}`
        : 'reply';
      expect([
        method,
        path.join('.'),
        defined(outcome.error, 'the refusal').message.startsWith(
          `worker w1 answered ${method} with a malformed reply: ${field}`,
        ),
      ]).toEqual([method, path.join('.'), true]);
      refused++;
    }
    expect(refused).toBeGreaterThan(MUTATIONS);
    expect(link.stats.listenerErrors).toBe(0);
  });

  it("malformed heartbeat answers — a pulse's field of another kind, at any depth — are dropped whole where they arrive; its optional fields may be left out, unknown ones are dropped", () => {
    const honest = {
      state: 'ready',
      framesDropped: 2,
      mesh: [
        { peer: 'ditswarm-w-1', transport: 'direct' },
        { peer: 'ditswarm-w-2', transport: 'relay' },
      ],
      threads: 2,
      load: { bytes: 10, totalBytes: 20, networkBytes: 5, elapsedMs: 100, note: '' },
    };
    const optional = ['mesh', 'threads', 'load'];
    const link = new Link(new SinkChannel());
    const pulses: unknown[] = [];
    const stop = watchHeartbeats(
      link,
      COORDINATOR,
      { onDead: () => {}, onPulse: (sent) => pulses.push(passing(checkPulse, sent, 'pulse') ?? 'dropped') },
      { intervalMs: 60_000 },
    );
    let msgId = 0;
    const echo = (pulse: unknown) => {
      const before = pulses.length;
      for (const frame of encodeFrames(
        { kind: 'rpc', from: 0, body: { type: 'heartbeat-echo', pulse }, tensors: [] },
        msgId++,
      ))
        link.receive(frame);
      return pulses.length > before ? pulses.at(-1) : 'dropped';
    };
    expect(echo(honest)).toEqual(honest);
    let dropped = 0;
    for (let i = 0; i < MUTATIONS; i++) {
      const roll = random.uniform();
      if (roll < 0.15) {
        expect(echo(withExtra(honest))).toEqual(honest);
      } else if (roll < 0.3) {
        const left = pick(optional);
        const { [left]: _, ...rest } = honest as Record<string, unknown>;
        expect(echo(rest)).toEqual(rest);
      } else {
        const path = pick(placesIn(honest).filter((p) => p.length > 0));
        const mutated = structuredClone(honest) as Record<string | number, unknown>;
        const parent = at(mutated, path.slice(0, -1)) as Record<string | number, unknown>;
        const leaf = defined(path.at(-1), 'the last key of a non-empty path');
        const original = parent[leaf];
        // another kind, never left out (a left-out optional field is a pulse without it)
        parent[leaf] =
          typeof original === 'string'
            ? pick<unknown>([7, 'x'.repeat(5_000), {}])
            : typeof original === 'number'
              ? pick<unknown>(['seven', -1, 1.5, {}])
              : pick<unknown>(['not-an-array', 7, true]);
        const fractionAllowed =
          typeof original === 'number' &&
          parent[leaf] === 1.5 &&
          ['bytes', 'totalBytes', 'networkBytes', 'elapsedMs'].includes(String(path.at(-1)));
        if (fractionAllowed) continue; // byte counts and ms may be fractions
        expect([path.join('.'), echo(mutated)]).toEqual([path.join('.'), 'dropped']);
        dropped++;
      }
    }
    stop();
    expect(dropped).toBeGreaterThan(MUTATIONS / 2);
    expect(link.stats.listenerErrors).toBe(0);
  });
});
