import { checkDegree, defaultDegree } from '../core/parallel.ts';
import { Executor, type ExecutorOptions, type LinkReport, type LostRank } from './executor.ts';
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
    let degree: number;
    if (asked === 'auto') {
      await this.swarm.waitForWorkers(1, timeoutMs);
      degree = defaultDegree(numHeads, this.swarm.workers().length);
    } else {
      checkDegree(numHeads, asked);
      await this.swarm.waitForWorkers(asked, timeoutMs);
      degree = asked;
    }
    this.ranks = this.swarm.workers().slice(0, degree);
    this.ranks.forEach((w, rank) => this.swarm.setActivity(w, `rank ${rank} of ${degree}`));
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
    for (const [, rank, what] of error.message.matchAll(/(?:misbehaving rank|rank) (\d+)(:| is gone)/g)) {
      const worker = this.ranks[Number(rank)];
      if (worker && !this.lost.has(Number(rank))) {
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
    for (let from = 1; from < this.ranks.length; from++) {
      for (let to = 0; to < from; to++) links.push({ from, to, transport: said(from, to) ?? said(to, from) ?? 'unknown' });
    }
    return links;
  }

  protected closeTransport(): void {
    this.offLeave?.();
    for (const w of this.ranks) this.swarm.setActivity(w, 'idle');
    this.ranks = [];
  }
}
