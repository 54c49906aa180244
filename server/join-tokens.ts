// The swarms' join tokens, held by the server (core/net/join-token.ts for their form): the server
// makes each one from a secret only it has, so the relay admits no page with a token of its own
// making, and a token can be revoked. A dashboard asks for one (POST SWARMS_PATH), keeps it across
// reloads by proving it holds it, and revokes it (POST REVOKE_PATH) when its link went where it
// should not: the relay then lets go the pages in that room and admits none with it again. With a
// state folder (npm start) the secret and the revocations outlive the server, so a restart keeps
// the links it gave out.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { appendFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import express, { type Express } from 'express';
import {
  findProof,
  FIND_PATH,
  PRESENCE_PATH,
  presenceProof,
  keepProof,
  openProof,
  REGISTER_PATH,
  renewProof,
  registerProof,
  REVOKE_PATH,
  revokeProof,
  roomOf,
  SWARMS_PATH,
  OWNER_KEY_PARAM,
  type CoordinatorAnswer,
  type CoordinatorRequest,
  type PresenceAnswer,
  type SwarmAnswer,
  type SwarmRequest,
} from '../core/net/join-token.ts';
import type { Origins } from './origins.ts';
import { clientSource, isLoopback, perAddressLimit } from './rate-limit.ts';
import { PEER_ID_PREFIX } from '../core/net/peer-link.ts';
import { dashboardIceProof, ICE_PATH, workerIceProof, type IceAnswer } from '../core/net/turn.ts';
import { defined } from '../core/defined.ts';

/**
 * join tokens one address may be given a minute: a dashboard asks once a load (and keeps the one
 * it has). Making one costs nothing kept, but each can be revoked, and revocations are kept.
 */
export const TOKENS_PER_MINUTE = 60;
/** swarms whose dashboard ids are kept (those of closed dashboards go first): far more than one server serves */
export const MAX_SWARMS = 10_000;
/** a swarm's earlier dashboard ids kept, so that none is registered again */
const PAST_IDS = 16;

export interface JoinTokens {
  /** A new token, for a new swarm. */
  issue(): string;
  /** The token of `room` if this server made it and it is not revoked, else null. */
  standing(room: string): string | null;
  /** What only the dashboard of `room` is given: it proves it is that swarm's dashboard. */
  dashboardKey(room: string): string;
  /**
   * What the server's owner holds (`npm start` prints it in the dashboard's link for other
   * machines): a page that proves it is given new tokens, as is one of the server's own machine.
   */
  ownerKey(): string;
  /**
   * The dashboard of `room` has the PeerJS id `peer` now (a fresh one each time it loads); false
   * for an id it had before (a request replayed to send its workers to an id that was let go).
   */
  register(room: string, peer: string): boolean;
  /** The id the dashboard of `room` last registered while its page holds it, or null. */
  coordinatorOf(room: string): string | null;
  /** `peer`'s page let it go: it is no swarm's dashboard any more. */
  forgetCoordinator(peer: string): void;
  /** No page enters `room` again; `onRevoke`'s listeners let go those in it. */
  revoke(room: string): void;
  onRevoke(listener: (room: string) => void): void;
  /** A dashboard registered a new id for `room` (it opened, or loaded again): `npm start` prints its worker link. */
  onRegister(listener: (room: string) => void): void;
}

/** `stateDir`: where the secret and the revoked rooms outlive restarts; without it they last as long as the process. */
export function openJoinTokens(stateDir?: string): JoinTokens {
  const secret = loadSecret(stateDir);
  const revokedFile = stateDir && join(stateDir, 'revoked-rooms');
  const revoked = new Set(
    revokedFile && existsSync(revokedFile) ? readFileSync(revokedFile, 'utf8').split('\n').filter(Boolean) : [],
  );
  const listeners = new Set<(room: string) => void>();
  const registered = new Set<(room: string) => void>();
  const sealed = (what: string, room: string) =>
    createHmac('sha256', secret).update(`${what}\n${room}`).digest('hex').slice(0, 32);
  const tokenOf = (room: string) => `${room}.${sealed('join token', room)}`;
  // each swarm's dashboard id for this load: in memory (a dashboard registers again as it loads),
  // with the ids it had before (at most PAST_IDS), which it never has again
  const coordinators = new Map<string, { peer: string; past: string[] }>();
  const roomOfPeer = new Map<string, string>();
  return {
    issue: () => tokenOf(randomBytes(12).toString('hex')),
    standing: (room) => (/^[0-9a-f]{24}$/.test(room) && !revoked.has(room) ? tokenOf(room) : null),
    dashboardKey: (room) => sealed('dashboard key', room),
    ownerKey: () => sealed('owner key', ''),
    register(room, peer) {
      const entry = coordinators.get(room) ?? { peer: '', past: [] };
      if (entry.peer === peer || entry.past.includes(peer)) return entry.peer === peer;
      if (entry.peer) entry.past = [...entry.past, entry.peer].slice(-PAST_IDS);
      roomOfPeer.delete(entry.peer);
      // one swarm per page: a dashboard whose link was revoked names its id for the new swarm only
      const before = roomOfPeer.get(peer);
      if (before !== undefined) defined(coordinators.get(before), `the swarm ${before} of ${peer}`).peer = '';
      entry.peer = peer;
      roomOfPeer.set(peer, room);
      coordinators.delete(room); // the most recently registered last
      coordinators.set(room, entry);
      if (coordinators.size > MAX_SWARMS) {
        // the least recently registered whose page is gone; a swarm whose dashboard is open only if
        // all are open (they hold signaling ids, of which there are far fewer than MAX_SWARMS)
        const [oldest, { peer: old }] =
          [...coordinators].find(([, e]) => !e.peer) ??
          defined(coordinators.entries().next().value, 'the least recently registered swarm');
        coordinators.delete(oldest);
        roomOfPeer.delete(old);
      }
      for (const listener of registered) listener(room);
      return true;
    },
    coordinatorOf: (room) => coordinators.get(room)?.peer || null,
    forgetCoordinator(peer) {
      const room = roomOfPeer.get(peer);
      if (room === undefined) return;
      roomOfPeer.delete(peer);
      const entry = defined(coordinators.get(room), `the swarm ${room} of ${peer}`);
      entry.past = [...entry.past, peer].slice(-PAST_IDS);
      entry.peer = '';
    },
    revoke(room) {
      if (revoked.has(room)) return;
      revoked.add(room);
      const peer = coordinators.get(room)?.peer;
      if (peer && roomOfPeer.get(peer) === room) roomOfPeer.delete(peer);
      coordinators.delete(room);
      if (revokedFile) appendFileSync(revokedFile, `${room}\n`);
      for (const listener of listeners) listener(room);
    },
    onRevoke: (listener) => void listeners.add(listener),
    onRegister: (listener) => void registered.add(listener),
  };
}

function loadSecret(stateDir: string | undefined): Buffer {
  if (!stateDir) return randomBytes(32);
  const file = join(stateDir, 'join-secret');
  if (existsSync(file)) {
    const secret = Buffer.from(readFileSync(file, 'utf8').trim(), 'hex');
    if (secret.length === 32) return secret;
    throw new Error(
      `${file} is not a 64-digit hex secret: delete it (the join links given out so far stop working) and start again`,
    );
  }
  mkdirSync(stateDir, { recursive: true });
  const secret = randomBytes(32);
  writeFileSync(file, secret.toString('hex') + '\n', { mode: 0o600 });
  return secret;
}

/** Whether `proof` is what `expected` is, in time that does not tell how much of it matched. */
export function sameProof(proof: unknown, expected: string): boolean {
  return (
    typeof proof === 'string' &&
    proof.length === expected.length &&
    timingSafeEqual(Buffer.from(proof), Buffer.from(expected))
  );
}

/**
 * POST SWARMS_PATH (`{room, proof}` of its dashboard key to keep a token → `{}`; else, to the
 * server's owner only, `{token, dashboardKey}`, new ones: a page of this machine, one with `owner`
 * proving the owner key, or a dashboard's renew proof of a standing token), POST REVOKE_PATH
 * (`{room, proof}` of the dashboard key → 204), POST REGISTER_PATH (a dashboard's id for this
 * load, proved with its dashboard key → 204) and POST FIND_PATH (a worker's proof of the token →
 * `{coordinator}`), and POST ICE_PATH (a worker's proof of the token, or a dashboard's of its key,
 * for its own id → `iceFor`'s TURN credentials; 404 where the server has no TURN). Pages of this
 * server's origins and the allowed ones only (CORS for those), a few tokens a minute from one network.
 */
export function mountJoinTokens(
  app: Express,
  tokens: JoinTokens,
  origins: Origins,
  vouch: (peer: string, auth: string) => boolean,
  /** whether a page holds `peer` on the signaling server now */
  holds: (peer: string) => boolean,
  /** TURN credentials for the page of `peer`, where this server has a TURN server (server/turn-credentials.ts) */
  iceFor: ((peer: string) => IceAnswer) | null = null,
): void {
  const limit = perAddressLimit(TOKENS_PER_MINUTE, 60_000);
  const json = express.json({ limit: 1024 });
  // SWARMS_PATH covers every path under it
  app.use(SWARMS_PATH, (request, response, next) => {
    const origin = request.headers.origin;
    if (!origins.originAllowed(origin))
      return void response
        .status(403)
        .type('text')
        .send('pages of this origin may not open swarms on this server: start it with --allow-origin for it');
    if (origin) response.setHeader('Access-Control-Allow-Origin', origin).setHeader('Vary', 'Origin');
    if (request.method === 'OPTIONS')
      return void response
        .setHeader('Access-Control-Allow-Methods', 'POST')
        .setHeader('Access-Control-Allow-Headers', 'content-type')
        .sendStatus(204);
    next();
  });
  /** the standing room of a SwarmRequest whose proof is `proofOf` the room's dashboard key, or null */
  const held = (body: unknown, proofOf: (dashboardKey: string, room: string) => string): string | null => {
    const room = field(body, 'room');
    if (typeof room !== 'string' || !tokens.standing(room)) return null;
    return sameProof(field(body, 'proof'), proofOf(tokens.dashboardKey(room), room)) ? room : null;
  };
  /** the room and id of a CoordinatorRequest whose proof `proofOf` makes from the room's token, or null */
  const proven = (
    body: unknown,
    proofOf: (token: string, room: string, peer: string) => string,
  ): { room: string; peer: string } | null => {
    const room = field(body, 'room');
    const peer = field(body, 'peer');
    if (typeof room !== 'string' || typeof peer !== 'string' || !PEER_ID.test(peer)) return null;
    const token = tokens.standing(room);
    return token && sameProof(field(body, 'proof'), proofOf(token, room, peer)) ? { room, peer } : null;
  };
  app.post(SWARMS_PATH, json, (request, response) => {
    if (held(request.body, keepProof)) return void response.json({} satisfies SwarmAnswer);
    const source = clientSource(request.socket.remoteAddress);
    // a join token opens a relay room and a swarm: the server's owner's to make, not anyone's who asks
    const owner =
      isLoopback(source) ||
      sameProof(field(request.body, 'owner'), openProof(tokens.ownerKey())) ||
      held(request.body, renewProof) !== null;
    if (!owner)
      return void response
        .status(403)
        .type('text')
        .send(
          'only the owner of this server opens swarms on it: open the dashboard on the machine that runs it ' +
            `(http://localhost:${request.socket.localPort ?? ''}/), or at the link with #${OWNER_KEY_PARAM}= it printed`,
        );
    if (!limit(source.prefix))
      return void response
        .status(429)
        .type('text')
        .send(`over ${TOKENS_PER_MINUTE} join links a minute from this network: wait a minute`);
    const token = tokens.issue();
    const room = defined(roomOf(token), 'the room of a token this server made');
    response.json({ token, dashboardKey: tokens.dashboardKey(room) } satisfies SwarmAnswer);
  });
  app.post(REVOKE_PATH, json, (request, response) => {
    const room = held(request.body, revokeProof);
    if (!room)
      return void response
        .status(403)
        .type('text')
        .send('no proof of the dashboard key of a join token this server stands by');
    tokens.revoke(room);
    response.sendStatus(204);
  });
  app.post(REGISTER_PATH, json, (request, response) => {
    const proved = proven(request.body, (_token, room, peer) => registerProof(tokens.dashboardKey(room), room, peer));
    if (!proved) return void response.status(403).type('text').send("no proof of this swarm's dashboard key");
    const { room, peer } = proved;
    const auth = field(request.body, 'auth');
    // the id is named to workers only while a page holds it, and only the page that holds it may name it
    if (!peer.startsWith(PEER_ID_PREFIX.coordinator) || typeof auth !== 'string' || !vouch(peer, auth))
      return void response
        .status(403)
        .type('text')
        .send(`${peer} is not a dashboard id this page holds on the signaling server`);
    if (!tokens.register(room, peer))
      return void response
        .status(409)
        .type('text')
        .send(`${peer} was this swarm's dashboard before: a dashboard takes a fresh id each load`);
    response.sendStatus(204);
  });
  app.post(FIND_PATH, json, (request, response) => {
    const room = proven(request.body, (token, _room, peer) => findProof(token, peer))?.room;
    if (!room)
      return void response
        .status(403)
        .type('text')
        .send('no proof of a join token this server stands by: the link was revoked, or is not of this server');
    const coordinator = tokens.coordinatorOf(room);
    if (!coordinator)
      return void response
        .status(404)
        .type('text')
        .send("this swarm's dashboard is not open: open it (or wait for it to load)");
    response.json({ coordinator } satisfies CoordinatorAnswer);
  });
  app.post(PRESENCE_PATH, json, (request, response) => {
    const proved = proven(request.body, (_token, room, peer) => presenceProof(tokens.dashboardKey(room), room, peer));
    if (!proved) return void response.status(403).type('text').send("no proof of this swarm's dashboard key");
    response.json({ present: holds(proved.peer) } satisfies PresenceAnswer);
  });
  app.post(ICE_PATH, json, (request, response) => {
    if (!iceFor)
      return void response
        .status(404)
        .type('text')
        .send('this server has no TURN server: its owner starts it with --turn-secret and --turn-url for one');
    // a worker proves the join token, a dashboard its dashboard key: only a swarm's pages relay through its TURN
    const proved =
      proven(request.body, (token, _room, peer) => workerIceProof(token, peer)) ??
      proven(request.body, (_token, room, peer) => dashboardIceProof(tokens.dashboardKey(room), room, peer));
    if (!proved)
      return void response
        .status(403)
        .type('text')
        .send(
          'no proof of a join token (or dashboard key) this server stands by: TURN credentials go to the pages ' +
            'of its swarms only; open the worker link the dashboard shows',
        );
    response.setHeader('Cache-Control', 'no-store').json(iceFor(proved.peer) satisfies IceAnswer);
  });
  // express tells an error handler by its 4 parameters, so `_next` stays
  const badRequest: express.ErrorRequestHandler = (error: Error, _request, response, _next) => {
    response.status(400).type('text').send(`a join-link request is JSON of at most 1 KiB: ${error.message}`);
  };
  app.use(SWARMS_PATH, badRequest);
}

/** `key` of a JSON body, which may be anything */
function field(body: unknown, key: keyof SwarmRequest | keyof CoordinatorRequest): unknown {
  return typeof body === 'object' && body !== null ? (body as Record<string, unknown>)[key] : undefined;
}

/** a PeerJS id as this project's pages make them (core/net/peer-link.ts), bounded */
const PEER_ID = /^[A-Za-z0-9_-]{1,64}$/;
