import { describe, expect, it } from 'vitest';
import { concatRows, placeColumns, rowChunks, rowsPerBuffer, sliceColumns } from '../../rank/chunks.ts';

describe('stage inputs cut to a buffer budget', () => {
  it('rows: blocks of at most maxRows that cover every row once, in order', () => {
    expect(rowChunks(10, 4)).toEqual([[0, 4], [4, 8], [8, 10]]);
    expect(rowChunks(8, 8)).toEqual([[0, 8]]);
    expect(rowChunks(0, 3)).toEqual([]);
    expect(() => rowChunks(5, 0)).toThrow('at least one row');
  });

  it('how many rows fit a buffer, never fewer than one', () => {
    // the 1.3B model's FFN at 32,760 tokens is 1.17 GB: a 128 MiB buffer takes 3,744 of its rows
    expect(rowsPerBuffer(128 << 20, 8960)).toBe(3744);
    expect(rowsPerBuffer(10, 8960)).toBe(1);
  });

  it('columns sliced and placed back give the matrix again; rows concatenate in order', () => {
    const m = Float32Array.from({ length: 12 }, (_, i) => i); // 3 rows × 4
    const left = sliceColumns(m, 4, 0, 1);
    const right = sliceColumns(m, 4, 1, 4);
    expect([...left]).toEqual([0, 4, 8]);
    expect([...right]).toEqual([1, 2, 3, 5, 6, 7, 9, 10, 11]);
    const back = new Float32Array(12);
    placeColumns(back, 4, 0, left);
    placeColumns(back, 4, 1, right);
    expect(back).toEqual(m);
    expect([...concatRows([m.subarray(0, 4), m.subarray(4)])]).toEqual([...m]);
  });
});
