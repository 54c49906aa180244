import { describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { Link } from '../../core/net/link.ts';
import { EmulatedWire, PacedChannel } from '../../core/net/paced-channel.ts';
import type { Message } from '../../core/net/protocol.ts';
import { SinkChannel } from './fixtures.ts';

// The slow-link emulator (issue 20): frames reach the real channel as a link of the set bandwidth
// and latency would deliver them, in order, and a Link on it sends no faster.
describe('PacedChannel', () => {
  const arrivals = (sink: SinkChannel, started: number) => {
    const at: number[] = [];
    const send = sink.send.bind(sink);
    sink.send = (data) => {
      at.push(performance.now() - started);
      send(data);
    };
    return at;
  };

  it('hands each frame on once the wire has carried it and the latency has passed, in order, holding it as buffered meanwhile', async () => {
    const sink = new SinkChannel();
    // 1 MB/s: 100 kB take 100 ms
    const paced = new PacedChannel(sink, new EmulatedWire({ bandwidth: 1e6, latencyMs: 20 }));
    const started = performance.now();
    const at = arrivals(sink, started);
    for (let i = 0; i < 3; i++) paced.send(new Uint8Array(100_000).fill(i).buffer);
    expect(paced.bufferedAmount).toBe(300_000);
    await new Promise((r) => setTimeout(r, 400));
    expect(sink.sent.map((frame) => new Uint8Array(frame)[0])).toEqual([0, 1, 2]);
    // 100, 200 and 300 ms on the wire, then 20 ms of latency (a timer may fire a millisecond early)
    at.forEach((ms, i) => expect(ms).toBeGreaterThanOrEqual(100 * (i + 1) + 20 - 2));
    expect(paced.bufferedAmount).toBe(0);
  });

  it('a Link on it sends a 1 MB message at the set bandwidth: about 1 s at 1 MB/s, where the real channel takes none', async () => {
    const sink = new SinkChannel();
    const link = new Link(new PacedChannel(sink, new EmulatedWire({ bandwidth: 1e6, latencyMs: 5 })), {
      highWaterBytes: 256 * 1024,
    });
    const started = performance.now();
    const at = arrivals(sink, started);
    const message: Message = {
      kind: 'tensor',
      from: 0,
      tag: { job: 1, step: 0, pass: 0, block: 0, phase: 0, group: 0 },
      dtype: 'f32',
      shape: [250_000],
      data: new Uint8Array(1_000_000),
    };
    await link.send(message);
    await new Promise((r) => setTimeout(r, 1_200));
    const bytes = sink.sent.reduce((n, f) => n + f.byteLength, 0);
    expect(bytes).toBeGreaterThan(1_000_000);
    expect(defined(at.at(-1), "the last frame's arrival")).toBeGreaterThanOrEqual((bytes / 1e6) * 1000 + 5 - 2);
  });

  it('the channels of one page share its wire, as its links share an uplink: two 100 kB frames on two channels take 200 ms', async () => {
    const wire = new EmulatedWire({ bandwidth: 1e6, latencyMs: 0 });
    const [a, b] = [new SinkChannel(), new SinkChannel()];
    const started = performance.now();
    const [atA, atB] = [arrivals(a, started), arrivals(b, started)];
    new PacedChannel(a, wire).send(new ArrayBuffer(100_000));
    new PacedChannel(b, wire).send(new ArrayBuffer(100_000));
    await new Promise((r) => setTimeout(r, 300));
    expect(atA[0]).toBeGreaterThanOrEqual(98);
    expect(atB[0]).toBeGreaterThanOrEqual(198);
  });

  it('frames of one wire reach their channels in the order they were sent, however close their due times', async () => {
    const wire = new EmulatedWire({ bandwidth: 1e9, latencyMs: 0 }); // a microsecond a frame
    const [a, b] = [new SinkChannel(), new SinkChannel()];
    const order: number[] = [];
    for (const sink of [a, b]) sink.send = (data) => void order.push(new Uint8Array(data)[0]);
    const [pa, pb] = [new PacedChannel(a, wire), new PacedChannel(b, wire)];
    for (let i = 0; i < 50; i++) (i % 2 ? pb : pa).send(Uint8Array.of(i).buffer);
    await new Promise((r) => setTimeout(r, 50));
    expect(order).toEqual(Array.from({ length: 50 }, (_, i) => i));
  });

  it('hands nothing on once the real channel has closed', async () => {
    const sink = new SinkChannel();
    let onClose = () => {};
    sink.addEventListener = (type, cb) => {
      if (type === 'close') onClose = cb;
    };
    const paced = new PacedChannel(sink, new EmulatedWire({ bandwidth: 1e6, latencyMs: 10 }));
    paced.send(new ArrayBuffer(1000));
    onClose();
    await new Promise((r) => setTimeout(r, 50));
    expect(sink.sent).toEqual([]);
    expect(() => paced.send(new ArrayBuffer(1))).toThrow('the channel is closed');
  });
});
