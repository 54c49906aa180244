import { checkDegree, defaultDegree } from '../core/parallel.ts';
import { Executor, WorkerError, type ExecutorOptions, type LinkReport, type LostRank } from './executor.ts';
import type { Swarm, SwarmWorker } from './swarm.ts';

/** Ranks on worker pages that joined the swarm over WebRTC. */
export class SwarmExecutor extends Executor {
  private ranks: SwarmWorker[] = [];
  private offLeave: (() => void) | null = null;
  /** ranks that left the swarm during this executor's life, with how it was noticed */
  private readonly lost = new Map<number, { reason: string; silentMs: number }>();

  constructor(
    options: ExecutorOptions,
    private readonly swarm: Swarm,
  ) {
    super(options);
  }

  protected async place(): Promise<string[]> {
    const { numHeads } = this.options.config;
    const timeoutMs = this.options.placementTimeoutMs ?? 30_000;
    const asked = this.options.ulyssesDegree ?? 'auto';
    // with CFG parallel two groups of `degree` workers each, on different workers
    const groups = this.options.cfgParallel ? 2 : 1;
    let degree: number;
    if (asked === 'auto') {
      await this.swarm.waitForWorkers(groups, timeoutMs);
      degree = defaultDegree(numHeads, Math.floor(this.swarm.workers().length / groups));
    } else {
      checkDegree(numHeads, asked);
      await this.swarm.waitForWorkers(groups * asked, timeoutMs);
      degree = asked;
    }
    const world = groups * degree;
    this.ranks = this.swarm.workers().slice(0, world);
    this.ranks.forEach((w, rank) => this.swarm.setActivity(w, `rank ${rank} of ${world}${groups > 1 ? ` (${rank < degree ? 'conditional' : 'unconditional'} group)` : ''}`));
    this.offLeave = this.swarm.on((e) => {
      if (e.type !== 'leave') return;
      const rank = this.ranks.indexOf(e.worker);
      if (rank < 0) return;
      this.lost.set(rank, { reason: e.reason, silentMs: e.silentMs });
      this.reportFailure(new Error(`rank ${rank} (worker ${e.worker.id}) is lost: ${e.reason}`));
    });
    return this.ranks.map((w) => w.id);
  }

  protected callRank(rank: number, method: string, args: unknown, timeoutMs: number): Promise<unknown> {
    const worker = this.ranks[rank];
    if (!worker) return Promise.reject(new Error(`no rank ${rank}: this executor has ${this.ranks.length} ranks`));
    if (method !== 'executeModel') return worker.rpc.call(method, args, timeoutMs);
    // what each rank is doing, for the dashboard's swarm view
    const { step, pass } = args as { step: number; pass: number };
    this.swarm.setActivity(worker, `rank ${rank}: step ${step + 1}${pass ? ' (unconditional)' : ''}`);
    return worker.rpc.call(method, args, timeoutMs).finally(() => this.swarm.setActivity(worker, `rank ${rank}: waiting`));
  }

  /**
   * A rank is lost if it left the swarm; if its peers lost their connection to it or caught it
   * sending in another rank's name (the rank is evicted: peers notice a closed tab before the
   * coordinator may); or if it does not answer a ping within two seconds (frozen: evicted).
   */
  override async lostRanks(error: Error): Promise<LostRank[]> {
    // a rank names its mesh peers by their rank in its group: with CFG parallel, offset by the group's first rank
    const groupStart = error instanceof WorkerError ? error.rank - (error.rank % this.groupSize) : 0;
    for (const [, named, what] of error.message.matchAll(/(?:misbehaving rank|rank) (\d+)(:| is gone)/g)) {
      const rank = groupStart + Number(named);
      const worker = this.ranks[rank];
      if (worker && !this.lost.has(rank)) {
        this.swarm.evict(worker, what === ':' ? `rank ${rank} sent tensors in another rank's name` : `its peers lost their connection to rank ${rank}`);
      }
    }
    const unanswered = await Promise.all(
      this.ranks.map((w, rank) => (this.lost.has(rank) ? false : w.rpc.call('ping', {}, 2_000).then(() => false, () => true))),
    );
    unanswered.forEach((silent, rank) => {
      if (silent && !this.lost.has(rank)) this.swarm.evict(this.ranks[rank], 'did not answer a ping within 2 s');
    });
    return [...this.lost].sort(([a], [b]) => a - b).map(([rank, { reason, silentMs }]) => ({ rank, worker: this.ranks[rank].id, reason, silentMs }));
  }

  /** The coordinator's links as the swarm admitted them; the mesh as each rank last reported it in its pulse. */
  override linkReport(): LinkReport[] {
    const links: LinkReport[] = this.ranks.map((w, rank) => ({ from: 'coordinator', to: rank, transport: w.transport }));
    const said = (from: number, to: number) => this.ranks[from].pulse?.mesh?.find((m) => m.peer === this.ranks[to].id)?.transport;
    // ranks link only within their group (CFG parallel's two groups meet at the coordinator)
    const P = this.groupSize;
    for (let from = 1; from < this.ranks.length; from++) {
      for (let to = from - (from % P); to < from; to++) links.push({ from, to, transport: said(from, to) ?? said(to, from) ?? 'unknown' });
    }
    return links;
  }

  protected closeTransport(): void {
    this.offLeave?.();
    for (const w of this.ranks) this.swarm.setActivity(w, 'idle');
    this.ranks = [];
  }
}
