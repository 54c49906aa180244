// The dashboard's view of the swarm: its PeerJS peer, and a roster of the worker pages that
// joined with the swarm's join token (each with a link, its WorkerApi, what it said about itself
// and its last pulse). A worker whose tab closes, crashes or freezes is dropped by the rules of
// core/net/heartbeat.ts (at once when its link closes or its page says it is frozen; after a
// silence measured against the swarm's load otherwise); listeners hear about every change.
// Workers reach it over a data channel, or through the server's relay (its socket is open while
// the swarm is, registered with the token).
import { Peer } from 'peerjs';
import type { DataConnectionLike, Transport } from '../core/net/channel.ts';
import { Silences, watchHeartbeats, type Death } from '../core/net/heartbeat.ts';
import type { Link } from '../core/net/link.ts';
import {
  connectRelay,
  newPeerId,
  openLink,
  peerOptions,
  registerPeer,
  signalingOptions,
  stayRegistered,
  type SignalingOptions,
} from '../core/net/peer-link.ts';
import {
  admitWorker,
  dialProven,
  JOIN_STEP_TIMEOUT_MS,
  joinMetadata,
  refuseJoin,
  type JoinMetadata,
} from '../core/net/join.ts';
import {
  askPresence,
  obtainSwarmKeys,
  registerCoordinator,
  renewSwarmKeys,
  revokeJoinToken,
  workerLink,
  type SwarmKeys,
} from '../core/net/join-token.ts';
import { COORDINATOR } from '../core/net/protocol.ts';
import type { RelayClient } from '../core/net/relay-client.ts';
import { askTurn, dashboardIceRequest, linkTransport, turnSignaling } from '../core/net/turn.ts';
import { passing } from '../core/net/check.ts';
import { remote } from '../core/net/rpc.ts';
import {
  BROWSER_ID_KEY,
  checkPulse,
  WORKER_CONTRACT,
  type ExecutionProvider,
  type WorkerInfo,
  type WorkerPulse,
  type WorkerRemote,
} from '../core/worker-api.ts';
import { lacksProbe, measureWorker, withEpMeasured, type WorkerMeasurement } from './measure.ts';
import { Emitter } from '../core/events.ts';
import { Accusations } from './accusations.ts';
import { Measurements } from './measurements.ts';

const DESCRIBE_TIMEOUT_MS = 15_000;
/** what a page may send before it has described itself: its describe reply is a few hundred bytes */
export const UNDESCRIBED_MAX_MESSAGE_BYTES = 64 * 1024;
/** what a worker may send in one message (a tile of video frames, a rank's rows) */
const MAX_MESSAGE_BYTES = 1 << 26;
/** refused pages remembered for the dashboard */
export const MAX_REFUSALS = 100;
/** How long a refused page's link stays open after the refusal is sent, so that the page reads why. */
export const REFUSAL_CLOSE_MS = 5_000;
/**
 * pages in the middle of joining at once: a page whose dial proved the token but whose channel
 * never opens holds a peer connection until let go, and a browser holds a few hundred. A dial
 * without that proof takes no place: it is closed at once.
 */
export const MAX_JOINING = 16;
const RELAY_RECONNECT_MS = 2_000;
/**
 * How long a page's engine has to answer pingEngine before a placement: behind the calls queued
 * before it (a released job's last stage), which on a slow machine take tens of seconds.
 */
export const ENGINE_CHECK_MS = 60_000;
/**
 * ... and as it joins, when its engine has nothing queued unless it was let go mid-call: a joining page holds one of
 * MAX_JOINING places meanwhile
 */
export const JOIN_ENGINE_CHECK_MS = 15_000;

export interface SwarmWorker {
  id: string;
  info: WorkerInfo;
  /** its WorkerApi: every reply checked against the contract */
  api: WorkerRemote;
  link: Link;
  joinedAt: number;
  /** what the executor is doing with it, for the dashboard; null while it does nothing with it */
  activity: string | null;
  pulse: WorkerPulse | null;
  /** bad frames this side dropped from it */
  framesDropped: number;
  /** its measured throughput and link, once the probe at join has finished */
  measurement: WorkerMeasurement | null;
  /** how its link to this dashboard goes: a data channel, or through the server's relay */
  transport: Transport;
}

export type SwarmEvent =
  | { type: 'join' | 'update'; worker: SwarmWorker }
  | {
      type: 'leave';
      worker: SwarmWorker;
      reason: string;
      at: number;
      silentMs: number;
      /** let go for wrong results: what it computed before is not to be trusted either */
      banned?: boolean;
    }
  | { type: 'refused'; peer: string; reason: string };

/**
 * What a dashboard keeps across reloads: its swarm's keys (its PeerJS id is new each load); and,
 * opened from another machine than the server's, the server's owner key, for new keys.
 */
export type SwarmIdentity = Partial<SwarmKeys> & { ownerKey?: string };

export class Swarm {
  private readonly roster = new Map<string, SwarmWorker>();
  /** measurements under way, by worker id */
  private readonly measuring = new Map<string, Promise<void>>();
  /**
   * Compute probes under way, by what they measure (issue 66): a worker's browser and its share of the cores. A tab
   * beside it of the same browser with the same share computes on the same cores as fast: it waits for that probe
   * instead of taking its own turn at the machine's probes. Once taken, a probe is kept in `measurements`.
   */
  private readonly computeOn = new Map<string, Promise<WorkerMeasurement['compute']>>();
  /** the last measurement begun of a worker on each machine (WorkerInfo.machine), which the next one waits for */
  private readonly measuringOn = new Map<string, Promise<unknown>>();
  /**
   * What this swarm's workers were measured at, by browser where they say one: a tab that reloads and joins again
   * finds its compute probe and its groups' rehearsals known (and a dashboard that keeps them, after its reload)
   */
  readonly measurements = new Measurements();
  private readonly connections = new Map<string, DataConnectionLike>();
  private readonly events = new Emitter<SwarmEvent>((error) => {
    console.error('swarm listener failed', error);
  });
  /** the last MAX_REFUSALS pages refused, newest last */
  readonly refusals: { peer: string; reason: string; at: number }[] = [];
  /** identities (Swarm.identityOf) and peer ids of pages let go for lying, and why: not admitted again */
  private readonly banned = new Map<string, string>();
  /** the identities the user marked trusted on the dashboard */
  private readonly markedTrusted = new Set<string>();
  /** one worker's word against another's, across jobs: the rule that decides who is set aside or banned */
  readonly accusations = new Accusations();
  /** this dashboard's own browser id: its worker tabs are this machine's, trusted (read when asked: made by a tab) */
  ownBrowser: () => string | null = ownBrowserId;
  /** pages between their dial and their describe reply */
  private joining = 0;
  /** the workers' silences: one machine's load shows in all of them (core/net/heartbeat.ts) */
  private readonly silences = new Silences();
  private relay: RelayClient | null = null;
  private closed = false;

  private constructor(
    private peer: Peer,
    readonly origin: string,
    private keys: SwarmKeys,
    private readonly signaling: SignalingOptions,
  ) {
    this.listen(peer);
  }

  private listen(peer: Peer): void {
    peer.on('connection', (conn) => void this.admit(conn as unknown as DataConnectionLike));
    // a dashboard in a background tab its browser froze is dropped by the signaling server too
    stayRegistered(peer, () => this.closed || this.peer !== peer);
  }

  /**
   * Registers this dashboard with the signaling server of `origin` under a fresh id (nobody can
   * hold it in wait for a reload), and tells the server that id for the swarm of `identity`'s
   * keys where it still stands by them, else of new ones: its workers find it by the server.
   */
  static async open(origin: string, identity: SwarmIdentity = {}): Promise<Swarm> {
    const signaling = await signalingOptions(origin);
    // the keys first: they prove this page is the swarm's dashboard, to be given TURN credentials for its peer
    const keys = await obtainSwarmKeys(origin, identity);
    const peer = await registerCoordinatorPeer(origin, signaling, keys);
    try {
      await registerCoordinator(origin, keys, peer.id, peer.options.token ?? '');
    } catch (e) {
      peer.destroy();
      throw e;
    }
    const swarm = new Swarm(peer, origin, keys, signaling);
    if (signaling.relay.mode === 'off') return swarm;
    try {
      await swarm.openRelay();
    } catch (e) {
      if (signaling.relay.mode === 'force') {
        swarm.close();
        throw new Error(`the server at ${origin} sends every link through its relay, but ${(e as Error).message}`, {
          cause: e,
        });
      }
      // without it only the workers whose data channels open can join
      console.warn(`no relay: ${(e as Error).message}`);
      swarm.reopenRelay();
    }
    return swarm;
  }

  get id(): string {
    return this.peer.id;
  }

  /** the join token every worker must prove it holds (it is in joinUrl's fragment) */
  get token(): string {
    return this.keys.token;
  }

  /** what the page keeps to open this swarm again after a reload */
  get identity(): SwarmKeys {
    return { ...this.keys };
  }

  /**
   * Revokes the join link (it went where it should not): the server gives a new one, the old one
   * opens nothing again (the relay lets its pages go), and every worker that joined with it is let
   * go — whoever holds the new link joins again. The dashboard moves to a fresh id: whoever
   * learnt the old one with the old link neither finds nor dials it.
   */
  async revokeJoinLink(): Promise<void> {
    const [old, joined, oldPeer] = [this.keys, this.workers(), this.peer];
    const keys = await renewSwarmKeys(this.origin, old);
    const peer = await registerCoordinatorPeer(this.origin, this.signaling, keys);
    try {
      await registerCoordinator(this.origin, keys, peer.id, peer.options.token ?? '');
    } catch (e) {
      peer.destroy();
      throw e;
    }
    [this.keys, this.peer] = [keys, peer];
    this.listen(peer);
    this.relay?.close('the join link was revoked'); // reopened with the new token and id
    await revokeJoinToken(this.origin, old);
    for (const worker of joined) this.evict(worker, 'the join link it joined with was revoked');
    oldPeer.destroy();
  }

  /** 'force' when the server sends every link through its relay. */
  get relayMode(): SignalingOptions['relay']['mode'] {
    return this.signaling.relay.mode;
  }

  // The relay socket lives as long as the swarm: workers that cannot reach this page directly come through it.
  private async openRelay(): Promise<void> {
    const auth = this.peer.options.token ?? '';
    const relay = await connectRelay(this.origin, this.signaling, {
      peer: this.peer.id,
      auth,
      token: this.keys.token,
      role: 'coordinator',
    });
    this.relay = relay;
    relay.onConnection((conn) => void this.admit(conn));
    relay.onClose((reason) => {
      if (!this.closed) console.warn(`relay socket lost (${reason}); reconnecting`);
      this.reopenRelay();
    });
  }

  private reopenRelay(): void {
    if (this.closed) return;
    setTimeout(() => {
      if (this.closed) return;
      this.openRelay().catch((e: unknown) => {
        console.warn(`relay: ${(e as Error).message}`);
        this.reopenRelay();
      });
    }, RELAY_RECONNECT_MS);
  }

  /**
   * The link a worker opens to join this swarm, at this page's origin (tabs of this machine: a secure context there).
   */
  get joinUrl(): string {
    return this.joinUrlAt(this.origin);
  }

  /**
   * The link other machines open: at the server's LAN address where this page was opened at
   * localhost (a localhost link means nothing elsewhere), else the same as joinUrl.
   */
  get lanJoinUrl(): string {
    const local = ['localhost', '127.0.0.1', '[::1]'].includes(new URL(this.origin).hostname);
    const [lan] = this.signaling.lanOrigins;
    return local && lan ? this.joinUrlAt(lan) : this.joinUrl;
  }

  private joinUrlAt(origin: string): string {
    // at the server's own https names, the link names its CA: a worker process pins it (a browser trusts it once);
    // elsewhere (a proxy in front with a certificate of its own) the CA is not what a worker meets
    const { ca, lanOrigins } = this.signaling;
    return workerLink(origin, this.token, ca && lanOrigins.includes(origin) ? ca.fingerprint : null);
  }

  workers(): SwarmWorker[] {
    return [...this.roster.values()].sort((a, b) => a.joinedAt - b.joinedAt);
  }

  /** How long a worker may be silent now, as its heartbeats are judged: longer when the machine is busy. */
  silenceLimitMs(): number {
    return this.silences.limitMs(Date.now());
  }

  on(listener: (e: SwarmEvent) => void): () => void {
    return this.events.on(listener);
  }

  setActivity(worker: SwarmWorker, activity: string | null): void {
    worker.activity = activity;
    this.emit({ type: 'update', worker });
  }

  /**
   * Disconnects a worker (it misbehaved, or the executor gave up on it). `ban`: it was convicted of
   * lying, and neither its page nor its browser is admitted again: a page that joins again under a
   * new peer id keeps its browser's id. The dashboard's own browser is banned by page only (its
   * other tabs are this machine's).
   */
  evict(worker: SwarmWorker, reason: string, { ban = false } = {}): void {
    if (ban) {
      for (const key of new Set([`peer:${worker.id}`, this.identityOf(worker)])) this.ban(key, reason);
      this.accusations.convict(this.identityOf(worker)); // its words against others are void
    }
    const conn = this.connections.get(worker.id);
    this.drop(worker, reason, 0, ban);
    conn?.close();
  }

  /**
   * Who a worker is across its pages' joins, for bans and the record of accusations: its browser's
   * id where it has one that is not this dashboard's own browser's, else its peer id.
   */
  identityOf(worker: Pick<SwarmWorker, 'id' | 'info'>): string {
    const { browser } = worker.info;
    return browser && browser !== this.ownBrowser() ? `browser:${browser}` : `peer:${worker.id}`;
  }

  /** Whether the worker is a tab of this dashboard's own browser: this machine's, trusted whatever the user marks. */
  isThisMachine(worker: Pick<SwarmWorker, 'info'>): boolean {
    const own = this.ownBrowser();
    return own !== null && worker.info.browser === own;
  }

  /** Trusted workers: the tabs of this dashboard's own browser, and those the user marked trusted. */
  isTrusted(worker: Pick<SwarmWorker, 'id' | 'info'>): boolean {
    return this.isThisMachine(worker) || this.markedTrusted.has(this.identityOf(worker));
  }

  /** Whether the record of accusations set the worker aside for the current job (the placer places without it). */
  isSetAside(worker: Pick<SwarmWorker, 'id' | 'info'>): boolean {
    return this.accusations.isSetAside(this.identityOf(worker));
  }

  /** The user marks a worker (its browser, where it has one) trusted, or no longer. */
  markTrusted(worker: Pick<SwarmWorker, 'id' | 'info'>, trusted: boolean): void {
    const key = this.identityOf(worker);
    if (trusted) this.markedTrusted.add(key);
    else this.markedTrusted.delete(key);
    const live = this.roster.get(worker.id);
    if (live) this.emit({ type: 'update', worker: live });
  }

  /** Why a page of this peer id (and browser, as it says) may not join, or null. */
  bannedReason(peer: string, browser: string | undefined): string | null {
    const reason =
      this.banned.get(`peer:${peer}`) ??
      (browser && browser !== this.ownBrowser() ? this.banned.get(`browser:${browser}`) : undefined);
    return reason === undefined ? null : `it was banned from this swarm for lying (${reason})`;
  }

  private ban(key: string, reason: string): void {
    this.banned.delete(key);
    this.banned.set(key, reason);
    const oldest = this.banned.keys().next();
    if (this.banned.size > MAX_REFUSALS && !oldest.done) this.banned.delete(oldest.value);
  }

  /**
   * Once each worker's measurement is for the threads it has now, and covers `ep` where a job asks for one: a worker
   * whose share of its machine's cores changed (its heartbeat says so) since it was measured is measured again, one
   * with a software WebGPU adapter is probed on it for a WebGPU job (measure.ts), and one being measured is waited
   * for. A worker's first measurement is not waited for.
   */
  async measuredNow(ep: ExecutionProvider | 'auto' = 'auto'): Promise<void> {
    await Promise.all(
      this.workers()
        .filter((w) => w.measurement)
        .map((w) => this.measure(w, ep)),
    );
  }

  /** Once every joined worker has its first measurement (what estimates predict from), or after `timeoutMs`. */
  allMeasured(timeoutMs: number): Promise<void> {
    return new Promise((resolve) => {
      const finish = () => {
        off();
        clearTimeout(timer);
        resolve();
      };
      const check = () => this.workers().every((w) => w.measurement) && finish();
      const off = this.on(check);
      const timer = setTimeout(finish, timeoutMs);
      check();
    });
  }

  /**
   * Measures a worker (coordinator/measure.ts) unless its measurement is for the threads it has now and covers `ep`;
   * one measurement of a worker at a time (one asked for during another waits for it, then measures what it lacks).
   */
  private measure(w: SwarmWorker, ep: ExecutionProvider | 'auto' = 'auto'): Promise<void> {
    const running = this.measuring.get(w.id);
    if (running) return ep === 'auto' ? running : running.then(() => this.measure(w, ep));
    const last = w.measurement;
    const current = last?.threads === w.info.threads ? last : null;
    if (current && (ep === 'auto' || !lacksProbe(w.info, current, ep))) return Promise.resolve();
    const run = (current ? Promise.resolve(current) : this.measureCompute(w))
      .then((m) => (ep === 'auto' ? m : withEpMeasured(w, m, ep)))
      .then(
        (m) => {
          w.measurement = m;
          if (this.roster.has(w.id)) this.emit({ type: 'update', worker: w });
        },
        (e: unknown) => console.warn(`could not measure worker ${w.id}: ${(e as Error).message}`),
      )
      .finally(() => this.measuring.delete(w.id));
    this.measuring.set(w.id, run);
    return run;
  }

  /**
   * A worker's measurement, from the compute probes known for its browser and share (measurements), or under way for
   * another tab of them (computeOn), where there are: its link is measured all the same.
   */
  private measureCompute(w: SwarmWorker): Promise<WorkerMeasurement> {
    const { browser, threads } = w.info;
    if (browser === undefined) return this.oneOnItsMachine(w, () => measureWorker(w));
    const key = `${browser} on ${threads}`;
    const known = this.measurements.computeOf(browser, threads);
    const kept = this.computeOn.get(key) ?? (known && Promise.resolve(known));
    const measured = this.oneOnItsMachine(w, () => measureWorker(w, undefined, kept));
    if (!kept) {
      const compute = measured.then((m) => m.compute);
      this.computeOn.set(key, compute);
      // a probe that failed is no measurement: the next worker of that browser takes its own
      void compute
        .then((probes) => this.measurements.setCompute(browser, threads, probes))
        .catch(() => undefined)
        .finally(() => {
          if (this.computeOn.get(key) === compute) this.computeOn.delete(key);
        });
    }
    return measured;
  }

  /**
   * Runs `measure` once the measurements begun before it of workers on `w`'s machine are done: each probe then has its
   * machine's cores to itself, beside the other browsers' tabs there as the tabs of one browser already are (their
   * probes take turns under a Web Lock), which is what the cost model takes a probe for (cost-model.ts coreShares).
   */
  private oneOnItsMachine<T>(w: SwarmWorker, measure: () => Promise<T>): Promise<T> {
    const { machine } = w.info;
    const run = (this.measuringOn.get(machine) ?? Promise.resolve()).then(measure);
    const done = run.catch(() => undefined);
    this.measuringOn.set(machine, done);
    void done.then(() => {
      if (this.measuringOn.get(machine) === done) this.measuringOn.delete(machine);
    });
    return run;
  }

  /** Resolves once `count` workers are live, or rejects after the timeout saying how many joined. */
  waitForWorkers(count: number, timeoutMs: number): Promise<SwarmWorker[]> {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (this.roster.size < count) return false;
        off();
        clearTimeout(timer);
        resolve(this.workers().slice(0, count));
        return true;
      };
      const off = this.on(() => check());
      const timer = setTimeout(() => {
        off();
        reject(
          new Error(
            `${this.roster.size} worker${this.roster.size === 1 ? '' : 's'} joined within ` +
              `${+(timeoutMs / 1000).toFixed(1)} s but ${count} ${count === 1 ? 'is' : 'are'} needed: ` +
              `open ${this.joinUrl} in ${count - this.roster.size} more tab(s) or machine(s)`,
          ),
        );
      }, timeoutMs);
      check();
    });
  }

  close(): void {
    this.closed = true;
    for (const conn of this.connections.values()) conn.close();
    this.roster.clear();
    this.relay?.close('the dashboard closed');
    this.peer.destroy();
  }

  private emit(e: SwarmEvent): void {
    this.events.emit(e);
  }

  private drop(worker: SwarmWorker, reason: string, silentMs: number, banned = false): void {
    worker.api.failAll?.(`worker ${worker.id} is gone: ${reason}`);
    worker.link.close(reason);
    // a worker that re-joined (through the relay, say) under the same id is another entry: leave it be
    if (this.roster.get(worker.id) !== worker) return;
    this.connections.delete(worker.id);
    this.roster.delete(worker.id);
    this.emit({ type: 'leave', worker, reason, at: Date.now(), silentMs, banned });
  }

  /**
   * Health checks that go through the engine (ping does not): every live worker's engine answers
   * pingEngine, after its measurement at join if that is under way; a worker whose engine does not
   * is let go — it would hold a placement, a text encoding or a decode for the length of a load.
   * How many were let go.
   */
  async letGoHungEngines(): Promise<number> {
    const hung = await Promise.all(
      this.workers().map(async (w) => {
        await this.measuring.get(w.id);
        return [w, await engineHangs(w.api, ENGINE_CHECK_MS)] as const;
      }),
    );
    let letGo = 0;
    for (const [w, why] of hung) {
      if (!why || this.roster.get(w.id) !== w) continue;
      this.evict(w, why);
      letGo++;
    }
    return letGo;
  }

  private refuse(conn: DataConnectionLike, reason: string): void {
    this.refusals.push({ peer: conn.peer, reason, at: Date.now() });
    if (this.refusals.length > MAX_REFUSALS) this.refusals.shift();
    this.emit({ type: 'refused', peer: conn.peer, reason });
    // let the refusal reach the page first: on a loaded machine half a second was not always enough, and the page then
    // said only that the dashboard did not answer its handshake
    setTimeout(() => conn.close(), REFUSAL_CLOSE_MS);
  }

  private async admit(conn: DataConnectionLike): Promise<void> {
    const meta = joinMetadata(conn.metadata);
    const ids = { coordinator: this.id, worker: conn.peer };
    if (!meta || !dialProven(this.keys.token, ids, meta) || this.joining >= MAX_JOINING) {
      conn.close();
      return;
    }
    this.joining++;
    try {
      await this.join(conn, meta);
    } finally {
      this.joining--;
    }
  }

  private async join(conn: DataConnectionLike, meta: JoinMetadata): Promise<void> {
    let worker: SwarmWorker | null = null;
    let api: WorkerRemote | null = null;
    // a page sends nothing large before it has said what it is: nothing to reserve memory for
    let maxMessageBytes = UNDESCRIBED_MAX_MESSAGE_BYTES;
    try {
      const link = await openLink(
        conn,
        (reason) => {
          if (worker) this.drop(worker, reason, Date.now() - link.lastHeardAt);
          else api?.failAll?.(reason);
        },
        {
          accept: (h) =>
            h.kind !== 'rpc'
              ? 'a worker may only send RPC messages to the coordinator'
              : h.totalBytes > maxMessageBytes
                ? 'reply too large'
                : null,
          // a worker whose data channel is slow to open dials through the relay too: this one need not wait long
          openTimeoutMs: conn.open ? undefined : JOIN_STEP_TIMEOUT_MS,
        },
      );
      // a banned page is told so (its page shows why), not left to time out in the handshake
      const banned = this.bannedReason(conn.peer, meta.browser);
      if (banned) await refuseJoin(link, banned);
      const refusal =
        banned ?? (await admitWorker(link, this.keys.token, { coordinator: this.id, worker: conn.peer }, meta));
      if (refusal) {
        this.refuse(conn, refusal);
        return;
      }
      api = remote(link, COORDINATOR, WORKER_CONTRACT, `worker ${conn.peer}`);
      const info = await api.describe({}, DESCRIBE_TIMEOUT_MS);
      // its browser as it describes itself, where its dial did not say (or said another)
      const bannedBrowser = this.bannedReason(conn.peer, info.browser);
      if (bannedBrowser) {
        this.refuse(conn, bannedBrowser);
        return;
      }
      // a page whose engine hangs (let go for it, and dialling again) joins once its engine answers
      const hung = await engineHangs(api, JOIN_ENGINE_CHECK_MS);
      if (hung) {
        this.refuse(conn, hung);
        return;
      }
      const previous = this.roster.get(conn.peer);
      if (previous) this.evict(previous, 'it joined again over a new connection');
      this.connections.set(conn.peer, conn);
      maxMessageBytes = MAX_MESSAGE_BYTES;
      const joined: SwarmWorker = {
        id: conn.peer,
        info,
        api,
        link,
        joinedAt: Date.now(),
        activity: null,
        pulse: null,
        framesDropped: 0,
        transport: await linkTransport(conn),
        measurement: null,
      };
      worker = joined;
      this.roster.set(joined.id, joined);
      watchHeartbeats(
        link,
        COORDINATOR,
        {
          onDead: (death) => {
            // gone of its own accord (its page said so, its link closed) is not silence: it is not counted as such
            this.drop(joined, deathReason(death), death.cause === 'silent' ? death.silentMs : 0);
            conn.close();
          },
          // a page starved of CPU keeps its signaling socket; a closed or crashed one's closes at once
          present: () => askPresence(this.origin, this.keys, joined.id),
          onPulse: (sent) => {
            const pulse = passing(checkPulse, sent, 'pulse');
            // a malformed pulse says nothing; the link's silence or the job's calls judge its sender
            if (!pulse) return;
            const before: WorkerPulse | null = joined.pulse;
            const changed =
              before?.state !== pulse.state ||
              before.framesDropped !== pulse.framesDropped ||
              joined.framesDropped !== link.stats.framesDropped ||
              JSON.stringify(before.mesh) !== JSON.stringify(pulse.mesh) ||
              before.load?.bytes !== pulse.load?.bytes;
            joined.pulse = pulse;
            joined.framesDropped = link.stats.framesDropped;
            if (changed) this.emit({ type: 'update', worker: joined });
            // a worker tab opened or closed beside it: its new share shows, and it is measured again
            // now if it has nothing to do, else before the next job is planned
            const { threads } = pulse;
            if (threads !== undefined && Number.isInteger(threads) && threads >= 1 && threads !== joined.info.threads) {
              joined.info = { ...joined.info, threads };
              this.emit({ type: 'update', worker: joined });
              if (joined.activity === null && joined.measurement) void this.measure(joined);
            }
            // its user changed what the model may take on it: the next placement's stages are cut by it
            const { modelMemoryGiB } = pulse;
            if (modelMemoryGiB !== undefined && modelMemoryGiB !== (joined.info.modelMemoryGiB ?? null)) {
              const { modelMemoryGiB: _was, ...info } = joined.info;
              joined.info = modelMemoryGiB === null ? info : { ...info, modelMemoryGiB };
              this.emit({ type: 'update', worker: joined });
            }
          },
        },
        { silences: this.silences },
      );
      this.emit({ type: 'join', worker: joined });
      // what the planner and the swarm view need: measured at join, and again when its share of the cores changes
      void this.measure(joined);
    } catch (e) {
      console.warn(`worker ${conn.peer} could not join: ${(e as Error).message}`);
      conn.close();
    }
  }
}

/**
 * A dashboard's PeerJS peer under a fresh id (nobody can hold it in wait), registered with the
 * signaling server, with TURN credentials for that id where the server gives them (`keys` prove
 * it is this swarm's dashboard).
 */
async function registerCoordinatorPeer(origin: string, signaling: SignalingOptions, keys: SwarmKeys): Promise<Peer> {
  const id = newPeerId('coordinator');
  const turn = await turnSignaling(signaling, () => askTurn(origin, dashboardIceRequest(keys, id)));
  const peer = await registerPeer(
    // PeerJS types its plain options object as a class
    // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- a plain object
    () => new Peer(id, peerOptions(turn.signaling)),
    origin,
  );
  turn.keepFresh(peer);
  return peer;
}

/** Why a worker's engine is not to be trusted with work (it did not answer pingEngine within `ms`), or null. */
async function engineHangs(api: Pick<WorkerRemote, 'pingEngine'>, ms: number): Promise<string | null> {
  try {
    await api.pingEngine({}, ms);
    return null;
  } catch (e) {
    return (
      `its engine did not answer within ${ms / 1000} s (${(e as Error).message}): it hangs or is still busy; ` +
      'it may join again once it answers, or reload the page'
    );
  }
}

/** Why the heartbeats found a worker dead, in the words the swarm's events carry. */
function deathReason({ cause, silentMs, limitMs }: Death): string {
  const s = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
  switch (cause) {
    case 'closed':
      return `its link closed after ${s(silentMs)} without an answer (tab closed or crashed)`;
    case 'frozen':
      return 'its browser froze its page (a hidden tab frozen to save power); its work is placed elsewhere';
    case 'silent':
      return `no answer for ${s(silentMs)}, past its limit of ${s(limitMs)} (tab crashed, frozen or hung)`;
  }
}

/** This browser's id (worker/cores.ts keeps it for its worker tabs), where this page can read one. */
function ownBrowserId(): string | null {
  try {
    return typeof localStorage === 'undefined' ? null : localStorage.getItem(BROWSER_ID_KEY);
  } catch {
    return null;
  }
}
