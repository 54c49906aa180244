import { describe, expect, it, vi } from 'vitest';
import { defined } from '../../core/defined.ts';
import {
  COORDINATOR,
  encodeFrames,
  frameMessage,
  fromF16,
  HEADER_BYTES,
  I8_GROUP,
  MAX_FRAME_BYTES,
  payloadBytes,
  PROTOCOL_VERSION,
  readHeader,
  Reassembler,
  tensorPayload,
  tensorValues,
  toF16,
  type DType,
  type FrameHeader,
  type Message,
  type TensorTag,
} from '../../core/net/protocol.ts';

// Deterministic randomness so a failing case can be replayed.
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function shuffled<T>(items: T[], random: () => number): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

const TAG: TensorTag = { job: 7, step: 3, pass: 1, block: 29, phase: 2, group: 1 };

function f32Tensor(shape: number[], seed = 1): Extract<Message, { kind: 'tensor' }> {
  const n = shape.reduce((a, b) => a * b, 1);
  const values = new Float32Array(n);
  const random = rng(seed);
  for (let i = 0; i < n; i++) values[i] = random() * 2 - 1;
  return { kind: 'tensor', from: 2, tag: TAG, dtype: 'f32', shape, data: new Uint8Array(values.buffer) };
}

function f16Tensor(n: number): Extract<Message, { kind: 'tensor' }> {
  const bits = new Uint16Array(n).map((_, i) => 0x3c00 + i);
  return { kind: 'tensor', from: 0, tag: TAG, dtype: 'f16', shape: [n], data: new Uint8Array(bits.buffer) };
}

/** Deep equality, with bulk byte comparison so megabyte tensors stay fast. */
function expectSameMessage(actual: Message | undefined, expected: Message): void {
  const bytes = (m: Message) =>
    m.kind === 'tensor' ? [m.data] : m.tensors.map((t) => new Uint8Array(t.buffer, t.byteOffset, t.byteLength));
  const shell = (m: Message) =>
    m.kind === 'tensor' ? { ...m, data: m.data.byteLength } : { ...m, tensors: m.tensors.map((t) => t.length) };
  const got = defined(actual, 'the decoded message');
  expect(shell(got)).toEqual(shell(expected));
  const a = bytes(got);
  bytes(expected).forEach((e, i) => expect(Buffer.compare(a[i], e)).toBe(0));
}

/** Pushes frames in order and returns every message that completed. */
function pushAll(r: Reassembler, frames: ArrayBuffer[]): Message[] {
  return frames.map((f) => r.push(f)).filter((m): m is Message => m !== null);
}

function patch(frame: ArrayBuffer, edit: (v: DataView) => void): ArrayBuffer {
  const copy = frame.slice(0);
  edit(new DataView(copy));
  return copy;
}

/** What `f` throws as `Name: message`, so a refusal's wording is pinned exactly. */
function thrown(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    return e instanceof Error ? `${e.name}: ${e.message}` : `non-Error ${String(e)}`;
  }
  return 'nothing thrown';
}

/** The one drop a bad frame must cause: no throw, null, counted, with a reason matching `reason`. */
function expectDropped(r: Reassembler, frame: ArrayBuffer, reason: RegExp): void {
  const before = r.dropped;
  let result: Message | null = null;
  expect(() => {
    result = r.push(frame);
  }).not.toThrow();
  expect(result).toBeNull();
  expect(r.dropped).toBe(before + 1);
  expect(r.lastError).toMatch(reason);
}

describe('frames', () => {
  it('have a 60-byte header and never exceed chunkBytes', () => {
    const msg = f32Tensor([1000, 100]); // 400 000 bytes
    const frames = encodeFrames(msg, 1, 16 * 1024);
    const stride = 16 * 1024 - HEADER_BYTES;
    expect(HEADER_BYTES).toBe(60);
    expect(frames).toHaveLength(Math.ceil(400_000 / stride));
    for (const f of frames) expect(f.byteLength).toBeLessThanOrEqual(16 * 1024);
    expect(frames.reduce((s, f) => s + f.byteLength - HEADER_BYTES, 0)).toBe(400_000);
  });

  it('refuse chunk sizes Chrome would reject or that leave no room for payload', () => {
    expect(() => encodeFrames(f16Tensor(4), 0, MAX_FRAME_BYTES + 1)).toThrow(/chunkBytes/);
    expect(() => encodeFrames(f16Tensor(4), 0, HEADER_BYTES)).toThrow(/chunkBytes/);
  });

  it('refuse a tensor whose data does not match its shape', () => {
    const msg = { ...f32Tensor([4, 4]), shape: [4, 5] };
    expect(() => encodeFrames(msg, 0)).toThrow(/needs 80 bytes, data has 64/);
  });

  it('refuse more than 4 dims and tag fields out of range', () => {
    expect(() => encodeFrames({ ...f32Tensor([1, 1, 1, 1, 1]) }, 0)).toThrow(/at most 4 dims/);
    expect(() => encodeFrames({ ...f16Tensor(1), tag: { ...TAG, block: 70_000 } }, 0)).toThrow(/tag.block/);
    expect(() => encodeFrames({ ...f16Tensor(1), from: 256 }, 0)).toThrow(/from/);
  });

  it('refuse a negative, fractional or too large msgId, from, tag field or shape dim, and an unknown dtype, naming the field and its range', () => {
    const t = f16Tensor(1);
    const u32 = (name: string, got: number) => `RangeError: ${name} must be an integer in [0, 4294967295], got ${got}`;
    const u16 = (name: string, got: number) => `RangeError: ${name} must be an integer in [0, 65535], got ${got}`;
    expect(thrown(() => encodeFrames(t, -1))).toBe(u32('msgId', -1));
    expect(thrown(() => encodeFrames(t, 2 ** 32))).toBe(u32('msgId', 2 ** 32));
    expect(thrown(() => encodeFrames({ ...t, from: -1 }, 0))).toBe(
      'RangeError: from must be an integer in [0, 255], got -1',
    );
    expect(thrown(() => encodeFrames({ ...t, from: 1.5 }, 0))).toBe(
      'RangeError: from must be an integer in [0, 255], got 1.5',
    );
    expect(thrown(() => encodeFrames({ ...t, tag: { ...TAG, job: -1 } }, 0))).toBe(u32('tag.job', -1));
    expect(thrown(() => encodeFrames({ ...t, tag: { ...TAG, step: 2 ** 32 } }, 0))).toBe(u32('tag.step', 2 ** 32));
    expect(thrown(() => encodeFrames({ ...t, tag: { ...TAG, pass: 65536 } }, 0))).toBe(u16('tag.pass', 65536));
    expect(thrown(() => encodeFrames({ ...t, tag: { ...TAG, phase: 0.5 } }, 0))).toBe(u16('tag.phase', 0.5));
    expect(thrown(() => encodeFrames({ ...t, tag: { ...TAG, group: 65536 } }, 0))).toBe(u16('tag.group', 65536));
    // a dim past the u32 range in an empty tensor: the byte count (0) alone would not notice it
    expect(thrown(() => encodeFrames({ ...f32Tensor([0]), shape: [0, 2 ** 32] }, 0))).toBe(u32('shape[1]', 2 ** 32));
    expect(thrown(() => encodeFrames({ ...t, dtype: 'bf16' as DType }, 0))).toBe(
      'TypeError: dtype must be one of f32, f16, i8, i4, got bf16',
    );
  });

  it('accept every header field at its maximum: msgId and job/step 2^32-1, from 255, pass/block/phase 65535, a shape dim 2^32-1', () => {
    const msg: Message = {
      kind: 'tensor',
      from: 255,
      tag: { job: 0xffffffff, step: 0xffffffff, pass: 0xffff, block: 0xffff, phase: 0xffff, group: 0xffff },
      dtype: 'f32',
      shape: [0, 0xffffffff],
      data: new Uint8Array(0),
    };
    const r = new Reassembler();
    expect(pushAll(r, encodeFrames(msg, 0xffffffff))).toEqual([msg]);
    expect(r.dropped).toBe(0);
  });

  it("accept chunkBytes of exactly MAX_FRAME_BYTES: frames of Chrome's limit, whose 262 084-byte stride the receiver accepts", () => {
    const msg = f32Tensor([100_000]); // 400 000 bytes: one full frame and the rest
    const frames = encodeFrames(msg, 1, MAX_FRAME_BYTES);
    expect(frames.map((f) => f.byteLength)).toEqual([
      MAX_FRAME_BYTES,
      HEADER_BYTES + 400_000 - (MAX_FRAME_BYTES - HEADER_BYTES),
    ]);
    const r = new Reassembler();
    const out = pushAll(r, frames);
    expect(r.dropped).toBe(0);
    expectSameMessage(out[0], msg);
  });

  it('refuse a payload over 4 GiB, which the u32 totalBytes cannot declare (a stand-in of that byteLength: nothing is allocated)', () => {
    const huge = { ...f16Tensor(1), shape: [2 ** 31], data: { byteLength: 2 ** 32 } as unknown as Uint8Array };
    expect(thrown(() => frameMessage(huge, 0))).toBe(
      'RangeError: message payload is 4294967296 bytes; at most 4294967295 fit a frame header',
    );
  });

  it('frame(index) builds frames 0..frameCount-1 and refuses an index below, at or past frameCount, or not an integer', () => {
    const source = frameMessage(f32Tensor([(1024 - HEADER_BYTES) / 2]), 0, 1024); // exactly two full frames
    expect(source.frameCount).toBe(2);
    expect([source.frame(0).byteLength, source.frame(1).byteLength]).toEqual([1024, 1024]);
    for (const index of [-1, 2, 3, 0.5, NaN]) {
      expect(thrown(() => source.frame(index))).toBe(`RangeError: frame index must be in [0, 2), got ${index}`);
    }
  });
});

describe('tensor messages round-trip', () => {
  const cases: Array<[name: string, msg: Extract<Message, { kind: 'tensor' }>, chunkBytes: number, frames: number]> = [
    ['empty (0 bytes, header-only frame)', f32Tensor([0, 16]), 1024, 1],
    ['one f16 element (2 bytes)', f16Tensor(1), 1024, 1],
    ['a scalar (ndim 0)', f32Tensor([]), 1024, 1],
    ['exactly one full chunk', f32Tensor([(1024 - HEADER_BYTES) / 4]), 1024, 1],
    ['one element past a chunk', f32Tensor([(1024 - HEADER_BYTES) / 4 + 1]), 1024, 2],
    ['a last chunk of 1 byte', f16Tensor(2), HEADER_BYTES + 3, 2],
    ['many chunks, 4-D', f32Tensor([2, 3, 100, 700], 9), 64 * 1024, 26],
  ];

  for (const [name, msg, chunkBytes, frameCount] of cases) {
    it(name, () => {
      const frames = encodeFrames(msg, 42, chunkBytes);
      expect(frames).toHaveLength(frameCount);
      const r = new Reassembler();
      const out = pushAll(r, frames);
      expect(r.dropped).toBe(0);
      expect(out).toHaveLength(1);
      expectSameMessage(out[0], msg);
      expect(r.openMessages).toBe(0);
    });
  }

  it('reassemble when chunks arrive in any order', () => {
    const msg = f32Tensor([64, 1024], 3); // 256 KiB
    const frames = encodeFrames(msg, 5, 4096);
    const r = new Reassembler();
    const out = pushAll(r, shuffled(frames, rng(11)));
    expect(out).toHaveLength(1);
    expectSameMessage(out[0], msg);
  });

  it('reassemble interleaved messages by msgId', () => {
    const a = f32Tensor([3000], 1);
    const b = f32Tensor([5000], 2);
    const fa = encodeFrames(a, 1, 2048);
    const fb = encodeFrames(b, 2, 2048);
    const mixed = shuffled([...fa, ...fb], rng(5));
    const out = pushAll(new Reassembler(), mixed);
    expect(out).toHaveLength(2);
    expect(out).toContainEqual(a);
    expect(out).toContainEqual(b);
  });

  it('deliver data in its own exactly-sized buffer, so it can be transferred to a Web Worker', () => {
    const msg = f32Tensor([10_000]);
    const out = defined(pushAll(new Reassembler(), encodeFrames(msg, 0, 8192))[0], 'the reassembled message');
    if (out.kind !== 'tensor') throw new Error('expected a tensor');
    expect(out.data.byteOffset).toBe(0);
    expect(out.data.buffer.byteLength).toBe(40_000);
    expect(new Float32Array(out.data.buffer)).toEqual(new Float32Array(msg.data.buffer));
  });
});

describe('rpc messages round-trip', () => {
  it('a JSON body with attached float32 tensors of 0, 3 and 100 000 elements over many chunks', () => {
    const body = {
      method: 'executeModel',
      args: { step: 4, prompt: 'ein Fuchs 🦊 im Schnee', ranks: [0, 1, 2] },
      id: 17,
    };
    const tensors = [
      new Float32Array(0),
      new Float32Array([1.5, -2, 3.25]),
      new Float32Array(100_000).map((_, i) => i / 7),
    ];
    const msg: Message = { kind: 'rpc', from: COORDINATOR, body, tensors };
    const frames = encodeFrames(msg, 9, 8192);
    expect(frames.length).toBeGreaterThan(40);
    const r = new Reassembler();
    const out = pushAll(r, shuffled(frames, rng(2)));
    expect(r.dropped).toBe(0);
    expect(out).toHaveLength(1);
    expectSameMessage(out[0], msg);
  });

  it('tensors attached at an odd JSON length are still aligned float32 views', () => {
    const msg: Message = {
      kind: 'rpc',
      from: 1,
      body: 'x',
      tensors: [new Float32Array([1, 2]), new Float32Array([3])],
    };
    const [out] = pushAll(new Reassembler(), encodeFrames(msg, 0));
    expect(out).toEqual(msg);
  });

  it('a tensor that is a view into a larger buffer sends only its own elements', () => {
    const big = new Float32Array([9, 9, 1, 2, 3, 9]);
    const msg: Message = { kind: 'rpc', from: 0, body: null, tensors: [big.subarray(2, 5)] };
    const [out] = pushAll(new Reassembler(), encodeFrames(msg, 0));
    expect(out).toEqual({ ...msg, tensors: [new Float32Array([1, 2, 3])] });
  });

  it('an undefined body arrives as null', () => {
    const [out] = pushAll(new Reassembler(), encodeFrames({ kind: 'rpc', from: 0, body: undefined, tensors: [] }, 0));
    expect(out).toEqual({ kind: 'rpc', from: 0, body: null, tensors: [] });
  });
});

describe('bad frames are dropped with a reason, never thrown', () => {
  const good = encodeFrames(f32Tensor([4000]), 3, 4096); // 16 000 bytes in 4 chunks of 4036

  it('a truncated header', () => {
    expectDropped(new Reassembler(), good[0].slice(0, 10), /10 bytes is shorter than the 60-byte header/);
  });

  it('a bad magic', () => {
    expectDropped(
      new Reassembler(),
      patch(good[0], (v) => v.setUint16(0, 0xbeef, true)),
      /bad magic 0xbeef/,
    );
  });

  it('an unknown version, kind or dtype', () => {
    const r = new Reassembler();
    expectDropped(
      r,
      patch(good[0], (v) => v.setUint8(2, 9)),
      /protocol version 9/,
    );
    expectDropped(
      r,
      patch(good[0], (v) => v.setUint8(3, 7)),
      /unknown kind 7/,
    );
    expectDropped(
      r,
      patch(good[0], (v) => v.setUint8(4, 4)),
      /unknown dtype 4/,
    );
  });

  it('more than 4 dims', () => {
    expectDropped(
      new Reassembler(),
      patch(good[0], (v) => v.setUint8(6, 5)),
      /ndim 5 exceeds 4/,
    );
  });

  it('flags (byte 7) other than none or signed, and a signed tensor whose total has no room for its signature', () => {
    const r = new Reassembler();
    expectDropped(
      r,
      patch(good[0], (v) => v.setUint8(7, 2)),
      /^unknown flags 2$/,
    );
    expectDropped(
      r,
      patch(good[0], (v) => v.setUint8(7, 1)),
      /^tensor shape \[4000\] f32 and a signature needs 16064 bytes, header declares 16000$/,
    );
    expect(r.openMessages).toBe(0);
  });

  it('chunkIndex not below chunkCount', () => {
    expectDropped(
      new Reassembler(),
      patch(good[0], (v) => v.setUint32(12, 4, true)),
      /chunkIndex 4 is not below chunkCount 4/,
    );
  });

  it('a chunkCount that does not match totalBytes and the chunk stride', () => {
    expectDropped(
      new Reassembler(),
      patch(good[0], (v) => v.setUint32(16, 1000, true)),
      /chunkCount 1000 does not match/,
    );
  });

  it('a chunk whose payload length is not what the header implies', () => {
    expectDropped(new Reassembler(), good[1].slice(0, 1000), /chunk 1 carries 940 payload bytes, expected 4036/);
  });

  it('totalBytes over the cap, before anything is allocated', () => {
    const r = new Reassembler({ maxMessageBytes: 10_000 });
    expectDropped(r, good[0], /declares 16000 bytes, over the 10000-byte cap/);
    expect(r.openMessages).toBe(0);
  });

  it('a shape dim past ndim that is not zero', () => {
    expectDropped(
      new Reassembler(),
      patch(good[0], (v) => v.setUint32(48, 5, true)),
      /^shape dim 1 is 5 but ndim is 1$/,
    );
  });

  it("a chunk stride of 0 or over 262 084 (Chrome's limit less the header); 262 084 itself passes", () => {
    const [frame] = encodeFrames(f32Tensor([4]), 1); // 16 bytes, one chunk whatever the stride
    const withStride = (stride: number) =>
      readHeader(new Uint8Array(patch(frame, (v) => v.setUint32(20, stride, true))));
    expect(withStride(0)).toBe('chunk stride 0 outside [1, 262084]');
    expect(withStride(MAX_FRAME_BYTES - HEADER_BYTES + 1)).toBe('chunk stride 262085 outside [1, 262084]');
    expect(withStride(MAX_FRAME_BYTES - HEADER_BYTES)).toMatchObject({
      chunkStride: 262_084,
      chunkCount: 1,
      totalBytes: 16,
    });
  });

  it('a tensor shape that does not match totalBytes', () => {
    expectDropped(
      new Reassembler(),
      patch(good[0], (v) => v.setUint32(44, 3999, true)),
      /shape \[3999\] f32 needs 15996 bytes, header declares 16000/,
    );
  });

  it('a header that disagrees with the first chunk of the same msgId, without spoiling the message', () => {
    const r = new Reassembler();
    expect(r.push(good[0])).toBeNull();
    expectDropped(
      r,
      patch(good[1], (v) => v.setUint16(38, 30, true)),
      /chunk 1 of message 3 disagrees with its first chunk on tag/,
    );
    expectDropped(
      r,
      patch(good[1], (v) => v.setUint8(5, 4)),
      /disagrees .* on magic\/version\/kind\/dtype\/from\/ndim/,
    );
    // byte 28 is the first of the tag (job): a field's first byte is that field's, not the one before it
    expectDropped(
      r,
      patch(good[1], (v) => v.setUint32(28, 8, true)),
      /disagrees with its first chunk on tag$/,
    );
    const out = pushAll(r, good.slice(1));
    expect(out).toEqual([f32Tensor([4000])]);
  });

  it('a duplicated chunk, and a chunk of a message already delivered', () => {
    const r = new Reassembler();
    r.push(good[0]);
    expectDropped(r, good[0], /duplicate chunk 0 of message 3/);
    expect(pushAll(r, good.slice(1))).toHaveLength(1);
    expectDropped(r, good[2], /chunk 2 of message 3, which is already complete/);
    expect(r.openMessages).toBe(0);
  });

  it('rpc JSON that does not parse, or bytes that are not UTF-8', () => {
    const [frame] = encodeFrames({ kind: 'rpc', from: 0, body: 'abcd', tensors: [] }, 8); // JSON '"abcd"' at offset 8
    expectDropped(
      new Reassembler(),
      patch(frame, (v) => v.setUint8(HEADER_BYTES + 8, 0x7b)),
      /rpc message 8: body is not valid UTF-8 JSON/,
    );
    expectDropped(
      new Reassembler(),
      patch(frame, (v) => v.setUint8(HEADER_BYTES + 9, 0xff)),
      /not valid UTF-8 JSON/,
    );
  });

  it('an rpc frame whose dtype is not f32 or whose ndim is not 0', () => {
    const [frame] = encodeFrames({ kind: 'rpc', from: 0, body: 'abcd', tensors: [] }, 8);
    expectDropped(
      new Reassembler(),
      patch(frame, (v) => v.setUint8(4, 1)),
      /^rpc frame must have dtype f32, ndim 0 and no signature, got f16, 0$/,
    );
    expectDropped(
      new Reassembler(),
      patch(frame, (v) => v.setUint8(6, 1)),
      /^rpc frame must have dtype f32, ndim 0 and no signature, got f32, 1$/,
    );
    expectDropped(
      new Reassembler(),
      patch(frame, (v) => v.setUint8(7, 1)),
      /^rpc frame must have dtype f32, ndim 0 and no signature, got f32, 0, signed$/,
    );
  });

  it('an rpc payload shorter than its 8-byte prefix; one of exactly 8 bytes passes the header and fails only on its empty JSON', () => {
    const [frame] = encodeFrames({ kind: 'rpc', from: 0, body: 'abcd', tensors: [] }, 8); // 16 payload bytes in one chunk
    const cut = (totalBytes: number) =>
      patch(frame, (v) => {
        v.setUint32(24, totalBytes, true);
        v.setUint32(HEADER_BYTES, 0, true); // 0 JSON bytes (and 0 tensors already): a prefix and nothing else
      }).slice(0, HEADER_BYTES + totalBytes);
    expectDropped(new Reassembler(), cut(7), /^rpc payload of 7 bytes is shorter than its 8-byte prefix$/);
    expect(readHeader(new Uint8Array(cut(8)))).toMatchObject({ kind: 'rpc', totalBytes: 8 });
    expectDropped(new Reassembler(), cut(8), /^rpc message 8: body is not valid UTF-8 JSON/);
  });

  it('an rpc prefix whose lengths do not add up to the payload', () => {
    const [frame] = encodeFrames({ kind: 'rpc', from: 0, body: 1, tensors: [new Float32Array(2)] }, 8);
    expectDropped(
      new Reassembler(),
      patch(frame, (v) => v.setUint32(HEADER_BYTES + 8, 3, true)),
      /do not add up/,
    );
    expectDropped(
      new Reassembler(),
      patch(frame, (v) => v.setUint32(HEADER_BYTES + 4, 1_000_000, true)),
      /declares 1000000 tensors/,
    );
  });

  it('a detached buffer, which cannot be read: what that throws is dropped as an internal error', () => {
    const frame = good[0].slice(0);
    structuredClone(frame, { transfer: [frame] });
    expectDropped(new Reassembler(), frame, /^internal error: .*detached/);
  });

  it('a frame that is not binary at all', () => {
    expectDropped(new Reassembler(), 'hello' as unknown as ArrayBuffer, /not binary/);
  });

  it('a frame the owner rejects by content, judged once per message before allocation', () => {
    const seen: FrameHeader[] = [];
    const r = new Reassembler({
      accept: (h) => {
        seen.push(h);
        return h.from === 2 && h.tag.block < 30
          ? null
          : `expected rank 2 and block < 30, got rank ${h.from} block ${h.tag.block}`;
      },
    });
    expect(pushAll(r, good)).toHaveLength(1);
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({
      kind: 'tensor',
      from: 2,
      tag: TAG,
      shape: [4000],
      totalBytes: 16000,
      chunkCount: 4,
    });
    const other = encodeFrames({ ...f32Tensor([4000]), from: 5 }, 4, 4096);
    expectDropped(r, other[0], /message 4 rejected: expected rank 2 and block < 30, got rank 5 block 29/);
    expect(r.openMessages).toBe(0);
  });

  it('an accept hook that throws counts as a rejection', () => {
    const r = new Reassembler({
      accept: () => {
        throw new Error('plan missing');
      },
    });
    expectDropped(r, good[0], /accept hook threw: plan missing/);
  });

  it('too many partial messages evicts the oldest', () => {
    const r = new Reassembler({ maxOpenMessages: 4 });
    for (let id = 0; id < 6; id++) r.push(encodeFrames(f32Tensor([4000]), id, 4096)[0]);
    expect(r.openMessages).toBe(4);
    expect(r.dropped).toBe(2);
    expect(r.lastError).toMatch(/evicted partial message 1 \(3 of 4 chunks missing\)/);
  });

  it('partial messages may fill maxPendingBytes exactly; one more evicts the oldest and releases its bytes', () => {
    const r = new Reassembler({ maxMessageBytes: 16_000, maxPendingBytes: 32_000 });
    const held = () => ({ open: r.openMessages, heldBytes: r.heldBytes, dropped: r.dropped });
    for (let id = 0; id < 2; id++) r.push(encodeFrames(f32Tensor([4000]), id, 4096)[0]);
    expect(held()).toEqual({ open: 2, heldBytes: 32_000, dropped: 0 });
    r.push(encodeFrames(f32Tensor([4000]), 2, 4096)[0]);
    expect(held()).toEqual({ open: 2, heldBytes: 32_000, dropped: 1 });
    expect(r.lastError).toMatch(/^evicted partial message 0 /);
  });

  it('a message of exactly maxPendingBytes is held; one byte over it is refused before allocation', () => {
    const atCap = new Reassembler({ maxMessageBytes: 16_000, maxPendingBytes: 16_000 });
    expect(atCap.push(good[0])).toBeNull();
    expect({ open: atCap.openMessages, heldBytes: atCap.heldBytes, dropped: atCap.dropped }).toEqual({
      open: 1,
      heldBytes: 16_000,
      dropped: 0,
    });
    const over = new Reassembler({ maxMessageBytes: 16_000, maxPendingBytes: 15_999 });
    expectDropped(over, good[0], /^message 3 declares 16000 bytes, over the 15999-byte pending cap$/);
    expect({ open: over.openMessages, heldBytes: over.heldBytes }).toEqual({ open: 0, heldBytes: 0 });
  });

  it('1000 frames of random bytes, and 1000 valid frames with random bytes changed: each dropped for a named reason, the counts pinned', () => {
    const random = rng(1234);
    const r = new Reassembler({ maxMessageBytes: 1 << 20 });
    // push() turns anything thrown inside it into an "internal error" drop: a frame dropped for that
    // reason is one no check caught, so it is counted here rather than hidden by the catch
    const reasons = new Map<string, number>();
    const pushCounted = (frame: ArrayBuffer): Message | null => {
      const before = r.dropped;
      const out = r.push(frame);
      if (r.dropped > before) {
        const reason = r.lastError.startsWith('internal error')
          ? r.lastError
          : r.lastError.replace(/0x[0-9a-f]+|\d+/g, 'N');
        reasons.set(reason, (reasons.get(reason) ?? 0) + 1);
      }
      return out;
    };

    for (let i = 0; i < 1000; i++) {
      const bytes = new Uint8Array(Math.floor(random() * 300)).map(() => random() * 256);
      // get past magic/version sometimes
      if (i % 2 === 0 && bytes.length >= 4) bytes.set([0x44, 0x57, PROTOCOL_VERSION], 0);
      const before = r.dropped;
      expect(pushCounted(bytes.buffer)).toBeNull();
      expect(r.dropped, `random frame ${i}`).toBe(before + 1);
    }
    expect(r.dropped).toBe(1000);
    expect(r.openMessages).toBe(0);
    expect([...reasons.keys()].filter((k) => k.startsWith('internal error'))).toEqual([]);

    const sources: ArrayBuffer[] = [
      ...encodeFrames(f32Tensor([3000]), 100, 2048),
      ...encodeFrames({ kind: 'rpc', from: 1, body: { a: [1, 2] }, tensors: [new Float32Array(700)] }, 200, 1024),
    ];
    const droppedBefore = r.dropped;
    reasons.clear();
    let delivered = 0;
    for (let i = 0; i < 1000; i++) {
      const frame = sources[Math.floor(random() * sources.length)].slice(0);
      const bytes = new Uint8Array(frame);
      const flips = 1 + Math.floor(random() * 3);
      for (let k = 0; k < flips; k++)
        bytes[Math.floor(random() * Math.min(bytes.length, HEADER_BYTES + 32))] = random() * 256;
      if (pushCounted(frame) !== null) delivered++;
    }
    const dropped = r.dropped - droppedBefore;
    expect([...reasons.keys()].filter((k) => k.startsWith('internal error'))).toEqual([]);
    // the seeded corruption, counted: a check that stops catching what it caught moves these numbers
    expect(
      { dropped, delivered, open: r.openMessages },
      `reasons ${JSON.stringify(Object.fromEntries(reasons))}`,
    ).toEqual({ dropped: 956, delivered: 1, open: 37 });
  });
});

describe("the Reassembler's bookkeeping", () => {
  const frames = encodeFrames(f32Tensor([4000]), 3, 4096); // 16 000 bytes in 4 chunks

  it("starts with nothing dropped, no error and no bytes held; holds a partial message's payload until it completes", () => {
    const r = new Reassembler();
    expect({ dropped: r.dropped, lastError: r.lastError, heldBytes: r.heldBytes }).toEqual({
      dropped: 0,
      lastError: '',
      heldBytes: 0,
    });
    r.push(frames[0]);
    expect(r.heldBytes).toBe(16_000);
    expect(pushAll(r, frames.slice(1))).toHaveLength(1);
    expect(r.heldBytes).toBe(0);
  });

  it('remembers the last 1024 completed msgIds, dropping a replay of any of them, and forgets the oldest past that', () => {
    const r = new Reassembler();
    const single = (id: number) => encodeFrames(f16Tensor(1), id)[0];
    for (let id = 0; id < 1024; id++) expect(r.push(single(id))).not.toBeNull();
    expectDropped(r, single(0), /^chunk 0 of message 0, which is already complete$/);
    expect(r.push(single(1024))).not.toBeNull(); // the 1025th: message 0 is forgotten, 1 still remembered
    expectDropped(r, single(1), /^chunk 0 of message 1, which is already complete$/);
    expect(r.push(single(0))).not.toBeNull();
  });

  it('a partial message costs its payload and one bit a chunk: a million one-byte chunks hold under 2 MB', () => {
    const first = frameMessage(f32Tensor([250_000]), 0, HEADER_BYTES + 1).frame(0); // 1 000 000 bytes, stride 1
    const r = new Reassembler();
    const before = process.memoryUsage().arrayBuffers;
    expect(r.push(first)).toBeNull();
    const grown = process.memoryUsage().arrayBuffers - before;
    expect(r.heldBytes).toBe(1_000_000);
    expect(grown).toBeLessThan(2_000_000); // payload 1 MB + chunk bitset 125 kB
  });
});

/** A copy of `bytes` that starts `offset` bytes into its buffer. */
const placed = (bytes: Uint8Array, offset: number) => {
  const buffer = new Uint8Array(offset + bytes.byteLength);
  buffer.set(bytes, offset);
  return buffer.subarray(offset);
};

describe('tensorValues', () => {
  const values = new Float32Array([1, -2, 0.5, 65504]);

  it('f32 at a 4-aligned byteOffset (0, 4) is a view of the payload; at a misaligned one (2) a copy of the same values', () => {
    const wire = tensorPayload(values, 'f32');
    for (const offset of [0, 4]) {
      const data = placed(wire, offset);
      const out = tensorValues(data, 'f32');
      expect(out).toEqual(values);
      expect(out.buffer).toBe(data.buffer);
      expect(out.byteOffset).toBe(offset);
    }
    expect(tensorValues(placed(wire, 2), 'f32')).toEqual(values);
  });

  it('f16 at an even byteOffset (2) is decoded without copying the payload; at an odd one (1) it is copied first', () => {
    const wire = tensorPayload(values, 'f16');
    const slice = vi.spyOn(Uint8Array.prototype, 'slice');
    try {
      expect(tensorValues(placed(wire, 2), 'f16')).toEqual(values);
      expect(slice).not.toHaveBeenCalled();
      expect(tensorValues(placed(wire, 1), 'f16')).toEqual(values);
      expect(slice).toHaveBeenCalledTimes(1);
    } finally {
      slice.mockRestore();
    }
  });
});

describe('i8', () => {
  it("sends a float32 scale per 64 values and one byte a value; each value within half a step of its group's largest, zeros exact", () => {
    const random = rng(8);
    // groups of very different sizes, a group of zeros, and a last group cut short
    const values = Float32Array.from({ length: 3 * I8_GROUP + 17 }, (_, i) =>
      i < I8_GROUP ? 0 : (random() - 0.5) * 10 ** ((i / I8_GROUP) | 0),
    );
    const wire = tensorPayload(values, 'i8');
    expect(wire.byteLength).toBe(payloadBytes(values.length, 'i8'));
    expect(wire.byteLength).toBe(values.length + 4 * 4);
    for (const offset of [0, 1, 3]) {
      const out = tensorValues(placed(wire, offset), 'i8');
      expect(out.length).toBe(values.length);
      for (let g = 0; g * I8_GROUP < values.length; g++) {
        const group = values.subarray(g * I8_GROUP, (g + 1) * I8_GROUP);
        const step = Math.max(...group.map(Math.abs)) / 127;
        group.forEach((v, i) =>
          expect(Math.abs(out[g * I8_GROUP + i] - v)).toBeLessThanOrEqual(step / 2 + 1e-6 * Math.abs(v)),
        );
      }
      expect(out.subarray(0, I8_GROUP).every((v) => v === 0)).toBe(true);
    }
  });

  it('a NaN or infinite value makes its group NaN on arrival (the receiver refuses it); frames declare int8 sizes', () => {
    const values = Float32Array.from({ length: 2 * I8_GROUP }, (_, i) => i);
    values[5] = NaN;
    values[I8_GROUP + 1] = Infinity;
    const out = tensorValues(tensorPayload(values, 'i8'), 'i8');
    expect(out.subarray(0, 2 * I8_GROUP).every((v) => Number.isNaN(v))).toBe(true);
    const data = tensorPayload(
      Float32Array.from({ length: 100 }, (_, i) => i),
      'i8',
    );
    const [frame] = encodeFrames({ kind: 'tensor', from: 0, tag: TAG, dtype: 'i8', shape: [100], data }, 1);
    expect(readHeader(new Uint8Array(frame))).toMatchObject({ dtype: 'i8', shape: [100], totalBytes: 108 });
    expect(() => encodeFrames({ kind: 'tensor', from: 0, tag: TAG, dtype: 'i8', shape: [101], data }, 1)).toThrow(
      'tensor of shape [101] i8 needs 109 bytes, data has 108',
    );
  });
});

describe('f16', () => {
  it('round-trips every finite half value bit-exactly, and NaN stays NaN', () => {
    const all = new Uint16Array(65536).map((_, i) => i);
    const back = toF16(fromF16(all));
    for (let h = 0; h < 65536; h++) {
      const isNaN = (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;
      if (isNaN) expect(Number.isNaN(fromF16(new Uint16Array([back[h]]))[0])).toBe(true);
      else if (back[h] !== h) throw new Error(`0x${h.toString(16)} came back as 0x${back[h].toString(16)}`);
    }
  });

  it('encodes the landmarks of the format', () => {
    const cases: Array<[number, number]> = [
      [1, 0x3c00],
      [-2, 0xc000],
      [65504, 0x7bff], // largest finite
      [65519, 0x7bff], // below the midpoint to infinity
      [65520, 0x7c00], // midpoint ties to even: infinity
      [2 ** 16, 0x7c00], // the first float32 exponent past the half range
      [-1.5 * 2 ** 16, 0xfc00], // ... with mantissa bits set: still infinity, not NaN
      [1e9, 0x7c00],
      [Infinity, 0x7c00],
      [-Infinity, 0xfc00],
      [-0, 0x8000],
      [2 ** -14, 0x0400], // smallest normal
      [2 ** -24, 0x0001], // smallest subnormal
      [2 ** -25, 0x0000], // halfway to the smallest subnormal ties to even: zero
      [2 ** -25 * 1.5, 0x0001],
      [3 * 2 ** -25, 0x0002], // halfway between subnormals 1 and 2 ties to even
      [1 + 2 ** -11, 0x3c00], // halfway between 1 and the next half: even
      [1 + 3 * 2 ** -11, 0x3c02], // halfway, rounds up to even
      [1 + 2 ** -11 + 2 ** -20, 0x3c01],
      [2 ** -14 - 2 ** -25, 0x0400], // the largest subnormal rounds up into the normals
      [1e-10, 0x0000],
    ];
    const bits = toF16(new Float32Array(cases.map(([x]) => x)));
    cases.forEach(([x, expected], i) => expect([x, bits[i]]).toEqual([x, expected]));
    expect(toF16(new Float32Array([NaN]))[0] & 0x7fff).toBeGreaterThan(0x7c00);
  });

  it('rounds normal values with relative error at most 2^-11', () => {
    const random = rng(77);
    const xs = new Float32Array(100_000).map(() => (random() < 0.5 ? -1 : 1) * 2 ** (-14 + random() * 29.99));
    const back = fromF16(toF16(xs));
    let worst = 0;
    for (let i = 0; i < xs.length; i++) worst = Math.max(worst, Math.abs(back[i] - xs[i]) / Math.abs(xs[i]));
    expect(worst).toBeLessThanOrEqual(2 ** -11);
    expect(worst).toBeGreaterThan(2 ** -12); // the bound is tight, so the test would notice truncation
  });
});

describe('i4', () => {
  it("sends a float32 scale per 64 values and half a byte a value; each value within half a step (its group's largest / 7), zeros exact, odd counts whole", () => {
    const random = rng(9);
    for (const length of [3 * I8_GROUP + 17, 3 * I8_GROUP + 18, 1]) {
      const values = Float32Array.from({ length }, (_, i) =>
        i < I8_GROUP ? 0 : (random() - 0.5) * 10 ** ((i / I8_GROUP) | 0),
      );
      const wire = tensorPayload(values, 'i4');
      expect(wire.byteLength).toBe(payloadBytes(length, 'i4'));
      expect(wire.byteLength).toBe(Math.ceil(length / 2) + 4 * Math.ceil(length / I8_GROUP));
      for (const offset of [0, 1]) {
        const out = tensorValues(placed(wire, offset), 'i4');
        expect(out.length, `${length} values`).toBe(length);
        for (let g = 0; g * I8_GROUP < length; g++) {
          const group = values.subarray(g * I8_GROUP, (g + 1) * I8_GROUP);
          const step = Math.max(...group.map(Math.abs)) / 7;
          group.forEach((v, i) =>
            expect(Math.abs(out[g * I8_GROUP + i] - v)).toBeLessThanOrEqual(step / 2 + 1e-6 * Math.abs(v)),
          );
        }
      }
    }
    const nan = Float32Array.from({ length: I8_GROUP }, (_, i) => i);
    nan[3] = NaN;
    expect(tensorValues(tensorPayload(nan, 'i4'), 'i4').every((v) => Number.isNaN(v))).toBe(true);
  });
});
