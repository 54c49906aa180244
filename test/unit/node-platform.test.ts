import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { hexOf } from '../../core/net/check.ts';
import { joinMetadata } from '../../core/net/join.ts';
import { MACHINE_HINT_BYTES } from '../../core/worker-api.ts';
import { machineId } from '../../worker/node/platform.ts';

describe("a worker process's machine id", () => {
  it('is the same in every process of this machine, as the tabs of one browser share theirs, and a join carries it', () => {
    const id = machineId();
    expect(id).toMatch(/^[0-9a-f]{32}$/);
    // it is also the process's machine hint (WorkerInfo.machine), which the dashboard checks as it arrives
    expect(hexOf(MACHINE_HINT_BYTES)(id, 'machine')).toBe(id);
    const platform = join(import.meta.dirname, '../../worker/node/platform.ts');
    const other = execFileSync(
      process.execPath,
      [
        '--import',
        'tsx',
        '--input-type=module',
        '-e',
        `console.log((await import(${JSON.stringify(platform)})).machineId())`,
      ],
      { encoding: 'utf8' },
    ).trim();
    expect(other).toBe(id);
    // a dashboard reads it from a dial as a browser's id, and refuses a banned machine by it before the proof
    expect(joinMetadata({ role: 'worker', nonce: 'a'.repeat(32), dial: 'b'.repeat(64), browser: id })?.browser).toBe(
      id,
    );
  });
});
