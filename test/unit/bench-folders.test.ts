import { existsSync, mkdtempSync, readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ensureFolder } from '../../bench/lib.ts';

// A benchmark's model folder is GBs written on demand: a run cut short must not leave one a later run takes as whole.
describe("a benchmark's model folder", () => {
  it('is written whole or not at all: a write that fails leaves nothing; a whole one is renamed in and kept', async () => {
    const root = mkdtempSync(join(tmpdir(), 'ditswarm-bench-folder-'));
    const dir = join(root, 'model');
    const write = (fail: boolean) => (into: string) => {
      mkdirSync(join(into, 'vae'), { recursive: true });
      writeFileSync(join(into, 'vae/config.json'), '{}');
      if (fail) throw new Error('cut short');
      writeFileSync(join(into, 'vae/weights'), 'whole');
    };
    await expect(ensureFolder(dir, 'vae/weights', write(true))).rejects.toThrow('cut short');
    expect([existsSync(dir), existsSync(`${dir}.partial`)]).toEqual([false, false]);
    await ensureFolder(dir, 'vae/weights', write(false));
    expect(readFileSync(join(dir, 'vae/weights'), 'utf8')).toBe('whole');
    // there: not written again
    await ensureFolder(dir, 'vae/weights', () => {
      throw new Error('written again');
    });
  });
});
