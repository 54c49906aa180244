// Messages and frames on the wire between the coordinator and worker pages.
//
// A data channel carries binary frames (PeerJS `serialization: 'raw'`). Chrome
// rejects a single send over 256 KiB, so every message is split into frames of
// at most `chunkBytes`, each a fixed little-endian header plus one slice of the
// payload. Frames of different messages may interleave; the receiver reassembles
// by `msgId`. Anything that arrives is validated before it is used or before any
// memory is allocated for it: a peer that sends garbage costs a counter, never
// a page.
//
// Header (HEADER_BYTES = 60, little-endian):
//   off size field
//    0   u16  magic 0x5744 ('DW')
//    2   u8   version (2: the head group at 42)
//    3   u8   kind: 1 rpc, 2 tensor
//    4   u8   dtype: 0 f32, 1 f16, 2 i8, 3 i4 (rpc: always f32)
//    5   u8   from: rank 0..254, or COORDINATOR (255)
//    6   u8   ndim 0..4 (rpc: 0)
//    7   u8   reserved, 0
//    8   u32  msgId
//   12   u32  chunkIndex
//   16   u32  chunkCount
//   20   u32  chunkStride: payload bytes in every chunk but the last
//   24   u32  totalBytes: payload bytes of the whole message
//   28   u32  job
//   32   u32  step
//   36   u16  pass
//   38   u16  block
//   40   u16  phase
//   42   u16  group: a Ulysses block's head group (core/parallel.ts headGroup), else 0
//   44   u32×4 shape (unused dims 0)
//   60        payload slice: bytes [chunkIndex·chunkStride, +min(chunkStride, rest))
//
// RPC payload: u32 jsonBytes, u32 tensorCount, u32 length (elements) of each
// tensor, UTF-8 JSON, zero padding to a multiple of 4, then each tensor's
// float32 data in order.

/**
 * How activations travel between ranks: float32 (exact), float16, or int8 or int4 with a float32
 * scale per I8_GROUP values (int4: displaced mode's deltas of keys and values only, rank/displaced.ts).
 * Each one's place here is its code on the wire: a new one goes last.
 */
export const DTYPES = ['f32', 'f16', 'i8', 'i4'] as const;
export type DType = (typeof DTYPES)[number];

/** The integers either side of 0 a quantizing transport rounds to: a scale is max|x| over these. */
export const QUANTIZED_LEVELS = { i8: 127, i4: 7 } as const;

/** Identifies one activation tensor of the all-to-all. All fields are small non-negative integers. */
export interface TensorTag {
  job: number;
  step: number;
  pass: number;
  block: number;
  phase: number;
  group: number;
}

export type Message =
  | { kind: 'rpc'; from: number; body: unknown; tensors: Float32Array[] }
  | {
      kind: 'tensor';
      from: number;
      tag: TensorTag;
      dtype: DType;
      shape: number[];
      data: Uint8Array;
      /** its sender's signature (core/net/signing.ts), after the data; absent where the mesh signs nothing */
      signature?: Uint8Array;
    };

/** Everything a frame's header declares; what `Reassembler`'s `accept` hook judges. */
export interface FrameHeader {
  kind: Message['kind'];
  dtype: DType;
  from: number;
  tag: TensorTag;
  shape: number[];
  /** a tensor's payload ends in its sender's signature */
  signed: boolean;
  msgId: number;
  chunkIndex: number;
  chunkCount: number;
  chunkStride: number;
  totalBytes: number;
}

/** `from` of the coordinator; worker ranks are 0..254. */
export const COORDINATOR = 255;
export const HEADER_BYTES = 60;
/** Chrome rejects a data-channel message larger than this. */
export const MAX_FRAME_BYTES = 256 * 1024;
export const DEFAULT_CHUNK_BYTES = 64 * 1024;
/**
 * Values per int8 scale: each group of 64 is sent as round(x / s) with s = max|x| / 127, so a
 * value is off by at most half a step of its group's largest (a Wan head's row is 128 values).
 */
export const I8_GROUP = 64;

/** Bytes of `elements` values of `dtype` on the wire. */
export function payloadBytes(elements: number, dtype: DType): number {
  const scales = 4 * Math.ceil(elements / I8_GROUP);
  if (dtype === 'i8') return elements + scales;
  if (dtype === 'i4') return Math.ceil(elements / 2) + scales;
  return elements * (dtype === 'f16' ? 2 : 4);
}

/** Bytes a value of `dtype` takes on the wire on average, its scales counted (int8: 1.0625). */
export const bytesPerElement = (dtype: DType): number => payloadBytes(I8_GROUP, dtype) / I8_GROUP;
export const MAX_NDIM = 4;

const MAGIC = 0x5744;
/** the header's byte 2: pages that speak another version drop each other's frames */
export const PROTOCOL_VERSION = 3;
const KIND_CODE = { rpc: 1, tensor: 2 } as const;
const KIND_NAME = [undefined, 'rpc', 'tensor'] as const;
/** a dtype's code on the wire (byte 4) is its place in DTYPES */
const DTYPE_CODE = Object.fromEntries(DTYPES.map((d, code) => [d, code])) as Record<DType, number>;
const U16_MAX = 0xffff;
const U32_MAX = 0xffffffff;
/** an Ed25519 signature's bytes (core/net/signing.ts) */
export const SIGNATURE_BYTES = 64;
/** the header's byte 7: a tensor's payload ends in its sender's signature */
const SIGNED = 1;
const NO_TAG: TensorTag = { job: 0, step: 0, pass: 0, block: 0, phase: 0, group: 0 };

// ---------------------------------------------------------------- encoding

/** A message cut into frames that are built one at a time, so a sender holds
 *  at most the frames it has queued on the channel. The message's arrays are
 *  read when each frame is built: do not mutate them until the last frame is. */
export interface FrameSource {
  readonly frameCount: number;
  /** Payload bytes (without headers) over all frames. */
  readonly payloadBytes: number;
  frame(index: number): ArrayBuffer;
}

export function frameMessage(msg: Message, msgId: number, chunkBytes = DEFAULT_CHUNK_BYTES): FrameSource {
  checkUint('msgId', msgId, U32_MAX);
  if (!Number.isInteger(chunkBytes) || chunkBytes <= HEADER_BYTES || chunkBytes > MAX_FRAME_BYTES) {
    throw new RangeError(
      `chunkBytes must be an integer in (${HEADER_BYTES}, ${MAX_FRAME_BYTES}] ` +
        `(header + at least one payload byte, Chrome's limit), got ${chunkBytes}`,
    );
  }
  checkUint('from', msg.from, 255);
  const segments =
    msg.kind === 'rpc'
      ? rpcSegments(msg.body, msg.tensors)
      : [tensorBytes(msg), ...(msg.signature ? [msg.signature] : [])];
  const starts: number[] = [];
  let totalBytes = 0;
  for (const s of segments) {
    starts.push(totalBytes);
    totalBytes += s.byteLength;
  }
  // Stryker disable next-line EqualityOperator: payloads are whole 2- or 4-byte units, never U32_MAX (odd) bytes
  if (totalBytes > U32_MAX)
    throw new RangeError(`message payload is ${totalBytes} bytes; at most ${U32_MAX} fit a frame header`);
  const stride = chunkBytes - HEADER_BYTES;
  const frameCount = Math.max(1, Math.ceil(totalBytes / stride));

  const template = new Uint8Array(HEADER_BYTES);
  const v = new DataView(template.buffer);
  const tag = msg.kind === 'tensor' ? msg.tag : NO_TAG;
  const shape = msg.kind === 'tensor' ? msg.shape : [];
  v.setUint16(0, MAGIC, true);
  v.setUint8(2, PROTOCOL_VERSION);
  v.setUint8(3, KIND_CODE[msg.kind]);
  v.setUint8(4, DTYPE_CODE[msg.kind === 'tensor' ? msg.dtype : 'f32']);
  v.setUint8(5, msg.from);
  v.setUint8(6, shape.length);
  v.setUint8(7, msg.kind === 'tensor' && msg.signature ? SIGNED : 0);
  v.setUint32(8, msgId, true);
  v.setUint32(16, frameCount, true);
  v.setUint32(20, stride, true);
  v.setUint32(24, totalBytes, true);
  v.setUint32(28, tag.job, true);
  v.setUint32(32, tag.step, true);
  v.setUint16(36, tag.pass, true);
  v.setUint16(38, tag.block, true);
  v.setUint16(40, tag.phase, true);
  v.setUint16(42, tag.group, true);
  shape.forEach((d, i) => v.setUint32(44 + 4 * i, d, true));

  return {
    frameCount,
    payloadBytes: totalBytes,
    frame(index: number): ArrayBuffer {
      if (!Number.isInteger(index) || index < 0 || index >= frameCount) {
        throw new RangeError(`frame index must be in [0, ${frameCount}), got ${index}`);
      }
      const begin = index * stride;
      const end = Math.min(begin + stride, totalBytes);
      const out = new Uint8Array(HEADER_BYTES + end - begin);
      out.set(template);
      new DataView(out.buffer).setUint32(12, index, true);
      // Copy [begin, end) of the concatenated segments: the payload's only copy.
      let at = HEADER_BYTES;
      // The segments tile [0, totalBytes): `at` reaches out.length with the last segment overlapping
      // [begin, end), before `s` runs out, so either bound alone ends the loop where both do.
      // Stryker disable next-line LogicalOperator,ConditionalExpression,EqualityOperator: either bound ends it
      for (let s = 0; s < segments.length && at < out.length; s++) {
        const segStart = starts[s];
        const seg = segments[s];
        const from = Math.max(begin, segStart);
        const to = Math.min(end, segStart + seg.byteLength);
        // Stryker disable next-line EqualityOperator: at from === to, going on copies nothing and adds 0 to `at`
        if (from >= to) continue;
        out.set(seg.subarray(from - segStart, to - segStart), at);
        at += to - from;
      }
      return out.buffer;
    },
  };
}

/** All frames of a message at once; see `frameMessage` to build them lazily. */
export function encodeFrames(msg: Message, msgId: number, chunkBytes = DEFAULT_CHUNK_BYTES): ArrayBuffer[] {
  const source = frameMessage(msg, msgId, chunkBytes);
  return Array.from({ length: source.frameCount }, (_, i) => source.frame(i));
}

function tensorBytes(msg: Extract<Message, { kind: 'tensor' }>): Uint8Array {
  const { tag, shape, dtype, data } = msg;
  checkUint('tag.job', tag.job, U32_MAX);
  checkUint('tag.step', tag.step, U32_MAX);
  checkUint('tag.pass', tag.pass, U16_MAX);
  checkUint('tag.block', tag.block, U16_MAX);
  checkUint('tag.phase', tag.phase, U16_MAX);
  checkUint('tag.group', tag.group, U16_MAX);
  if (!(dtype in DTYPE_CODE))
    throw new TypeError(`dtype must be one of ${Object.keys(DTYPE_CODE).join(', ')}, got ${dtype}`);
  if (shape.length > MAX_NDIM)
    throw new RangeError(`a tensor has at most ${MAX_NDIM} dims, got shape [${shape.join(',')}]`);
  shape.forEach((d, i) => checkUint(`shape[${i}]`, d, U32_MAX));
  const expected = payloadBytes(
    shape.reduce((a, b) => a * b, 1),
    dtype,
  );
  if (msg.signature && msg.signature.byteLength !== SIGNATURE_BYTES)
    throw new RangeError(`a tensor's signature is ${SIGNATURE_BYTES} bytes, got ${msg.signature.byteLength}`);
  if (data.byteLength !== expected) {
    throw new RangeError(
      `tensor of shape [${shape.join(',')}] ${dtype} needs ${expected} bytes, data has ${data.byteLength}`,
    );
  }
  return data;
}

const utf8 = new TextEncoder();

function rpcSegments(body: unknown, tensors: Float32Array[]): Uint8Array[] {
  // eslint-disable-next-line @typescript-eslint/no-unnecessary-condition -- stringify(undefined) is undefined
  const json = utf8.encode(JSON.stringify(body) ?? 'null');
  const prefixBytes = 8 + 4 * tensors.length;
  const pad = (4 - ((prefixBytes + json.byteLength) % 4)) % 4;
  const prefix = new Uint8Array(prefixBytes);
  const v = new DataView(prefix.buffer);
  v.setUint32(0, json.byteLength, true);
  v.setUint32(4, tensors.length, true);
  tensors.forEach((t, i) => v.setUint32(8 + 4 * i, t.length, true));
  return [
    prefix,
    json,
    new Uint8Array(pad),
    ...tensors.map((t) => new Uint8Array(t.buffer, t.byteOffset, t.byteLength)),
  ];
}

function checkUint(name: string, value: number, max: number): void {
  if (!Number.isInteger(value) || value < 0 || value > max) {
    throw new RangeError(`${name} must be an integer in [0, ${max}], got ${value}`);
  }
}

// ---------------------------------------------------------------- decoding

export interface ReassemblerOptions {
  /** Largest payload one message may declare; bigger frames are dropped before allocation. */
  maxMessageBytes?: number;
  /** Partial messages kept at once; past it the oldest is evicted. */
  maxOpenMessages?: number;
  /** Bytes held by partial messages at once; past it the oldest are evicted. */
  maxPendingBytes?: number;
  /** Judges the first frame of each message by content, before allocation; a string rejects it with that reason. */
  accept?: (header: FrameHeader) => string | null;
}

interface PartialMessage {
  header: FrameHeader;
  /** The header's bytes minus chunkIndex, to check that later chunks agree. */
  signature: Uint8Array;
  payload: Uint8Array; // [totalBytes]
  seen: Uint32Array; // bitset over chunks
  missing: number;
}

/** Turns frames from one peer back into messages. Never throws; bad input is dropped and counted. */
export class Reassembler {
  /** Frames (or partial messages) rejected so far. */
  dropped = 0;
  /** whole messages that arrived and did not decode: a sender that encodes honestly never sends one */
  malformed = 0;
  /** Why the last one was rejected. */
  lastError = '';

  private readonly maxMessageBytes: number;
  private readonly maxOpenMessages: number;
  private readonly maxPendingBytes: number;
  private readonly accept: ReassemblerOptions['accept'];
  private readonly open = new Map<number, PartialMessage>();
  private pendingBytes = 0;
  // Recently completed ids, so a replayed chunk cannot deliver a message twice.
  private readonly done = new Set<number>();
  private readonly doneOrder: number[] = [];

  constructor(opts: ReassemblerOptions = {}) {
    this.maxMessageBytes = opts.maxMessageBytes ?? 64 * 1024 * 1024;
    this.maxOpenMessages = Math.max(1, opts.maxOpenMessages ?? 64);
    this.maxPendingBytes = opts.maxPendingBytes ?? 4 * this.maxMessageBytes;
    this.accept = opts.accept;
  }

  /** Partial messages currently held. */
  get openMessages(): number {
    return this.open.size;
  }

  /** Bytes reserved for partial messages: bounded by maxPendingBytes whatever a peer sends. */
  get heldBytes(): number {
    return this.pendingBytes;
  }

  push(frame: ArrayBuffer | ArrayBufferView): Message | null {
    try {
      return this.pushFrame(frame);
    } catch (e) {
      // Unreachable by design; the guarantee "never throws" must not depend on that.
      return this.drop(`internal error: ${e instanceof Error ? e.message : String(e)}`);
    }
  }

  private pushFrame(frame: unknown): Message | null {
    let bytes: Uint8Array;
    if (frame instanceof ArrayBuffer) bytes = new Uint8Array(frame);
    else if (ArrayBuffer.isView(frame)) bytes = new Uint8Array(frame.buffer, frame.byteOffset, frame.byteLength);
    else return this.drop(`frame is not binary (got ${typeof frame}); the channel must use serialization 'raw'`);

    const header = readHeader(bytes);
    if (typeof header === 'string') return this.drop(header);
    const { msgId, chunkIndex, chunkCount, chunkStride, totalBytes } = header;
    if (totalBytes > this.maxMessageBytes) {
      return this.drop(`message ${msgId} declares ${totalBytes} bytes, over the ${this.maxMessageBytes}-byte cap`);
    }
    if (this.done.has(msgId)) return this.drop(`chunk ${chunkIndex} of message ${msgId}, which is already complete`);

    let partial = this.open.get(msgId);
    if (partial === undefined) {
      const verdict = this.judge(header);
      if (verdict !== null) return this.drop(`message ${msgId} rejected: ${verdict}`);
      if (totalBytes > this.maxPendingBytes) {
        return this.drop(
          `message ${msgId} declares ${totalBytes} bytes, over the ${this.maxPendingBytes}-byte pending cap`,
        );
      }
      while (this.open.size >= this.maxOpenMessages || this.pendingBytes + totalBytes > this.maxPendingBytes) {
        this.evictOldest();
      }
      partial = {
        header,
        signature: signatureOf(bytes),
        payload: new Uint8Array(totalBytes),
        seen: new Uint32Array(Math.ceil(chunkCount / 32)),
        missing: chunkCount,
      };
      this.open.set(msgId, partial);
      this.pendingBytes += totalBytes;
    } else {
      const diff = firstDifference(partial.signature, signatureOf(bytes));
      if (diff !== null)
        return this.drop(`chunk ${chunkIndex} of message ${msgId} disagrees with its first chunk on ${diff}`);
    }

    const word = chunkIndex >>> 5;
    const bit = 1 << (chunkIndex & 31);
    if ((partial.seen[word] & bit) !== 0) return this.drop(`duplicate chunk ${chunkIndex} of message ${msgId}`);
    partial.seen[word] |= bit;
    partial.payload.set(bytes.subarray(HEADER_BYTES), chunkIndex * chunkStride);
    if (--partial.missing > 0) return null;

    this.open.delete(msgId);
    this.pendingBytes -= totalBytes;
    this.markDone(msgId);
    return this.complete(partial.header, partial.payload);
  }

  private judge(header: FrameHeader): string | null {
    if (this.accept === undefined) return null;
    try {
      return this.accept(header);
    } catch (e) {
      return `accept hook threw: ${e instanceof Error ? e.message : String(e)}`;
    }
  }

  private complete(h: FrameHeader, payload: Uint8Array): Message | null {
    if (h.kind === 'tensor') {
      const end = payload.byteLength - (h.signed ? SIGNATURE_BYTES : 0);
      const signature = h.signed ? { signature: payload.subarray(end) } : {};
      return {
        kind: 'tensor',
        from: h.from,
        tag: h.tag,
        dtype: h.dtype,
        shape: h.shape,
        data: payload.subarray(0, end),
        ...signature,
      };
    }
    const rpc = decodeRpc(payload);
    if (typeof rpc === 'string') {
      this.malformed++;
      return this.drop(`rpc message ${h.msgId}: ${rpc}`);
    }
    return { kind: 'rpc', from: h.from, body: rpc.body, tensors: rpc.tensors };
  }

  private evictOldest(): void {
    const first = this.open.entries().next();
    if (first.done) return;
    const [oldestId, oldest] = first.value;
    this.open.delete(oldestId);
    this.pendingBytes -= oldest.header.totalBytes;
    this.drop(
      `evicted partial message ${oldestId} ` +
        `(${oldest.missing} of ${oldest.header.chunkCount} chunks missing) to make room`,
    );
  }

  private markDone(msgId: number): void {
    this.done.add(msgId);
    this.doneOrder.push(msgId);
    const forgotten = this.doneOrder.length > 1024 ? this.doneOrder.shift() : undefined;
    if (forgotten !== undefined) this.done.delete(forgotten);
  }

  private drop(reason: string): null {
    this.dropped++;
    this.lastError = reason;
    return null;
  }
}

/** Parses and validates one frame's header against its own length; a string says what is wrong. */
export function readHeader(bytes: Uint8Array): FrameHeader | string {
  if (bytes.byteLength < HEADER_BYTES)
    return `frame of ${bytes.byteLength} bytes is shorter than the ${HEADER_BYTES}-byte header`;
  const v = new DataView(bytes.buffer, bytes.byteOffset, HEADER_BYTES);
  const magic = v.getUint16(0, true);
  if (magic !== MAGIC) return `bad magic 0x${magic.toString(16)}, expected 0x${MAGIC.toString(16)}`;
  const version = v.getUint8(2);
  if (version !== PROTOCOL_VERSION) return `protocol version ${version}, this page speaks ${PROTOCOL_VERSION}`;
  const kind = KIND_NAME[v.getUint8(3)];
  if (kind === undefined) return `unknown kind ${v.getUint8(3)}`;
  const dtype = DTYPES.at(v.getUint8(4));
  if (dtype === undefined) return `unknown dtype ${v.getUint8(4)}`;
  const from = v.getUint8(5);
  const ndim = v.getUint8(6);
  if (ndim > MAX_NDIM) return `ndim ${ndim} exceeds ${MAX_NDIM}`;
  const flags = v.getUint8(7);
  if (flags !== 0 && flags !== SIGNED) return `unknown flags ${flags}`;
  const signed = flags === SIGNED;
  const msgId = v.getUint32(8, true);
  const chunkIndex = v.getUint32(12, true);
  const chunkCount = v.getUint32(16, true);
  const chunkStride = v.getUint32(20, true);
  const totalBytes = v.getUint32(24, true);
  const tag = {
    job: v.getUint32(28, true),
    step: v.getUint32(32, true),
    pass: v.getUint16(36, true),
    block: v.getUint16(38, true),
    phase: v.getUint16(40, true),
    group: v.getUint16(42, true),
  };
  const shape: number[] = [];
  for (let i = 0; i < MAX_NDIM; i++) {
    const d = v.getUint32(44 + 4 * i, true);
    if (i < ndim) shape.push(d);
    else if (d !== 0) return `shape dim ${i} is ${d} but ndim is ${ndim}`;
  }

  if (kind === 'rpc') {
    if (dtype !== 'f32' || ndim !== 0 || signed)
      return `rpc frame must have dtype f32, ndim 0 and no signature, got ${dtype}, ${ndim}${signed ? ', signed' : ''}`;
    if (totalBytes < 8) return `rpc payload of ${totalBytes} bytes is shorter than its 8-byte prefix`;
  } else {
    const elements = shape.reduce((a, b) => a * b, 1);
    const needs = payloadBytes(elements, dtype) + (signed ? SIGNATURE_BYTES : 0);
    if (needs !== totalBytes) {
      const what = `tensor shape [${shape.join(',')}] ${dtype}${signed ? ' and a signature' : ''}`;
      return `${what} needs ${needs} bytes, header declares ${totalBytes}`;
    }
  }
  if (chunkStride === 0 || chunkStride > MAX_FRAME_BYTES - HEADER_BYTES) {
    return `chunk stride ${chunkStride} outside [1, ${MAX_FRAME_BYTES - HEADER_BYTES}]`;
  }
  const expectedCount = Math.max(1, Math.ceil(totalBytes / chunkStride));
  if (chunkCount !== expectedCount) {
    return (
      `chunkCount ${chunkCount} does not match ${totalBytes} bytes in chunks of ${chunkStride} ` +
      `(expected ${expectedCount})`
    );
  }
  if (chunkIndex >= chunkCount) return `chunkIndex ${chunkIndex} is not below chunkCount ${chunkCount}`;
  const expectedPayload = Math.min(chunkStride, totalBytes - chunkIndex * chunkStride);
  const payload = bytes.byteLength - HEADER_BYTES;
  if (payload !== expectedPayload)
    return `chunk ${chunkIndex} carries ${payload} payload bytes, expected ${expectedPayload}`;

  return { kind, dtype, from, tag, shape, signed, msgId, chunkIndex, chunkCount, chunkStride, totalBytes };
}

const SIGNATURE_FIELDS: Array<[name: string, begin: number, end: number]> = [
  ['magic/version/kind/dtype/from/ndim', 0, 8],
  ['msgId', 8, 12],
  ['chunkCount/chunkStride/totalBytes', 16, 28],
  ['tag', 28, 44],
  ['shape', 44, 60],
];

function signatureOf(frame: Uint8Array): Uint8Array {
  const sig = frame.slice(0, HEADER_BYTES);
  sig.fill(0, 12, 16); // chunkIndex is the one field that differs between chunks
  return sig;
}

function firstDifference(a: Uint8Array, b: Uint8Array): string | null {
  for (const [name, begin, end] of SIGNATURE_FIELDS) {
    for (let i = begin; i < end; i++) if (a[i] !== b[i]) return name;
  }
  return null;
}

const utf8Strict = new TextDecoder('utf-8', { fatal: true });

function decodeRpc(payload: Uint8Array): { body: unknown; tensors: Float32Array[] } | string {
  const v = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const jsonBytes = v.getUint32(0, true);
  const tensorCount = v.getUint32(4, true);
  const prefixBytes = 8 + 4 * tensorCount;
  if (prefixBytes > payload.byteLength)
    return `declares ${tensorCount} tensors, more than ${payload.byteLength} bytes can hold`;
  let elements = 0;
  const lengths: number[] = [];
  for (let i = 0; i < tensorCount; i++) {
    const n = v.getUint32(8 + 4 * i, true);
    lengths.push(n);
    elements += n;
  }
  const jsonEnd = prefixBytes + jsonBytes;
  const dataStart = jsonEnd + ((4 - (jsonEnd % 4)) % 4);
  if (dataStart + 4 * elements !== payload.byteLength) {
    return (
      `prefix declares ${jsonBytes} JSON bytes and ${elements} floats, ` +
      `which do not add up to the ${payload.byteLength}-byte payload`
    );
  }
  let body: unknown;
  try {
    body = JSON.parse(utf8Strict.decode(payload.subarray(prefixBytes, jsonEnd)));
  } catch (e) {
    return `body is not valid UTF-8 JSON (${e instanceof Error ? e.message : String(e)})`;
  }
  // Views into the message's one buffer: dataStart is 4-aligned and the buffer starts at 0.
  const tensors: Float32Array[] = [];
  let at = payload.byteOffset + dataStart;
  for (const n of lengths) {
    tensors.push(new Float32Array(payload.buffer, at, n));
    at += 4 * n;
  }
  return { body, tensors };
}

// ---------------------------------------------------------------- f16

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** IEEE binary16 bits of each value, rounded to nearest even; overflow → ±inf, NaN stays NaN. */
export function toF16(src: Float32Array): Uint16Array {
  const out = new Uint16Array(src.length);
  // Stryker disable next-line EqualityOperator: a pass at i = src.length writes past the typed array's end: ignored
  for (let i = 0; i < src.length; i++) {
    f32Scratch[0] = src[i];
    out[i] = f16Bits(u32Scratch[0]);
  }
  return out;
}

function f16Bits(b: number): number {
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  const mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 | (mant >>> 13) : 0);
  const e = exp - 112; // rebias 127 → 15
  if (e >= 0x1f) return sign | 0x7c00;
  // At e = 1 the subnormal branch below computes the same bits (shift 13, rounded alike).
  // Stryker disable next-line EqualityOperator: at e = 1 both branches give the same bits
  if (e >= 1) {
    const h = sign | (e << 10) | (mant >>> 13);
    const rest = mant & 0x1fff;
    // A carry out of the mantissa bumps the exponent, and past the top lands on inf: both correct.
    return rest > 0x1000 || (rest === 0x1000 && (h & 1) !== 0) ? h + 1 : h;
  }
  // Subnormal half: value = m · 2^-24 with m = (1.mant · 2^23) >> (14 − e).
  const shift = 14 - e;
  if (shift > 24) return sign;
  const full = mant | 0x800000;
  const m = full >>> shift;
  const rest = full & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  return sign | (rest > half || (rest === half && (m & 1) !== 0) ? m + 1 : m);
}

let f16Table: Float32Array | undefined;

/** Float32 values of IEEE binary16 bits (exact). */
export function fromF16(src: Uint16Array): Float32Array {
  const table = (f16Table ??= buildF16Table());
  const out = new Float32Array(src.length);
  // Stryker disable next-line EqualityOperator: a pass at i = src.length writes past the typed array's end: ignored
  for (let i = 0; i < src.length; i++) out[i] = table[src[i]];
  return out;
}

function buildF16Table(): Float32Array {
  const t = new Float32Array(65536);
  // Stryker disable next-line EqualityOperator: a pass at h = 65536 writes past the table's end: ignored
  for (let h = 0; h < 65536; h++) {
    const sign = h & 0x8000 ? -1 : 1;
    const e = (h >>> 10) & 0x1f;
    const m = h & 0x3ff;
    if (e === 0) t[h] = sign * m * 2 ** -24;
    else if (e === 0x1f) t[h] = m !== 0 ? NaN : sign * Infinity;
    else t[h] = sign * 2 ** (e - 15) * (1 + m / 1024);
  }
  return t;
}

// ---------------------------------------------------------------- i8

/**
 * Integers of at most `levels` either side of 0 with a float32 scale per `group` values (s = max|x| / levels) into
 * `scales` and `q`: the wire's groups of I8_GROUP, or a weight matrix's rows (int8 weights). |x| ≤ max rounds to at
 * most `levels`; a NaN or infinite value makes its scale NaN or infinite, which the receiver refuses.
 */
export function quantize(
  src: Float32Array,
  scales: Float32Array,
  q: Int8Array,
  levels: number,
  group = I8_GROUP,
): void {
  for (let g = 0; g < scales.length; g++) {
    const end = Math.min(src.length, (g + 1) * group);
    let max = 0;
    for (let i = g * group; i < end; i++) max = Math.max(max, Math.abs(src[i]));
    const scale = max / levels;
    scales[g] = scale;
    for (let i = g * group; i < end; i++) q[i] = scale > 0 ? Math.round(src[i] / scale) : 0;
  }
}

/** int8 with a float32 scale per I8_GROUP values: the scales first, then the values. */
function toI8(src: Float32Array): Uint8Array {
  const out = new Uint8Array(payloadBytes(src.length, 'i8'));
  const groups = Math.ceil(src.length / I8_GROUP);
  quantize(
    src,
    new Float32Array(out.buffer, 0, groups),
    new Int8Array(out.buffer, 4 * groups, src.length),
    QUANTIZED_LEVELS.i8,
  );
  return out;
}

function fromI8(data: Uint8Array): Float32Array {
  const n = elementsOfI8(data.byteLength);
  const groups = Math.ceil(n / I8_GROUP);
  const aligned = data.byteOffset % 4 === 0 ? data : data.slice();
  const scales = new Float32Array(aligned.buffer, aligned.byteOffset, groups);
  const q = new Int8Array(aligned.buffer, aligned.byteOffset + 4 * groups, n);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = q[i] * scales[(i / I8_GROUP) | 0];
  return out;
}

/**
 * Whether every scale of an int8 or int4 payload is one its sender's quantize could have written:
 * finite, not negative, reached by a value of its group (|q| = levels) and passed by none (an int4
 * nibble of 0, q = −8, never is). Then each scale is the largest |value| of its group over the
 * levels, and bounding the values bounds the scales.
 */
export function quantizedScalesHonest(data: Uint8Array, dtype: 'i8' | 'i4'): boolean {
  const levels = QUANTIZED_LEVELS[dtype];
  const values = tensorValues(data, dtype);
  const groups = Math.ceil(values.length / I8_GROUP);
  const aligned = data.byteOffset % 4 === 0 ? data : data.slice();
  const scales = new Float32Array(aligned.buffer, aligned.byteOffset, groups);
  for (let g = 0; g < groups; g++) {
    const scale = scales[g];
    if (!(scale >= 0 && scale < Infinity)) return false;
    let largest = 0;
    for (let i = g * I8_GROUP; i < Math.min(values.length, (g + 1) * I8_GROUP); i++)
      largest = Math.max(largest, Math.abs(values[i]));
    // q·scale, as the receiver computes it: |q| = levels for the largest, never more
    if (largest !== (scale > 0 ? Math.fround(levels * scale) : 0)) return false;
  }
  return true;
}

/** The values in an int8 payload of `bytes` (the inverse of payloadBytes). */
function elementsOfI8(bytes: number): number {
  const groups = Math.ceil(bytes / (I8_GROUP + 4));
  return bytes - 4 * groups;
}

// ---------------------------------------------------------------- i4

/**
 * int4 with a float32 scale per I8_GROUP values (s = max|x| / 7): the scales first, then two values
 * a byte, low nibble first, each stored as q + 8 (1…15), so a 0 nibble is the padding of an odd count.
 */
function toI4(src: Float32Array): Uint8Array {
  const out = new Uint8Array(payloadBytes(src.length, 'i4'));
  const groups = Math.ceil(src.length / I8_GROUP);
  const q = new Int8Array(src.length);
  quantize(src, new Float32Array(out.buffer, 0, groups), q, QUANTIZED_LEVELS.i4);
  const nibbles = out.subarray(4 * groups);
  for (let i = 0; i < q.length; i++) nibbles[i >> 1] |= (q[i] + 8) << (4 * (i & 1));
  return out;
}

function fromI4(data: Uint8Array): Float32Array {
  const groups = Math.ceil(data.byteLength / (I8_GROUP / 2 + 4));
  const aligned = data.byteOffset % 4 === 0 ? data : data.slice();
  const scales = new Float32Array(aligned.buffer, aligned.byteOffset, groups);
  const nibbles = aligned.subarray(4 * groups);
  const n = 2 * nibbles.length - (nibbles.length && nibbles[nibbles.length - 1] >> 4 === 0 ? 1 : 0);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (((nibbles[i >> 1] >> (4 * (i & 1))) & 0xf) - 8) * scales[(i / I8_GROUP) | 0];
  return out;
}

/**
 * A tensor's values as they travel: float32 as is, rounded to float16 (half the bytes), or int8
 * (about a quarter) or int4 (an eighth) with scales.
 */
export function tensorPayload(values: Float32Array, dtype: DType): Uint8Array {
  if (dtype === 'i8') return toI8(values);
  if (dtype === 'i4') return toI4(values);
  const wire = dtype === 'f16' ? toF16(values) : values;
  return new Uint8Array(wire.buffer, wire.byteOffset, wire.byteLength);
}

/** The float32 values of a received payload of the given dtype. */
export function tensorValues(data: Uint8Array, dtype: DType): Float32Array {
  if (dtype === 'i8') return fromI8(data);
  if (dtype === 'i4') return fromI4(data);
  if (dtype === 'f16') {
    const aligned = data.byteOffset % 2 === 0 ? data : data.slice();
    return fromF16(new Uint16Array(aligned.buffer, aligned.byteOffset, aligned.byteLength / 2));
  }
  const aligned = data.byteOffset % 4 === 0 ? data : data.slice();
  return new Float32Array(aligned.buffer, aligned.byteOffset, aligned.byteLength / 4);
}
