// Reader and writer of the safetensors format (8-byte little-endian header length, JSON header,
// raw little-endian data), the format of diffusers' checkpoints. Every dtype is widened to float32
// when read; a writer stores float32 values as F32, or narrowed to BF16 or F16 (rounded to nearest even).
// A small file is read whole; a large one by its header, then tensor by tensor (readTensor) or a run of neighbouring
// tensors at a time (readTensorRun).

import { defined } from './defined.ts';
import type { Tensor } from './tensor.ts';
import { sizeOf } from './tensor.ts';

export type SafetensorsDType = 'F32' | 'F16' | 'BF16';
export type TensorMap = Map<string, Tensor>;

const BYTES: Record<SafetensorsDType, number> = { F32: 4, F16: 2, BF16: 2 };
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

export class SafetensorsError extends Error {
  override name = 'SafetensorsError';
}

/** Byte ranges of files by path: all a reader of large checkpoints needs (core/model/files.ts). */
export interface ByteRanges {
  /** bytes [begin, end) of a file, fewer where the file ends first, in memory of their own (or the whole file's) */
  readRange(path: string, begin: number, end: number): Promise<Uint8Array>;
}

/** Where one tensor's bytes are: its file, and its absolute byte range there. */
export interface TensorEntry {
  name: string;
  file: string;
  dtype: SafetensorsDType;
  shape: number[];
  begin: number;
  end: number;
}

const isDType = (dtype: unknown): dtype is SafetensorsDType => typeof dtype === 'string' && Object.hasOwn(BYTES, dtype);
const isShape = (shape: unknown): shape is number[] =>
  Array.isArray(shape) && shape.every((d) => Number.isInteger(d) && (d as number) >= 0);
const isWhole = (n: unknown): n is number => Number.isInteger(n);

const headerLength = (bytes: Uint8Array): number =>
  Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true));

/**
 * The tensors a header (the JSON after the 8-byte length) lists, each checked: a known dtype, a
 * shape, and data_offsets that span exactly its bytes within `dataBytes` (when the file's size is known).
 */
function parseHeader(json: Uint8Array, file: string, dataBytes: number | null): TensorEntry[] {
  const fail = (what: string) => new SafetensorsError(`${file}: ${what}`);
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder().decode(json));
  } catch (e) {
    throw fail(`header is not valid JSON (${(e as Error).message})`);
  }
  if (typeof header !== 'object' || header === null || Array.isArray(header)) throw fail('header is not a JSON object');
  const dataStart = 8 + json.byteLength;
  const entries: TensorEntry[] = [];
  for (const [name, value] of Object.entries(header as Record<string, unknown>)) {
    if (name === '__metadata__') continue;
    const where = `tensor "${name}"`;
    const entry: Partial<Record<'dtype' | 'shape' | 'data_offsets', unknown>> =
      typeof value === 'object' && value !== null ? value : {};
    const { dtype, shape } = entry;
    if (!isDType(dtype)) throw fail(`${where} has dtype ${JSON.stringify(dtype)}; supported: F32, F16, BF16`);
    if (!isShape(shape)) throw fail(`${where} has a bad shape ${JSON.stringify(shape)}`);
    const offsets = entry.data_offsets;
    const [begin, end] = (Array.isArray(offsets) ? offsets : []) as unknown[];
    if (!isWhole(begin) || !isWhole(end) || begin < 0 || end < begin || (dataBytes !== null && end > dataBytes)) {
      throw fail(
        `${where} has data_offsets ${JSON.stringify(offsets)} outside the ${dataBytes ?? "file's"} data bytes`,
      );
    }
    const expected = sizeOf(shape) * BYTES[dtype];
    if (end - begin !== expected) {
      throw fail(`${where} of shape [${shape.join(',')}] ${dtype} needs ${expected} bytes but spans ${end - begin}`);
    }
    entries.push({ name, file, dtype, shape, begin: dataStart + begin, end: dataStart + end });
  }
  return entries;
}

/** A whole safetensors file in memory, every tensor widened to float32. */
export function readSafetensors(bytes: Uint8Array, file: string): TensorMap {
  const fail = (what: string) => new SafetensorsError(`${file}: ${what}`);
  if (bytes.byteLength < 8)
    throw fail(`only ${bytes.byteLength} bytes, not a safetensors file (needs an 8-byte header length)`);
  const headerBytes = headerLength(bytes);
  if (headerBytes > MAX_HEADER_BYTES || 8 + headerBytes > bytes.byteLength) {
    throw fail(`header claims ${headerBytes} bytes but the file has ${bytes.byteLength - 8} after the length field`);
  }
  const entries = parseHeader(bytes.subarray(8, 8 + headerBytes), file, bytes.byteLength - 8 - headerBytes);
  return new Map(
    entries.map((e) => [e.name, { shape: e.shape, data: widen(bytes.subarray(e.begin, e.end), e.dtype) }]),
  );
}

/**
 * The tensors of a safetensors file, from its header: two small reads, however large the file, and a third of the
 * last byte its tensors need, so that a truncated file fails where it is opened (on the coordinator, before any
 * worker is asked to load it), not after a worker has read gigabytes of it.
 */
export async function readSafetensorsHeader(files: ByteRanges, file: string): Promise<TensorEntry[]> {
  const length = await files.readRange(file, 0, 8);
  if (length.byteLength < 8)
    throw new SafetensorsError(
      `${file}: only ${length.byteLength} bytes, not a safetensors file (needs an 8-byte header length)`,
    );
  const headerBytes = headerLength(length);
  if (headerBytes > MAX_HEADER_BYTES)
    throw new SafetensorsError(
      `${file}: header claims ${headerBytes} bytes, more than any checkpoint's (${MAX_HEADER_BYTES})`,
    );
  const json = await files.readRange(file, 8, 8 + headerBytes);
  if (json.byteLength < headerBytes)
    throw new SafetensorsError(
      `${file}: header claims ${headerBytes} bytes but the file ends after ${8 + json.byteLength}: ` +
        'truncated? fetch it again',
    );
  const entries = parseHeader(json, file, null);
  const end = entries.reduce((last, e) => Math.max(last, e.end), 0);
  if (end > 8 + headerBytes && (await files.readRange(file, end - 1, end)).byteLength < 1)
    throw new SafetensorsError(
      `${file}: its tensors need ${end} bytes but the file ends before: truncated? fetch it again`,
    );
  return entries;
}

/** a tensor of a file that ended before it did, `held` of its bytes read */
const truncated = (entry: TensorEntry, held: number) =>
  new SafetensorsError(
    `${entry.file}: tensor "${entry.name}" needs bytes [${entry.begin}, ${entry.end}) ` +
      `but the file holds ${held} of them: truncated? fetch it again`,
  );

/** One tensor read by its byte range and widened to float32; a file that ends early is named. */
export async function readTensor(files: ByteRanges, entry: TensorEntry): Promise<Tensor> {
  const raw = await files.readRange(entry.file, entry.begin, entry.end);
  if (raw.byteLength !== entry.end - entry.begin) throw truncated(entry, raw.byteLength);
  return { shape: entry.shape, data: widen(raw, entry.dtype, true) };
}

/**
 * Rows [from, to) of a tensor read as `rows` rows, widened to float32: a large tensor read a piece at a time, so that a
 * loader holding it narrower (float16, int8) never has all of it in float32 at once.
 */
export async function readTensorRows(
  files: ByteRanges,
  entry: TensorEntry,
  rows: number,
  from: number,
  to: number,
): Promise<Float32Array> {
  const rowBytes = (entry.end - entry.begin) / rows;
  const [begin, end] = [entry.begin + from * rowBytes, entry.begin + to * rowBytes];
  const raw = await files.readRange(entry.file, begin, end);
  if (raw.byteLength !== end - begin) throw truncated(entry, begin - entry.begin + raw.byteLength);
  return widen(raw, entry.dtype, true);
}

/**
 * The most bytes one read of neighbouring tensors asks for (tensorRuns): a model of many small tensors (norms and
 * biases between its matrices) costs a request per run, not per tensor; a tensor larger than this is a run alone.
 */
export const RUN_BYTES = 4 << 20;

/**
 * `entries` in runs of neighbours, each read with one request (readTensorRun): tensors that lie end to end in one
 * file, in its order, up to `maxBytes` a run.
 */
export function tensorRuns(entries: readonly TensorEntry[], maxBytes = RUN_BYTES): TensorEntry[][] {
  const sorted = [...entries].sort((a, b) => (a.file === b.file ? a.begin - b.begin : a.file < b.file ? -1 : 1));
  const runs: TensorEntry[][] = [];
  for (const entry of sorted) {
    const run = runs.at(-1);
    const last = run?.at(-1);
    if (run && last && last.file === entry.file && last.end === entry.begin && entry.end - run[0].begin <= maxBytes)
      run.push(entry);
    else runs.push([entry]);
  }
  return runs;
}

/** A run's tensors (tensorRuns) read by one byte range, each widened to float32 as readTensor does. */
export async function readTensorRun(files: ByteRanges, run: readonly TensorEntry[]): Promise<Tensor[]> {
  if (run.length === 1) return [await readTensor(files, run[0])];
  const [first, last] = [run[0], defined(run.at(-1), 'a run')];
  const raw = await files.readRange(first.file, first.begin, last.end);
  return run.map((entry) => {
    if (raw.byteLength < entry.end - first.begin)
      throw truncated(entry, Math.max(0, first.begin + raw.byteLength - entry.begin));
    // copied out: a tensor of its own buffer, which nothing else of the run keeps alive
    return {
      shape: entry.shape,
      data: widen(raw.subarray(entry.begin - first.begin, entry.end - first.begin), entry.dtype),
    };
  });
}

/** a few reads in flight: one request at a time leaves a page's link idle between them */
const READS_IN_FLIGHT = 4;

/**
 * The tensors of `entries` by name, in their order, read a run of neighbours at a time (tensorRuns) with a few reads in
 * flight; `onProgress` hears the bytes read of all of them. A read that fails fails them all, and stops the rest.
 */
export async function readTensors(
  files: ByteRanges,
  entries: readonly TensorEntry[],
  onProgress?: (loaded: number, total: number) => void,
): Promise<TensorMap> {
  const total = entries.reduce((sum, e) => sum + e.end - e.begin, 0);
  const read = new Map<string, Tensor>();
  let loaded = 0;
  const queue = tensorRuns(entries);
  const reader = async () => {
    try {
      for (let run = queue.shift(); run; run = queue.shift()) {
        const tensors = await readTensorRun(files, run);
        run.forEach((entry, i) => read.set(entry.name, tensors[i]));
        onProgress?.((loaded += run.reduce((sum, e) => sum + e.end - e.begin, 0)), total);
      }
    } catch (e) {
      queue.length = 0;
      throw e;
    }
  };
  await Promise.all(Array.from({ length: READS_IN_FLIGHT }, reader));
  // in the entries' order, not the order the reads finished in
  return new Map(entries.map(({ name }) => [name, defined(read.get(name), name)]));
}

/**
 * Float32 values of raw little-endian data (every browser and Node host is little-endian). F32 bytes
 * of a buffer the caller owns are viewed in place where aligned; else (a slice of Node's shared
 * Buffer pool, say) copied.
 */
function widen(raw: Uint8Array, dtype: SafetensorsDType, owned = false): Float32Array {
  if (dtype === 'F32')
    return owned && raw.byteOffset % 4 === 0
      ? new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4)
      : new Float32Array(new Uint8Array(raw).buffer);
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const n = raw.byteLength / BYTES[dtype];
  const out = new Float32Array(n);
  if (dtype === 'BF16') {
    const word = new DataView(new ArrayBuffer(4));
    for (let i = 0; i < n; i++) {
      word.setUint32(0, view.getUint16(i * 2, true) << 16);
      out[i] = word.getFloat32(0);
    }
  } else {
    for (let i = 0; i < n; i++) out[i] = halfToFloat(view.getUint16(i * 2, true));
  }
  return out;
}

function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * fraction * 2 ** -24;
  if (exponent === 0x1f) return fraction ? NaN : sign * Infinity;
  return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
}

/** A tensor to be written: its name and shape (its values come separately, as float32). */
export interface TensorSpec {
  name: string;
  shape: number[];
}

/** The bytes a tensor of `shape` takes stored as `dtype`. */
export const storedBytes = (shape: number[], dtype: SafetensorsDType = 'F32'): number => BYTES[dtype] * sizeOf(shape);

/**
 * A safetensors header as the Python writer makes it: `__metadata__` first, tensors sorted by name
 * with their data in that order, the JSON padded with spaces so the data starts 8-byte aligned.
 * Returns the bytes before the data (length field and JSON) and the tensors in data order.
 */
export function safetensorsHeader(
  tensors: TensorSpec[],
  metadata?: Record<string, string>,
  dtype: SafetensorsDType = 'F32',
): { head: Uint8Array; order: TensorSpec[] } {
  const order = [...tensors].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const header: Record<string, unknown> = metadata ? { __metadata__: metadata } : {};
  let offset = 0;
  for (const t of order) {
    const bytes = storedBytes(t.shape, dtype);
    header[t.name] = { dtype, shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8); // keep the data 8-byte aligned
  const jsonBytes = new TextEncoder().encode(json);
  const head = new Uint8Array(8 + jsonBytes.length);
  new DataView(head.buffer).setBigUint64(0, BigInt(jsonBytes.length), true);
  head.set(jsonBytes, 8);
  return { head, order };
}

/**
 * Tensors in state-dict order split into shards as huggingface_hub splits them: greedily, a new
 * shard whenever the next tensor would take this one past `maxShardBytes` (diffusers' 5 GB is 5e9).
 */
export function planShards(
  tensors: TensorSpec[],
  maxShardBytes: number,
  dtype: SafetensorsDType = 'F32',
): TensorSpec[][] {
  const shards: TensorSpec[][] = [[]];
  let size = 0;
  for (const t of tensors) {
    const bytes = storedBytes(t.shape, dtype);
    if (size + bytes > maxShardBytes && shards[shards.length - 1].length) {
      shards.push([]);
      size = 0;
    }
    shards[shards.length - 1].push(t);
    size += bytes;
  }
  return shards;
}

/** Writes tensors (sorted by name, as the Python writer does) as `dtype`, with optional string metadata. */
export function writeSafetensors(
  tensors: TensorMap,
  metadata?: Record<string, string>,
  dtype: SafetensorsDType = 'F32',
): Uint8Array {
  for (const [name, t] of tensors) {
    if (t.data.length !== sizeOf(t.shape))
      throw new SafetensorsError(
        `tensor "${name}": shape [${t.shape.join(',')}] does not match ${t.data.length} values`,
      );
  }
  const { head, order } = safetensorsHeader(
    [...tensors].map(([name, t]) => ({ name, shape: t.shape })),
    metadata,
    dtype,
  );
  const out = new Uint8Array(head.length + order.reduce((n, t) => n + storedBytes(t.shape, dtype), 0));
  out.set(head);
  let at = head.length;
  for (const { name } of order) {
    const stored = narrow(defined(tensors.get(name), `tensor "${name}"`).data, dtype);
    out.set(stored, at);
    at += stored.byteLength;
  }
  return out;
}

/** Float32 values as the little-endian bytes of `dtype`: F32 as they are, BF16 and F16 rounded to nearest even. */
export function narrow(data: Float32Array, dtype: SafetensorsDType): Uint8Array {
  if (dtype === 'F32') return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  const bits = new Uint32Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength));
  const out = new Uint16Array(data.length);
  for (let i = 0; i < bits.length; i++) out[i] = dtype === 'BF16' ? toBfloat16(bits[i]) : toHalf(bits[i]);
  return new Uint8Array(out.buffer);
}

/** The bfloat16 nearest a float32 (its top half, rounded to nearest even); NaN stays NaN. */
function toBfloat16(f: number): number {
  if ((f & 0x7fffffff) > 0x7f800000) return (f >>> 16) | 0x40;
  return (f + 0x7fff + ((f >>> 16) & 1)) >>> 16;
}

/** The float16 nearest a float32, rounded to nearest even: subnormals, overflow to infinity, NaN kept. */
function toHalf(f: number): number {
  const sign = (f >>> 16) & 0x8000;
  const exponent = (f >>> 23) & 0xff;
  const mantissa = f & 0x7fffff;
  if (exponent === 0xff) return sign | 0x7c00 | (mantissa ? 0x200 : 0);
  const e = exponent - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    // a subnormal half: the implicit bit joins the mantissa, shifted out with rounding
    const m = mantissa | 0x800000;
    const shift = 14 - e;
    const half = m >>> shift;
    const rest = m & ((1 << shift) - 1);
    const midway = 1 << (shift - 1);
    return sign | (half + (rest > midway || (rest === midway && half & 1) ? 1 : 0));
  }
  const half = (e << 10) | (mantissa >>> 13);
  const rest = mantissa & 0x1fff;
  // a carry out of the mantissa moves into the exponent, as rounding up should
  return sign | (half + (rest > 0x1000 || (rest === 0x1000 && half & 1) ? 1 : 0));
}
