import { Peer, type DataConnection } from 'peerjs';
import { newPeerId, openLink, PEER_ID_PREFIX, signalingOptions, type DataConnectionLike, type SignalingOptions } from '../core/peer-link.ts';
import { serveRpc } from '../core/rpc.ts';
import { probeWebGpu } from './webgpu.ts';
import { startEngineWorker } from './engine-client.ts';
import { MeshExchange } from './mesh-exchange.ts';
import { WorkerRuntime, type InitArgs, type WorkerInfo, type WorkerState } from './runtime.ts';

/**
 * A worker page's presence in the swarm: its PeerJS peer, the link to the coordinator (over
 * which it answers RPCs), the direct links to the other ranks of a job, and the engine in a Web
 * Worker. Everything a page shows comes from `onStatus`.
 */
const MESH_TIMEOUT_MS = 30_000;
const RECONNECT_MS = 2_000;

export interface WorkerStatus {
  peerId: string;
  coordinator: string | null;
  connected: boolean;
  state: WorkerState | 'joining' | 'disconnected' | 'left';
  detail: string;
  info: WorkerInfo | null;
  totals: { steps: number; bytesSent: number; computeMs: number };
  framesDropped: number;
}

export interface WorkerEndpointOptions {
  origin: string;
  /** the coordinator's peer id from the worker link; without it the newest coordinator is found */
  swarm?: string | null;
  onStatus(status: WorkerStatus): void;
}

export async function startWorkerEndpoint(options: WorkerEndpointOptions): Promise<{ leave(): void }> {
  const signaling = await signalingOptions(options.origin);
  const peer = new Peer(newPeerId('worker'), { ...signaling, config: { iceServers: [] }, debug: 1 });
  await new Promise<void>((resolve, reject) => {
    peer.once('open', () => resolve());
    peer.once('error', (e) => reject(new Error(`could not reach the signaling server: ${e.message}`)));
  });
  const engineWorker = startEngineWorker();
  const status: WorkerStatus = {
    peerId: peer.id,
    coordinator: null,
    connected: false,
    state: 'joining',
    detail: 'looking for the dashboard',
    info: null,
    totals: { steps: 0, bytesSent: 0, computeMs: 0 },
    framesDropped: 0,
  };
  const publish = (patch: Partial<WorkerStatus>) => options.onStatus(Object.assign(status, patch));

  const adapter = await probeWebGpu();
  const info: WorkerInfo = {
    ep: adapter ? 'webgpu' : 'wasm',
    adapter: adapter ?? 'WebAssembly (no WebGPU adapter)',
    threads: 1,
    memoryGiB: (navigator as Navigator & { deviceMemory?: number }).deviceMemory ?? null,
    userAgent: navigator.userAgent,
  };
  publish({ info });

  // Connections from other ranks can arrive before this rank's initWorker: keep them until asked.
  const rankConnections = new Map<string, DataConnection>();
  const rankWaiters = new Map<string, (conn: DataConnection) => void>();
  peer.on('connection', (conn) => {
    const meta = conn.metadata as { role?: string; session?: string; rank?: number } | undefined;
    if (meta?.role !== 'rank' || typeof meta.session !== 'string' || !Number.isInteger(meta.rank)) return conn.close();
    const key = `${meta.session}/${meta.rank}`;
    const waiter = rankWaiters.get(key);
    if (waiter) waiter(conn);
    else rankConnections.set(key, conn);
  });

  let mesh: MeshExchange | null = null;
  const closeMesh = () => {
    mesh?.closeLinks('job mesh closed');
    mesh = null;
  };

  async function connectMesh(init: InitArgs): Promise<MeshExchange> {
    closeMesh();
    const exchange = (mesh = new MeshExchange(init.rank, init.world));
    const linkTo = async (rank: number): Promise<void> => {
      let conn: DataConnection;
      if (rank < init.rank) {
        // the higher rank dials, so each pair connects once
        conn = peer.connect(init.peers[rank], { serialization: 'raw', reliable: true, metadata: { role: 'rank', session: init.session, rank: init.rank } });
      } else {
        const key = `${init.session}/${rank}`;
        conn =
          rankConnections.get(key) ??
          (await new Promise<DataConnection>((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`rank ${rank} did not connect to rank ${init.rank} within ${MESH_TIMEOUT_MS / 1000} s`)), MESH_TIMEOUT_MS);
            rankWaiters.set(key, (c) => (clearTimeout(timer), resolve(c)));
          }));
        rankConnections.delete(key);
        rankWaiters.delete(key);
      }
      const link = await openLink(conn as unknown as DataConnectionLike, (reason) => exchange.fail(new Error(`rank ${rank} is gone: ${reason}`)), {
        // a rank may only send tensors, and only as itself
        accept: (h) => (h.kind !== 'tensor' ? `rank ${rank} sent a ${h.kind} message on the mesh` : h.from !== rank ? `rank ${rank} sent a tensor claiming to be rank ${h.from}` : null),
      });
      exchange.addPeer(rank, link);
    };
    await Promise.all(init.peers.map((_, rank) => (rank === init.rank ? null : linkTo(rank))));
    return exchange;
  }

  const runtime = new WorkerRuntime(engineWorker.engine, {
    connectMesh,
    describe: async () => info,
    onState: (state, detail) => publish({ state, detail, totals: { ...runtime.totals } }),
    onShutdown: () => closeMesh(),
  });

  let leaving = false;
  async function joinCoordinator(): Promise<void> {
    while (!leaving) {
      try {
        const coordinator = options.swarm ?? (await discoverCoordinator(signaling, options.origin));
        if (!coordinator) throw new Error('no dashboard is open yet');
        publish({ coordinator, detail: `connecting to ${coordinator}` });
        const conn = peer.connect(coordinator, { serialization: 'raw', reliable: true, metadata: { role: 'worker' } });
        let closed!: () => void;
        const gone = new Promise<void>((resolve) => (closed = resolve));
        const link = await openLink(conn as unknown as DataConnectionLike, () => closed(), {
          accept: (h) => (h.kind !== 'rpc' ? 'the coordinator may only send RPC messages' : null),
        });
        serveRpc(link, 0, (method, args) => runtime.dispatch(method, args));
        publish({ connected: true, state: runtime.state, detail: 'joined the swarm' });
        const dropped = setInterval(() => status.framesDropped !== link.stats.framesDropped && publish({ framesDropped: link.stats.framesDropped }), 1000);
        await gone;
        clearInterval(dropped);
        closeMesh();
        publish({ connected: false, state: 'disconnected', detail: 'lost the dashboard; reconnecting' });
      } catch (e) {
        publish({ connected: false, detail: `${(e as Error).message}; retrying` });
      }
      await new Promise((r) => setTimeout(r, RECONNECT_MS));
    }
  }
  void joinCoordinator();

  return {
    leave() {
      leaving = true;
      closeMesh();
      peer.destroy();
      engineWorker.terminate();
      publish({ connected: false, state: 'left', detail: 'left the swarm' });
    },
  };
}

/** The newest dashboard registered with this origin's signaling server. */
async function discoverCoordinator(s: SignalingOptions, origin: string): Promise<string | null> {
  const response = await fetch(new URL(`${s.path.replace(/\/$/, '')}/${s.key}/peers`, origin));
  if (!response.ok) return null;
  const ids = ((await response.json()) as string[]).filter((id) => id.startsWith(PEER_ID_PREFIX.coordinator));
  return ids.at(-1) ?? null;
}
