/** The one tensor type: a row-major float32 buffer and its shape. */
export interface Tensor {
  shape: number[];
  data: Float32Array;
}

export function sizeOf(shape: readonly number[]): number {
  return shape.reduce((n, d) => n * d, 1);
}

export function tensor(shape: number[], data?: Float32Array): Tensor {
  const size = sizeOf(shape);
  if (data && data.length !== size) {
    throw new Error(`tensor of shape [${shape.join(',')}] needs ${size} values, got ${data.length}`);
  }
  return { shape, data: data ?? new Float32Array(size) };
}

/** Largest |a−b| over two equally long buffers: the parity measure used everywhere. */
export function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) throw new Error(`cannot compare ${a.length} values with ${b.length}`);
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (!(d <= m)) m = d; // NaN propagates as the maximum
  }
  return m;
}

/** Rows [start, start+count) of a row-major [rows, cols] buffer; rows past the end read as zeros. */
export function sliceRows(data: Float32Array, cols: number, start: number, count: number): Float32Array {
  const out = new Float32Array(count * cols);
  const rows = data.length / cols;
  const available = Math.max(0, Math.min(count, rows - start));
  out.set(data.subarray(start * cols, (start + available) * cols));
  return out;
}

/** Columns [start, start+count) of a row-major [rows, cols] buffer. */
export function sliceCols(data: Float32Array, cols: number, start: number, count: number): Float32Array {
  const rows = data.length / cols;
  const out = new Float32Array(rows * count);
  for (let r = 0; r < rows; r++) out.set(data.subarray(r * cols + start, r * cols + start + count), r * count);
  return out;
}

/** Writes `part` [rows, count] into columns [start, start+count) of `into` [rows, cols]. */
export function setCols(into: Float32Array, cols: number, start: number, part: Float32Array, count: number): void {
  const rows = into.length / cols;
  for (let r = 0; r < rows; r++) into.set(part.subarray(r * count, (r + 1) * count), r * cols + start);
}

/** Buffers one after another in one new buffer. */
export function concat(parts: Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

// Loops, not `map` or `every` with a callback: these run on the MBs of every exchange on a page's
// main thread, where a callback a value costs about three times the work.

/** a + b, elementwise. */
export function add(a: Float32Array, b: Float32Array): Float32Array {
  const out = new Float32Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i] + b[i];
  return out;
}

/** a − b, elementwise. */
export function subtract(a: Float32Array, b: Float32Array): Float32Array {
  const out = new Float32Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i] - b[i];
  return out;
}

/** Every value finite and at most `limit` in magnitude (NaN is not). */
export function allWithin(values: Float32Array, limit = Number.MAX_VALUE): boolean {
  for (let i = 0; i < values.length; i++) if (!(Math.abs(values[i]) <= limit)) return false;
  return true;
}
