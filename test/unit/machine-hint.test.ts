import { describe, expect, it } from 'vitest';
import { machineHint, type MachineView } from '../../rank/machine-hint.ts';

const laptop: MachineView = {
  cores: 2,
  memoryGiB: 8,
  platform: 'Linux x86_64',
  timeZone: 'Europe/Berlin',
  adapter: null,
};

describe('a machine hint (WorkerInfo.machine)', () => {
  it('is 16 bytes of lowercase hex, the same for what two browsers on one machine both see', () => {
    expect(machineHint(laptop)).toMatch(/^[0-9a-f]{32}$/);
    expect(machineHint({ ...laptop })).toBe(machineHint(laptop));
  });

  it('differs where the cores, the memory, the OS, the time zone or the WebGPU adapter differ', () => {
    const others: MachineView[] = [
      { ...laptop, cores: 4 },
      { ...laptop, memoryGiB: null },
      { ...laptop, platform: 'MacIntel' },
      { ...laptop, timeZone: 'UTC' },
      { ...laptop, adapter: 'nvidia ampere' },
    ];
    const hints = new Set([laptop, ...others].map(machineHint));
    expect(hints.size).toBe(1 + others.length);
  });
});
