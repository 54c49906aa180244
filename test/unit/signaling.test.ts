import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { MAX_SIGNALING_MESSAGE_BYTES } from '../../server/peer-signaling.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';

// The signaling server against a hostile client with only what the server hands anyone (its
// /signaling.json): no list of peers to pick a dashboard's id from, no 40 MiB offers held.
let server: RunningServer;
let signaling: { path: string; key: string };

beforeAll(async () => {
  server = await startServer({ port: 0, quiet: true });
  signaling = await (await fetch(`${server.url}/signaling.json`)).json();
});
afterAll(async () => server.close());

const socket = (id: string) =>
  new Promise<WebSocket>((resolve, reject) => {
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}${signaling.path}/peerjs?key=${signaling.key}&id=${id}&token=t${id}`);
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
    ws.send(JSON.stringify({ type: 'OFFER', dst: 'nobody', payload: { sdp: 'x'.repeat(MAX_SIGNALING_MESSAGE_BYTES) } }));
    expect(await closed).toBe(1009); // message too big
  });

  it('still takes a small OFFER', async () => {
    const [a, b] = [await socket('honest-a'), await socket('honest-b')];
    const got = new Promise<string>((resolve) => b.on('message', (m) => resolve(String(m))));
    a.send(JSON.stringify({ type: 'OFFER', dst: 'honest-b', payload: { sdp: 'v=0' } }));
    expect(JSON.parse(await got)).toMatchObject({ type: 'OFFER', src: 'honest-a' });
    a.close();
    b.close();
  });
});
