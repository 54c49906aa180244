// What a worker needs of where it runs: a browser tab (tab.ts) or a Node process (node/platform.ts). The
// endpoint (endpoint.ts) is the same for both: the same join, worker API, mesh and relay.
import type { Peer } from 'peerjs';
import type { peerOptions } from '../core/net/peer-link.ts';
import type { WorkerInfo } from '../core/worker-api.ts';
import type { EngineHandle } from '../rank/engine-client.ts';
import type { CoreShare } from './cores.ts';

export interface WorkerPlatform {
  /** a PeerJS peer under `id` */
  newPeer(id: string, options: ReturnType<typeof peerOptions>): Peer;
  /** what the worker says of itself when it joins, less its share of the cores and what its user set */
  describe(): Promise<Omit<WorkerInfo, 'threads' | 'browser' | 'modelMemoryGiB'>>;
  /** its share of its machine's cores, which `onChange` hears change */
  shareCores(id: string, onChange: () => void): Promise<CoreShare>;
  /** the engine, in a thread of its own, on `threads` threads */
  startEngine(threads: number): EngineHandle;
  /** keeps the worker from being put to sleep while it is in the swarm; returns the release */
  keepAwake(id: string): () => void;
  /** calls `stop` as the worker is about to be stopped without warning (a tab frozen); returns the unsubscribe */
  onFreeze(stop: () => void): () => void;
  /** the most memory measured so far, or null where it cannot be measured */
  peakMemoryBytes: () => number | null;
}
