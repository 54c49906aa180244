import http from 'node:http';
import { defined } from '../../core/defined.ts';
import { peerOptions } from '../../core/net/peer-link.ts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import {
  MAX_SIGNALING_CLIENTS_PER_ADDRESS,
  MAX_SIGNALING_MESSAGE_BYTES,
  SIGNALING_BURST,
} from '../../server/peer-signaling.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';

// The signaling server against a hostile client with only what the server hands anyone (its
// /signaling.json): no list of peers to pick a dashboard's id from, no 40 MiB offers held.
let server: RunningServer;
let signaling: { path: string; key: string };

beforeAll(async () => {
  server = await startServer({ port: 0, quiet: true });
  signaling = (await (await fetch(`${server.url}/signaling.json`)).json()) as typeof signaling;
});
afterAll(async () => server.close());

const socket = (id: string) =>
  new Promise<WebSocket>((resolve, reject) => {
    const ws = new WebSocket(
      `${server.url.replace('http', 'ws')}${signaling.path}/peerjs?key=${signaling.key}&id=${id}&token=t${id}`,
    );
    ws.once('message', () => resolve(ws)); // peer's OPEN
    ws.once('error', reject);
  });

describe('the signaling server', () => {
  it('lists no peers (issue 17, finding 1)', async () => {
    const response = await fetch(`${server.url}${signaling.path}/${signaling.key}/peers`);
    expect(response.ok).toBe(false);
  });

  it('closes a socket that sends a message past 64 KiB, an OFFER to an id that does not exist among them (finding 9)', async () => {
    const ws = await socket('attacker-1');
    const closed = new Promise<number>((resolve) => ws.once('close', resolve));
    ws.send(
      JSON.stringify({ type: 'OFFER', dst: 'nobody', payload: { sdp: 'x'.repeat(MAX_SIGNALING_MESSAGE_BYTES) } }),
    );
    expect(await closed).toBe(1009); // message too big
  });

  it('cuts a socket that sends past its rate, and takes no more pages from one address than its share (finding 9)', async () => {
    const flooder = await socket('flooder');
    const closed = new Promise<number>((resolve) => flooder.once('close', resolve));
    for (let i = 0; i <= SIGNALING_BURST; i++) flooder.send(JSON.stringify({ type: 'HEARTBEAT' }));
    expect(await closed).toBe(1006); // terminated
    const held = await Promise.all(
      Array.from({ length: MAX_SIGNALING_CLIENTS_PER_ADDRESS }, (_, i) => socket(`many-${i}`)),
    );
    await expect(socket('one-too-many')).rejects.toThrow(/429/);
    // a place given back is free again
    const opens = () =>
      socket(`again-${held.length}`).then(
        (ws) => (held.push(ws), true),
        () => false,
      );
    defined(held.shift(), 'the first socket held').close();
    await expect.poll(opens).toBe(true);
    for (const ws of held.splice(0)) ws.close();
    await expect.poll(opens).toBe(true);
    held[0].close();
  });

  it('still takes a small OFFER', async () => {
    const [a, b] = [await socket('honest-a'), await socket('honest-b')];
    const got = new Promise<string>((resolve) =>
      b.on('message', (m) => resolve(new TextDecoder().decode(Array.isArray(m) ? Buffer.concat(m) : m))),
    );
    a.send(JSON.stringify({ type: 'OFFER', dst: 'honest-b', payload: { sdp: 'v=0' } }));
    expect(JSON.parse(await got)).toMatchObject({ type: 'OFFER', src: 'honest-a' });
    a.close();
    b.close();
  });
});

// DNS rebinding and foreign pages (issue 17, finding 11): the server answers to its own names only,
// websockets and CORS only for its own origins and those it was told to allow.
describe("the server's hosts and origins", () => {
  const get = (path: string, headers: Record<string, string>) =>
    new Promise<{ status: number; headers: http.IncomingHttpHeaders }>((resolve, reject) => {
      const url = new URL(path, server.url);
      http
        .get({ host: '127.0.0.1', port: url.port, path: url.pathname, headers }, (res) => {
          res.resume();
          resolve({ status: defined(res.statusCode, 'the status of a response'), headers: res.headers });
        })
        .on('error', reject);
    });
  const upgrade = (origin: string, at = server) =>
    new Promise<number | 'open'>((resolve) => {
      const ws = new WebSocket(`${at.url.replace('http', 'ws')}/relay`, { headers: { Origin: origin } });
      ws.once('open', () => {
        ws.close();
        resolve('open');
      });
      ws.once('unexpected-response', (_req, res) => resolve(defined(res.statusCode, 'the status of a response')));
      ws.once('error', () => {});
    });

  it('refuses a request naming another host (421), and serves its own names', async () => {
    expect((await get('/signaling.json', { Host: 'rebound.evil.example:5173' })).status).toBe(421);
    expect((await get('/signaling.json', { Host: `localhost:${server.port}` })).status).toBe(200);
    expect((await get('/signaling.json', { Host: `127.0.0.1:${server.port}` })).status).toBe(200);
  });

  it('answers CORS for its own origin only', async () => {
    const own = await get(`${signaling.path}/${signaling.key}/id`, {
      Host: `localhost:${server.port}`,
      Origin: server.url,
    });
    expect(own.headers['access-control-allow-origin']).toBe(server.url);
    const foreign = await get(`${signaling.path}/${signaling.key}/id`, {
      Host: `localhost:${server.port}`,
      Origin: 'http://evil.example',
    });
    expect(foreign.headers['access-control-allow-origin']).toBeUndefined();
  });

  it("lets an allowed origin's page read its signaling settings and model files by Range, and no other origin", async () => {
    const allowing = await startServer({ port: 0, quiet: true, allowOrigins: ['https://mine.example'] });
    const read = (path: string, origin: string) =>
      fetch(new URL(path, allowing.url), { headers: { Origin: origin, Range: 'bytes=0-9' } });
    try {
      for (const path of ['/signaling.json', '/models/tiny-wan-demo/transformer/config.json']) {
        const mine = await read(path, 'https://mine.example');
        expect(mine.headers.get('access-control-allow-origin'), path).toBe('https://mine.example');
        expect(mine.headers.get('access-control-expose-headers'), path).toContain('Content-Range');
        expect(mine.headers.get('cross-origin-resource-policy'), path).toBe('cross-origin');
        const other = await read(path, 'https://other.example');
        expect(other.headers.get('access-control-allow-origin'), path).toBeNull();
        expect(other.headers.get('cross-origin-resource-policy'), path).toBe('same-origin');
      }
    } finally {
      await allowing.close();
    }
  });

  it('refuses a websocket from a foreign page (403), takes one from its own and from an allowed origin', async () => {
    expect(await upgrade('http://evil.example')).toBe(403);
    expect(await upgrade(server.url)).not.toBe(403);
    const allowing = await startServer({ port: 0, quiet: true, allowOrigins: ['https://mine.example'] });
    try {
      expect(await upgrade('https://mine.example', allowing)).not.toBe(403);
      expect(await upgrade('https://other.example', allowing)).toBe(403);
    } finally {
      await allowing.close();
    }
  });
});

describe("a page's PeerJS token (issue 17, finding 14)", () => {
  it("is 128 bits from the crypto RNG, not PeerJS's Math.random default", () => {
    const options = {
      host: 'h',
      port: 1,
      path: '/peerjs',
      key: 'k',
      secure: false,
      iceServers: [],
      relay: { mode: 'off' as const, path: '/relay' },
      lanOrigins: [],
      origins: [],
      ca: null,
    };
    const [a, b] = [peerOptions(options).token, peerOptions(options).token];
    expect(a).toMatch(/^[0-9a-f]{32}$/);
    expect(a).not.toBe(b);
  });
});
