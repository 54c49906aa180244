import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { findProof, roomOf, type SwarmKeys } from '../../core/net/join-token.ts';
import { signalingOptions } from '../../core/net/peer-link.ts';
import { askTurn, dashboardIceRequest, ICE_PATH, workerIceRequest, type IceAnswer } from '../../core/net/turn.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';
import {
  issueTurnCredentials,
  TURN_CREDENTIAL_LIFETIME_S,
  turnCredential,
  turnServerFrom,
} from '../../server/turn-credentials.ts';

// TURN as the standard relay (issue 63, item 4): coturn's time-limited credentials, given by the
// server to the pages of its swarms only.
const SECRET = 'north-wind-secret';
const TURN = { secret: SECRET, urls: ['turn:127.0.0.1:3478', 'turn:127.0.0.1:3478?transport=tcp'] };
const WORKER = 'ditswarm-w-0123456789ab';

describe("coturn's REST credentials", () => {
  it('are base64(HMAC-SHA1(secret, username)): the vector openssl and Python compute', () => {
    // printf '%s' '1700000000:ditswarm-w-0123456789ab' | openssl dgst -sha1 -hmac north-wind-secret -binary | base64
    // (and Python's base64.b64encode(hmac.new(b'north-wind-secret', username, hashlib.sha1).digest()))
    expect(turnCredential(SECRET, '1700000000:ditswarm-w-0123456789ab')).toBe('o8jz3p8GO2Ie/271wPS/jJMzSm4=');
  });

  it('name the expiry a day on, in unix seconds, and the id; every URL of the TURN server gets them', () => {
    const now = 1_699_913_600_500; // half a second into 1699913600
    const { iceServers, expiresAt } = issueTurnCredentials(TURN, WORKER, now);
    expect(TURN_CREDENTIAL_LIFETIME_S).toBe(86_400);
    expect(iceServers).toEqual([
      {
        urls: TURN.urls,
        username: '1700000000:ditswarm-w-0123456789ab',
        credential: 'o8jz3p8GO2Ie/271wPS/jJMzSm4=',
      },
    ]);
    expect(expiresAt).toBe(1_700_000_000_000);
  });

  it('come from a secret and at least one turn: URL; one without the other, or another scheme, is refused', () => {
    expect(turnServerFrom(undefined, [])).toBeNull();
    expect(turnServerFrom('s', ['turn:h:3478', 'turns:h:5349?transport=tcp'])).toEqual({
      secret: 's',
      urls: ['turn:h:3478', 'turns:h:5349?transport=tcp'],
    });
    expect(() => turnServerFrom(undefined, ['turn:h:3478'])).toThrow(/give --turn-secret S or DITSWARM_TURN_SECRET/);
    expect(() => turnServerFrom('s', [])).toThrow(/give --turn-url turn:HOST:3478/);
    expect(() => turnServerFrom('s', ['stun:h:3478'])).toThrow(/"stun:h:3478" is no TURN URL: give turn:HOST:PORT/);
  });
});

describe('a server with a TURN secret', () => {
  let server: RunningServer;
  let keys: SwarmKeys;
  beforeAll(async () => {
    server = await startServer({ port: 0, quiet: true, turn: TURN, iceServers: [{ urls: 'stun:stun.example.org' }] });
    const token = server.joinTokens.issue();
    keys = { token, dashboardKey: server.joinTokens.dashboardKey(defined(roomOf(token), 'its room')) };
  });
  afterAll(() => server.close());

  const post = (body: unknown) =>
    fetch(new URL(ICE_PATH, server.url), {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });

  it('publishes that it has TURN, and its STUN list, but no secret and no credential, to everyone', async () => {
    const published = await (await fetch(new URL('/signaling.json', server.url))).text();
    expect(published).not.toContain(SECRET);
    expect(published).not.toContain('credential');
    const signaling = await signalingOptions(server.url);
    expect(signaling).toMatchObject({
      turn: true,
      iceTransportPolicy: 'all',
      iceServers: [{ urls: 'stun:stun.example.org' }],
    });
  });

  it('gives no credentials (403) to a page that proves no join token, a made-up one, or another id than its proof', async () => {
    const room = defined(roomOf(keys.token), 'its room');
    const madeUp = `${room}.${'0'.repeat(32)}`;
    for (const body of [
      {},
      { room, peer: WORKER },
      { room, peer: WORKER, proof: 'f'.repeat(64) },
      workerIceRequest(madeUp, WORKER),
      { ...workerIceRequest(keys.token, WORKER), peer: 'ditswarm-w-ffffffffffff' },
      // the proof of another purpose (finding the dashboard) is no proof here
      { room, peer: WORKER, proof: findProof(keys.token, WORKER) },
    ]) {
      const response = await post(body);
      expect(response.status).toBe(403);
      const text = await response.text();
      expect(text).toContain('TURN credentials go to the pages of its swarms only');
      expect(text).not.toContain('credential"');
    }
    await expect(askTurn(server.url, workerIceRequest(madeUp, WORKER))).rejects.toThrow(
      /gave no TURN credentials: HTTP 403 no proof of a join token/,
    );
  });

  it("gives a worker that proves the join token, and the dashboard that proves its key, a day's credentials for their own ids", async () => {
    const before = Date.now();
    const worker = await askTurn(server.url, workerIceRequest(keys.token, WORKER));
    const dashboard = await askTurn(server.url, dashboardIceRequest(keys, 'ditswarm-c-0123456789ab'));
    for (const [answer, id] of [
      [worker, WORKER],
      [dashboard, 'ditswarm-c-0123456789ab'],
    ] as [IceAnswer, string][]) {
      const [turn] = answer.iceServers;
      expect(answer.iceServers).toHaveLength(1);
      expect(turn.urls).toEqual(TURN.urls);
      const username = defined(turn.username, 'a username');
      expect(username).toMatch(new RegExp(`^\\d+:${id}$`));
      // what coturn computes from its static-auth-secret
      expect(turn.credential).toBe(turnCredential(SECRET, username));
      const expiry = Number(username.split(':')[0]) * 1000;
      expect(expiry).toBe(answer.expiresAt);
      expect(expiry - before).toBeGreaterThan((TURN_CREDENTIAL_LIFETIME_S - 5) * 1000);
      expect(expiry - before).toBeLessThanOrEqual(TURN_CREDENTIAL_LIFETIME_S * 1000);
    }
  });

  it('gives none once the join link is revoked', async () => {
    const token = server.joinTokens.issue();
    expect((await post(workerIceRequest(token, WORKER))).status).toBe(200);
    server.joinTokens.revoke(defined(roomOf(token), 'its room'));
    expect((await post(workerIceRequest(token, WORKER))).status).toBe(403);
  });
});

describe('a server without TURN', () => {
  it('says so (404) to a page that asks, and publishes no TURN', async () => {
    const server = await startServer({ port: 0, quiet: true });
    try {
      const token = server.joinTokens.issue();
      const response = await fetch(new URL(ICE_PATH, server.url), {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(workerIceRequest(token, WORKER)),
      });
      expect(response.status).toBe(404);
      expect(await response.text()).toContain('starts it with --turn-secret and --turn-url');
      expect((await signalingOptions(server.url)).turn).toBe(false);
    } finally {
      await server.close();
    }
  });

  it('refuses to start with every link forced through TURN', async () => {
    await expect(startServer({ port: 0, quiet: true, iceTransportPolicy: 'relay' })).rejects.toThrow(
      /sends every link through TURN, but this server has no TURN server: give --turn-secret and --turn-url/,
    );
  });
});
