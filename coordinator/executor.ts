import type { WanConfig } from '../core/model/config.ts';
import { patchify, tokenGrid, unpatchify } from '../core/model/tokens.ts';
import { gatherRows, planUlysses, scatterRows } from '../core/parallel.ts';
import type { Transport } from '../core/net/channel.ts';
import type { DType } from '../core/net/protocol.ts';
import { RpcTimeout } from '../core/net/rpc.ts';
import type { Tensor } from '../core/tensor.ts';
import type { ExecutionProvider } from '../rank/onnx-stages.ts';
import type { MeshProbe } from '../rank/mesh-probe.ts';
import type { ExecuteArgs, ExecuteResult, WorkerInfo } from '../rank/runtime.ts';

/**
 * The executor interface of the seed (vLLM-style): the base class owns the lifecycle — placement,
 * init and load on every rank, collective RPC with timeouts, one DiT forward split across ranks,
 * graceful shutdown — and a backend only says how to reach rank r.
 */
export interface ExecutorOptions {
  config: WanConfig;
  /** URL of the model folder as the workers fetch it */
  modelUrl: string;
  /** Ulysses degree (of each group with cfgParallel); 'auto' takes the largest the live workers allow */
  ulyssesDegree?: number | 'auto';
  /**
   * CFG parallel: ranks [0, P) run the conditional pass and ranks [P, 2P) the unconditional one,
   * each group a Ulysses mesh of its own (world = 2P), so a step's two passes run at the same time.
   */
  cfgParallel?: boolean;
  placementTimeoutMs?: number;
  rpcTimeoutMs?: number;
  ep?: ExecutionProvider | 'auto';
  /** how activations travel between ranks: float32 (exact), or float16 (half the bytes) */
  dtype?: DType;
}

export interface RpcOptions {
  args?: unknown;
  /** per-rank arguments, instead of the same `args` for all */
  argsFor?: (rank: number) => unknown;
  timeoutMs?: number;
  /** return only this rank's reply */
  uniqueReplyRank?: number;
  /** call only these ranks (replies in this order); all ranks by default */
  ranks?: number[];
}

export interface RankReport {
  rank: number;
  worker: string;
  computeMs: number;
  commMs: number;
  bytesSent: number;
}

/** One link of the running ranks: the coordinator's to a rank, or one between two ranks (`from` > `to`). */
export interface LinkReport {
  from: 'coordinator' | number;
  to: number;
  /** a data channel, or through the server's relay; 'unknown' until the rank has said */
  transport: Transport | 'unknown';
}

export interface ForwardRequest {
  job: number;
  step: number;
  pass: number;
  timestep: number;
  latent: Tensor; // [C, T, H, W]
}

/** Some ranks did not answer in time. */
export class TimeoutError extends Error {
  override name = 'TimeoutError';
  constructor(
    readonly method: string,
    readonly silentRanks: number[],
    timeoutMs: number,
  ) {
    super(`${method} timed out after ${timeoutMs} ms waiting for rank${silentRanks.length > 1 ? 's' : ''} ${silentRanks.join(', ')}`);
  }
}

/** A rank's method threw; the message is the rank's own error text. */
export class WorkerError extends Error {
  override name = 'WorkerError';
  constructor(
    readonly rank: number,
    readonly method: string,
    readonly remoteMessage: string,
  ) {
    super(`rank ${rank} failed in ${method}: ${remoteMessage}`);
  }
}

export type FailureListener = (error: Error) => void;

/** A rank the executor let go, and how its loss was noticed. */
export interface LostRank {
  rank: number;
  worker: string;
  reason: string;
  /** how long it had been silent when it was declared lost */
  silentMs: number;
}

export abstract class Executor {
  /** number of ranks after initialize() */
  world = 0;
  /** what each rank said about itself, in rank order */
  workers: (WorkerInfo & { id: string })[] = [];
  protected readonly failureListeners = new Set<FailureListener>();
  private closed = false;

  constructor(readonly options: ExecutorOptions) {}

  /** Chooses and reserves the ranks; returns their peer ids in rank order. */
  protected abstract place(): Promise<string[]>;
  /** Calls one rank's method; rejects with RpcTimeout or the remote error. */
  protected abstract callRank(rank: number, method: string, args: unknown, timeoutMs: number): Promise<unknown>;
  /** Closes the connections to the ranks (after the graceful part of shutdown). */
  protected abstract closeTransport(): void;

  get rpcTimeoutMs(): number {
    return this.options.rpcTimeoutMs ?? 120_000;
  }

  /** ranks per Ulysses mesh: the world, or half of it with CFG parallel */
  get groupSize(): number {
    return this.options.cfgParallel ? this.world / 2 : this.world;
  }

  /** The ranks of one group in rank order: group 0 runs pass 0 (conditional), group 1 pass 1. */
  groupRanks(group: number): number[] {
    return Array.from({ length: this.groupSize }, (_, i) => group * this.groupSize + i);
  }

  async initialize(): Promise<void> {
    const peers = await this.place();
    this.world = peers.length;
    if (this.options.cfgParallel && this.world % 2) throw new Error(`cfgParallel needs two groups of equal size, but ${this.world} ranks were placed`);
    const session = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
    const dtype = this.options.dtype ?? 'f32';
    // each group is its own mesh: ranks, world, peers and session are the group's
    const P = this.groupSize;
    await this.collectiveRpc('initWorker', {
      argsFor: (rank) => {
        const group = Math.floor(rank / P);
        return { rank: rank % P, world: P, peers: peers.slice(group * P, (group + 1) * P), session: this.options.cfgParallel ? `${session}.${group}` : session, dtype };
      },
    });
    const infos = (await this.collectiveRpc('describe')) as WorkerInfo[];
    const loaded = (await this.collectiveRpc('loadModel', { args: { modelUrl: this.options.modelUrl, ep: this.options.ep ?? 'auto' } })) as { ep: ExecutionProvider; adapter: string }[];
    this.workers = infos.map((info, rank) => ({ ...info, ...loaded[rank], id: peers[rank] }));
  }

  /** Runs a worker method on every rank: all replies in rank order, or only `uniqueReplyRank`'s. */
  async collectiveRpc(method: string, options: RpcOptions = {}): Promise<unknown> {
    if (this.world === 0) throw new Error(`${method} needs ranks: call initialize() first`);
    const only = options.uniqueReplyRank;
    // checked before any rank runs the method, so a bad call has no side effects on the workers
    if (only !== undefined && !(Number.isInteger(only) && only >= 0 && only < this.world)) {
      throw new Error(`uniqueReplyRank ${only} is not a rank of this ${this.world}-rank executor`);
    }
    const timeoutMs = options.timeoutMs ?? this.rpcTimeoutMs;
    const ranks = options.ranks ?? Array.from({ length: this.world }, (_, r) => r);
    // Fails fast on the first rank that errs (a lost rank must not leave the others' calls hanging);
    // timeouts all fall due together and are reported as one TimeoutError naming every silent rank.
    const replies = await new Promise<unknown[]>((resolve, reject) => {
      const results: unknown[] = [];
      const silent: number[] = [];
      let pending = ranks.length;
      const settle = () => {
        if (--pending > 0) return;
        if (silent.length) reject(new TimeoutError(method, silent.sort((a, b) => a - b), timeoutMs));
        else resolve(results);
      };
      ranks.forEach((rank, i) => {
        this.callRank(rank, method, options.argsFor ? options.argsFor(rank) : options.args ?? {}, timeoutMs).then(
          (value) => {
            results[i] = value;
            settle();
          },
          (reason: unknown) => {
            if (reason instanceof RpcTimeout) silent.push(rank);
            else reject(new WorkerError(rank, method, reason instanceof Error ? reason.message : String(reason)));
            settle();
          },
        );
      });
    });
    return only === undefined ? replies : replies[only];
  }

  /** Gives every rank the job's text embeddings (conditional, then unconditional) and latent shape. */
  async prepareJob(job: number, texts: Float32Array[], latentShape: number[]): Promise<void> {
    await this.collectiveRpc('prepareJob', { args: { job, texts, latentShape } });
  }

  /** Times an all-to-all on the ranks' mesh for the prepared job (rank/mesh-probe.ts): the link the cost model plans with. */
  async probeMesh(job: number): Promise<MeshProbe[]> {
    return (await this.collectiveRpc('probeMesh', { args: { job } })) as MeshProbe[];
  }

  /**
   * One DiT forward pass on the ranks of the pass (all, or the pass's group with CFG parallel):
   * scatter the tokens, run, gather the rows in token order.
   */
  async executeModel(request: ForwardRequest): Promise<{ output: Tensor; ranks: RankReport[] }> {
    const { config } = this.options;
    const plan = planUlysses(config, tokenGrid(config, request.latent.shape).count, this.groupSize);
    const patches = patchify(config, request.latent);
    const width = patches.shape[1];
    const ranks = this.groupRanks(this.options.cfgParallel ? request.pass : 0);
    const results = (await this.collectiveRpc('executeModel', {
      ranks,
      argsFor: (rank): ExecuteArgs => ({
        job: request.job,
        step: request.step,
        pass: request.pass,
        timestep: request.timestep,
        latentShape: request.latent.shape,
        patches: scatterRows(plan, patches.data, width, rank % plan.degree),
      }),
    })) as ExecuteResult[];
    const rows = gatherRows(plan, results.map((r) => r.rows), results[0].rows.length / plan.localTokens);
    return {
      output: unpatchify(config, rows, request.latent.shape),
      ranks: results.map((r, i) => ({ rank: ranks[i], worker: this.workers[ranks[i]]?.id ?? '', computeMs: r.computeMs, commMs: r.commMs, bytesSent: r.bytesSent })),
    };
  }

  /** Which links of the ranks are direct and which are relayed; ranks in one page (local) have none. */
  linkReport(): LinkReport[] {
    return [];
  }

  /**
   * After a failed call: which ranks are lost (gone, frozen or misbehaving) and were let go.
   * An empty list means the failure was not a lost rank, so retrying would not help.
   */
  async lostRanks(_error: Error): Promise<LostRank[]> {
    return [];
  }

  /** Pings every rank; rejects naming the silent ones. */
  async checkHealth(timeoutMs = 5_000): Promise<void> {
    await this.collectiveRpc('ping', { timeoutMs });
  }

  onFailure(listener: FailureListener): () => void {
    this.failureListeners.add(listener);
    return () => this.failureListeners.delete(listener);
  }

  protected reportFailure(error: Error): void {
    for (const listener of this.failureListeners) listener(error);
  }

  /** Asks every rank to stop, waits up to graceMs for their acks, then closes the connections. */
  async shutdown({ graceMs = 5_000 } = {}): Promise<{ acked: number[]; silent: number[] }> {
    if (this.closed) return { acked: [], silent: [] };
    this.closed = true;
    const ranks = Array.from({ length: this.world }, (_, r) => r);
    const acks = await Promise.allSettled(ranks.map((r) => this.callRank(r, 'shutdown', {}, graceMs)));
    this.closeTransport();
    return { acked: ranks.filter((r) => acks[r].status === 'fulfilled'), silent: ranks.filter((r) => acks[r].status === 'rejected') };
  }
}

/** Races a call against its timeout, rejecting with RpcTimeout. */
export function withTimeout<T>(work: Promise<T>, method: string, timeoutMs: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  const timeout = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new RpcTimeout(`${method} did not answer within ${timeoutMs} ms`)), timeoutMs)));
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}
