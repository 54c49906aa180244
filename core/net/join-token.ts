// A swarm's join token is the server's to give (server/join-tokens.ts): `<room>.<seal>`, where the
// room names the swarm on the server (the relay groups a swarm's pages by it; it is no secret) and
// the seal is an HMAC of the room under a secret only the server holds. So nobody can make up a
// token the relay takes, and the server checks one without keeping a list: it recomputes it from
// the room. Pages still never send the token: they show the server proofs made with it (joinProof),
// bound to what they ask, as they show each other (core/net/join.ts).
//
// A dashboard takes a fresh PeerJS id each time it loads, so nobody can hold the id its workers
// will dial next; it tells the server that id (with a dashboard key the server gave it alone, so
// a worker holding the join token cannot take its place), and workers ask the server for it with
// a proof of the token: the link names no id, and the server tells it to nobody without the token.
import { defined } from '../defined.ts';
import { joinProof } from './hmac.ts';
import { CA_LINK_PARAM } from './local-ca.ts';

/** Where a dashboard asks its server for a join token, or to keep the one it has. */
export const SWARMS_PATH = '/swarms';
/** Where a dashboard tells its server that a join token is no longer good. */
export const REVOKE_PATH = '/swarms/revoke';
/** Where a dashboard tells its server its id for this load. */
export const REGISTER_PATH = '/swarms/coordinator';
/** Where a worker asks its server for the id of its swarm's dashboard. */
export const FIND_PATH = '/swarms/find';
/** a dashboard asks whether a silent worker's page still holds its id on the signaling server (askPresence) */
export const PRESENCE_PATH = '/swarms/presence';

const TOKEN_PATTERN = /^([0-9a-f]{24})\.[0-9a-f]{32}$/;

/** The room a join token names, or null for what is no token of this server's making. */
export function roomOf(token: string): string | null {
  return TOKEN_PATTERN.exec(token)?.[1] ?? null;
}

/** What a page shows the relay to enter its swarm's room: bound to its PeerJS id and credential. */
export const relayProof = (token: string, peer: string, auth: string): string =>
  joinProof(token, 'relay', roomOf(token) ?? '', peer, auth);

/**
 * What the dashboard asks its server: keep this token (a keep proof of its dashboard key), or a new
 * one, given only to the server's owner: a page of the server's own machine, one that proves the
 * owner key the server prints (`owner`), or a dashboard renewing its token (a renew proof).
 */
export interface SwarmRequest {
  room?: string;
  proof?: string;
  /** openProof of the server's owner key */
  owner?: string;
}

/** Where a dashboard opened from another machine finds the server's owner key: its link's `#owner=`. */
export const OWNER_KEY_PARAM = 'owner';

/** What the server answers: a new token and its dashboard key, or none when the one the dashboard holds stands. */
export interface SwarmAnswer {
  token?: string;
  dashboardKey?: string;
}

/** What a dashboard holds of its swarm: the token its workers prove, and the key that proves it is their dashboard. */
export interface SwarmKeys {
  token: string;
  dashboardKey: string;
}

/** A dashboard's id for this load (REGISTER_PATH), or a worker asking for it (FIND_PATH). */
export interface CoordinatorRequest {
  room: string;
  /** the id registered, or the asking worker's own */
  peer: string;
  proof: string;
  /** registering: the PeerJS token the id is held with, so the server knows the page holds it */
  auth?: string;
}

export interface CoordinatorAnswer {
  coordinator: string;
}

// Keyed by the dashboard key: only the dashboard the server gave the token to keeps it, revokes it
// or says where it is (a worker holding the token could otherwise cut off or take over the swarm).
export const keepProof = (dashboardKey: string, room: string): string => joinProof(dashboardKey, 'keep', room);
export const revokeProof = (dashboardKey: string, room: string): string => joinProof(dashboardKey, 'revoke', room);
export const renewProof = (dashboardKey: string, room: string): string => joinProof(dashboardKey, 'renew', room);
export const openProof = (ownerKey: string): string => joinProof(ownerKey, 'open');
export const registerProof = (dashboardKey: string, room: string, peer: string): string =>
  joinProof(dashboardKey, 'register', room, peer);
export const findProof = (token: string, peer: string): string => joinProof(token, 'find', roomOf(token) ?? '', peer);
export const presenceProof = (dashboardKey: string, room: string, peer: string): string =>
  joinProof(dashboardKey, 'presence', room, peer);

export interface PresenceAnswer {
  present: boolean;
}

async function post(origin: string, path: string, body: SwarmRequest | CoordinatorRequest): Promise<Response> {
  const response = await fetch(new URL(path, origin), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  if (!response.ok)
    throw new Error(
      `the server at ${origin} would not ${WHAT_FOR[path]}: HTTP ${response.status} ${await response.text()}`,
    );
  return response;
}

const WHAT_FOR: Record<string, string> = {
  [SWARMS_PATH]: 'give this dashboard a join link',
  [REVOKE_PATH]: 'revoke the join link',
  [REGISTER_PATH]: "take this dashboard's id",
  [PRESENCE_PATH]: 'say whether a worker page is there',
};

/**
 * The keys a dashboard of `origin` works with: `held` where the server still stands by its token
 * (a reload keeps its workers' links), else new ones from the server, which gives them to its
 * owner only (`held.ownerKey`, or a page of the server's own machine).
 */
export async function obtainSwarmKeys(
  origin: string,
  held?: Partial<SwarmKeys> & { ownerKey?: string },
): Promise<SwarmKeys> {
  const { token, dashboardKey, ownerKey } = held ?? {};
  const room = token === undefined ? null : roomOf(token);
  const keep = room && token && dashboardKey ? { room, keys: { token, dashboardKey } } : null;
  const request: SwarmRequest = {
    ...(keep && { room: keep.room, proof: keepProof(keep.keys.dashboardKey, keep.room) }),
    ...(ownerKey && { owner: openProof(ownerKey) }),
  };
  const answer = (await (await post(origin, SWARMS_PATH, request)).json()) as SwarmAnswer;
  if (keep && answer.token === undefined) return keep.keys;
  return newKeys(origin, answer);
}

/** New keys for the swarm whose keys are `held` (its link is to be revoked): its dashboard key entitles it. */
export async function renewSwarmKeys(origin: string, held: SwarmKeys): Promise<SwarmKeys> {
  const room = defined(roomOf(held.token), 'the room of the swarm token');
  const request: SwarmRequest = { room, proof: renewProof(held.dashboardKey, room) };
  return newKeys(origin, (await (await post(origin, SWARMS_PATH, request)).json()) as SwarmAnswer);
}

function newKeys(origin: string, answer: SwarmAnswer): SwarmKeys {
  if (typeof answer.token === 'string' && roomOf(answer.token) && typeof answer.dashboardKey === 'string')
    return { token: answer.token, dashboardKey: answer.dashboardKey };
  throw new Error(`the server at ${origin} answered ${JSON.stringify(answer).slice(0, 200)} for a join token`);
}

/** Tells the server `token` is no longer good: no page enters its relay room again, the pages in it are let go. */
export async function revokeJoinToken(origin: string, keys: SwarmKeys): Promise<void> {
  const room = roomOf(keys.token);
  if (room) await post(origin, REVOKE_PATH, { room, proof: revokeProof(keys.dashboardKey, room) });
}

/**
 * Tells the server that `peer` (held with the PeerJS token `auth`) is the swarm's dashboard now:
 * its workers are sent there.
 */
export async function registerCoordinator(origin: string, keys: SwarmKeys, peer: string, auth: string): Promise<void> {
  const room = defined(roomOf(keys.token), 'the room of the swarm token');
  await post(origin, REGISTER_PATH, { room, peer, proof: registerProof(keys.dashboardKey, room, peer), auth });
}

/**
 * Whether the page of worker `peer` still holds its id on the server: a page whose tab closed or
 * crashed lets its signaling socket go at once, while one that is only starved of CPU (a busy
 * machine) or hung keeps it. The dashboard's key proves the question is its own.
 */
export async function askPresence(origin: string, keys: SwarmKeys, peer: string): Promise<boolean> {
  const room = defined(roomOf(keys.token), 'the room of the swarm token');
  const response = await post(origin, PRESENCE_PATH, {
    room,
    peer,
    proof: presenceProof(keys.dashboardKey, room, peer),
  });
  const answer = (await response.json()) as Partial<PresenceAnswer>;
  if (typeof answer.present !== 'boolean')
    throw new Error(`the server at ${origin} answered ${JSON.stringify(answer).slice(0, 200)} for a page's presence`);
  return answer.present;
}

/**
 * The id of the swarm's dashboard as the server has it; else why not: `refused` where the server
 * does not stand by the token (revoked, or none of its making), `waiting` where no dashboard of the
 * swarm is open. A server that cannot be reached throws.
 */
export async function findCoordinator(
  origin: string,
  token: string,
  worker: string,
): Promise<{ coordinator: string } | { refused: string } | { waiting: string }> {
  const room = roomOf(token);
  if (!room) return { refused: 'this link has no join token of this server: open the worker link the dashboard shows' };
  const body: CoordinatorRequest = { room, peer: worker, proof: findProof(token, worker) };
  const response = await fetch(new URL(FIND_PATH, origin), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = async () => (await response.text()).slice(0, 300);
  if (response.status === 403) return { refused: `the server refused this link: ${await text()}` };
  if (response.status === 404) return { waiting: await text() };
  if (!response.ok)
    throw new Error(
      `the server at ${origin} would not say where this swarm's dashboard is: HTTP ${response.status} ${await text()}`,
    );
  const answer = (await response.json()) as Partial<CoordinatorAnswer>;
  if (typeof answer.coordinator !== 'string')
    throw new Error(`the server at ${origin} answered ${JSON.stringify(answer).slice(0, 200)} for the dashboard's id`);
  return { coordinator: answer.coordinator };
}

/**
 * The link a worker opens to join a swarm: the token in the fragment, which a browser sends to no server and puts in
 * no Referer, and no dashboard id (the worker asks the server for this load's). With `caFingerprint` (at the server's
 * own https names) it names the server's CA, which a worker process pins and a browser trusts once.
 */
export function workerLink(origin: string, token: string, caFingerprint: string | null): string {
  const link = `${origin}/worker.html#token=${encodeURIComponent(token)}`;
  return caFingerprint === null ? link : `${link}&${CA_LINK_PARAM}=${caFingerprint}`;
}
