import { afterEach, describe, expect, it, vi } from 'vitest';
import { byteProgress } from '../../server/cli/progress.ts';

describe('byteProgress', () => {
  afterEach(() => vi.restoreAllMocks());

  const writes = (tty: boolean, steps: number[]) => {
    const lines: string[] = [];
    vi.spyOn(process.stderr, 'write').mockImplementation((chunk) => (lines.push(String(chunk)), true));
    const had = process.stderr.isTTY;
    process.stderr.isTTY = tty;
    try {
      const progress = byteProgress('load');
      for (const done of steps) progress(done, 4e9);
    } finally {
      process.stderr.isTTY = had;
    }
    return lines;
  };

  it('in a log, a line per tenth and nothing in between', () => {
    expect(writes(false, [0, 1e8, 2e8, 4e8, 4.1e8, 2e9, 4e9])).toEqual([
      'load: 0.00 of 4.00 GB\n',
      'load: 0.40 of 4.00 GB\n',
      'load: 2.00 of 4.00 GB\n',
      'load: 4.00 of 4.00 GB\n',
    ]);
  });

  it('on a terminal, one line rewritten per per cent, ended when done', () => {
    expect(writes(true, [0, 1e7, 4e7, 4e9])).toEqual([
      '\rload: 0.00 of 4.00 GB',
      '\rload: 0.04 of 4.00 GB',
      '\rload: 4.00 of 4.00 GB\n',
    ]);
  });
});
