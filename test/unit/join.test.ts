import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { Channel } from '../../core/net/channel.ts';
import { joinProof } from '../../core/net/hmac.ts';
import { connectRelay } from '../../core/net/peer-link.ts';
import { admitWorker, joinDashboard, workerDial, type JoinMetadata } from '../../core/net/join.ts';
import { Link } from '../../core/net/link.ts';
import { stringMatching } from './matchers.ts';

// The join handshake (issue 17, finding 1): a worker serves only a dashboard that proves it holds
// the join token, a dashboard admits only a worker that does, and the token crosses no link.
function tappedPair(): { dashboard: Link; worker: Link; sentByWorker: Uint8Array[] } {
  const sentByWorker: Uint8Array[] = [];
  const channel = (deliver: (frame: ArrayBuffer) => void, tap?: Uint8Array[]): Channel => ({
    bufferedAmount: 0,
    bufferedAmountLowThreshold: 0,
    send: (frame) => (tap?.push(new Uint8Array(frame.slice(0))), void setImmediate(() => deliver(frame))),
    addEventListener() {},
    removeEventListener() {},
  });
  const dashboard: Link = new Link(channel((f) => worker.receive(f)));
  const worker: Link = new Link(channel((f) => dashboard.receive(f), sentByWorker));
  return { dashboard, worker, sentByWorker };
}

const ids = { coordinator: 'ditswarm-c-1', worker: 'ditswarm-w-1' };
const metadata = (): JoinMetadata => workerDial('the-token', ids);

describe('the join handshake', () => {
  it('both hold the token: the worker serves, the dashboard admits', async () => {
    const { dashboard, worker } = tappedPair();
    const m = metadata();
    const [admitted, joined] = await Promise.all([
      admitWorker(dashboard, 'the-token', ids, m),
      joinDashboard(worker, 'the-token', ids, m),
    ]);
    expect([admitted, joined]).toEqual([null, null]);
  });

  it('a page that took the dashboard’s id without the token is refused by the worker, which never sends the token', async () => {
    const { dashboard, worker, sentByWorker } = tappedPair();
    const m = metadata();
    const impostor = admitWorker(dashboard, 'a-guess', ids, m);
    const joined = await joinDashboard(worker, 'the-secret-token', ids, m);
    expect(joined).toEqual({
      refused:
        "the dashboard did not prove it holds this link's join token: open the join link the dashboard shows (a page that took its place cannot)",
    });
    worker.close('refused'); // as the worker page does: its connection closes, and with it the other side's
    dashboard.close('the worker closed the connection');
    expect(await impostor).toMatch(/did not prove it holds the join token/);
    const everything = Buffer.concat(sentByWorker).toString('latin1');
    expect(everything).not.toContain('the-secret-token');
  });

  it('a proof for one exchange does not answer another (the nonces are bound into it)', async () => {
    const first = tappedPair();
    const m = metadata();
    // a recorded challenge replayed to a worker that dialled with a fresh nonce
    const recorded: unknown[] = [];
    first.worker.onMessage((msg) => recorded.push(msg));
    await Promise.all([
      admitWorker(first.dashboard, 'the-token', ids, m),
      joinDashboard(first.worker, 'the-token', ids, m),
    ]);
    const second = tappedPair();
    const replay = recorded.find((msg) => (msg as { body?: { type?: string } }).body?.type === 'challenge') as {
      body: object;
    };
    await second.dashboard.send({ kind: 'rpc', from: 255, body: replay.body, tensors: [] });
    expect(await joinDashboard(second.worker, 'the-token', ids, metadata())).toMatchObject({
      refused: stringMatching(/did not prove/),
    });
  });
});

describe("a page's relay registration", () => {
  const TOKEN = `${'ab'.repeat(12)}.${'5e'.repeat(16)}`;
  it("names its swarm by the token's room and proves it holds the token, which it never sends", async () => {
    const urls: string[] = [];
    const server = http.createServer();
    server.on('upgrade', (request, socket) => {
      urls.push(request.url ?? '');
      socket.destroy();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const signaling = {
      host: '127.0.0.1',
      port: 0,
      path: '/peerjs',
      key: 'k',
      secure: false,
      iceServers: [],
      relay: { mode: 'fallback' as const, path: '/relay' },
      lanOrigins: [],
      origins: [],
      ca: null,
    };
    // a page's WebSocket (Node 20 has none of its own)
    const globals = globalThis as { WebSocket?: unknown };
    const before = globals.WebSocket;
    globals.WebSocket = class extends WebSocket {
      constructor(url: string) {
        super(url);
        this.on('error', () => {}); // the stand-in server hangs up: expected
      }
    };
    try {
      void connectRelay(origin, signaling, { peer: 'p', auth: 'a', token: TOKEN, role: 'worker' }).catch(() => {});
      await expect.poll(() => urls.length).toBe(1);
    } finally {
      globals.WebSocket = before;
      server.close();
    }
    expect(urls).toHaveLength(1);
    expect(urls[0]).not.toContain(TOKEN.split('.')[1]);
    const query = new URL(urls[0], origin).searchParams;
    expect(query.get('room')).toBe(TOKEN.split('.')[0]);
    expect(query.get('proof')).toBe(joinProof(TOKEN, 'relay', TOKEN.split('.')[0], 'p', 'a'));
  });
});
