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

/**
 * How many rows of `floatsPerRow` floats one buffer of `maxBufferBytes` holds (at least one: a row is
 * the least a stage can take).
 */
export function rowsPerBuffer(maxBufferBytes: number, floatsPerRow: number): number {
  return Math.max(1, Math.floor(maxBufferBytes / (4 * floatsPerRow)));
}
