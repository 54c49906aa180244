// Liveness of a worker as the coordinator judges it: the coordinator sends a heartbeat every
// half second and the worker answers at once, from its message handler. Any valid frame counts as a
// sign of life; after DEAD_AFTER_MS of silence the worker is dead — its tab closed, crashed or is
// stuck in a loop. Only the coordinator judges by a timer: a worker is usually a hidden tab, whose
// timers browsers throttle, but whose message events they deliver on time. A worker that hears
// nothing asks the server instead (askWhileSilent), which knows at once when a dashboard's page left.
// Two kinds of silence are not death. A worker whose last answer said it is loading a model may
// be silent for LOADING_DEAD_AFTER_MS: taking in GBs of weights beside other tabs on a busy
// machine starves its page for seconds; a closed tab still shows at once, its link closes. Time the
// coordinator itself was not listening (its own timer came late: its page was starved) is not
// counted against anyone. Nor is time the coordinator's beats waited behind a long message to the
// worker (a real model's prompt embedding is megabytes): a worker cannot answer a beat it has not
// been sent.

import type { Link } from './link.ts';
import type { WorkerPulse } from '../worker-api.ts';

export const HEARTBEAT_INTERVAL_MS = 500;
export const DEAD_AFTER_MS = 3_000;
export const LOADING_DEAD_AFTER_MS = 60_000;
/** this long without a word from the coordinator, and a worker asks the server whether it left */
export const COORDINATOR_SILENT_MS = 3_000;

/** A heartbeat as it arrives: the pulse of an echo is the worker's word, judged by the receiver (checkPulse). */
type HeartbeatBody = { type: 'heartbeat' } | { type: 'heartbeat-echo'; pulse: unknown };

function heartbeatBody(body: unknown): HeartbeatBody | null {
  const type = (body as { type?: unknown } | null)?.type;
  return type === 'heartbeat' || type === 'heartbeat-echo' ? (body as HeartbeatBody) : null;
}

/** Worker side: answer every heartbeat with the current pulse. */
export function answerHeartbeats(link: Link, from: number, pulse: () => WorkerPulse): () => void {
  return link.onMessage((msg) => {
    if (msg.kind !== 'rpc' || heartbeatBody(msg.body)?.type !== 'heartbeat') return;
    link.send({ kind: 'rpc', from, body: { type: 'heartbeat-echo', pulse: pulse() }, tensors: [] }).catch(() => {});
  });
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

/** Coordinator side: beat every interval; `onDead` once after `deadAfterMs` of silence. */
export function watchHeartbeats(
  link: Link,
  from: number,
  /** the pulse as the worker sent it, unchecked: the receiver judges it (checkPulse) */
  handlers: { onDead(silentMs: number): void; onPulse?(pulse: unknown): void },
  { intervalMs = HEARTBEAT_INTERVAL_MS, deadAfterMs = DEAD_AFTER_MS } = {},
): () => void {
  let loading = false;
  const off = link.onMessage((msg) => {
    const body = msg.kind === 'rpc' ? heartbeatBody(msg.body) : null;
    if (body?.type !== 'heartbeat-echo' || typeof body.pulse !== 'object' || body.pulse === null) return;
    loading = 'state' in body.pulse && body.pulse.state === 'loading';
    handlers.onPulse?.(body.pulse);
  });
  let listeningSince = Date.now();
  let lastTick = Date.now();
  /** beats not yet handed to the channel: queued behind a long message */
  let beatsQueued = 0;
  const timer = setInterval(() => {
    const now = Date.now();
    // a tick this late means this page was not running, and a beat still queued has not reached
    // the worker: either way the silence starts again from now
    if (now - lastTick > 4 * intervalMs || beatsQueued > 0) listeningSince = now;
    lastTick = now;
    const silentMs = now - Math.max(link.lastHeardAt, listeningSince);
    if (silentMs > (loading ? Math.max(deadAfterMs, LOADING_DEAD_AFTER_MS) : deadAfterMs) || link.closed) {
      stop();
      handlers.onDead(silentMs);
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
  };
  return stop;
}
