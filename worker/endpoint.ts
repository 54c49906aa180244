// A worker page's presence in the swarm: its PeerJS peer, the link to the coordinator (over
// which it answers RPCs), the links to the other ranks of a job, and the engine in a Web
// Worker. Links are data channels, or go through the server's relay when a channel does not
// open (or the server forces the relay); the page keeps its relay socket open while it is in
// the swarm so that other ranks can reach it that way. Everything a page shows comes from
// `onStatus`.
import { Peer } from 'peerjs';
import type { DataConnectionLike, Transport } from '../core/net/channel.ts';
import { answerHeartbeats } from '../core/net/heartbeat.ts';
import type { Link } from '../core/net/link.ts';
import {
  connectRelay,
  dial,
  DIRECT_OPEN_TIMEOUT_MS,
  newPeerId,
  openLink,
  PEER_ID_PREFIX,
  peerOptions,
  registerPeer,
  signalingOptions,
  transportOf,
  type OpenLinkOptions,
  type SignalingOptions,
} from '../core/net/peer-link.ts';
import { RelayRefused, type RelayClient } from '../core/net/relay-client.ts';
import { serve } from '../core/net/rpc.ts';
import { PeerLost, WORKER_CONTRACT, type ExecutionProvider, type InitArgs, type WorkerApi, type WorkerInfo, type WorkerState, type WorkerTotals } from '../core/worker-api.ts';
import { startEngineWorker } from '../rank/engine-client.ts';
import { MeshExchange } from '../rank/exchange/mesh.ts';
import { WorkerRuntime } from '../rank/runtime.ts';
import { probeWebGpu } from '../rank/webgpu.ts';

const MESH_TIMEOUT_MS = 30_000;
const RECONNECT_MS = 2_000;
const REFUSED_RETRY_MS = 15_000;
/** Connections of one rank kept until this rank asks for them (a data channel, then maybe a relayed one). */
const MAX_EARLY_CANDIDATES = 4;

export interface WorkerStatus {
  peerId: string;
  coordinator: string | null;
  connected: boolean;
  state: WorkerState | 'joining' | 'disconnected' | 'refused' | 'left';
  detail: string;
  info: WorkerInfo | null;
  totals: WorkerTotals;
  framesDropped: number;
  /** how the link to the dashboard goes, once connected */
  transport: Transport | null;
  /** the EP the loaded model runs on (the job may ask for WebAssembly on a WebGPU machine) */
  ep: ExecutionProvider | null;
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
  const peer = await registerPeer(() => new Peer(newPeerId('worker'), peerOptions(signaling)), options.origin);
  const engineWorker = startEngineWorker();
  const status: WorkerStatus = {
    peerId: peer.id,
    coordinator: null,
    connected: false,
    state: 'joining',
    detail: 'looking for the dashboard',
    info: null,
    totals: { steps: 0, bytesSent: 0, computeMs: 0, bytesDownloaded: 0, bytesKept: 0, deviceTensorsLeft: 0 },
    framesDropped: 0,
    transport: null,
    ep: null,
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

  let leaving = false;
  // One relay socket per page, opened on joining and kept open: ranks that cannot reach this page
  // over a data channel come through it. Registered with the join token; the server vouches for
  // this page's id by the token PeerJS registered it with.
  let relay: Promise<RelayClient> | null = null;
  const relayClient = (): Promise<RelayClient> => {
    relay ??= connectRelay(options.origin, signaling, { peer: peer.id, auth: peer.options.token ?? '', token: options.token ?? '', role: 'worker' }).then(
      (client) => {
        client.onConnection(incoming);
        client.onClose(() => {
          relay = null;
          if (!leaving) setTimeout(() => void relayClient().catch(() => {}), RECONNECT_MS);
        });
        return client;
      },
      (e: Error) => {
        relay = null;
        throw e;
      },
    );
    return relay;
  };

  // Connections from other ranks can arrive before this rank's initWorker: keep them until asked.
  const rankCandidates = new Map<string, DataConnectionLike[]>();
  const rankWaiters = new Map<string, (conn: DataConnectionLike) => void>();
  function incoming(conn: DataConnectionLike): void {
    const meta = conn.metadata as { role?: string; session?: string; rank?: number } | undefined;
    if (meta?.role !== 'rank' || typeof meta.session !== 'string' || !Number.isInteger(meta.rank)) return conn.close();
    const key = `${meta.session}/${meta.rank}`;
    const waiter = rankWaiters.get(key);
    if (waiter) return waiter(conn);
    const early = rankCandidates.get(key) ?? [];
    if (early.length >= MAX_EARLY_CANDIDATES) return conn.close();
    rankCandidates.set(key, [...early, conn]);
  }
  peer.on('connection', (conn) => incoming(conn as unknown as DataConnectionLike));

  type Mesh = { exchange: MeshExchange; connections: DataConnectionLike[]; links: Map<number, { peer: string; transport: Transport }> };
  let mesh: Mesh | null = null;
  const closeMesh = (reason = 'job mesh closed') => {
    mesh?.exchange.fail(new Error(reason));
    mesh?.exchange.closeLinks(reason);
    mesh?.connections.forEach((c) => c.close());
    mesh = null;
  };

  /**
   * The connection rank `rank` opened to this one, as a Link: the first of its connections to
   * open wins (its data channel, or after RELAY_FALLBACK_MS its relayed one); later ones close.
   */
  function acceptRank(init: InitArgs, rank: number, current: Mesh, linkOptions: (conn: DataConnectionLike) => OpenLinkOptions, onLost: (reason: string) => void) {
    const key = `${init.session}/${rank}`;
    return new Promise<{ conn: DataConnectionLike; link: Link }>((resolve, reject) => {
      let settled = false;
      const finish = () => {
        settled = true;
        clearTimeout(timer);
        if (rankWaiters.get(key) === consider) rankWaiters.delete(key);
      };
      const timer = setTimeout(() => {
        finish();
        reject(new Error(`rank ${rank} did not connect to rank ${init.rank} within ${MESH_TIMEOUT_MS / 1000} s`));
      }, MESH_TIMEOUT_MS);
      const consider = (conn: DataConnectionLike) => {
        if (settled) return conn.close();
        // the signaling server (and the relay, by the same credential) vouches for peer ids: only the
        // peer the coordinator named may be rank r. An impostor is turned away; the real rank may still come.
        if (conn.peer !== init.peers[rank]) return conn.close();
        current.connections.push(conn);
        let chosen = false;
        const opening = openLink(conn, (reason) => chosen && onLost(reason), { ...linkOptions(conn), openTimeoutMs: conn.open ? undefined : DIRECT_OPEN_TIMEOUT_MS });
        opening.then(
          (link) => {
            if (settled) {
              link.close('another connection of the same rank opened first');
              return conn.close();
            }
            chosen = true;
            finish();
            resolve({ conn, link });
          },
          () => {}, // a data channel that never opened: that rank dials again through the relay
        );
      };
      const early = rankCandidates.get(key) ?? [];
      rankCandidates.delete(key);
      rankWaiters.set(key, consider);
      early.forEach(consider);
    });
  }

  async function connectMesh(init: InitArgs): Promise<MeshExchange> {
    closeMesh('a new job mesh replaced it');
    const exchange = new MeshExchange(init.rank, init.world, init.dtype ?? 'f32');
    const current: Mesh = (mesh = { exchange, connections: [], links: new Map() });
    // ranks that cannot open a data channel to this one reach it through the relay: have the socket ready
    if (signaling.relay.mode !== 'off') void relayClient().catch(() => {});
    const linkTo = async (rank: number): Promise<void> => {
      const linkOptions = (conn: DataConnectionLike): OpenLinkOptions => ({
        // a rank may only send tensors of the running job, of the planned size, and only as itself
        accept: (h) =>
          h.kind !== 'tensor'
            ? `rank ${rank} sent a ${h.kind} message on the mesh`
            : h.from !== rank
              ? misbehaved(conn, `it sent a tensor in the name of rank ${h.from}`)
              : runtime.judgeTensor(h.tag, h.totalBytes),
      });
      const misbehaved = (conn: DataConnectionLike, why: string) => {
        exchange.fail(new PeerLost({ rank, cause: 'misbehaved', evidence: `${why}; disconnected` }));
        conn.close();
        return why;
      };
      const onLost = (reason: string) => exchange.fail(new PeerLost({ rank, cause: 'disconnected', evidence: reason }));
      let opened: { conn: DataConnectionLike; link: Link };
      if (rank < init.rank) {
        // the higher rank dials, so each pair connects once
        const conn = await dial(peer, init.peers[rank], { role: 'rank', session: init.session, rank: init.rank }, { mode: signaling.relay.mode, client: relayClient });
        current.connections.push(conn);
        if (mesh !== current) throw new Error(`the mesh for rank ${rank} was replaced while connecting`);
        opened = { conn, link: await openLink(conn, onLost, linkOptions(conn)) };
      } else {
        opened = await acceptRank(init, rank, current, linkOptions, onLost);
      }
      current.links.set(rank, { peer: opened.conn.peer, transport: transportOf(opened.conn) });
      exchange.addPeer(rank, opened.link);
    };
    await Promise.all(init.peers.map((_, rank) => (rank === init.rank ? null : linkTo(rank))));
    return exchange;
  }

  const runtime = new WorkerRuntime(engineWorker.engine, {
    connectMesh,
    describe: async () => info,
    onState: (state, detail) => publish({ state, detail, totals: { ...runtime.totals }, ep: runtime.ep }),
    onShutdown: () => closeMesh('released by the coordinator'),
  });

  async function joinCoordinator(): Promise<void> {
    while (!leaving) {
      try {
        const coordinator = options.swarm ?? (await discoverCoordinator(signaling, options.origin));
        if (!coordinator) throw new Error('no dashboard is open yet');
        publish({ coordinator, detail: `connecting to ${coordinator}${signaling.relay.mode === 'force' ? ' through the relay' : ''}` });
        if (signaling.relay.mode === 'fallback') await relayClient().catch(() => null); // only links that need it use it
        const conn = await dial(peer, coordinator, { role: 'worker', token: options.token ?? '' }, { mode: signaling.relay.mode, client: relayClient });
        let closed!: () => void;
        const gone = new Promise<void>((resolve) => (closed = resolve));
        const link = await openLink(conn, () => closed(), {
          accept: (h) => (h.kind !== 'rpc' ? 'the coordinator may only send RPC messages' : null),
        });
        let refusal: string | null = null;
        link.onMessage((msg) => {
          const body = msg.kind === 'rpc' ? (msg.body as { type?: string; reason?: unknown }) : null;
          if (body?.type === 'refused') refusal = String(body.reason);
        });
        serve<WorkerApi>(link, 0, WORKER_CONTRACT, runtime);
        answerHeartbeats(link, 0, () => {
          const framesDropped = link.stats.framesDropped + (mesh?.exchange.framesDropped() ?? 0);
          if (framesDropped !== status.framesDropped) publish({ framesDropped });
          return { state: runtime.state, framesDropped, mesh: [...(mesh?.links.values() ?? [])] };
        });
        const transport = transportOf(conn);
        publish({ connected: true, transport, state: runtime.state, detail: `joined the swarm${transport === 'relay' ? ' (through the relay)' : ''}` });
        await gone;
        closeMesh('lost the dashboard');
        if (refusal) {
          publish({ connected: false, state: 'refused', detail: `the dashboard refused this worker: ${refusal}` });
          await new Promise((r) => setTimeout(r, REFUSED_RETRY_MS));
          continue;
        }
        publish({ connected: false, transport: null, state: 'disconnected', detail: 'lost the dashboard; reconnecting' });
      } catch (e) {
        if (e instanceof RelayRefused) {
          publish({ connected: false, transport: null, state: 'refused', detail: `the dashboard's relay refused this worker: ${e.reason}` });
          await new Promise((r) => setTimeout(r, REFUSED_RETRY_MS));
          continue;
        }
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
      void relay?.then((client) => client.close('this worker left the swarm'), () => {});
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
