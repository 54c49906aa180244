import { Peer, type DataConnection } from 'peerjs';
import type { Link } from '../core/link.ts';
import { newPeerId, openLink, signalingOptions, type DataConnectionLike } from '../core/peer-link.ts';
import { COORDINATOR } from '../core/protocol.ts';
import { RpcClient } from '../core/rpc.ts';
import type { WorkerInfo } from '../worker/runtime.ts';

/**
 * The dashboard's view of the swarm: its PeerJS peer, and a roster of the worker pages that
 * joined (each with a link, an RPC client and what it said about itself). Workers come and go;
 * listeners hear about every change.
 */
const DESCRIBE_TIMEOUT_MS = 15_000;

export interface SwarmWorker {
  id: string;
  info: WorkerInfo;
  rpc: RpcClient;
  link: Link;
  joinedAt: number;
  /** what the executor is doing with it, for the dashboard */
  activity: string;
}

export type SwarmEvent = { type: 'join' | 'leave' | 'update'; worker: SwarmWorker };

export class Swarm {
  private readonly roster = new Map<string, SwarmWorker>();
  private readonly listeners = new Set<(e: SwarmEvent) => void>();

  private constructor(
    private readonly peer: Peer,
    readonly origin: string,
  ) {
    peer.on('connection', (conn) => void this.admit(conn));
  }

  /** Registers this dashboard with the signaling server of `origin`. */
  static async open(origin: string): Promise<Swarm> {
    const signaling = await signalingOptions(origin);
    const peer = new Peer(newPeerId('coordinator'), { ...signaling, config: { iceServers: [] }, debug: 1 });
    await new Promise<void>((resolve, reject) => {
      peer.once('open', () => resolve());
      peer.once('error', (e) => reject(new Error(`could not reach the signaling server at ${origin}: ${e.message}`)));
    });
    return new Swarm(peer, origin);
  }

  get id(): string {
    return this.peer.id;
  }

  /** The link other machines open to join this swarm. */
  get joinUrl(): string {
    return `${this.origin}/worker.html?swarm=${encodeURIComponent(this.id)}`;
  }

  workers(): SwarmWorker[] {
    return [...this.roster.values()].sort((a, b) => a.joinedAt - b.joinedAt);
  }

  on(listener: (e: SwarmEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  setActivity(worker: SwarmWorker, activity: string): void {
    worker.activity = activity;
    this.emit({ type: 'update', worker });
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
        reject(new Error(`${this.roster.size} worker${this.roster.size === 1 ? '' : 's'} joined within ${+(timeoutMs / 1000).toFixed(1)} s but ${count} ${count === 1 ? 'is' : 'are'} needed: open ${this.joinUrl} in ${count - this.roster.size} more tab(s) or machine(s)`));
      }, timeoutMs);
      check();
    });
  }

  close(): void {
    for (const w of this.roster.values()) w.link.close('the dashboard closed the swarm');
    this.roster.clear();
    this.peer.destroy();
  }

  private emit(e: SwarmEvent): void {
    for (const listener of this.listeners) {
      try {
        listener(e);
      } catch (error) {
        console.error('swarm listener failed', error);
      }
    }
  }

  private async admit(conn: DataConnection): Promise<void> {
    if ((conn.metadata as { role?: string } | undefined)?.role !== 'worker') return conn.close();
    let worker: SwarmWorker | null = null;
    let rpc: RpcClient | null = null;
    try {
      const link = await openLink(
        conn as unknown as DataConnectionLike,
        (reason) => {
          rpc?.failAll(`worker ${conn.peer} is gone: ${reason}`);
          if (worker && this.roster.delete(worker.id)) this.emit({ type: 'leave', worker });
        },
        { accept: (h) => (h.kind !== 'rpc' ? 'a worker may only send RPC messages to the coordinator' : null) },
      );
      rpc = new RpcClient(link, COORDINATOR);
      const info = await rpc.call<WorkerInfo>('describe', {}, DESCRIBE_TIMEOUT_MS);
      worker = { id: conn.peer, info, rpc, link, joinedAt: Date.now(), activity: 'idle' };
      this.roster.set(worker.id, worker);
      this.emit({ type: 'join', worker });
    } catch (e) {
      console.warn(`worker ${conn.peer} could not join: ${(e as Error).message}`);
      conn.close();
    }
  }
}
