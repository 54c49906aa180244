// The `swarm` backend: ranks on worker pages that joined the swarm over WebRTC (or the relay). The
// placer chose the workers; this class reaches them, watches them leave, and judges who is lost.
import type { Remote } from '../core/net/rpc.ts';
import type { RankLost, WorkerApi } from '../core/worker-api.ts';
import {
  Executor,
  SpotCheckFailed,
  TimeoutError,
  WorkerError,
  type ExecutorOptions,
  type LinkReport,
  type LostRank,
} from './executor.ts';
import type { Swarm, SwarmWorker } from './swarm.ts';

export class SwarmExecutor extends Executor {
  private offLeave: (() => void) | null = null;
  /** ranks let go during this executor's life, with why */
  private readonly lost = new Map<number, LostRank>();

  constructor(
    options: ExecutorOptions,
    private readonly swarm: Swarm,
    /** the workers to place on, in rank order (the planner chose them: placement.workers) */
    private ranks: SwarmWorker[],
  ) {
    super(options);
  }

  protected place(): Promise<string[]> {
    const live = new Set(this.swarm.workers());
    const gone = this.ranks.filter((w) => !live.has(w));
    if (gone.length)
      return Promise.reject(
        new Error(
          `worker${gone.length > 1 ? 's' : ''} ${gone.map((w) => w.id).join(', ')} left the swarm before placement`,
        ),
      );
    this.ranks.forEach((w, rank) => this.swarm.setActivity(w, this.layout.describe(rank)));
    this.offLeave = this.swarm.on((e) => {
      if (e.type !== 'leave') return;
      const rank = this.ranks.indexOf(e.worker);
      if (rank < 0 || this.lost.has(rank)) return;
      this.lost.set(rank, {
        rank,
        worker: e.worker.id,
        cause: e.silentMs > 0 ? 'silent' : 'disconnected',
        evidence: e.reason,
        silentMs: e.silentMs,
      });
      this.reportFailure(new Error(`rank ${rank} (worker ${e.worker.id}) is lost: ${e.reason}`));
    });
    return Promise.resolve(this.ranks.map((w) => w.id));
  }

  protected remoteOf(rank: number): Remote<WorkerApi> | undefined {
    return this.rankWorker(rank)?.api;
  }

  /** as the rank's page last said in its pulse: counted in its engine's Web Worker */
  protected override progressOf(rank: number): number | null {
    return this.rankWorker(rank)?.pulse?.progress?.done ?? null;
  }

  protected override showActivity(rank: number, doing: string): void {
    const worker = this.rankWorker(rank);
    if (worker) this.swarm.setActivity(worker, doing);
  }

  /**
   * Who is lost, on the coordinator's own evidence: a rank that left the swarm (its link closed, or
   * its heartbeats stopped), a rank whose reply broke the contract or a spot check convicted
   * (banned), and a rank that does not answer a ping within the swarm's silence limit (the one its
   * heartbeats are judged by, core/net/heartbeat.ts: a busy machine's pages answer late) — every rank is pinged,
   * so a rank another rank blames is let go only if it is silent to the coordinator too. One rank's
   * word against another's that still answers (NaN sent between ranks, withheld tensors: the
   * coordinator never sees those; a spot check that no third judgement decided) is judged by the
   * record of accusations (accusations.ts): it sets a rank aside for the job or bans the one the
   * record convicts, never the accuser with the accused on one word.
   */
  override async lostRanks(error: Error): Promise<LostRank[]> {
    const lostBefore = this.lost.size;
    if (error instanceof WorkerError && error.breach)
      this.letGo(error.rank, 'misbehaved', `its ${error.method} reply broke the contract: ${error.remoteMessage}`, 0, {
        ban: true,
      });
    const accused = error instanceof WorkerError ? error.blame : null;
    const silentAtTimeout = error instanceof TimeoutError ? new Set(error.silentRanks) : new Set<number>();
    const started = Date.now();
    const pingMs = this.swarm.silenceLimitMs();
    const unanswered = await Promise.all(
      this.ranks.map((w, rank) =>
        this.lost.has(rank)
          ? Promise.resolve(false)
          : w.api.ping({}, pingMs).then(
              () => false,
              () => true,
            ),
      ),
    );
    unanswered.forEach((silent, rank) => {
      if (!silent || this.lost.has(rank)) return;
      const said =
        error instanceof WorkerError && error.blame?.rank === rank
          ? `; rank ${error.rank} reported: ${error.blame.evidence}`
          : '';
      const timedOut =
        error instanceof TimeoutError && silentAtTimeout.has(rank) ? `; it had not answered ${error.method}` : '';
      this.letGo(
        rank,
        'silent',
        `did not answer a ping within ${(pingMs / 1000).toFixed(1)} s${timedOut}${said}`,
        Date.now() - started,
      );
    });
    if (
      accused &&
      error instanceof WorkerError &&
      accused.rank !== error.rank &&
      !this.lost.has(accused.rank) &&
      !this.lost.has(error.rank)
    )
      this.judgeWord(error.rank, accused, error instanceof SpotCheckFailed && error.disputed);
    // a rank that answers pings but whose engine (which pings do not reach) made no progress on its
    // call for the call's whole limit: it hangs (a slow engine moves, and is waited for); with nobody
    // else to blame, it goes
    if (this.lost.size === lostBefore && error instanceof TimeoutError) {
      for (const rank of error.silentRanks)
        this.letGo(
          rank,
          'silent',
          `it answered pings, but its engine made no progress on ${error.method} for ` +
            `${(error.timeoutMs / 1000).toFixed(1)} s (the call's limit, stretched where every rank was late): ` +
            'it hangs',
          0,
        );
    }
    // a rank that failed its call and blames nobody the coordinator can confirm cannot be trusted with the step again;
    // one blaming a rank the coordinator already saw leave (its link closed first) is confirmed
    if (this.lost.size === lostBefore && error instanceof WorkerError && !(accused && this.lost.has(accused.rank)))
      this.letGo(
        error.rank,
        'misbehaved',
        `its ${error.method} failed, blaming nobody the coordinator can confirm: ${error.remoteMessage}`,
        0,
      );
    return [...this.lost.values()].sort((a, b) => a.rank - b.rank);
  }

  /** The worker of `rank`; none for a rank outside the placement (a rank's blame may name any) or after closing. */
  private rankWorker(rank: number): SwarmWorker | undefined {
    return this.ranks[rank];
  }

  /**
   * Rank `accuser`'s word against `accused` (disputed: a spot check's disagreement between them), as
   * the record of accusations judges it: the convicted is banned and those it accused stay; else
   * the ranks the rule sets aside leave the job, connected and not banned.
   */
  private judgeWord(accuser: number, accused: RankLost, disputed: boolean): void {
    const [by, of] = [this.rankWorker(accuser), this.rankWorker(accused.rank)];
    if (!by || !of) return;
    const [a, b] = [this.swarm.identityOf(by), this.swarm.identityOf(of)];
    if (a === b) return; // two tabs of one browser: the record cannot tell them apart
    const identity = new Map([
      [a, accuser],
      [b, accused.rank],
    ]);
    const trusted = new Set([by, of].filter((w) => this.swarm.isTrusted(w)).map((w) => this.swarm.identityOf(w)));
    const { accusations } = this.swarm;
    const judged = disputed ? accusations.dispute(a, b, trusted) : accusations.accuse(a, b, trusted);
    const what = { silent: 'withholding its tensors', misbehaved: 'misbehaving', disconnected: 'gone' }[accused.cause];
    const word = disputed
      ? `rank ${accused.rank}'s recomputation and rank ${accuser}'s rows disagree, with nobody to decide: ` +
        accused.evidence
      : `rank ${accuser} reported it ${what}: ${accused.evidence}`;
    if (judged.convicted !== null) {
      const rank = identity.get(judged.convicted);
      if (rank !== undefined)
        this.letGo(rank, 'misbehaved', `convicted by the record of accusations (${judged.why}); last: ${word}`, 0, {
          ban: true,
        });
      return;
    }
    for (const aside of judged.setAside) {
      const rank = identity.get(aside);
      if (rank !== undefined) this.setAside(rank, `set aside for this job, not banned: ${word}`);
    }
  }

  /** Out of this job's placement (the placer places without it) but kept in the swarm, not banned. */
  private setAside(rank: number, evidence: string): void {
    const worker = this.rankWorker(rank);
    if (!worker || this.lost.has(rank)) return;
    this.lost.set(rank, { rank, worker: worker.id, cause: 'misbehaved', evidence, silentMs: 0 });
  }

  /** `ban`: on the coordinator's own evidence of a lie, the worker is not admitted again */
  private letGo(
    rank: number,
    cause: RankLost['cause'],
    evidence: string,
    silentMs: number,
    { ban = false } = {},
  ): void {
    const worker = this.rankWorker(rank);
    if (!worker || this.lost.has(rank)) return;
    this.lost.set(rank, { rank, worker: worker.id, cause, evidence, silentMs });
    this.swarm.evict(worker, evidence, { ban });
  }

  /** The coordinator's links as the swarm admitted them; the meshes as each rank last reported them in its pulse. */
  override linkReport(): LinkReport[] {
    const links: LinkReport[] = this.ranks.map((w, rank) => ({
      from: 'coordinator',
      to: rank,
      transport: w.transport,
    }));
    const said = (from: number, to: number) =>
      this.ranks[from].pulse?.mesh?.find((m) => m.peer === this.ranks[to].id)?.transport;
    for (const [from, to] of this.layout.meshPairs())
      links.push({ from, to, transport: said(from, to) ?? said(to, from) ?? 'unknown' });
    return links;
  }

  protected closeTransport(): void {
    this.offLeave?.();
    for (const w of this.ranks) this.swarm.setActivity(w, null);
    this.ranks = [];
  }
}
