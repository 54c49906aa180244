import http from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  askPresence,
  keepProof,
  openProof,
  PRESENCE_PATH,
  presenceProof,
  renewProof,
  renewSwarmKeys,
  roomOf,
  SWARMS_PATH,
  type SwarmAnswer,
} from '../../core/net/join-token.ts';
import { defined } from '../../core/defined.ts';
import { mountJoinTokens, openJoinTokens, type JoinTokens } from '../../server/join-tokens.ts';
import { serverOrigins } from '../../server/origins.ts';

// Who is given a join token (issue 33, finding 6): a token opens a swarm and a relay room on the
// server, so it is its owner's to make. Requests here come from another machine of the LAN (the
// address the server sees is set before its routes) unless a test says otherwise.
let server: http.Server;
let origin: string;
let tokens: JoinTokens;
let clientAddress = '10.0.0.9';
/** the one worker page the stub signaling server holds */
const PRESENT_WORKER = 'ditswarm-w-0123456789ab';

beforeAll(async () => {
  tokens = openJoinTokens();
  const app = express();
  app.use((request, _response, next) => {
    Object.defineProperty(request.socket, 'remoteAddress', { value: clientAddress, configurable: true });
    next();
  });
  mountJoinTokens(
    app,
    tokens,
    serverOrigins([], () => null),
    () => false,
    (peer) => peer === PRESENT_WORKER,
  );
  server = http.createServer(app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

const ask = async (body: object, from = '10.0.0.9') => {
  clientAddress = from;
  const response = await fetch(new URL(SWARMS_PATH, origin), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: response.status, answer: response.ok ? ((await response.json()) as SwarmAnswer) : null };
};

describe('a new join token', () => {
  it('is refused (403) to a page of another machine that proves nothing, or a wrong owner key', async () => {
    expect((await ask({})).status).toBe(403);
    expect((await ask({ owner: openProof('a guess') })).status).toBe(403);
    expect((await ask({ owner: tokens.ownerKey() })).status).toBe(403); // the key itself is no proof
  });

  it("is given to a page of the server's own machine (any loopback address), and to one proving the owner key", async () => {
    for (const from of ['127.0.0.1', '127.0.0.2', '::1', '::ffff:127.0.0.1']) {
      const { status, answer } = await ask({}, from);
      expect(status).toBe(200);
      expect(roomOf(defined(answer?.token, 'a token'))).not.toBeNull();
    }
    const { status, answer } = await ask({ owner: openProof(tokens.ownerKey()) });
    expect(status).toBe(200);
    expect(answer?.dashboardKey).toMatch(/^[0-9a-f]{32}$/);
  });

  it("is given to a dashboard renewing its standing token (Revoke), not for a revoked one nor with a worker's token", async () => {
    const token = tokens.issue();
    const room = defined(roomOf(token), 'the room');
    const dashboardKey = tokens.dashboardKey(room);
    expect((await ask({ room, proof: keepProof(dashboardKey, room) })).answer).toEqual({}); // kept, none new
    expect((await ask({ room, proof: renewProof(token, room) })).status).toBe(403);
    clientAddress = '10.0.0.9';
    const renewed = await renewSwarmKeys(origin, { token, dashboardKey });
    expect(renewed.token).not.toBe(token);
    tokens.revoke(room);
    expect((await ask({ room, proof: renewProof(dashboardKey, room) })).status).toBe(403);
  });
});

describe("a silent worker's presence, as the dashboard asks it (issue 34)", () => {
  it("the dashboard proving its key hears whether a page holds the id; a worker's token, a wrong key or another room are refused", async () => {
    const token = tokens.issue();
    const room = defined(roomOf(token), 'the room');
    const keys = { token, dashboardKey: tokens.dashboardKey(room) };
    expect(await askPresence(origin, keys, PRESENT_WORKER)).toBe(true);
    expect(await askPresence(origin, keys, 'ditswarm-w-ffffffffffff')).toBe(false);
    // the token is what workers hold: it proves nothing of the dashboard
    await expect(askPresence(origin, { token, dashboardKey: token }, PRESENT_WORKER)).rejects.toThrow(
      /would not say whether a worker page is there: HTTP 403 no proof of this swarm's dashboard key/,
    );
    const other = tokens.issue();
    const proofOfOther = presenceProof(tokens.dashboardKey(defined(roomOf(other), 'the room')), room, PRESENT_WORKER);
    const response = await fetch(new URL(PRESENCE_PATH, origin), {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ room, peer: PRESENT_WORKER, proof: proofOfOther }),
    });
    expect(response.status).toBe(403);
    tokens.revoke(room);
    await expect(askPresence(origin, keys, PRESENT_WORKER)).rejects.toThrow(/HTTP 403/);
  });
});
