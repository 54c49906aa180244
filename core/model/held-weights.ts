// A model's weights read straight into the type a rank holds them in (float16, int8 or float32), a piece of rows at a
// time: a piece is widened to float32 as the checkpoint's dtype is read, narrowed into the held array and dropped, so a
// load holds what it keeps plus a few pieces, never a stage's weights in float32 beside their narrow copies.
import { defined } from '../defined.ts';
import { fromF16, toF16 } from '../net/protocol.ts';
import {
  readTensorRows,
  readTensorRun,
  RUN_BYTES,
  tensorRuns,
  type ByteRanges,
  type TensorEntry,
} from '../safetensors.ts';
import { sizeOf } from '../tensor.ts';
import type { WeightType } from '../worker-api.ts';
import { storedInt8 } from './stage-graphs.ts';

/** A weight as a rank holds it: float32 or float16 values, or int8 bytes (offset by 128) and a scale per row. */
export type HeldWeight =
  | { type: 'float32'; data: Float32Array }
  | { type: 'float16'; data: Uint16Array }
  | { type: 'int8'; bytes: Uint8Array; scales: Float32Array };

/** How a weight is held: its type, and its dims as its graph takes it (int8's scales are per `dims[0]` row). */
export interface HeldAs {
  type: WeightType;
  dims: number[];
}

export const heldWeightBytes = (w: HeldWeight): number =>
  w.type === 'int8' ? w.bytes.byteLength + w.scales.byteLength : w.data.byteLength;

/** `data` [rows, …] narrowed to `type` (storedInt8's rows for int8). */
export function narrowWeight(data: Float32Array, rows: number, type: WeightType): HeldWeight {
  if (type === 'float32') return { type, data };
  if (type === 'float16') return { type, data: toF16(data) };
  return { type, ...storedInt8(data, rows) };
}

/** Rows [from, to) of a held weight of `rows` rows as float32, the values its graph computes with. */
export function widenRows(w: HeldWeight, rows: number, from: number, to: number): Float32Array {
  const size = w.type === 'int8' ? w.bytes.length : w.data.length;
  const cols = size / rows;
  if (w.type === 'float32') return w.data.slice(from * cols, to * cols);
  if (w.type === 'float16') return fromF16(w.data.subarray(from * cols, to * cols));
  const out = new Float32Array((to - from) * cols);
  // the byte's top bit flipped back is the int8 value, sign-extended
  for (let i = 0; i < out.length; i++)
    out[i] = (((w.bytes[from * cols + i] ^ 0x80) << 24) >> 24) * w.scales[from + Math.floor(i / cols)];
  return out;
}

/** A held weight's float32 values. */
export function widenWeight(w: HeldWeight): Float32Array {
  const rows = w.type === 'int8' ? w.scales.length : 1;
  return widenRows(w, rows, 0, rows);
}

/** The Euclidean norm of each of a held weight's `rows` rows, widened a row at a time. */
export function heldRowNorms(w: HeldWeight, rows: number): Float32Array {
  return Float32Array.from({ length: rows }, (_, r) => rowNorm(widenRows(w, rows, r, r + 1)));
}

/** ‖row‖, summed in float64 */
export function rowNorm(row: Float32Array): number {
  let sq = 0;
  for (const x of row) sq += x ** 2;
  return Math.sqrt(sq);
}

/** An empty weight of `as` that rows are narrowed into, piece by piece. */
function heldRows({ type, dims }: HeldAs): { weight: HeldWeight; take(from: number, values: Float32Array): void } {
  const [rows, size] = [dims[0] ?? 1, sizeOf(dims)];
  const cols = size / rows;
  if (type === 'int8') {
    const weight = { type, bytes: new Uint8Array(size), scales: new Float32Array(rows) };
    return {
      weight,
      take(from, values) {
        const piece = storedInt8(values, values.length / cols);
        weight.bytes.set(piece.bytes, from * cols);
        weight.scales.set(piece.scales, from);
      },
    };
  }
  const weight: HeldWeight =
    type === 'float16' ? { type, data: new Uint16Array(size) } : { type, data: new Float32Array(size) };
  return {
    weight,
    take: (from, values) => weight.data.set(weight.type === 'float16' ? toF16(values) : values, from * cols),
  };
}

/** reads in flight: one at a time leaves a page's link idle between them */
const READS_IN_FLIGHT = 4;

/** One read of a load: a run of small neighbouring tensors whole, or rows [from, to) of one large tensor. */
type Piece = { run: TensorEntry[] } | { entry: TensorEntry; from: number; to: number };

/**
 * The weights `entries` name, each held as `heldAs` says, read a piece of at most `pieceBytes` of float32 at a time
 * (with a few pieces in flight); `onProgress` hears the checkpoint bytes read. A tensor of a size its `heldAs` dims do
 * not have is an error naming both.
 */
export async function readHeldWeights(
  files: ByteRanges,
  entries: readonly TensorEntry[],
  heldAs: (name: string) => HeldAs,
  onProgress?: (loaded: number, total: number) => void,
  pieceBytes = RUN_BYTES,
): Promise<Map<string, HeldWeight>> {
  const held = new Map(
    entries.map((e) => {
      const as = heldAs(e.name);
      if (sizeOf(as.dims) !== sizeOf(e.shape))
        throw new Error(`${e.name} is [${e.shape.join(', ')}] in ${e.file}, and is held as [${as.dims.join(', ')}]`);
      return [e.name, { rows: as.dims[0] ?? 1, ...heldRows(as) }];
    }),
  );
  const pieces: Piece[] = tensorRuns(entries, pieceBytes).flatMap((run): Piece[] => {
    const [entry] = run;
    const { rows } = defined(held.get(entry.name), entry.name);
    const rowFloats = sizeOf(entry.shape) / rows;
    if (run.length > 1 || 4 * sizeOf(entry.shape) <= pieceBytes) return [{ run }];
    const step = Math.max(1, Math.floor(pieceBytes / (4 * rowFloats)));
    return Array.from({ length: Math.ceil(rows / step) }, (_, i) => ({
      entry,
      from: i * step,
      to: Math.min(rows, (i + 1) * step),
    }));
  });
  const total = entries.reduce((sum, e) => sum + e.end - e.begin, 0);
  let loaded = 0;
  const read = async (piece: Piece) => {
    if ('run' in piece) {
      const tensors = await readTensorRun(files, piece.run);
      piece.run.forEach((e, i) => defined(held.get(e.name), e.name).take(0, tensors[i].data));
      return piece.run.reduce((sum, e) => sum + e.end - e.begin, 0);
    }
    const { entry, from, to } = piece;
    const into = defined(held.get(entry.name), entry.name);
    into.take(from, await readTensorRows(files, entry, into.rows, from, to));
    return ((entry.end - entry.begin) / into.rows) * (to - from);
  };
  const reader = async () => {
    try {
      for (let piece = pieces.shift(); piece; piece = pieces.shift())
        onProgress?.((loaded += await read(piece)), total);
    } catch (e) {
      pieces.length = 0;
      throw e;
    }
  };
  await Promise.all(Array.from({ length: READS_IN_FLIGHT }, reader));
  return new Map([...held].map(([name, { weight }]) => [name, weight]));
}
