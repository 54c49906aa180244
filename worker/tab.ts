// A worker in a browser tab: PeerJS on the browser's WebRTC, the engine in a Web Worker, the cores shared
// with the other worker tabs of this browser (cores.ts), Web Locks to stay awake.
import { Peer } from 'peerjs';
import { EngineHost, type ProbeGate } from '../rank/engine-client.ts';
import { sampleMemoryPeak } from '../rank/memory.ts';
import { describeCompute } from '../rank/webgpu.ts';
import { shareCores } from './cores.ts';
import { describeMachine } from '../rank/machine-hint.ts';
import type { WorkerPlatform } from './platform.ts';

export const tabPlatform: WorkerPlatform = {
  // PeerJS types its options as a class, but takes a plain object
  // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- a plain object, as PeerJS's docs
  newPeer: (id, options) => new Peer(id, options),
  describe: async () => {
    const compute = await describeCompute();
    return {
      kind: 'tab',
      ...compute,
      memoryGiB: (navigator as Navigator & { deviceMemory?: number }).deviceMemory ?? null,
      userAgent: navigator.userAgent,
      ...describeMachine(compute),
    };
  },
  shareCores,
  startEngine: (threads) => new EngineHost(threads, oneProbeAtATime),
  keepAwake,
  onFreeze(stop) {
    // a page its browser freezes (a hidden tab, to save power) says so while it still can
    document.addEventListener('freeze', stop);
    return () => document.removeEventListener('freeze', stop);
  },
  peakMemoryBytes: sampleMemoryPeak(),
};

/**
 * Holds a Web Lock for as long as this page is in the swarm: Chrome does not freeze or discard a
 * background tab that holds one (nor one with an open WebRTC connection, which a joined page has
 * too). What it does not prevent is written on the worker page and in README. Returns its release.
 */
function keepAwake(peerId: string): () => void {
  const { locks } = navigator as Partial<Pick<Navigator, 'locks'>>;
  let release = () => {};
  const held = new Promise<void>((resolve) => (release = resolve));
  void locks?.request(`ditswarm-worker-awake-${peerId}`, () => held).catch(() => {});
  return release;
}

/**
 * Compute probes of the worker tabs of this browser on this machine, one at a time: each measures
 * its share of the cores as a job will use it, not a crowd of probes fighting over them.
 */
const oneProbeAtATime: ProbeGate = async (probe) => {
  const { locks } = navigator as Partial<Pick<Navigator, 'locks'>>;
  return locks ? await locks.request('ditswarm-compute-probe', () => probe()) : probe();
};
