import { checkDegree, defaultDegree } from '../core/parallel.ts';
import { Executor, type ExecutorOptions } from './executor.ts';
import type { Swarm, SwarmWorker } from './swarm.ts';

/** Ranks on worker pages that joined the swarm over WebRTC. */
export class SwarmExecutor extends Executor {
  private ranks: SwarmWorker[] = [];
  private offLeave: (() => void) | null = null;

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
      const rank = this.ranks.indexOf(e.worker);
      if (e.type === 'leave' && rank >= 0) this.reportFailure(new Error(`rank ${rank} (worker ${e.worker.id}) left the swarm`));
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

  protected closeTransport(): void {
    this.offLeave?.();
    for (const w of this.ranks) this.swarm.setActivity(w, 'idle');
    this.ranks = [];
  }
}
