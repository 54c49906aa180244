// A swarm's join token is the server's to give (server/join-tokens.ts): `<room>.<seal>`, where the
// room names the swarm on the server (the relay groups a swarm's pages by it; it is no secret) and
// the seal is an HMAC of the room under a secret only the server holds. So nobody can make up a
// token the relay takes, and the server checks one without keeping a list: it recomputes it from
// the room. Pages still never send the token: they show the server proofs made with it (joinProof),
// bound to what they ask, as they show each other (core/net/join.ts).
import { joinProof } from './hmac.ts';

/** Where a dashboard asks its server for a join token, or to keep the one it has. */
export const SWARMS_PATH = '/swarms';
/** Where a dashboard tells its server that a join token is no longer good. */
export const REVOKE_PATH = '/swarms/revoke';

const TOKEN_PATTERN = /^([0-9a-f]{24})\.[0-9a-f]{32}$/;

/** The room a join token names, or null for what is no token of this server's making. */
export function roomOf(token: string): string | null {
  return TOKEN_PATTERN.exec(token)?.[1] ?? null;
}

/** What a page shows the relay to enter its swarm's room: bound to its PeerJS id and credential. */
export const relayProof = (token: string, peer: string, auth: string): string => joinProof(token, 'relay', roomOf(token) ?? '', peer, auth);

/** What the dashboard asks its server: keep this token (proof that it holds it), or a new one. */
export interface SwarmRequest {
  room?: string;
  proof?: string;
}

/** What the server answers: a new token, or none when the one the dashboard holds stands. */
export interface SwarmAnswer {
  token?: string;
}

export const keepProof = (token: string): string => joinProof(token, 'keep', roomOf(token) ?? '');
export const revokeProof = (token: string): string => joinProof(token, 'revoke', roomOf(token) ?? '');

async function post(origin: string, path: string, body: SwarmRequest): Promise<Response> {
  const response = await fetch(new URL(path, origin), { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (!response.ok) throw new Error(`the server at ${origin} would not ${path === REVOKE_PATH ? 'revoke the join link' : 'give this dashboard a join link'}: HTTP ${response.status} ${await response.text()}`);
  return response;
}

/**
 * The join token a dashboard of `origin` works with: `held` where the server still stands by it
 * (a reload keeps its workers' links), else a new one from the server.
 */
export async function obtainJoinToken(origin: string, held?: string): Promise<string> {
  const room = held === undefined ? null : roomOf(held);
  const request: SwarmRequest = room && held ? { room, proof: keepProof(held) } : {};
  const answer = (await (await post(origin, SWARMS_PATH, request)).json()) as SwarmAnswer;
  if (typeof answer.token === 'string' && roomOf(answer.token)) return answer.token;
  if (held && room && answer.token === undefined) return held;
  throw new Error(`the server at ${origin} answered ${JSON.stringify(answer).slice(0, 200)} for a join token`);
}

/** Tells the server `token` is no longer good: no page enters its relay room again, the pages in it are let go. */
export async function revokeJoinToken(origin: string, token: string): Promise<void> {
  const room = roomOf(token);
  if (room) await post(origin, REVOKE_PATH, { room, proof: revokeProof(token) });
}
