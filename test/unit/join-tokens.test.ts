import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { keepProof, obtainJoinToken, REVOKE_PATH, revokeJoinToken, revokeProof, roomOf, SWARMS_PATH } from '../../core/net/join-token.ts';
import { openJoinTokens, TOKENS_PER_MINUTE } from '../../server/join-tokens.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';

// Join tokens are the server's to give (issue 17, findings 4 and 14): a token nobody can make up,
// kept across a dashboard's reloads and the server's restarts, revocable; asked for over HTTP by
// pages of the server's own origins.
describe('the join tokens a server makes', () => {
  it('are its own: a token of another secret, a changed seal or a revoked room is not one it stands by', () => {
    const tokens = openJoinTokens();
    const token = tokens.issue();
    const room = roomOf(token)!;
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

  it('outlive a restart with a state folder: the same secret, the same revocations', () => {
    const dir = mkdtempSync(join(tmpdir(), 'ditswarm-tokens-'));
    try {
      const before = openJoinTokens(dir);
      const [kept, revoked] = [before.issue(), before.issue()];
      before.revoke(roomOf(revoked)!);
      const after = openJoinTokens(dir);
      expect(after.standing(roomOf(kept)!)).toBe(kept);
      expect(after.standing(roomOf(revoked)!)).toBeNull();
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
    fetch(`${server.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });

  it('gives a new token, keeps one its holder proves it holds, and not one it does not', async () => {
    const token = await obtainJoinToken(server.url);
    expect(server.joinTokens.standing(roomOf(token)!)).toBe(token);
    expect(await obtainJoinToken(server.url, token)).toBe(token);
    // the room alone is public: without the proof the asker gets a token of its own, never this one
    const answer = await (await post(SWARMS_PATH, { room: roomOf(token), proof: 'f'.repeat(64) })).json();
    expect(answer.token).toMatch(/^[0-9a-f]{24}\./);
    expect(answer.token).not.toBe(token);
    // a token of an older dashboard (not of this server's making) is replaced
    expect(await obtainJoinToken(server.url, '0123456789abcdef01234567')).not.toBe('0123456789abcdef01234567');
  });

  it('revokes a token on proof of it only, and then gives its holder a new one', async () => {
    const token = await obtainJoinToken(server.url);
    const room = roomOf(token)!;
    expect((await post(REVOKE_PATH, { room, proof: keepProof(token) })).status).toBe(403); // a keep proof is no revoke proof
    expect(server.joinTokens.standing(room)).toBe(token);
    await revokeJoinToken(server.url, token);
    expect(server.joinTokens.standing(room)).toBeNull();
    expect((await post(REVOKE_PATH, { room, proof: revokeProof(token) })).status).toBe(403); // gone
    expect(await obtainJoinToken(server.url, token)).not.toBe(token);
  });

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
