import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { defined } from '../../core/defined.ts';
import { relayProof, roomOf } from '../../core/net/join-token.ts';
import { relayUrl, type RelayRole } from '../../core/net/relay-client.ts';
import { openJoinTokens, type JoinTokens } from '../../server/join-tokens.ts';
import { CONNECTION_CREDIT_BYTES, createRelay, type Relay } from '../../server/relay.ts';

// One client holding a join token against the relay's memory (issue 33, finding 6): its pages, all
// its own, open connections to a page of theirs that never reads, each within its credit.
const FRAME = 256 * 1024;
const ROOM_BUDGET = 2 * 1024 * 1024;

let server: http.Server;
let relay: Relay;
let origin: string;
let tokens: JoinTokens;
const opened: WebSocket[] = [];

beforeEach(async () => {
  tokens = openJoinTokens();
  relay = createRelay({ vouch: (peer, auth) => auth === `auth-${peer}`, tokens, roomBudgetBytes: ROOM_BUDGET });
  server = http.createServer();
  server.on('upgrade', (request, socket, head) => relay.handleUpgrade(request, socket, head));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterEach(async () => {
  for (const ws of opened.splice(0)) ws.terminate();
  relay.close();
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

const text = (data: WebSocket.RawData) =>
  (Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data as ArrayBuffer)).toString();

async function page(peer: string, token: string, role: RelayRole) {
  const auth = `auth-${peer}`;
  const registration = { peer, auth, room: roomOf(token) ?? '', proof: relayProof(token, peer, auth), role };
  const ws = new WebSocket(relayUrl(origin, '/relay', registration));
  opened.push(ws);
  const messages: string[] = [];
  ws.on('message', (data, binary) => !binary && messages.push(text(data)));
  await new Promise((resolve) => ws.once('open', resolve));
  await expect.poll(() => messages.some((m) => m.includes('welcome'))).toBe(true);
  let ref = 0;
  return {
    ws,
    messages,
    async dial(to: string): Promise<number> {
      const asked = ++ref;
      ws.send(JSON.stringify({ t: 'dial', ref: asked, to, metadata: {} }));
      const answer = () => messages.find((m) => m.includes('"t":"dialed"') && m.includes(`"ref":${asked},`));
      await expect.poll(answer).toBeTruthy();
      return (JSON.parse(defined(answer(), 'the dialed message')) as { conn: number }).conn;
    },
  };
}

const frame = (conn: number) => {
  const f = Buffer.alloc(4 + FRAME, 7);
  f.writeUInt32LE(conn, 0);
  return f;
};

describe("the relay's memory for one join token", () => {
  it('is bounded: past the room budget its page with the most queued is let go, though each connection kept within its credit; another room goes on', async () => {
    const token = tokens.issue();
    await page('c', token, 'coordinator');
    const stalled = await page('stalled', token, 'worker');
    const flooders = [await page('f1', token, 'worker'), await page('f2', token, 'worker')];
    const other = tokens.issue();
    await page('other-c', other, 'coordinator');
    const bystander = await page('other-w', other, 'worker');
    const toBystander = await bystander.dial('other-c');
    const conns = await Promise.all(flooders.map((f) => f.dial('stalled')));
    stalled.ws.pause(); // reads nothing from now on: what it is sent waits in the server

    const perConnection = Math.floor((CONNECTION_CREDIT_BYTES * 3) / 4 / (FRAME + 4)); // within its credit
    expect(perConnection * FRAME * flooders.length).toBeGreaterThan(4 * ROOM_BUDGET);
    for (const [i, f] of flooders.entries()) for (let k = 0; k < perConnection; k++) f.ws.send(frame(conns[i]));

    await expect.poll(() => relay.stats().socketsCut, { timeout: 20_000 }).toBe(1);
    const stats = relay.stats();
    expect(stats.sockets.map((s) => s.peer)).not.toContain('stalled');
    expect(stats.connectionsCut).toBe(0); // no connection went past its credit: the room's budget did it
    for (const s of stats.sockets) expect(s.peakQueued).toBeLessThanOrEqual(ROOM_BUDGET + FRAME + 4);

    // the other swarm's pages were never touched
    bystander.ws.send(frame(toBystander));
    await expect
      .poll(() => bystander.messages.some((m) => m.includes('"t":"ack"') && m.includes(`"conn":${toBystander}`)))
      .toBe(true);
  });
});
