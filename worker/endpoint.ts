// A worker's presence in the swarm, a tab's or a process's (platform.ts): its PeerJS peer, the link
// to the coordinator (over which it serves the WorkerApi), its mesh to the other ranks of a job
// (mesh.ts), and the engine in a thread of its own. Links are data channels, or go through the
// server's relay when a channel does not open (or the server forces the relay); the worker keeps its
// relay socket open while it is in the swarm so that other ranks can reach it that way. Everything a
// worker shows comes from `onStatus`.
import type { DataConnectionLike, Transport } from '../core/net/channel.ts';
import { announceStop, answerHeartbeats, askWhileSilent } from '../core/net/heartbeat.ts';
import { joinDashboard, workerDial, type JoinMetadata } from '../core/net/join.ts';
import { findCoordinator } from '../core/net/join-token.ts';
import {
  connectRelay,
  dial,
  newPeerId,
  openLink,
  peerOptions,
  registeredId,
  registerPeer,
  signalingOptions,
  stayRegistered,
} from '../core/net/peer-link.ts';
import { RelayRefused, type RelayClient } from '../core/net/relay-client.ts';
import { askTurn, linkTransport, turnSignaling, workerIceRequest } from '../core/net/turn.ts';
import { serve } from '../core/net/rpc.ts';
import {
  WORKER_CONTRACT,
  type ExecutionProvider,
  type WorkerApi,
  type WorkerInfo,
  type WorkerState,
  type WorkerTotals,
} from '../core/worker-api.ts';
import { WorkerRuntime } from '../rank/runtime.ts';
import type { CoreShare } from './cores.ts';
import { WorkerMesh } from './mesh.ts';
import { modelSource } from './model-origin.ts';
import type { WorkerPlatform } from './platform.ts';

const RECONNECT_MS = 2_000;
const REFUSED_RETRY_MS = 15_000;

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
  /** the EP the loaded model runs on (the job may ask for WebAssembly on a WebGPU machine), and why */
  ep: ExecutionProvider | null;
  epWhy: string;
  /**
   * this tab's share of its machine's cores: WASM threads now, from the next job, of how many cores,
   * among how many worker tabs
   */
  cores: { threads: number; next: number; of: number; tabs: number } | null;
}

export interface WorkerEndpointOptions {
  origin: string;
  /** the join token from the worker link */
  token?: string | null;
  /** what its user lets the model's weights take, in GiB (the page's field); none: not set */
  modelMemoryGiB?: number | null;
  onStatus(status: WorkerStatus): void;
  /** a tab's or a process's */
  platform: WorkerPlatform;
  /**
   * Where the server stands by the link no more (it was revoked, or is of no server here): a tab asks again now and
   * then, for as long as its page is open; a process given this stops asking, and this says why.
   */
  onLinkRefused?(why: string): void;
}

/** A joined worker page's hold on its endpoint. */
export interface WorkerEndpoint {
  leave(): void;
  /** what its user lets the model's weights take, in GiB (null: not set): its next pulse tells the dashboard */
  setModelMemory(gib: number | null): void;
}

export async function startWorkerEndpoint(options: WorkerEndpointOptions): Promise<WorkerEndpoint> {
  const signaling = await signalingOptions(options.origin);
  const served = await fetch(new URL('/models.json', options.origin))
    .then((r): Promise<unknown> => r.json())
    .catch(() => null);
  const sourceOfModel = modelSource(options.origin, servedUrls(served), signaling.origins);
  const { platform } = options;
  // its id first: TURN credentials are given for an id, to a page that proves the join token
  const id = newPeerId('worker');
  const { token } = options;
  const turn = await turnSignaling(
    signaling,
    token ? () => askTurn(options.origin, workerIceRequest(token, id)) : null,
  );
  const peer = await registerPeer(() => platform.newPeer(id, peerOptions(turn.signaling)), options.origin);
  turn.keepFresh(peer);
  const info: WorkerInfo = {
    ...(await platform.describe()),
    threads: 1, // this worker's share of the cores, once counted
    ...(options.modelMemoryGiB ? { modelMemoryGiB: options.modelMemoryGiB } : {}),
  };
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
    epWhy: '',
    cores: null,
  };
  const publish = (patch: Partial<WorkerStatus>) => options.onStatus(Object.assign(status, patch));

  // The cores are shared among the worker tabs of this browser: a tab that joins or leaves changes
  // every tab's share, which each takes up between jobs (a new engine on the new threads).
  const publishCores = () =>
    publish({ cores: { threads: engine.threads, next: cores.threads(), of: cores.cores, tabs: cores.tabs() } });
  const takeShare = async () => {
    await engine.restart(cores.threads());
    publishCores();
  };
  const cores: CoreShare = await platform.shareCores(peer.id, () => {
    publishCores();
    if (runtime.state === 'idle') void takeShare(); // not placed: at once
  });
  info.threads = cores.threads();
  info.browser = cores.browser;
  const engine = platform.startEngine(cores.threads());
  const releaseAwake = platform.keepAwake(peer.id);
  publish({ info });
  publishCores();

  let leaving = false;
  // One relay socket per page, opened on joining and kept open: ranks that cannot reach this page
  // over a data channel come through it. Registered with the join token; the server vouches for
  // this page's id by the token PeerJS registered it with.
  let relay: Promise<RelayClient> | null = null;
  const relayClient = (): Promise<RelayClient> => {
    relay ??= connectRelay(options.origin, signaling, {
      peer: peer.id,
      auth: peer.options.token ?? '',
      token: options.token ?? '',
      role: 'worker',
    }).then(
      (client) => {
        client.onConnection((conn) => mesh.incoming(conn));
        client.onClose(() => {
          relay = null;
          if (!leaving) setTimeout(() => void relayClient().catch(() => {}), RECONNECT_MS);
        });
        return client;
      },
      (e: unknown) => {
        relay = null;
        throw e;
      },
    );
    return relay;
  };

  const mesh: WorkerMesh = new WorkerMesh(peer, signaling.relay.mode, relayClient, (from, tag, bytes, link) =>
    runtime.judgeTensor(from, tag, bytes, link),
  );
  peer.on('connection', (conn) => mesh.incoming(conn as unknown as DataConnectionLike));
  stayRegistered(peer, () => leaving);

  const runtime: WorkerRuntime = new WorkerRuntime(engine, {
    connectMesh: (init) => {
      // ranks that cannot open a data channel to this one reach it through the relay: have the socket ready
      if (signaling.relay.mode !== 'off') void relayClient().catch(() => {});
      return mesh.connect(init);
    },
    connectStages: (init) => mesh.connectStages(init),
    describe: () => Promise.resolve({ ...info, threads: cores.threads() }),
    betweenJobs: takeShare,
    peakMemoryBytes: platform.peakMemoryBytes,
    modelSource: sourceOfModel,
    onState: (state, detail) =>
      publish({ state, detail, totals: { ...runtime.totals }, ep: runtime.ep, epWhy: runtime.epReason }),
    onShutdown: () => mesh.close('released by the coordinator'),
  });

  async function joinCoordinator(): Promise<void> {
    while (!leaving) {
      try {
        if (!options.token) {
          publish({
            state: 'refused',
            detail: 'this link has no join token: open the worker link the dashboard shows (…/worker.html#token=…)',
          });
          return;
        }
        // the dashboard's id changes each time it loads: the server says which it is now, to a page
        // that proves the token
        // a frozen or sleeping page's id was dropped by the signaling server: it asks under it once it is back
        const found = await findCoordinator(options.origin, options.token, await registeredId(peer));
        if ('refused' in found) {
          publish({ connected: false, transport: null, state: 'refused', detail: found.refused });
          if (options.onLinkRefused) {
            options.onLinkRefused(found.refused);
            return;
          }
          await new Promise((r) => setTimeout(r, REFUSED_RETRY_MS));
          continue;
        }
        if ('waiting' in found) {
          publish({
            connected: false,
            transport: null,
            state: 'disconnected',
            detail: `waiting for the dashboard: ${found.waiting}`,
          });
          await new Promise((r) => setTimeout(r, RECONNECT_MS));
          continue;
        }
        const { coordinator } = found;
        publish({
          coordinator,
          detail: `connecting to ${coordinator}${signaling.relay.mode === 'force' ? ' through the relay' : ''}`,
        });
        // opened now, but only links that need it use it
        if (signaling.relay.mode === 'fallback') await relayClient().catch(() => null);
        // the token never leaves this page: the dashboard and this worker prove they hold it (core/net/join.ts)
        const metadata: JoinMetadata = {
          ...workerDial(options.token ?? '', { coordinator, worker: peer.id }),
          ...(info.browser && { browser: info.browser }),
        };
        const conn = await dial(peer, coordinator, metadata, { mode: signaling.relay.mode, client: relayClient });
        let closed!: () => void;
        const gone = new Promise<void>((resolve) => (closed = resolve));
        const link = await openLink(conn, () => closed(), {
          accept: (h) => (h.kind !== 'rpc' ? 'the coordinator may only send RPC messages' : null),
        });
        // nothing is served before the dashboard has proved it holds the join token
        const refusal = await joinDashboard(link, options.token ?? '', { coordinator, worker: peer.id }, metadata);
        if (refusal) {
          link.close(refusal.refused);
          conn.close();
          publish({ connected: false, transport: null, state: 'refused', detail: refusal.refused });
          await new Promise((r) => setTimeout(r, REFUSED_RETRY_MS));
          continue;
        }
        serve<WorkerApi>(link, 0, WORKER_CONTRACT, runtime);
        answerHeartbeats(link, 0, () => {
          const framesDropped = link.stats.framesDropped + mesh.framesDropped();
          if (framesDropped !== status.framesDropped) publish({ framesDropped });
          return {
            state: runtime.state,
            framesDropped,
            mesh: mesh.links(),
            threads: cores.threads(),
            modelMemoryGiB: info.modelMemoryGiB ?? null,
            load: runtime.loadStatus ?? undefined,
            progress: engine.progress,
            holds: engine.holds,
          };
        });
        // a worker about to be frozen says so while it still can: its work is placed elsewhere at once,
        // not after a silence (a closing page's link closes by itself)
        const unfreeze = platform.onFreeze(() => announceStop(link, 0));
        const transport = await linkTransport(conn);
        const how = { direct: '', turn: ' (through TURN)', relay: ' (through the relay)' }[transport];
        publish({
          connected: true,
          transport,
          state: runtime.state,
          detail: `joined the swarm${how}`,
        });
        const stopAsking = askWhileSilent(
          link,
          () => findCoordinator(options.origin, options.token ?? '', peer.id),
          coordinator,
          () => {
            link.close('the server says the dashboard left');
            conn.close();
          },
        );
        await gone;
        stopAsking();
        unfreeze();
        // its link closed because it left (leave() set it while this waited): it has said so
        // eslint-disable-next-line @typescript-eslint/no-unnecessary-condition
        if (leaving) return;
        mesh.close('lost the dashboard');
        publish({
          connected: false,
          transport: null,
          state: 'disconnected',
          detail: 'lost the dashboard; reconnecting',
        });
      } catch (e) {
        if (e instanceof RelayRefused) {
          publish({
            connected: false,
            transport: null,
            state: 'refused',
            detail: `the dashboard's relay refused this worker: ${e.reason}`,
          });
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
    setModelMemory(gib) {
      if (gib === null) delete info.modelMemoryGiB;
      else info.modelMemoryGiB = gib;
    },
    leave() {
      leaving = true;
      mesh.close('this worker left the swarm');
      void relay?.then(
        (client) => client.close('this worker left the swarm'),
        () => {},
      );
      peer.destroy();
      engine.terminate();
      releaseAwake();
      cores.leave();
      publish({ connected: false, state: 'left', detail: 'left the swarm' });
    },
  };
}

/** The model folder and adapter files a server's /models.json says it was started on: anyone's JSON, read as such. */
function servedUrls(served: unknown): string[] {
  if (typeof served !== 'object' || served === null) return [];
  const { default: model, loras } = served as { default?: unknown; loras?: unknown };
  const adapters = Array.isArray(loras) ? loras.map((l: unknown) => (l as { url?: unknown } | null)?.url) : [];
  return [model, ...adapters].filter((url): url is string => typeof url === 'string');
}
