// How a worker and its dashboard prove to each other that they hold the swarm's join token,
// without sending it: whoever registers the dashboard's peer id after it closed learns nothing from
// a worker, and no worker serves it. The worker dials with a fresh nonce; the dashboard answers
// with its own and its proof; the worker checks that proof before it serves anything, and answers
// with its proof; the dashboard checks it before it asks anything. Each proof (joinProof) binds
// both nonces and both peer ids, so none can be replayed to another exchange. The dial itself
// carries a first proof, bound to its nonce and both ids: the dashboard takes one of its few
// joining places only for a dial that proves the token, so pages without it cannot hold them.
import { joinProof, nonce } from './hmac.ts';
import type { Link } from './link.ts';
import { COORDINATOR } from './protocol.ts';

/** what a worker dials its dashboard with */
export interface JoinMetadata {
  role: 'worker';
  nonce: string;
  /** joinProof of the token, the nonce and both ids (dialProof) */
  dial: string;
  /** its browser's id (WorkerInfo.browser), where it has one: a dashboard refuses a banned browser before the proof */
  browser?: string;
}

const dialProof = (token: string, nonce: string, ids: { coordinator: string; worker: string }): string =>
  joinProof(token, 'dial', nonce, ids.worker, ids.coordinator);

/** What a worker holding `token` dials its dashboard with: a fresh nonce, and its proof of the token. */
export function workerDial(token: string, ids: { coordinator: string; worker: string }): JoinMetadata {
  const fresh = nonce();
  return { role: 'worker', nonce: fresh, dial: dialProof(token, fresh, ids) };
}

/** Whether a dial's metadata proves `token` for this worker dialling this dashboard (before any place is given it). */
export const dialProven = (token: string, ids: { coordinator: string; worker: string }, metadata: JoinMetadata) =>
  metadata.dial === dialProof(token, metadata.nonce, ids);

/** how long either side waits for the other's step of the handshake */
export const JOIN_STEP_TIMEOUT_MS = 10_000;

type JoinBody =
  | { type: 'challenge'; nonce: string; proof: string }
  | { type: 'hello'; proof: string }
  | { type: 'refused'; reason: string };

/** The join metadata of a worker's dial, or null where it is not one. */
export function joinMetadata(metadata: unknown): JoinMetadata | null {
  const m = metadata as Partial<JoinMetadata> | null;
  if (!(
    m?.role === 'worker' &&
    typeof m.nonce === 'string' &&
    /^[0-9a-f]{32}$/.test(m.nonce) &&
    typeof m.dial === 'string' &&
    /^[0-9a-f]{64}$/.test(m.dial)
  ))
    return null;
  const browser = typeof m.browser === 'string' && /^[0-9a-f-]{1,64}$/.test(m.browser) ? m.browser : undefined;
  return { role: 'worker', nonce: m.nonce, dial: m.dial, ...(browser && { browser }) };
}

/** The next handshake message on `link` of this type, or null on timeout or a closed link. */
function next<T extends JoinBody['type']>(
  link: Link,
  types: T[],
  timeoutMs: number,
): Promise<Extract<JoinBody, { type: T }> | null> {
  return new Promise((resolve) => {
    const done = (value: Extract<JoinBody, { type: T }> | null) => {
      clearTimeout(timer);
      offClose();
      off();
      resolve(value);
    };
    const timer = setTimeout(() => done(null), timeoutMs);
    const offClose = link.onClose(() => done(null));
    if (link.closed) queueMicrotask(() => done(null));
    const off = link.onMessage((msg) => {
      const body = msg.kind === 'rpc' ? (msg.body as Partial<JoinBody> | null) : null;
      if (body && types.includes(body.type as T)) done(body as Extract<JoinBody, { type: T }>);
    });
  });
}

const text = (v: unknown, max = 256): v is string => typeof v === 'string' && v.length <= max;

/**
 * The dashboard's side, on a worker's new link: null once the worker has proved it holds `token`,
 * else why it is refused (it is told so).
 */
export async function admitWorker(
  link: Link,
  token: string,
  ids: { coordinator: string; worker: string },
  metadata: JoinMetadata,
): Promise<string | null> {
  const ours = nonce();
  const hello = next(link, ['hello'], JOIN_STEP_TIMEOUT_MS);
  const proof = joinProof(token, 'coordinator', metadata.nonce, ours, ids.worker, ids.coordinator);
  await link
    .send({ kind: 'rpc', from: COORDINATOR, body: { type: 'challenge', nonce: ours, proof }, tensors: [] })
    .catch(() => {});
  const answer = await hello;
  if (
    answer &&
    text(answer.proof) &&
    answer.proof === joinProof(token, 'worker', ours, metadata.nonce, ids.worker, ids.coordinator)
  )
    return null;
  const reason = answer
    ? 'it did not prove it holds the join token: open the join link shown on the dashboard'
    : 'it did not prove it holds the join token in time (a wrong join link?)';
  await refuseJoin(link, reason);
  return reason;
}

/** Tells a worker on its new link why it is refused (its page shows the reason), instead of a silent close. */
export async function refuseJoin(link: Link, reason: string): Promise<void> {
  await link.send({ kind: 'rpc', from: COORDINATOR, body: { type: 'refused', reason }, tensors: [] }).catch(() => {});
}

/**
 * The worker's side, on its new link to its dashboard: null once the dashboard has proved it
 * holds `token` (and been given this worker's proof), else why this worker will not serve it.
 */
export async function joinDashboard(
  link: Link,
  token: string,
  ids: { coordinator: string; worker: string },
  metadata: JoinMetadata,
): Promise<{ refused: string } | null> {
  const step = await next(link, ['challenge', 'refused'], JOIN_STEP_TIMEOUT_MS);
  if (!step) return { refused: 'the dashboard did not answer the join handshake' };
  if (step.type === 'refused')
    return {
      refused: `the dashboard refused this worker: ${text(step.reason, 1000) ? step.reason : 'no reason given'}`,
    };
  if (
    !text(step.nonce) ||
    !text(step.proof) ||
    step.proof !== joinProof(token, 'coordinator', metadata.nonce, step.nonce, ids.worker, ids.coordinator)
  ) {
    return {
      refused:
        "the dashboard did not prove it holds this link's join token: " +
        'open the join link the dashboard shows (a page that took its place cannot)',
    };
  }
  await link.send({
    kind: 'rpc',
    from: 0,
    body: { type: 'hello', proof: joinProof(token, 'worker', step.nonce, metadata.nonce, ids.worker, ids.coordinator) },
    tensors: [],
  });
  return null;
}
