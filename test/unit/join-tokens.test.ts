import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WebSocket } from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  findCoordinator,
  findProof,
  keepProof,
  obtainSwarmKeys,
  REGISTER_PATH,
  registerCoordinator,
  registerProof,
  REVOKE_PATH,
  revokeJoinToken,
  revokeProof,
  roomOf,
  SWARMS_PATH,
} from '../../core/net/join-token.ts';
import { defined } from '../../core/defined.ts';
import { MAX_SWARMS, openJoinTokens, TOKENS_PER_MINUTE } from '../../server/join-tokens.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';
import { anyString } from './matchers.ts';

/** The room a token the server made names (every token it makes names one). */
const roomIn = (token: string) => defined(roomOf(token), `the room of token ${token}`);

// Join tokens are the server's to give (issue 17, findings 4 and 14): a token nobody can make up,
// kept across a dashboard's reloads and the server's restarts, revocable; asked for over HTTP by
// pages of the server's own origins.
describe('the join tokens a server makes', () => {
  it('are its own: a token of another secret, a changed seal or a revoked room is not one it stands by', () => {
    const tokens = openJoinTokens();
    const token = tokens.issue();
    const room = roomIn(token);
    expect(token).toMatch(/^[0-9a-f]{24}\.[0-9a-f]{32}$/);
    expect(tokens.standing(room)).toBe(token);
    expect(openJoinTokens().standing(room)).not.toBe(token);
    expect(tokens.standing('not a room')).toBeNull();
    const heard: string[] = [];
    tokens.onRevoke((r) => heard.push(r));
    tokens.revoke(room);
    tokens.revoke(room);
    expect(tokens.standing(room)).toBeNull();
    expect(heard).toEqual([room]);
  });

  it(`keep the ids of ${MAX_SWARMS} swarms' dashboards, letting those of closed dashboards go first: an open one is not pushed out by new swarms`, () => {
    const tokens = openJoinTokens();
    const open = roomIn(tokens.issue());
    expect(tokens.register(open, 'ditswarm-c-open')).toBe(true);
    for (let i = 0; i < MAX_SWARMS + 10; i++) {
      const room = roomIn(tokens.issue());
      tokens.register(room, `ditswarm-c-${i}`);
      tokens.forgetCoordinator(`ditswarm-c-${i}`);
    }
    expect(tokens.coordinatorOf(open)).toBe('ditswarm-c-open');
    // a closed dashboard's id is named to nobody, and never registered again
    const room = roomIn(tokens.issue());
    tokens.register(room, 'ditswarm-c-gone');
    tokens.forgetCoordinator('ditswarm-c-gone');
    expect(tokens.coordinatorOf(room)).toBeNull();
    expect(tokens.register(room, 'ditswarm-c-gone')).toBe(false);
    // a dashboard that revokes its link names the same id for its new swarm, and only there; once
    // its page closes, neither names it
    const [oldRoom, newRoom] = [roomIn(tokens.issue()), roomIn(tokens.issue())];
    tokens.register(oldRoom, 'ditswarm-c-revoker');
    tokens.register(newRoom, 'ditswarm-c-revoker');
    expect([tokens.coordinatorOf(oldRoom), tokens.coordinatorOf(newRoom)]).toEqual([null, 'ditswarm-c-revoker']);
    tokens.revoke(oldRoom);
    tokens.forgetCoordinator('ditswarm-c-revoker');
    expect(tokens.coordinatorOf(newRoom)).toBeNull();
  });

  it('tell their listeners of each new dashboard id a swarm registers (npm start prints its worker link then), not of a refused one', () => {
    const tokens = openJoinTokens();
    const heard: string[] = [];
    tokens.onRegister((room) => heard.push(room));
    const room = roomIn(tokens.issue());
    tokens.register(room, 'ditswarm-c-first');
    tokens.register(room, 'ditswarm-c-first'); // the same id again: nothing new
    tokens.register(room, 'ditswarm-c-reload');
    expect(tokens.register(room, 'ditswarm-c-first')).toBe(false); // an id it had before
    expect(heard).toEqual([room, room]);
  });

  it('outlive a restart with a state folder: the same secret, the same revocations', () => {
    const dir = mkdtempSync(join(tmpdir(), 'ditswarm-tokens-'));
    try {
      const before = openJoinTokens(dir);
      const [kept, revoked] = [before.issue(), before.issue()];
      before.revoke(roomIn(revoked));
      const after = openJoinTokens(dir);
      expect(after.standing(roomIn(kept))).toBe(kept);
      expect(after.standing(roomIn(revoked))).toBeNull();
      expect(readFileSync(join(dir, 'join-secret'), 'utf8')).toMatch(/^[0-9a-f]{64}\n$/);
    } finally {
      rmSync(dir, { recursive: true });
    }
  });
});

describe('asking the server for a join token', () => {
  let server: RunningServer;
  beforeAll(async () => {
    server = await startServer({ port: 0, quiet: true });
  });
  afterAll(async () => server.close());
  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${server.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });

  const obtainJoinToken = async (origin: string, held?: string) =>
    (
      await obtainSwarmKeys(
        origin,
        held ? { token: held, dashboardKey: server.joinTokens.dashboardKey(roomOf(held) ?? '') } : {},
      )
    ).token;

  it('gives a new token, keeps one its holder proves it holds, and not one it does not', async () => {
    const token = await obtainJoinToken(server.url);
    expect(server.joinTokens.standing(roomIn(token))).toBe(token);
    expect(await obtainJoinToken(server.url, token)).toBe(token);
    // the room alone is public: without the proof the asker gets a token of its own, never this one
    const answer = (await (await post(SWARMS_PATH, { room: roomOf(token), proof: 'f'.repeat(64) })).json()) as {
      token: unknown;
    };
    expect(answer.token).toMatch(/^[0-9a-f]{24}\./);
    expect(answer.token).not.toBe(token);
    // a token of an older dashboard (not of this server's making) is replaced
    expect(await obtainJoinToken(server.url, '0123456789abcdef01234567')).not.toBe('0123456789abcdef01234567');
  });

  it('revokes a token on proof of its dashboard key only, and then gives its holder a new one', async () => {
    const keys = await obtainSwarmKeys(server.url);
    const { token, dashboardKey } = keys;
    const room = roomIn(token);
    // a keep proof is no revoke proof
    expect((await post(REVOKE_PATH, { room, proof: keepProof(dashboardKey, room) })).status).toBe(403);
    // a worker holds the token, not the dashboard key
    expect((await post(REVOKE_PATH, { room, proof: revokeProof(token, room) })).status).toBe(403);
    expect(server.joinTokens.standing(room)).toBe(token);
    await revokeJoinToken(server.url, keys);
    expect(server.joinTokens.standing(room)).toBeNull();
    expect((await post(REVOKE_PATH, { room, proof: revokeProof(dashboardKey, room) })).status).toBe(403); // gone
    expect(await obtainJoinToken(server.url, token)).not.toBe(token);
  });

  /** A page holding `id` on the server's PeerJS (its token: `auth-<id>`), as a dashboard does; close() lets it go. */
  const holdId = async (id: string) => {
    const { path, key } = (await (await fetch(`${server.url}/signaling.json`)).json()) as { path: string; key: string };
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}${path}/peerjs?key=${key}&id=${id}&token=auth-${id}`);
    await new Promise((resolve, reject) => (ws.once('message', resolve), ws.once('error', reject))); // peer's OPEN
    const close = () =>
      new Promise((resolve) => {
        ws.once('close', resolve);
        ws.close();
      });
    return { auth: `auth-${id}`, close };
  };

  it('tells a worker that proves the token the id its dashboard holds for this load, and lets only the dashboard register one', async () => {
    const keys = await obtainSwarmKeys(server.url);
    const room = roomIn(keys.token);
    const worker = 'ditswarm-w-0123456789ab';
    // no dashboard open yet: the worker waits
    expect(await findCoordinator(server.url, keys.token, worker)).toEqual({
      waiting: "this swarm's dashboard is not open: open it (or wait for it to load)",
    });
    const first = await holdId('ditswarm-c-first');
    await registerCoordinator(server.url, keys, 'ditswarm-c-first', first.auth);
    expect(await findCoordinator(server.url, keys.token, worker)).toEqual({ coordinator: 'ditswarm-c-first' });
    // a reload: the old page lets its id go, and from then on the id is named to nobody (anyone may
    // take a free id); the new page registers a fresh id, and workers are sent there
    await first.close();
    await expect.poll(() => findCoordinator(server.url, keys.token, worker)).toMatchObject({ waiting: anyString() });
    const second = await holdId('ditswarm-c-second');
    await registerCoordinator(server.url, keys, 'ditswarm-c-second', second.auth);
    expect(await findCoordinator(server.url, keys.token, worker)).toEqual({ coordinator: 'ditswarm-c-second' });
    // an id registered before is not taken again (a replayed request, its id now held by whoever took it)
    const again = await holdId('ditswarm-c-first');
    expect(
      (
        await post(REGISTER_PATH, {
          room,
          peer: 'ditswarm-c-first',
          proof: registerProof(keys.dashboardKey, room, 'ditswarm-c-first'),
          auth: again.auth,
        })
      ).status,
    ).toBe(409);
    // only the page that holds an id may register it, and only a dashboard's
    expect(
      (
        await post(REGISTER_PATH, {
          room,
          peer: 'ditswarm-c-third',
          proof: registerProof(keys.dashboardKey, room, 'ditswarm-c-third'),
          auth: 'auth-ditswarm-c-third',
        })
      ).status,
    ).toBe(403);
    const workerPage = await holdId(worker);
    expect(
      (
        await post(REGISTER_PATH, {
          room,
          peer: worker,
          proof: registerProof(keys.dashboardKey, room, worker),
          auth: workerPage.auth,
        })
      ).status,
    ).toBe(403);
    // a worker holds the token, not the dashboard key: it cannot send the swarm's workers to itself
    expect(
      (
        await post(REGISTER_PATH, {
          room,
          peer: 'ditswarm-c-first',
          proof: registerProof(keys.token, room, 'ditswarm-c-first'),
          auth: again.auth,
        })
      ).status,
    ).toBe(403);
    // without the token, nothing is told: a made-up proof, or a proof made for another page's id
    expect((await post('/swarms/find', { room, peer: worker, proof: 'f'.repeat(64) })).status).toBe(403);
    expect(
      (await post('/swarms/find', { room, peer: 'ditswarm-w-other', proof: findProof(keys.token, worker) })).status,
    ).toBe(403);
    expect(
      (
        await post(REGISTER_PATH, {
          room,
          peer: 'not an id!',
          proof: registerProof(keys.dashboardKey, room, 'not an id!'),
          auth: 'x',
        })
      ).status,
    ).toBe(403);
    expect(await findCoordinator(server.url, keys.token, worker)).toEqual({ coordinator: 'ditswarm-c-second' });
    // a revoked link is told nothing
    await revokeJoinToken(server.url, keys);
    expect(await findCoordinator(server.url, keys.token, worker)).toEqual({
      refused:
        'the server refused this link: no proof of a join token this server stands by: the link was revoked, or is not of this server',
    });
    await Promise.all([second, again, workerPage].map((p) => p.close()));
  });

  it('keeps the keys a dashboard holds only with its dashboard key: a page with the token alone gets new ones', async () => {
    const keys = await obtainSwarmKeys(server.url);
    expect(await obtainSwarmKeys(server.url, keys)).toEqual(keys);
    expect((await obtainSwarmKeys(server.url, { token: keys.token })).token).not.toBe(keys.token);
  });

  // last: it uses up this address's tokens for the minute
  it('answers pages of its own origins only, refuses malformed requests, and gives one address a few tokens a minute', async () => {
    const foreign = await post(SWARMS_PATH, {}, { origin: 'https://evil.example' });
    expect(foreign.status).toBe(403);
    const own = await post(SWARMS_PATH, {}, { origin: server.url });
    expect(own.headers.get('access-control-allow-origin')).toBe(server.url);
    expect((await post(SWARMS_PATH, '{not json')).status).toBe(400);
    expect((await post(SWARMS_PATH, { pad: 'x'.repeat(2048) })).status).toBe(400);
    const statuses: number[] = [];
    for (let i = 0; i < TOKENS_PER_MINUTE; i++) statuses.push((await post(SWARMS_PATH, {})).status);
    expect(statuses.at(-1)).toBe(429);
    expect(statuses.filter((s) => s === 200).length).toBeLessThanOrEqual(TOKENS_PER_MINUTE);
    // one that holds its token is still answered
    const held = server.joinTokens.issue();
    expect(await obtainJoinToken(server.url, held)).toBe(held);
  });
});
