// Stage inputs cut so that no tensor a stage makes exceeds what one buffer of the worker may hold
// (a WebGPU adapter's maxStorageBufferBindingSize: 128 MB by default, 1–4 GB where asked for; on
// WASM a share of the 4 GB heap). Every stage but attention is row-wise — a token's output depends
// on its own row (and the shared text context) alone — so it runs a block of rows at a time;
// attention is head-wise, so it runs a group of heads (all tokens) at a time. The results are put
// back together in order: the same numbers as one call.

/** [begin, end) row ranges of at most `maxRows` rows covering `rows`. */
export function rowChunks(rows: number, maxRows: number): [number, number][] {
  if (!(maxRows >= 1)) throw new Error(`a chunk must hold at least one row, got ${maxRows}`);
  const chunks: [number, number][] = [];
  for (let begin = 0; begin < rows; begin += maxRows) chunks.push([begin, Math.min(rows, begin + maxRows)]);
  return chunks;
}

/** How many rows of `floatsPerRow` floats one buffer of `maxBufferBytes` holds (at least one: a row is the least a stage can take). */
export function rowsPerBuffer(maxBufferBytes: number, floatsPerRow: number): number {
  return Math.max(1, Math.floor(maxBufferBytes / (4 * floatsPerRow)));
}

export function concatRows(parts: Float32Array[]): Float32Array {
  if (parts.length === 1) return parts[0];
  const all = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    all.set(part, at);
    at += part.length;
  }
  return all;
}

/** Columns [from, to) of a row-major matrix `width` wide. */
export function sliceColumns(a: Float32Array, width: number, from: number, to: number): Float32Array {
  const rows = a.length / width;
  const out = new Float32Array(rows * (to - from));
  for (let r = 0; r < rows; r++) out.set(a.subarray(r * width + from, r * width + to), r * (to - from));
  return out;
}

/** Writes `part` (its columns `from`.. of `into`, `width` wide) back in place. */
export function placeColumns(into: Float32Array, width: number, from: number, part: Float32Array): void {
  const rows = into.length / width;
  const partWidth = part.length / rows;
  for (let r = 0; r < rows; r++) into.set(part.subarray(r * partWidth, (r + 1) * partWidth), r * width + from);
}
