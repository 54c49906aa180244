// The machine hint of a worker tab or the dashboard's own rank (WorkerInfo.machine): a hash of what every browser
// on one machine sees alike, so that two browsers (two profiles, Chrome beside Firefox) whose tabs each claim all the
// cores are known to share them. It is a hint, not an identity: two alike machines meet under one hint, and the
// rehearsals, which time the workers all at once, correct what it gets wrong.
import { sha256 } from '../core/net/hmac.ts';
import { MACHINE_HINT_BYTES, type WorkerInfo } from '../core/worker-api.ts';

/** What a page sees of its machine; each field is one a browser reports alike in all its profiles. */
export interface MachineView {
  cores: number;
  /** navigator.deviceMemory, where the browser says it */
  memoryGiB: number | null;
  /** the OS, as the browser names it */
  platform: string;
  timeZone: string;
  /** the WebGPU adapter's name, where there is one */
  adapter: string | null;
}

/**
 * The hint of `view`. Left out on purpose: the screen (a window's screen is the monitor it is on, and the zoom scales
 * it), the user agent and languages (a second browser or profile differs in them on the same machine).
 */
export function machineHint(view: MachineView): string {
  const seen = JSON.stringify(['ditswarm machine hint', view]);
  const digest = sha256(new TextEncoder().encode(seen)).subarray(0, MACHINE_HINT_BYTES);
  return [...digest].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** This page's machine as its WorkerInfo says it, computing on `compute` (describeCompute). */
export function describeMachine(compute: Pick<WorkerInfo, 'ep' | 'adapter'>): Pick<WorkerInfo, 'cores' | 'machine'> {
  const view = machineView(compute.ep === 'webgpu' ? compute.adapter : null);
  return { cores: view.cores, machine: machineHint(view) };
}

/** What this page sees of its machine. */
function machineView(adapter: string | null): MachineView {
  return {
    cores: Math.max(1, navigator.hardwareConcurrency || 1),
    memoryGiB: (navigator as Navigator & { deviceMemory?: number }).deviceMemory ?? null,
    // eslint-disable-next-line @typescript-eslint/no-deprecated -- every browser has it; userAgentData only Chromium
    platform: navigator.platform,
    timeZone: Intl.DateTimeFormat().resolvedOptions().timeZone,
    adapter,
  };
}
