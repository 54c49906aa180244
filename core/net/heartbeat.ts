// Liveness of a worker as the coordinator judges it: the coordinator sends a heartbeat every
// half second and the worker answers at once, from its message handler. Any valid frame counts as a
// sign of life. Only the coordinator judges by a timer: a worker is usually a hidden tab, whose
// timers browsers throttle, but whose message events they deliver on time. A worker that hears
// nothing asks the server instead (askWhileSilent), which knows at once when a dashboard's page left.
//
// Gone is told from slow by evidence, not by one fixed silence:
// - a closed link, or a page that says its browser is freezing it (announceStop), is dead at the
//   next beat, whatever else holds;
// - a page's answers come from its main thread, which a busy machine starves for seconds: its
//   silence limit is SILENCE_MARGIN times the longest silence any worker of the swarm ended lately
//   (the machine's measured load), at least DEAD_AFTER_MS and at most MAX_SILENT_MS;
// - a worker silent past that limit is dead once the signaling server says its page let its id go (a
//   closed or crashed tab's socket closes at once), whatever it was doing; one the server still holds
//   is starved or hung, and is given MAX_SILENT_MS;
// - where the server cannot say, silence is the evidence, and some silences are slowness: when every
//   worker of the swarm is late together, that is load on the machine (the limit is MAX_SILENT_MS),
//   and a worker whose last answer said it is loading a model may be silent for LOADING_DEAD_AFTER_MS.
// Time the coordinator itself was not listening (its own timer came late: its page was starved) is
// not counted against anyone. Nor is time the coordinator's beats waited behind a long message to
// the worker (a real model's prompt embedding is megabytes): a worker cannot answer a beat it has
// not been sent.

import type { Link } from './link.ts';
import type { WorkerPulse } from '../worker-api.ts';

export const HEARTBEAT_INTERVAL_MS = 500;
/** the silence that makes a worker dead on a machine that answers on time */
export const DEAD_AFTER_MS = 3_000;
/** a worker's silence limit, as a multiple of the longest silence the swarm's workers ended lately */
export const SILENCE_MARGIN = 3;
/** how long an ended silence counts towards the limit: a machine's load comes and goes */
export const SILENCE_MEMORY_MS = 60_000;
/**
 * the longest silence of a worker whose link stays open: past it, its page is frozen or hung
 * however busy the machine (a crashed page's data channel closes by itself about then)
 */
export const MAX_SILENT_MS = 30_000;
export const LOADING_DEAD_AFTER_MS = 60_000;
/** this long without a word from the coordinator, and a worker asks the server whether it left */
export const COORDINATOR_SILENT_MS = 3_000;

/** A heartbeat as it arrives: the pulse of an echo is the worker's word, judged by the receiver (checkPulse). */
type HeartbeatBody =
  { type: 'heartbeat' } | { type: 'heartbeat-echo'; pulse: unknown } | { type: 'heartbeat-stop'; why: 'frozen' };

function heartbeatBody(body: unknown): HeartbeatBody | null {
  const b = body as { type?: unknown; why?: unknown } | null;
  if (b?.type === 'heartbeat' || b?.type === 'heartbeat-echo') return b as HeartbeatBody;
  return b?.type === 'heartbeat-stop' && b.why === 'frozen' ? (b as HeartbeatBody) : null;
}

/** Worker side: answer every heartbeat with the current pulse. */
export function answerHeartbeats(link: Link, from: number, pulse: () => WorkerPulse): () => void {
  return link.onMessage((msg) => {
    if (msg.kind !== 'rpc' || heartbeatBody(msg.body)?.type !== 'heartbeat') return;
    link.send({ kind: 'rpc', from, body: { type: 'heartbeat-echo', pulse: pulse() }, tensors: [] }).catch(() => {});
  });
}

/**
 * Worker side: tells the coordinator this page stops answering now (its browser is freezing it),
 * so that its work is placed elsewhere at once rather than after a silence.
 */
export function announceStop(link: Link, from: number): void {
  link.send({ kind: 'rpc', from, body: { type: 'heartbeat-stop', why: 'frozen' }, tensors: [] }).catch(() => {});
}

/**
 * Worker side: while the dashboard is silent, asks the server every few seconds where it is, and lets the link go
 * when the server no longer names it: a closed tab's channel may take ICE's consent timeout (30 s) to
 * close, but its socket to the server closes at once. A busy dashboard is still named, so silence
 * alone never ends the link.
 */
export function askWhileSilent(
  link: Pick<Link, 'lastHeardAt' | 'closed'>,
  find: () => Promise<{ coordinator: string } | { refused: string } | { waiting: string }>,
  coordinator: string,
  onGone: () => void,
): () => void {
  const timer = setInterval(() => {
    if (link.closed || Date.now() - link.lastHeardAt < COORDINATOR_SILENT_MS) return;
    find().then(
      (found) => {
        if (!link.closed && !('coordinator' in found && found.coordinator === coordinator)) onGone();
      },
      () => {}, // the server out of reach says nothing about the dashboard
    );
  }, COORDINATOR_SILENT_MS);
  return () => clearInterval(timer);
}

/**
 * The silences of one coordinator's workers, shared by their watchers: what the swarm's load makes
 * of a page's answers, and whether every worker is late at once.
 */
export class Silences {
  /** silences that ended (a worker answered after being silent so long), oldest first */
  private readonly ended: { at: number; ms: number }[] = [];
  /** each watched worker's silence now */
  private readonly current = new Map<symbol, () => number>();

  /** a worker answered after `ms` of silence */
  noteEnded(ms: number, now: number): void {
    this.ended.push({ at: now, ms });
    while (this.ended.length && now - this.ended[0].at > SILENCE_MEMORY_MS) this.ended.shift();
  }

  /** How long a worker may be silent now: SILENCE_MARGIN times the longest recent silence, within the bounds. */
  limitMs(now: number, deadAfterMs = DEAD_AFTER_MS): number {
    const longest = Math.max(0, ...this.ended.filter((e) => now - e.at <= SILENCE_MEMORY_MS).map((e) => e.ms));
    return Math.min(MAX_SILENT_MS, Math.max(deadAfterMs, SILENCE_MARGIN * longest));
  }

  /** Whether every watched worker but `self` (at least one) is silent past DEAD_AFTER_MS too: the machine is slow. */
  allLateBut(self: symbol, deadAfterMs = DEAD_AFTER_MS): boolean {
    const others = [...this.current].filter(([who]) => who !== self);
    return others.length > 0 && others.every(([, silentMs]) => silentMs() > deadAfterMs);
  }

  join(who: symbol, silentMs: () => number): () => void {
    this.current.set(who, silentMs);
    return () => this.current.delete(who);
  }
}

/** Why a watched worker is dead, for the swarm's events and the executor's blame. */
export interface Death {
  silentMs: number;
  /** 'closed': its link closed; 'frozen': its page said its browser froze it; 'silent': past its silence limit */
  cause: 'closed' | 'frozen' | 'silent';
  /** the silence limit it was judged by (cause 'silent') */
  limitMs: number;
}

/** Coordinator side: beat every interval; `onDead` once when the rules above find the worker dead. */
export function watchHeartbeats(
  link: Link,
  from: number,
  /** the pulse as the worker sent it, unchecked: the receiver judges it (checkPulse) */
  handlers: {
    onDead(death: Death): void;
    onPulse?(pulse: unknown): void;
    /**
     * whether the worker's page is still there as a third party sees it (the signaling server holds
     * its id): asked once a silence passes its limit, before the worker is called dead
     */
    present?(): Promise<boolean>;
  },
  {
    intervalMs = HEARTBEAT_INTERVAL_MS,
    deadAfterMs = DEAD_AFTER_MS,
    /** the other workers of the same coordinator; a worker watched alone is judged by its own silences */
    silences = new Silences(),
  } = {},
): () => void {
  let loading = false;
  let stopped: 'frozen' | null = null;
  const off = link.onMessage((msg) => {
    const body = msg.kind === 'rpc' ? heartbeatBody(msg.body) : null;
    if (body?.type === 'heartbeat-stop') stopped = body.why;
    if (body?.type !== 'heartbeat-echo' || typeof body.pulse !== 'object' || body.pulse === null) return;
    loading = 'state' in body.pulse && body.pulse.state === 'loading';
    handlers.onPulse?.(body.pulse);
  });
  let listeningSince = Date.now();
  let lastTick = Date.now();
  let heardAt = link.lastHeardAt;
  const silentAt = (now: number) => now - Math.max(link.lastHeardAt, listeningSince);
  const self = Symbol('worker');
  const leave = silences.join(self, () => silentAt(Date.now()));
  /** beats not yet handed to the channel: queued behind a long message */
  let beatsQueued = 0;
  /** for the silence under way: the server was asked whether the page is there, and what it said */
  let presence: 'asking' | 'present' | 'gone' | 'unknown' | null = null;
  const timer = setInterval(() => {
    const now = Date.now();
    // a tick this late means this page was not running, and a beat still queued has not reached
    // the worker: either way the silence starts again from now
    if (now - lastTick > 4 * intervalMs || beatsQueued > 0) listeningSince = now;
    lastTick = now;
    if (link.lastHeardAt > heardAt) {
      silences.noteEnded(link.lastHeardAt - Math.max(heardAt, listeningSince), now);
      heardAt = link.lastHeardAt;
      presence = null;
    }
    const silentMs = silentAt(now);
    // what the machine's load lets any page be silent for; past it, the server is asked whether the page is there
    const loadLimitMs = silences.limitMs(now, deadAfterMs);
    // what silence alone proves, where the server cannot say: a loading page, or every page late together, is slow
    const silenceLimitMs = loading
      ? Math.max(deadAfterMs, LOADING_DEAD_AFTER_MS)
      : silences.allLateBut(self, deadAfterMs)
        ? Math.max(MAX_SILENT_MS, deadAfterMs)
        : loadLimitMs;
    if (silentMs > loadLimitMs && handlers.present && presence === null) {
      presence = 'asking';
      handlers.present().then(
        (present) => {
          if (presence === 'asking') presence = present ? 'present' : 'gone';
        },
        () => {
          // a server that cannot say leaves the silence as the evidence
          if (presence === 'asking') presence = 'unknown';
        },
      );
    }
    // a page the server let go is gone however slow it was (a closed or crashed tab's socket closes at once); one it
    // still holds is starved or hung, and has until MAX_SILENT_MS, as has one while the server does not answer (a
    // server that never answers must not keep it alive)
    const limitMs =
      presence === 'gone'
        ? loadLimitMs
        : presence === 'asking' || presence === 'present'
          ? Math.max(silenceLimitMs, MAX_SILENT_MS)
          : silenceLimitMs;
    const cause: Death['cause'] | null = link.closed ? 'closed' : (stopped ?? (silentMs > limitMs ? 'silent' : null));
    if (cause) {
      stop();
      handlers.onDead({ silentMs, cause, limitMs });
      return;
    }
    beatsQueued++;
    link
      .send({ kind: 'rpc', from, body: { type: 'heartbeat' }, tensors: [] })
      .catch(() => {})
      .finally(() => beatsQueued--);
  }, intervalMs);
  const stop = () => {
    clearInterval(timer);
    off();
    leave();
  };
  return stop;
}
