import { describe, expect, it } from 'vitest';
import { rowChunks, rowsPerBuffer } from '../../rank/chunks.ts';

describe('stage inputs cut to a buffer budget', () => {
  it('rows: blocks of at most maxRows that cover every row once, in order', () => {
    expect(rowChunks(10, 4)).toEqual([
      [0, 4],
      [4, 8],
      [8, 10],
    ]);
    expect(rowChunks(8, 8)).toEqual([[0, 8]]);
    expect(rowChunks(0, 3)).toEqual([]);
    expect(() => rowChunks(5, 0)).toThrow('at least one row');
  });

  it('how many rows fit a buffer, never fewer than one', () => {
    // the 1.3B model's FFN at 32,760 tokens is 1.17 GB: a 128 MiB buffer takes 3,744 of its rows
    expect(rowsPerBuffer(128 << 20, 8960)).toBe(3744);
    expect(rowsPerBuffer(10, 8960)).toBe(1);
  });
});
