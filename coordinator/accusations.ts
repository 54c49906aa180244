// One worker's word against another's, where the coordinator saw neither lie: a rank blaming a peer
// (withholding, NaN between ranks, gone while it answers pings), or a spot check between a rank and
// its checker with no third rank to decide. The one rule for such words, kept across jobs:
//
// - an accusation sets the accused aside for the rest of the job (kept connected, not banned); the
//   accuser stays: one word costs at most one rank, never the accuser's and the accused's both;
// - a spot check's disagreement with no third judge is evidence that one of the two lied: it sets
//   both aside, and counts as each accusing the other;
// - a worker accused by DISTINCT_ACCUSERS_TO_CONVICT distinct peers is convicted (its peers agree);
// - a worker whose accusations name DISTINCT_ACCUSERS_TO_CONVICT distinct peers not convicted is
//   convicted (its accusations never held);
// - a convicted worker is banned, its record dropped, and those it accused are cleared: set aside no
//   more, they come back into the job;
// - a trusted worker's word (this machine's, or marked trusted: Swarm.isTrusted) is the coordinator's
//   own: between a trusted and an untrusted worker, the untrusted one is convicted at once.
//
// Over repeated jobs a liar meets distinct honest peers and is convicted; an honest worker accused
// by one liar is only ever set aside. Workers are named by an identity a page does not shed by
// joining again (Swarm.identityOf: its browser's id where it has one).

/** How many distinct peers' words convict a worker (see the rule above). */
export const DISTINCT_ACCUSERS_TO_CONVICT = 2;
/** identities remembered; the oldest go first */
export const MAX_REMEMBERED = 1_000;

/** What the record now says: who is convicted (banned), who is set aside, who is cleared. */
export interface Judgement {
  convicted: string | null;
  setAside: string[];
  cleared: string[];
  /** why, for the convicted */
  why: string;
}

export class Accusations {
  /** accuser → the distinct workers it accused */
  private readonly named = new Map<string, Set<string>>();
  /** accused → the distinct workers that accused it */
  private readonly accusedBy = new Map<string, Set<string>>();
  /** set aside for the current job (Accusations.newJob clears it) */
  private readonly aside = new Set<string>();

  /** `accuser` says `accused` lied: the accused is set aside unless the record (or trust) convicts one of them. */
  accuse(accuser: string, accused: string, trusted: ReadonlySet<string> = new Set()): Judgement {
    if (accuser === accused) return { convicted: null, setAside: [], cleared: [], why: '' };
    const byTrust = this.byTrust(accuser, accused, trusted);
    if (byTrust) return byTrust;
    this.record(accuser, accused);
    return this.judge([accused, accuser], [accused]);
  }

  /** `a` and `b` contradict each other and nobody else can say who lies: both set aside unless the record decides. */
  dispute(a: string, b: string, trusted: ReadonlySet<string> = new Set()): Judgement {
    if (a === b) return { convicted: null, setAside: [], cleared: [], why: '' };
    const byTrust = this.byTrust(a, b, trusted);
    if (byTrust) return byTrust;
    this.record(a, b);
    this.record(b, a);
    return this.judge([a, b], [a, b]);
  }

  /** A worker convicted on the coordinator's own evidence: its accusations are void, those it accused cleared. */
  convict(identity: string): string[] {
    const cleared = [...(this.named.get(identity) ?? [])];
    this.forget(identity);
    for (const c of cleared) this.aside.delete(c);
    return cleared;
  }

  isSetAside(identity: string): boolean {
    return this.aside.has(identity);
  }

  /** A new job: every worker may be placed again (the record of words stays). */
  newJob(): void {
    this.aside.clear();
  }

  /** Between a trusted and an untrusted worker, the untrusted one's conviction; else null. */
  private byTrust(a: string, b: string, trusted: ReadonlySet<string>): Judgement | null {
    if (trusted.has(a) === trusted.has(b)) return null;
    const untrusted = trusted.has(a) ? b : a;
    const cleared = this.convict(untrusted);
    return { convicted: untrusted, setAside: [], cleared, why: 'its word was against a trusted worker’s' };
  }

  private judge(suspects: string[], otherwiseAside: string[]): Judgement {
    for (const suspect of suspects) {
      const why = this.convicts(suspect);
      if (!why) continue;
      const cleared = this.convict(suspect);
      return { convicted: suspect, setAside: [], cleared, why };
    }
    for (const s of otherwiseAside) this.aside.add(s);
    return { convicted: null, setAside: otherwiseAside, cleared: [], why: '' };
  }

  /** Why the record convicts `identity`, or null. */
  private convicts(identity: string): string | null {
    const accusers = this.accusedBy.get(identity)?.size ?? 0;
    if (accusers >= DISTINCT_ACCUSERS_TO_CONVICT) return `${accusers} distinct peers accused it`;
    // an accusation that held convicted the accused, whose record (and the words against it) went with it
    const named = this.named.get(identity)?.size ?? 0;
    if (named >= DISTINCT_ACCUSERS_TO_CONVICT)
      return `it accused ${named} distinct peers, and no other peer's word backed any of its accusations`;
    return null;
  }

  private record(accuser: string, accused: string): void {
    add(this.named, accuser, accused);
    add(this.accusedBy, accused, accuser);
  }

  private forget(identity: string): void {
    for (const accused of this.named.get(identity) ?? []) this.accusedBy.get(accused)?.delete(identity);
    for (const accuser of this.accusedBy.get(identity) ?? []) this.named.get(accuser)?.delete(identity);
    this.named.delete(identity);
    this.accusedBy.delete(identity);
    this.aside.delete(identity);
  }
}

function add(map: Map<string, Set<string>>, key: string, value: string): void {
  const set = map.get(key) ?? new Set<string>();
  map.delete(key); // re-inserted: the most recently seen last, the oldest first to go
  map.set(key, set.add(value));
  const oldest = map.keys().next();
  if (map.size > MAX_REMEMBERED && !oldest.done) map.delete(oldest.value);
}
