import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { defined } from '../../core/defined.ts';
import type { Link } from '../../core/net/link.ts';
import { dial, openLink, type PeerDialer } from '../../core/net/peer-link.ts';
import { EmulatedWire } from '../../core/net/paced-channel.ts';
import type { Message, TensorTag } from '../../core/net/protocol.ts';
import {
  RelayClient,
  RelayRefused,
  relayUrl,
  type RelayConnection,
  type RelayRegistration,
  type RelaySocket,
} from '../../core/net/relay-client.ts';
import { relayProof, roomOf } from '../../core/net/join-token.ts';
import { openJoinTokens, type JoinTokens } from '../../server/join-tokens.ts';
import { CONNECTION_CREDIT_BYTES, createRelay, type Relay } from '../../server/relay.ts';

// The relay, as pages see it: real `ws` sockets against the relay on a real http server. Pages
// are vouched for by a stand-in for the signaling server: peer p holds the credential `auth-p`.
// Join tokens are the server's (openJoinTokens); a test names them, and each name is a token.
const FRAME = 256 * 1024;

let server: http.Server;
let relay: Relay;
let origin: string;
let tokens: JoinTokens;
let named: Map<string, string>;
const opened: { close(): void }[] = [];

beforeEach(async () => {
  tokens = openJoinTokens();
  named = new Map([
    ['', ''],
    ['made-up', `${'0'.repeat(24)}.${'0'.repeat(32)}`],
  ]);
  relay = createRelay({ vouch: (peer, auth) => auth === `auth-${peer}`, tokens });
  server = http.createServer();
  server.on('upgrade', (request, socket, head) => relay.handleUpgrade(request, socket, head));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterEach(async () => {
  for (const o of opened.splice(0)) o.close();
  relay.close();
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

/** a text frame as ws hands it over (a Buffer, an ArrayBuffer or fragments) */
function text(data: WebSocket.RawData): string {
  if (Array.isArray(data)) return Buffer.concat(data).toString();
  return (Buffer.isBuffer(data) ? data : Buffer.from(data)).toString();
}

/** the server's token called `name` in this test */
function token(name: string): string {
  let value = named.get(name);
  if (value === undefined) {
    value = tokens.issue();
    named.set(name, value);
  }
  return value;
}

function registration(
  peer: string,
  name: string,
  role: RelayRegistration['role'],
  auth = `auth-${peer}`,
): RelayRegistration {
  const t = token(name);
  return { peer, auth, room: roomOf(t) ?? '', proof: t && relayProof(t, peer, auth), role };
}

async function page(peer: string, token: string, role: RelayRegistration['role']): Promise<RelayClient> {
  const client = await RelayClient.connect(
    relayUrl(origin, '/relay', registration(peer, token, role)),
    (url) => new WebSocket(url),
  );
  opened.push(client);
  return client;
}

/** A coordinator page and a worker page of one swarm, and a relayed connection between them. */
async function pair(token = 'swarm-token') {
  const coordinator = await page('c', token, 'coordinator');
  const worker = await page('w', token, 'worker');
  const incoming = new Promise<RelayConnection>((resolve) => coordinator.onConnection(resolve));
  const dialed = await worker.dial('c', { role: 'worker', token });
  return { coordinator, worker, dialed, accepted: await incoming };
}

function patterned(bytes: number, seed = 1): Uint8Array {
  const data = new Uint8Array(bytes);
  let state = seed;
  for (let i = 0; i < bytes; i++) {
    state = (state * 1664525 + 1013904223) >>> 0;
    data[i] = state >>> 24;
  }
  return data;
}

function received(conn: RelayConnection, count: number): Promise<Uint8Array[]> {
  const got: Uint8Array[] = [];
  return new Promise((resolve) =>
    conn.on('data', (data) => {
      got.push(new Uint8Array(data as Uint8Array)); // a copy: the view is the socket's buffer
      if (got.length === count) resolve(got);
    }),
  );
}

describe('the relay', () => {
  it('forwards frames byte-exact both ways between two pages of one swarm, announcing the dialer with its metadata', async () => {
    const { dialed, accepted } = await pair();
    expect(accepted.peer).toBe('w');
    expect(accepted.metadata).toEqual({ role: 'worker', token: 'swarm-token' });
    expect([dialed.transport, accepted.transport]).toEqual(['relay', 'relay']);
    const up = [1, 1000, FRAME].map((n, i) => patterned(n, i + 1));
    const down = [7, FRAME - 1].map((n, i) => patterned(n, i + 10));
    const atCoordinator = received(accepted, up.length);
    const atWorker = received(dialed, down.length);
    for (const frame of up) dialed.dataChannel.send(frame.slice().buffer);
    for (const frame of down) accepted.dataChannel.send(frame.slice().buffer);
    const same = (a: Uint8Array[], b: Uint8Array[]) =>
      a.length === b.length && a.every((x, i) => Buffer.compare(x, b[i]) === 0);
    expect(same(await atCoordinator, up)).toBe(true);
    expect(same(await atWorker, down)).toBe(true);
    // every frame was acked once written to the receiver: nothing is left counted as buffered
    await expect.poll(() => [dialed.dataChannel.bufferedAmount, accepted.dataChannel.bufferedAmount]).toEqual([0, 0]);
    expect(relay.stats()).toMatchObject({
      framesForwarded: 5,
      bytesForwarded: 1 + 1000 + FRAME + 7 + FRAME - 1,
      framesDropped: 0,
    });
  });

  it('keeps frames the accepting side sends at once until the dialer listens', async () => {
    const coordinator = await page('c', 'swarm-token', 'coordinator');
    const worker = await page('w', 'swarm-token', 'worker');
    const hello = patterned(1000, 5);
    // before the dialer has its connection
    coordinator.onConnection((conn) => conn.dataChannel.send(hello.slice().buffer));
    const dialed = await worker.dial('c', { role: 'worker', token: 'swarm-token' });
    await new Promise((r) => setTimeout(r, 100)); // the frame is in by now, with nobody listening
    const [got] = await received(dialed, 1);
    expect(Buffer.compare(got, hello)).toBe(0);
  });

  it("refuses a page without a join token, with one the server did not make, with another page's proof, with a token no dashboard holds, or with a peer id it does not hold", async () => {
    await page('c', 'swarm-token', 'coordinator');
    await expect(page('w1', '', 'worker')).rejects.toThrow(/does not hold a join token this server stands by/);
    await expect(page('w2', 'made-up', 'coordinator')).rejects.toThrow(
      /does not hold a join token this server stands by/,
    );
    // a proof overheard from page c's registration opens nothing for another page
    const overheard = {
      ...registration('w3', 'swarm-token', 'worker'),
      proof: registration('c', 'swarm-token', 'worker').proof,
    };
    await expect(
      RelayClient.connect(relayUrl(origin, '/relay', overheard), (url) => new WebSocket(url) as unknown as RelaySocket),
    ).rejects.toThrow(/does not hold a join token/);
    await expect(page('w4', 'another-swarm', 'worker')).rejects.toThrow(
      /no dashboard of this join link is on the relay/,
    );
    const impostor = RelayClient.connect(
      relayUrl(origin, '/relay', registration('c', 'swarm-token', 'worker', 'guessed')),
      (url) => new WebSocket(url),
    );
    await expect(impostor).rejects.toBeInstanceOf(RelayRefused);
    await expect(impostor).rejects.toThrow(/"c" is not registered on the signaling server/);
    expect(relay.stats().sockets.map((s) => s.peer)).toEqual(['c']);
  });

  it('lets go the pages of a revoked join token and admits none with it again (issue 17, findings 4 and 14)', async () => {
    const { coordinator, worker } = await pair();
    const closed = Promise.all([coordinator, worker].map((p) => new Promise<string>((resolve) => p.onClose(resolve))));
    tokens.revoke(defined(roomOf(token('swarm-token')), 'the room of the join token'));
    expect(await closed).toEqual([
      expect.stringMatching(/join link was revoked/),
      expect.stringMatching(/join link was revoked/),
    ]);
    await expect(page('c', 'swarm-token', 'coordinator')).rejects.toThrow(
      /does not hold a join token this server stands by/,
    );
    await page('c', 'new-token', 'coordinator');
  });

  it('does not connect pages of different swarms', async () => {
    await page('c1', 'token-1', 'coordinator');
    await page('c2', 'token-2', 'coordinator');
    const worker = await page('w', 'token-2', 'worker');
    await expect(worker.dial('c1', { role: 'worker', token: 'token-1' })).rejects.toThrow(
      /peer c1 is not on the relay in this swarm's room/,
    );
    expect(relay.stats().connections).toBe(0);
  });

  it("a page that never reads stalls only the connections to it: a sender past a connection's credit loses that connection, its others keep flowing (issue 17, finding 5)", async () => {
    const { coordinator } = await pair();
    // raw sockets: one that never reads, one that ignores acks and floods it
    const raw = async (peer: string) => {
      const ws = new WebSocket(relayUrl(origin, '/relay', registration(peer, 'swarm-token', 'worker')));
      opened.push({ close: () => ws.terminate() });
      const messages: string[] = [];
      ws.on('message', (data, binary) => !binary && messages.push(text(data)));
      await new Promise((resolve) => ws.once('open', resolve));
      await expect.poll(() => messages.some((m) => m.includes('welcome'))).toBe(true);
      return { ws, messages };
    };
    const stalled = await raw('stalled');
    const flooder = await raw('flooder');
    const dialTo = async (to: string, ref: number) => {
      flooder.ws.send(JSON.stringify({ t: 'dial', ref, to, metadata: {} }));
      await expect
        .poll(() => flooder.messages.some((m) => m.includes('dialed') && m.includes(`"ref":${ref}`)))
        .toBe(true);
      return (
        JSON.parse(
          defined(
            flooder.messages.find((m) => m.includes('dialed') && m.includes(`"ref":${ref}`)),
            'the dialed message',
          ),
        ) as {
          conn: number;
        }
      ).conn;
    };
    const toStalled = await dialTo('stalled', 1);
    const toCoordinator = await new Promise<number>((resolve) => {
      coordinator.onConnection(() => {});
      void dialTo('c', 2).then(resolve);
    });
    stalled.ws.pause(); // stops reading its TCP socket: the kernel buffers fill, then the server's queue

    const frame = (conn: number) => {
      const f = Buffer.alloc(4 + FRAME, 7);
      f.writeUInt32LE(conn, 0);
      return f;
    };
    const total = 128; // 32 MiB
    for (let i = 0; i < total; i++) flooder.ws.send(frame(toStalled));
    await expect
      .poll(() => flooder.messages.some((m) => m.includes('"t":"closed"') && m.includes(`"conn":${toStalled}`)), {
        timeout: 20_000,
      })
      .toBe(true);
    const stats = relay.stats();
    expect(stats.connectionsCut).toBe(1);
    // what the relay held for the stalled page: the connection's credit at most, not the flood
    expect(
      defined(
        stats.sockets.find((s) => s.peer === 'stalled'),
        "the stalled page's socket",
      ).peakQueued,
    ).toBeLessThanOrEqual(CONNECTION_CREDIT_BYTES + FRAME);
    expect(stats.framesForwarded).toBeLessThan(total);

    // the same sender's other connection still flows: the server never stopped reading its socket
    const acked = () =>
      flooder.messages.filter((m) => m.includes('"t":"ack"') && m.includes(`"conn":${toCoordinator}`)).length;
    for (let i = 0; i < 4; i++) flooder.ws.send(frame(toCoordinator));
    await expect.poll(acked, { timeout: 10_000 }).toBe(4);
  });

  it('lets go a page that floods tiny frames and never reads its acks: the acks queued for it are bounded', async () => {
    const { coordinator } = await pair();
    coordinator.onConnection(() => {});
    const ws = new WebSocket(relayUrl(origin, '/relay', registration('acker', 'swarm-token', 'worker')));
    opened.push({ close: () => ws.terminate() });
    const messages: string[] = [];
    ws.on('message', (data, binary) => !binary && messages.push(text(data)));
    await new Promise((resolve) => ws.once('open', resolve));
    await expect.poll(() => messages.some((m) => m.includes('welcome'))).toBe(true);
    ws.send(JSON.stringify({ t: 'dial', ref: 1, to: 'c', metadata: {} }));
    await expect.poll(() => messages.some((m) => m.includes('dialed'))).toBe(true);
    const conn = (
      JSON.parse(
        defined(
          messages.find((m) => m.includes('dialed')),
          'the dialed message',
        ),
      ) as { conn: number }
    ).conn;
    ws.pause(); // reads nothing from now on: every ack waits in the server
    const tiny = Buffer.alloc(5);
    tiny.writeUInt32LE(conn, 0);
    for (let i = 0; i < 400_000; i++) ws.send(tiny);
    await expect.poll(() => relay.stats().socketsCut, { timeout: 60_000 }).toBe(1);
    expect(relay.stats().sockets.map((s) => s.peer)).not.toContain('acker');
  });

  it('closes the other side of a connection when one page closes it (quietly) or leaves (with the reason)', async () => {
    const { coordinator, worker, dialed, accepted } = await pair();
    const errors: string[] = [];
    accepted.on('error', (e) => errors.push(e.message));
    const closed = new Promise<void>((resolve) => accepted.on('close', resolve));
    dialed.close();
    await closed;
    expect(errors).toEqual([]); // a normal close is not an error
    const incoming = new Promise<RelayConnection>((resolve) => coordinator.onConnection(resolve));
    const again = await worker.dial('c', { role: 'worker', token: 'swarm-token' });
    const atCoordinator = await incoming;
    const left = new Promise<string>((resolve) => atCoordinator.on('error', (e) => resolve(e.message)));
    worker.close();
    expect(again.open).toBe(false);
    expect(await left).toBe('peer w left the relay');
    expect(atCoordinator.open).toBe(false);
    expect(relay.stats().connections).toBe(0);
  });
});

describe('a Link over a relayed connection', () => {
  it('sends a 5 MB tensor intact; bufferedAmount, driven by acks alone, never passes highWater + one frame', async () => {
    const { dialed, accepted } = await pair();
    const highWaterBytes = 1024 * 1024;
    const chunkBytes = 64 * 1024;
    const options = { highWaterBytes, chunkBytes };
    const [sender, receiver] = await Promise.all([
      openLink(dialed, () => {}, options),
      openLink(accepted, () => {}, options),
    ]);
    const channel = dialed.dataChannel;
    let peak = 0;
    let lowEvents = 0;
    const send = channel.send.bind(channel);
    channel.send = (frame) => {
      send(frame);
      peak = Math.max(peak, channel.bufferedAmount);
    };
    channel.addEventListener('bufferedamountlow', () => lowEvents++);

    const data = patterned(5_000_000); // [1250000] f32
    const tag: TensorTag = { job: 1, step: 0, pass: 0, block: 0, phase: 0, group: 0 };
    const message: Message = { kind: 'tensor', from: 1, tag, dtype: 'f32', shape: [1_250_000], data };
    const arrived = next(receiver);
    await sender.send(message);
    const out = await arrived;
    if (out.kind !== 'tensor') throw new Error('expected a tensor');
    expect(Buffer.compare(out.data, data)).toBe(0);
    console.log(
      `relayed Link: 5 MB in ${sender.stats.framesSent} frames, peak bufferedAmount ${peak} B (highWater ${highWaterBytes}), ${lowEvents} bufferedamountlow events`,
    );
    expect(peak).toBeGreaterThanOrEqual(highWaterBytes); // flow control was exercised ...
    expect(peak).toBeLessThanOrEqual(highWaterBytes + chunkBytes); // ... and held
    expect(lowEvents).toBeGreaterThan(0);
    expect(receiver.stats.framesDropped).toBe(0);
  });

  it('on an emulated wire (issue 20) it delivers as the slower link would: 500 kB at 1 MB/s take at least half a second, intact', async () => {
    const { dialed, accepted } = await pair();
    const [sender, receiver] = await Promise.all([
      openLink(dialed, () => {}, { emulate: new EmulatedWire({ bandwidth: 1e6, latencyMs: 5 }) }),
      openLink(accepted, () => {}),
    ]);
    const data = patterned(500_000);
    const arrived = next(receiver);
    const started = performance.now();
    await sender.send({
      kind: 'tensor',
      from: 1,
      tag: { job: 1, step: 0, pass: 0, block: 0, phase: 0, group: 0 },
      dtype: 'f32',
      shape: [125_000],
      data,
    });
    const out = await arrived;
    const ms = performance.now() - started;
    if (out.kind !== 'tensor') throw new Error('expected a tensor');
    expect(Buffer.compare(out.data, data)).toBe(0);
    expect(ms).toBeGreaterThanOrEqual((sender.stats.bytesSent / 1e6) * 1000 + 5 - 2);
    expect(ms).toBeLessThan(2_000);
  });

  it('closes the Link when the relay drops the connection', async () => {
    const { dialed, accepted, coordinator } = await pair();
    const reasons: string[] = [];
    const link = await openLink(dialed, (reason) => reasons.push(reason));
    await openLink(accepted, () => {});
    coordinator.close();
    await expect.poll(() => reasons).toEqual([expect.stringMatching(/connection to c failed: peer c left the relay/)]);
    expect(link.closed).toBe(true);
  });
});

describe('dial', () => {
  /** A PeerJS stand-in whose data channels never open, as on a network that blocks UDP. */
  const blockedPeer = () => {
    const closed: string[] = [];
    const peer: PeerDialer = {
      connect: (to) => ({ peer: to, metadata: null, open: false, on: () => {}, close: () => closed.push(to) }),
    };
    return { peer, closed };
  };

  it('goes through the relay when the data channel does not open in time, with the same metadata', async () => {
    const coordinator = await page('c', 'swarm-token', 'coordinator');
    const worker = await page('w', 'swarm-token', 'worker');
    const incoming = new Promise<RelayConnection>((resolve) => coordinator.onConnection(resolve));
    const { peer, closed } = blockedPeer();
    const started = Date.now();
    const conn = await dial(
      peer,
      'c',
      { role: 'worker', token: 'swarm-token' },
      { mode: 'fallback', client: () => Promise.resolve(worker), fallbackMs: 200 },
    );
    expect(Date.now() - started).toBeGreaterThanOrEqual(200);
    expect(conn.transport).toBe('relay');
    expect(closed).toEqual(['c']); // the data channel that did not open is given up
    expect((await incoming).metadata).toEqual({ role: 'worker', token: 'swarm-token' });
  });

  it('forced, goes through the relay at once; off, fails naming the timeout', async () => {
    await page('c', 'swarm-token', 'coordinator');
    const worker = await page('w', 'swarm-token', 'worker');
    const { peer, closed } = blockedPeer();
    const forced = await dial(peer, 'c', { role: 'worker' }, { mode: 'force', client: () => Promise.resolve(worker) });
    expect([forced.transport, closed]).toEqual(['relay', []]);
    await expect(
      dial(peer, 'c', {}, { mode: 'off', client: () => Promise.resolve(worker), fallbackMs: 50 }),
    ).rejects.toThrow(/no data channel to c within 0.05 s \(the relay is off on this server\)/);
  });
});

function next(link: Link): Promise<Message> {
  return new Promise((resolve) => {
    const off = link.onMessage((m) => {
      off();
      resolve(m);
    });
  });
}
