import { beforeAll, describe, expect, it } from 'vitest';
import { Link } from '../../core/net/link.ts';
import type { Channel } from '../../core/net/channel.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { COORDINATOR, encodeFrames, Reassembler, type Message } from '../../core/net/protocol.ts';
import { remote, serve } from '../../core/net/rpc.ts';
import { WORKER_CONTRACT, type WorkerApi } from '../../core/worker-api.ts';
import { SeededRandom } from '../../core/random.ts';
import { MeshExchange } from '../../rank/exchange/mesh.ts';
import { referenceStages } from '../../rank/stages.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { WorkerRuntime } from '../../rank/runtime.ts';
import { stubEngine, tinyModelFiles, validJobArgs } from './fixtures.ts';

/**
 * What a peer sends can never hurt a page: 10,000+ random and mutated frames go to the frame
 * decoder, to a worker's RPC dispatch, to a rank's mesh link and to the coordinator's RPC client.
 * Nothing throws out of a handler, no job state changes, and what is held stays bounded.
 */
const FRAMES_PER_TARGET = 10_000;
const random = new SeededRandom(99);
const pick = <T>(items: T[]): T => items[Math.floor(random.uniform() * items.length)];

/** A channel whose sends are only recorded (the other side never answers). */
class SinkChannel implements Channel {
  bufferedAmount = 0;
  bufferedAmountLowThreshold = 0;
  sent: ArrayBuffer[] = [];
  send(data: ArrayBuffer) {
    this.sent.push(data);
  }
  addEventListener() {}
  removeEventListener() {}
}

/** Valid frames turned into hostile ones: truncated, bytes flipped, fields rewritten, or noise. */
function mutate(valid: ArrayBuffer[]): ArrayBuffer {
  const base = new Uint8Array(pick(valid).slice(0));
  const view = new DataView(base.buffer);
  switch (Math.floor(random.uniform() * 6)) {
    case 0:
      return base.slice(0, Math.floor(random.uniform() * base.length)).buffer;
    case 1:
      for (let i = 0; i < 1 + random.uniform() * 4; i++) base[Math.floor(random.uniform() * base.length)] = random.uniform() * 256;
      return base.buffer;
    case 2: {
      // a header field (dtype, from, ndim, ids, chunk index/count, stride, total size, tag, shape) set to something else
      const offset = pick([4, 5, 6, 8, 12, 16, 20, 24, 28, 32, 36, 38, 40, 44, 48]);
      if (offset <= 6) base[offset] = random.uniform() * 256;
      else if (offset >= 36 && offset <= 40) view.setUint16(offset, random.uniform() * 65536, true);
      else view.setUint32(offset, pick([0, 1, 2, 255, 65535, 2 ** 31, 2 ** 32 - 1, Math.floor(random.uniform() * 2 ** 32)]), true);
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

let model: WanModel;
beforeAll(async () => {
  model = await loadTransformer(tinyModelFiles);
});

function runtimeFor(rank: number, world: number) {
  const engine = stubEngine(referenceStages(model), model.config);
  const exchanges = memoryExchanges(world);
  return new WorkerRuntime(engine, {
    connectMesh: async () => exchanges[rank],
    describe: async () => ({ ep: 'wasm', adapter: 'test', threads: 1, memoryGiB: null, userAgent: 'node' }),
  });
}

describe(`fuzz: ${FRAMES_PER_TARGET} hostile frames per target`, () => {
  it('the frame decoder never throws and never holds more than its caps', () => {
    const reassembler = new Reassembler({ maxMessageBytes: 1 << 20, maxOpenMessages: 16 });
    const tensor: Message = { kind: 'tensor', from: 1, tag: { job: 1, step: 2, pass: 0, block: 1, phase: 0 }, dtype: 'f32', shape: [4096], data: new Uint8Array(16384) };
    const rpc: Message = { kind: 'rpc', from: COORDINATOR, body: { type: 'request', id: 1, method: 'ping', args: {} }, tensors: [new Float32Array(3000)] };
    const valid = [...encodeFrames(tensor, 1, 4096), ...encodeFrames(rpc, 2, 2048)];
    let peakHeld = 0;
    for (let i = 0; i < FRAMES_PER_TARGET; i++) {
      expect(() => reassembler.push(mutate(valid))).not.toThrow();
      peakHeld = Math.max(peakHeld, reassembler.heldBytes);
      expect(reassembler.openMessages).toBeLessThanOrEqual(16);
    }
    expect(peakHeld).toBeLessThanOrEqual(4 << 20);
    expect(reassembler.dropped).toBeGreaterThan(FRAMES_PER_TARGET / 2);
  });

  it("a worker's RPC dispatch answers or ignores every hostile frame and its state does not change", async () => {
    const runtime = runtimeFor(0, 1);
    const channel = new SinkChannel();
    const link = new Link(channel, { accept: (h) => (h.kind !== 'rpc' ? 'rpc only' : null) });
    serve<WorkerApi>(link, 0, WORKER_CONTRACT, runtime);
    const requests: Message[] = ['ping', 'describe', 'eval', '__proto__', 'constructor', 'executeModel', 'loadModel', 'prepareJob', 'toString'].map((method, id) => ({
      kind: 'rpc',
      from: COORDINATOR,
      body: { type: 'request', id, method, args: { job: 1, rank: 'x', texts: [{ $tensor: 7 }] } },
      tensors: [new Float32Array(8)],
    }));
    const valid = requests.flatMap((m, i) => encodeFrames(m, i, 96));
    for (let i = 0; i < FRAMES_PER_TARGET; i++) link.receive(mutate(valid));
    await new Promise((r) => setTimeout(r, 50));
    expect(link.stats.listenerErrors).toBe(0);
    expect(runtime.state).toBe('idle');
    await expect(runtime.executeModel(validJobArgs.executeModel)).rejects.toThrow('before initWorker');
  });

  it("a rank's mesh link delivers nothing that is not a tensor of the prepared job with the planned size", async () => {
    const runtime = runtimeFor(0, 2);
    await runtime.initWorker({ rank: 0, world: 2, peers: ['a', 'b'], session: 's' });
    await runtime.loadModel({ modelUrl: 'x', ep: 'wasm' });
    const shape = [16, 1, 14, 10]; // 35 tokens: 18 per rank at P = 2
    await runtime.prepareJob({ job: 5, texts: [new Float32Array(32 * model.config.textDim)], latentShape: shape });
    const exchange = new MeshExchange(0, 2);
    let delivered = 0;
    const link = new Link(new SinkChannel(), { accept: (h) => (h.kind !== 'tensor' ? 'tensors only' : h.from !== 1 ? 'wrong rank' : runtime.judgeTensor(h.tag, h.totalBytes)) });
    link.onMessage(() => delivered++);
    exchange.addPeer(1, link);
    const W = 6 * model.config.headDim; // 12 heads / 2 ranks
    const good = (phase: number, floats: number): Message => ({ kind: 'tensor', from: 1, tag: { job: 5, step: 0, pass: 0, block: 0, phase }, dtype: 'f32', shape: [floats], data: new Uint8Array(floats * 4) });
    const hostile: Message[] = [
      { ...good(0, 3 * 18 * W), from: 0 } as Message, // another rank's slot
      { ...good(0, 3 * 18 * W), tag: { job: 4, step: 0, pass: 0, block: 0, phase: 0 } } as Message, // another job
      { ...good(0, 3 * 18 * W), tag: { job: 5, step: 0, pass: 0, block: 9, phase: 0 } } as Message, // no such block
      good(0, 3 * 18 * W + 1), // not the planned size
      good(1, 18 * W - 1),
      good(2, 18 * W), // no such phase
    ];
    const valid = hostile.flatMap((m, i) => encodeFrames(m, i, 8192));
    for (let i = 0; i < FRAMES_PER_TARGET; i++) link.receive(mutate(valid));
    expect(delivered).toBe(0);
    expect(link.stats.listenerErrors).toBe(0);
    expect(runtime.state).toBe('ready');
    // and the honest message still gets through afterwards
    for (const frame of encodeFrames(good(1, 18 * W), 99_999, 8192)) link.receive(frame);
    expect(delivered).toBe(1);
  });

  it("the coordinator's RPC client survives hostile replies and still resolves the real one", async () => {
    const channel = new SinkChannel();
    const link = new Link(channel);
    const client = remote(link, COORDINATOR, WORKER_CONTRACT, 'worker w0');
    const pending = client.ping({}, 5_000);
    const pong = { state: 'ready', rank: 0, totals: { steps: 1, bytesSent: 0, computeMs: 0, bytesDownloaded: 0, bytesKept: 0, deviceTensorsLeft: 0 } };
    const replies: Message[] = [
      { kind: 'rpc', from: 0, body: { type: 'reply', id: 1, ok: true, result: { $tensor: 3 } }, tensors: [] },
      { kind: 'rpc', from: 0, body: { type: 'reply', id: 77, ok: false, error: 'x' }, tensors: [] },
      { kind: 'rpc', from: 0, body: { type: 'request', id: 1, method: 'ping', args: {} }, tensors: [] },
    ];
    const valid = replies.flatMap((m, i) => encodeFrames(m, 100 + i, 96));
    // the first reply with id 1 is malformed on purpose; mutated copies must not resolve the call either
    for (let i = 0; i < FRAMES_PER_TARGET; i++) link.receive(mutate(valid.slice(1)));
    expect(link.stats.listenerErrors).toBe(0);
    for (const frame of encodeFrames({ kind: 'rpc', from: 0, body: { type: 'reply', id: 1, ok: true, result: pong }, tensors: [] }, 5000, 96)) link.receive(frame);
    await expect(pending).resolves.toEqual(pong);
  });
});
