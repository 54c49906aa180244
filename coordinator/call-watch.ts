// When a collective call gives up on a rank. A rank is hung when its engine made no progress for
// the call's limit (the planner's timeouts: a multiple of the predicted step with a floor), counted
// from the call's start or the engine's last move, however long the call has run: a rank whose
// engine moves is slow, never hung. When every rank of a call is stalled together, that is the
// machine slowing (load), not one rank failing: the limit doubles, up to MAX_STRETCHES times,
// before anyone is named.

/** how many times a call's limit may double while every rank of it is stalled together */
export const MAX_STRETCHES = 2;

/** How often a call's ranks are looked at: often enough to name a hung rank soon after its limit. */
export const watchIntervalMs = (limitMs: number): number => Math.max(10, Math.min(1_000, limitMs / 4));

export class CallWatch {
  private limit: number;
  private stretches = 0;
  /** each rank's engine progress as last seen, and when it last moved (the call's start at first) */
  private readonly seen: Map<number, { done: number | null; at: number }>;

  constructor(
    limitMs: number,
    private readonly ranks: readonly number[],
    /** how far a rank's engine has got (EngineProgress.done), or null where nothing says */
    private readonly progressOf: (rank: number) => number | null,
    now = Date.now(),
  ) {
    this.limit = limitMs;
    this.seen = new Map(ranks.map((rank) => [rank, { done: progressOf(rank), at: now }]));
  }

  /** the limit now, stretched or not */
  get limitMs(): number {
    return this.limit;
  }

  /** how long `rank`'s engine has not moved */
  stalledMs(rank: number, now = Date.now()): number {
    return now - (this.seen.get(rank)?.at ?? now);
  }

  /** Notes the ranks' progress; the ranks of `waiting` hung now (none while the limit stretches). */
  check(waiting: ReadonlySet<number>, now = Date.now()): number[] {
    for (const [rank, seen] of this.seen) {
      const done = this.progressOf(rank);
      if (done !== null && done !== seen.done) Object.assign(seen, { done, at: now });
    }
    const stalled = [...waiting].filter((rank) => this.stalledMs(rank, now) > this.limit).sort((a, b) => a - b);
    if (stalled.length === this.ranks.length && this.stretches < MAX_STRETCHES) {
      this.stretches++;
      this.limit *= 2;
      return [];
    }
    return stalled;
  }
}
