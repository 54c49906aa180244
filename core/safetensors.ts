// Reader and writer of the safetensors format (8-byte little-endian header length, JSON header,
// raw little-endian data), the format of diffusers' checkpoints. Every dtype is widened to float32.

import type { Tensor } from './tensor.ts';
import { sizeOf } from './tensor.ts';

export type SafetensorsDType = 'F32' | 'F16' | 'BF16';
export type TensorMap = Map<string, Tensor>;

const BYTES: Record<SafetensorsDType, number> = { F32: 4, F16: 2, BF16: 2 };
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

export class SafetensorsError extends Error {
  override name = 'SafetensorsError';
}

export function readSafetensors(bytes: Uint8Array, file: string): TensorMap {
  const fail = (what: string) => new SafetensorsError(`${file}: ${what}`);
  if (bytes.byteLength < 8) throw fail(`only ${bytes.byteLength} bytes, not a safetensors file (needs an 8-byte header length)`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerBytes = Number(view.getBigUint64(0, true));
  if (headerBytes > MAX_HEADER_BYTES || 8 + headerBytes > bytes.byteLength) {
    throw fail(`header claims ${headerBytes} bytes but the file has ${bytes.byteLength - 8} after the length field`);
  }
  let header: Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
  try {
    header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerBytes)));
  } catch (e) {
    throw fail(`header is not valid JSON (${(e as Error).message})`);
  }
  if (typeof header !== 'object' || header === null || Array.isArray(header)) throw fail('header is not a JSON object');
  const dataStart = 8 + headerBytes;
  const dataBytes = bytes.byteLength - dataStart;
  const tensors: TensorMap = new Map();
  for (const [name, entry] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const where = `tensor "${name}"`;
    const dtype = entry?.dtype as SafetensorsDType;
    if (!(dtype in BYTES)) throw fail(`${where} has dtype ${JSON.stringify(entry?.dtype)}; supported: F32, F16, BF16`);
    const shape = entry.shape;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) throw fail(`${where} has a bad shape ${JSON.stringify(shape)}`);
    const [begin, end] = entry.data_offsets ?? [];
    if (!Number.isInteger(begin) || !Number.isInteger(end) || begin < 0 || end < begin || end > dataBytes) {
      throw fail(`${where} has data_offsets ${JSON.stringify(entry.data_offsets)} outside the ${dataBytes} data bytes`);
    }
    const expected = sizeOf(shape) * BYTES[dtype];
    if (end - begin !== expected) {
      throw fail(`${where} of shape [${shape}] ${dtype} needs ${expected} bytes but spans ${end - begin}`);
    }
    tensors.set(name, { shape, data: widen(bytes.subarray(dataStart + begin, dataStart + end), dtype) });
  }
  return tensors;
}

function widen(raw: Uint8Array, dtype: SafetensorsDType): Float32Array {
  // a fresh copy (Node's Buffer.slice would share its pool); every browser and Node host is little-endian
  if (dtype === 'F32') return new Float32Array(new Uint8Array(raw).buffer);
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

/** Writes float32 tensors (sorted by name, as the Python writer does) with optional string metadata. */
export function writeSafetensors(tensors: TensorMap, metadata?: Record<string, string>): Uint8Array {
  const names = [...tensors.keys()].sort();
  const header: Record<string, unknown> = metadata ? { __metadata__: metadata } : {};
  let offset = 0;
  for (const name of names) {
    const t = tensors.get(name)!;
    if (t.data.length !== sizeOf(t.shape)) throw new SafetensorsError(`tensor "${name}": shape [${t.shape}] does not match ${t.data.length} values`);
    header[name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - ((8 + json.length) % 8)) % 8); // keep the data 8-byte aligned
  const headerBytes = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + headerBytes.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(headerBytes.length), true);
  out.set(headerBytes, 8);
  let at = 8 + headerBytes.length;
  for (const name of names) {
    const data = tensors.get(name)!.data;
    out.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), at);
    at += data.byteLength;
  }
  return out;
}
