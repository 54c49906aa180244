import { Peer, type DataConnection } from 'peerjs';
import { newPeerId, openLink, PEER_ID_PREFIX, signalingOptions, type DataConnectionLike, type SignalingOptions } from '../core/peer-link.ts';
import { answerHeartbeats } from '../core/heartbeat.ts';
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
const REFUSED_RETRY_MS = 15_000;

export interface WorkerStatus {
  peerId: string;
  coordinator: string | null;
  connected: boolean;
  state: WorkerState | 'joining' | 'disconnected' | 'refused' | 'left';
  detail: string;
  info: WorkerInfo | null;
  totals: { steps: number; bytesSent: number; computeMs: number };
  framesDropped: number;
}

export interface WorkerEndpointOptions {
  origin: string;
  /** the coordinator's peer id from the worker link; without it the newest coordinator is found */
  swarm?: string | null;
  /** the join token from the worker link */
  token?: string | null;
  onStatus(status: WorkerStatus): void;
}

export async function startWorkerEndpoint(options: WorkerEndpointOptions): Promise<{ leave(): void }> {
  const signaling = await signalingOptions(options.origin);
  const peer = new Peer(newPeerId('worker'), { ...signaling, config: { iceServers: signaling.iceServers }, debug: 1 });
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

  let mesh: { exchange: MeshExchange; connections: DataConnection[] } | null = null;
  const closeMesh = (reason = 'job mesh closed') => {
    mesh?.exchange.fail(new Error(reason));
    mesh?.exchange.closeLinks(reason);
    mesh?.connections.forEach((c) => c.close());
    mesh = null;
  };

  async function connectMesh(init: InitArgs): Promise<MeshExchange> {
    closeMesh('a new job mesh replaced it');
    const exchange = new MeshExchange(init.rank, init.world);
    const current = (mesh = { exchange, connections: [] as DataConnection[] });
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
        // the signaling server vouches for peer ids: only the peer the coordinator named may be rank r
        if (conn.peer !== init.peers[rank]) {
          conn.close();
          throw new Error(`peer ${conn.peer} claimed rank ${rank}, which the coordinator gave to ${init.peers[rank]}; misbehaving rank ${rank}`);
        }
      }
      current.connections.push(conn);
      const misbehaved = (why: string) => {
        exchange.fail(new Error(`misbehaving rank ${rank}: ${why}; disconnected`));
        conn.close();
        return why;
      };
      const link = await openLink(conn as unknown as DataConnectionLike, (reason) => exchange.fail(new Error(`rank ${rank} is gone: ${reason}`)), {
        // a rank may only send tensors of the running job, of the planned size, and only as itself
        accept: (h) =>
          h.kind !== 'tensor'
            ? `rank ${rank} sent a ${h.kind} message on the mesh`
            : h.from !== rank
              ? misbehaved(`it sent a tensor in the name of rank ${h.from}`)
              : runtime.judgeTensor(h.tag, h.totalBytes),
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
    onShutdown: () => closeMesh('released by the coordinator'),
  });

  let leaving = false;
  async function joinCoordinator(): Promise<void> {
    while (!leaving) {
      try {
        const coordinator = options.swarm ?? (await discoverCoordinator(signaling, options.origin));
        if (!coordinator) throw new Error('no dashboard is open yet');
        publish({ coordinator, detail: `connecting to ${coordinator}` });
        const conn = peer.connect(coordinator, { serialization: 'raw', reliable: true, metadata: { role: 'worker', token: options.token ?? '' } });
        let closed!: () => void;
        const gone = new Promise<void>((resolve) => (closed = resolve));
        const link = await openLink(conn as unknown as DataConnectionLike, () => closed(), {
          accept: (h) => (h.kind !== 'rpc' ? 'the coordinator may only send RPC messages' : null),
        });
        let refusal: string | null = null;
        link.onMessage((msg) => {
          const body = msg.kind === 'rpc' ? (msg.body as { type?: string; reason?: unknown }) : null;
          if (body?.type === 'refused') refusal = String(body.reason);
        });
        serveRpc(link, 0, (method, args) => runtime.dispatch(method, args));
        answerHeartbeats(link, 0, () => {
          const framesDropped = link.stats.framesDropped + (mesh?.exchange.framesDropped() ?? 0);
          if (framesDropped !== status.framesDropped) publish({ framesDropped });
          return { state: runtime.state, framesDropped };
        });
        publish({ connected: true, state: runtime.state, detail: 'joined the swarm' });
        await gone;
        closeMesh('lost the dashboard');
        if (refusal) {
          publish({ connected: false, state: 'refused', detail: `the dashboard refused this worker: ${refusal}` });
          await new Promise((r) => setTimeout(r, REFUSED_RETRY_MS));
          continue;
        }
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
      closeMesh('this worker left the swarm');
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
