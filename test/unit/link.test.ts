import { afterEach, describe, expect, it, vi } from 'vitest';
import { Link } from '../../core/net/link.ts';
import type { Channel } from '../../core/net/channel.ts';
import { defined } from '../../core/defined.ts';
import { stringMatching } from './matchers.ts';
import { COORDINATOR, encodeFrames, HEADER_BYTES, type Message, type TensorTag } from '../../core/net/protocol.ts';

/** One direction of an in-memory data channel: `send` buffers, a later task
 *  drains up to `bytesPerTick` to the far end and fires `bufferedamountlow`
 *  when the buffer falls to the threshold, like RTCDataChannel. */
class FakeChannel implements Channel {
  bufferedAmount = 0;
  bufferedAmountLowThreshold = 0;
  /** Highest bufferedAmount ever reached. */
  peakBuffered = 0;
  closed = false;
  deliver: (frame: ArrayBuffer) => void = () => {};
  private readonly queue: ArrayBuffer[] = [];
  private readonly listeners = { bufferedamountlow: new Set<() => void>(), close: new Set<() => void>() };
  private draining = false;

  constructor(private readonly bytesPerTick = 256 * 1024) {}

  send(data: ArrayBuffer): void {
    if (this.closed) throw new Error("InvalidStateError: RTCDataChannel.readyState is not 'open'");
    if (data.byteLength > 256 * 1024) throw new TypeError('message too large');
    this.queue.push(data);
    this.bufferedAmount += data.byteLength;
    this.peakBuffered = Math.max(this.peakBuffered, this.bufferedAmount);
    if (!this.draining) {
      this.draining = true;
      setImmediate(this.drain);
    }
  }

  addEventListener(type: 'bufferedamountlow' | 'close', cb: () => void): void {
    this.listeners[type].add(cb);
  }

  removeEventListener(type: 'bufferedamountlow' | 'close', cb: () => void): void {
    this.listeners[type].delete(cb);
  }

  close(): void {
    this.closed = true;
    setImmediate(() => this.listeners.close.forEach((cb) => cb()));
  }

  private readonly drain = (): void => {
    const before = this.bufferedAmount;
    let budget = this.bytesPerTick;
    while (this.queue.length > 0 && budget > 0 && !this.closed) {
      const frame = defined(this.queue.shift(), 'a queued frame');
      budget -= frame.byteLength;
      this.bufferedAmount -= frame.byteLength;
      this.deliver(frame);
    }
    if (before > this.bufferedAmountLowThreshold && this.bufferedAmount <= this.bufferedAmountLowThreshold) {
      this.listeners.bufferedamountlow.forEach((cb) => cb());
    }
    if (this.queue.length > 0 && !this.closed) setImmediate(this.drain);
    else this.draining = false;
  };
}

/** Two Links joined by a pair of fake channels. */
function linkedPair(opts: ConstructorParameters<typeof Link>[1] = {}, bytesPerTick?: number) {
  const aToB = new FakeChannel(bytesPerTick);
  const bToA = new FakeChannel(bytesPerTick);
  const a = new Link(aToB, opts);
  const b = new Link(bToA, opts);
  aToB.deliver = (f) => b.receive(f);
  bToA.deliver = (f) => a.receive(f);
  return { a, b, aToB, bToA };
}

function nextMessages(link: Link, count: number): Promise<Message[]> {
  const got: Message[] = [];
  return new Promise((resolve) => {
    const off = link.onMessage((m) => {
      got.push(m);
      if (got.length === count) {
        off();
        resolve(got);
      }
    });
  });
}

const TAG: TensorTag = { job: 1, step: 0, pass: 0, block: 5, phase: 1, group: 0 };

function patterned(bytes: number): Uint8Array {
  const data = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i++) data[i] = (i * 2654435761) >>> 24;
  return data;
}

afterEach(() => {
  vi.restoreAllMocks();
});

describe('Link', () => {
  it('delivers a 20 MB tensor intact while the channel buffer stays under highWater + one frame', async () => {
    const { a, b, aToB } = linkedPair();
    const data = patterned(20_000_000); // [5000, 1000] f32
    const msg: Message = { kind: 'tensor', from: 1, tag: TAG, dtype: 'f32', shape: [5000, 1000], data };
    const arrived = nextMessages(b, 1);
    await a.send(msg);
    const out = defined((await arrived)[0], 'the delivered message');
    if (out.kind !== 'tensor') throw new Error('expected a tensor');
    expect({ ...out, data: undefined }).toEqual({ ...msg, data: undefined });
    expect(Buffer.compare(out.data, data)).toBe(0);
    expect(aToB.peakBuffered).toBeGreaterThan(3 * 1024 * 1024); // flow control was actually exercised
    expect(aToB.peakBuffered).toBeLessThanOrEqual(4 * 1024 * 1024 + 64 * 1024);
    expect(b.stats.framesDropped).toBe(0);
  });

  it('counts payload bytes apart from header bytes', async () => {
    const { a, b } = linkedPair({ chunkBytes: 16 * 1024 });
    const arrived = nextMessages(b, 1);
    await a.send({ kind: 'tensor', from: 0, tag: TAG, dtype: 'f16', shape: [100_000], data: patterned(200_000) });
    await arrived;
    const frames = Math.ceil(200_000 / (16 * 1024 - HEADER_BYTES));
    expect(a.stats).toMatchObject({
      framesSent: frames,
      payloadBytesSent: 200_000,
      bytesSent: 200_000 + frames * HEADER_BYTES,
      messagesSent: 1,
    });
    expect(b.stats.messagesReceived).toBe(1);
  });

  it('keeps per-link order for concurrent senders, both directions at once', async () => {
    const { a, b } = linkedPair({ highWaterBytes: 256 * 1024 });
    const big: Message = {
      kind: 'tensor',
      from: 0,
      tag: TAG,
      dtype: 'f32',
      shape: [500_000],
      data: patterned(2_000_000),
    };
    const atB = nextMessages(b, 21);
    const atA = nextMessages(a, 10);
    const resolved: number[] = [];
    const sends: Promise<unknown>[] = [a.send(big).then(() => resolved.push(-1))];
    for (let i = 0; i < 20; i++) {
      sends.push(
        a
          .send({ kind: 'rpc', from: COORDINATOR, body: { i }, tensors: [new Float32Array([i])] })
          .then(() => resolved.push(i)),
      );
    }
    for (let i = 0; i < 10; i++) sends.push(b.send({ kind: 'rpc', from: 0, body: { reply: i }, tensors: [] }));
    await Promise.all(sends);
    const [fromA, fromB] = await Promise.all([atB, atA]);
    expect(fromA[0].kind).toBe('tensor');
    expect(fromA.slice(1).map((m) => (m.kind === 'rpc' ? m.body : null))).toEqual(
      Array.from({ length: 20 }, (_, i) => ({ i })),
    );
    expect(fromB.map((m) => (m.kind === 'rpc' ? m.body : null))).toEqual(
      Array.from({ length: 10 }, (_, i) => ({ reply: i })),
    );
    expect(resolved).toEqual([-1, ...Array.from({ length: 20 }, (_, i) => i)]);
  });

  it('rejects queued and later sends once the channel closes', async () => {
    const { a, aToB } = linkedPair({ highWaterBytes: 64 * 1024 });
    const data = patterned(1_000_000);
    const pending = a.send({ kind: 'tensor', from: 0, tag: TAG, dtype: 'f32', shape: [250_000], data });
    aToB.close();
    await expect(pending).rejects.toThrow(/channel closed before \d+ of 16 frames were sent/);
    await expect(a.send({ kind: 'rpc', from: 0, body: 1, tensors: [] })).rejects.toThrow(/cannot send: channel closed/);
  });

  it('tells its close listeners once, with the reason, and not a listener removed before', async () => {
    const { a, aToB, b } = linkedPair();
    const heard: string[] = [];
    a.onClose((reason) => heard.push(reason));
    a.onClose((reason) => heard.push(`again: ${reason}`))();
    aToB.close();
    await vi.waitFor(() => expect(a.closed).toBe(true));
    a.close('later');
    b.onClose((reason) => heard.push(`b: ${reason}`));
    b.close('its owner let it go');
    expect(heard).toEqual(['channel closed', 'b: its owner let it go']);
  });

  it('rejects a send the channel refuses, and keeps going with the next', async () => {
    const channel = new FakeChannel();
    const link = new Link(channel);
    const sent: ArrayBuffer[] = [];
    const realSend = channel.send.bind(channel);
    let failNext = true;
    channel.send = (d) => {
      if (failNext) {
        failNext = false;
        throw new Error('OperationError: send queue full');
      }
      sent.push(d);
      realSend(d);
    };
    await expect(link.send({ kind: 'rpc', from: 0, body: 'lost', tensors: [] })).rejects.toThrow(/send queue full/);
    await link.send({ kind: 'rpc', from: 0, body: 'kept', tensors: [] });
    expect(sent).toHaveLength(1);
  });

  it('rejects a malformed message at send time with the encoder’s reason', async () => {
    const { a } = linkedPair();
    const bad: Message = { kind: 'tensor', from: 0, tag: TAG, dtype: 'f32', shape: [3], data: new Uint8Array(5) };
    await expect(a.send(bad)).rejects.toThrow(/needs 12 bytes, data has 5/);
  });

  it('survives a throwing listener: later listeners and messages still arrive, the error is reported', async () => {
    const { a, b } = linkedPair();
    const errors: Error[] = [];
    b.onError((e) => errors.push(e));
    b.onMessage(() => {
      throw new Error('listener bug');
    });
    const arrived = nextMessages(b, 2);
    await a.send({ kind: 'rpc', from: 0, body: 1, tensors: [] });
    await a.send({ kind: 'rpc', from: 0, body: 2, tensors: [] });
    const got = await arrived;
    expect(got.map((m) => (m.kind === 'rpc' ? m.body : null))).toEqual([1, 2]);
    expect(errors.map((e) => e.message)).toEqual(['listener bug', 'listener bug']);
    expect(b.stats.listenerErrors).toBe(2);
  });

  it('drops bad frames with a reason instead of throwing', () => {
    const { b } = linkedPair();
    expect(() => b.receive(new ArrayBuffer(7))).not.toThrow();
    expect(b.stats).toMatchObject({
      framesDropped: 1,
      lastDropReason: stringMatching(/shorter than the 60-byte header/),
    });
  });

  it('lets its owner reject messages from a peer that claims the wrong rank', () => {
    const link = new Link(new FakeChannel(), {
      accept: (h) => (h.from === 3 ? null : `peer is rank 3, frame claims ${h.from}`),
    });
    const got: Message[] = [];
    link.onMessage((m) => got.push(m));
    for (const f of encodeFrames({ kind: 'rpc', from: 4, body: 'spoof', tensors: [] }, 0)) link.receive(f);
    for (const f of encodeFrames({ kind: 'rpc', from: 3, body: 'honest', tensors: [] }, 1)) link.receive(f);
    expect(got).toEqual([{ kind: 'rpc', from: 3, body: 'honest', tensors: [] }]);
    expect(link.stats.lastDropReason).toMatch(/peer is rank 3, frame claims 4/);
  });

  it('refuses a highWater that risks Chromium closing the channel', () => {
    expect(() => new Link(new FakeChannel(), { highWaterBytes: 16 * 1024 * 1024 })).toThrow(/16 MiB/);
  });

  it('paces on bufferedamountlow, never on timers', async () => {
    const timeout = vi.spyOn(globalThis, 'setTimeout');
    const interval = vi.spyOn(globalThis, 'setInterval');
    const { a, b, aToB } = linkedPair({ highWaterBytes: 128 * 1024 }, 32 * 1024);
    expect(aToB.bufferedAmountLowThreshold).toBe(32 * 1024);
    const arrived = nextMessages(b, 1);
    await a.send({ kind: 'tensor', from: 0, tag: TAG, dtype: 'f32', shape: [250_000], data: patterned(1_000_000) });
    await arrived;
    expect(timeout).not.toHaveBeenCalled();
    expect(interval).not.toHaveBeenCalled();
    expect(aToB.peakBuffered).toBeLessThanOrEqual(128 * 1024 + 64 * 1024);
  });
});
