// The relay: pages that cannot open a data channel to each other send their link frames here
// over one WebSocket each, and the server forwards them (see core/net/relay-client.ts for the wire).
//
// - Who: a page registers with its PeerJS id, the token it registered that id with on the
//   signaling server (so nobody can take another page's id), and the swarm's join token. A
//   dashboard opens a swarm's room; a worker is admitted only to a room a dashboard holds, and
//   frames go only between pages of one room.
// - How much: the server holds at most `socketCapBytes` (plus the frames already read from the
//   senders' sockets) queued for one receiving socket. Past it, it stops reading from the sockets
//   that send to it until it has drained to half: TCP then pushes back on the senders, and a page
//   that never reads makes its senders wait, never the server's memory grow.
// - When: every frame is acked to its sender once written to the receiver's socket, which is
//   what the page's `bufferedAmount` and `bufferedamountlow` are made of.

import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer, type RawData, type WebSocket } from 'ws';
import { MAX_FRAME_BYTES } from '../core/net/protocol.ts';
import { CLOSED_BY_OTHER_SIDE, MAX_RELAY_CONTROL_BYTES, RELAY_ENVELOPE_BYTES, type RelayControl, type RelayRole } from '../core/net/relay-client.ts';

export const DEFAULT_RELAY_SOCKET_CAP_BYTES = 16 * 1024 * 1024;
const MAX_CONNECTIONS_PER_SOCKET = 64;
const MAX_METADATA_BYTES = 1024;

export interface RelayOptions {
  /** Whether `peer` is registered on the signaling server with `auth` as its token. */
  vouch(peer: string, auth: string): boolean;
  socketCapBytes?: number;
}

export interface RelaySocketStats {
  peer: string;
  role: RelayRole;
  /** bytes handed to the socket and not yet written out */
  queued: number;
  /** the most it ever had queued */
  peakQueued: number;
  /** whether the server has stopped reading from it (a receiver it sends to is full) */
  paused: boolean;
}

export interface RelayStats {
  sockets: RelaySocketStats[];
  connections: number;
  framesForwarded: number;
  bytesForwarded: number;
  /** frames for a connection that is not the sender's (closed meanwhile, or never its own) */
  framesDropped: number;
  refused: { peer: string; reason: string }[];
}

export interface Relay {
  /** Takes over an HTTP upgrade for the relay path. */
  handleUpgrade(request: IncomingMessage, socket: Duplex, head: Buffer): void;
  stats(): RelayStats;
  close(): void;
}

interface Client {
  ws: WebSocket;
  peer: string;
  token: string;
  role: RelayRole;
  queued: number;
  peakQueued: number;
  /** receivers over the cap that this socket sends to: it is not read from until they drain */
  blockedOn: Set<Client>;
  /** senders waiting for this socket to drain */
  blocking: Set<Client>;
  conns: Set<number>;
}

interface Connection {
  id: number;
  a: Client;
  b: Client;
}

export function createRelay(options: RelayOptions): Relay {
  const cap = options.socketCapBytes ?? DEFAULT_RELAY_SOCKET_CAP_BYTES;
  const wss = new WebSocketServer({ noServer: true, maxPayload: RELAY_ENVELOPE_BYTES + MAX_FRAME_BYTES, perMessageDeflate: false });
  const clients = new Map<string, Client>();
  const connections = new Map<number, Connection>();
  const counters = { framesForwarded: 0, bytesForwarded: 0, framesDropped: 0 };
  const refused: RelayStats['refused'] = [];
  let nextConn = 1;

  /** Queues `data` on `to`; past the cap, stops reading from `cause`, whose traffic filled it. */
  function write(to: Client, data: Buffer | string, cause: Client | null, written?: () => void): void {
    if (to.ws.readyState !== to.ws.OPEN) return;
    const size = typeof data === 'string' ? Buffer.byteLength(data) : data.byteLength;
    to.queued += size;
    to.peakQueued = Math.max(to.peakQueued, to.queued);
    to.ws.send(data, { binary: typeof data !== 'string' }, (error) => {
      to.queued -= size;
      if (!error) written?.();
      if (to.queued <= cap / 2) release(to);
    });
    if (to.queued > cap && cause) block(cause, to);
  }

  function block(sender: Client, receiver: Client): void {
    if (sender.blockedOn.has(receiver)) return;
    if (sender.blockedOn.size === 0) sender.ws.pause();
    sender.blockedOn.add(receiver);
    receiver.blocking.add(sender);
  }

  function release(receiver: Client): void {
    for (const sender of receiver.blocking) {
      sender.blockedOn.delete(receiver);
      if (sender.blockedOn.size === 0) sender.ws.resume();
    }
    receiver.blocking.clear();
  }

  const control = (to: Client, message: RelayControl, cause: Client | null = null) => write(to, JSON.stringify(message), cause);

  function refuse(ws: WebSocket, peer: string, reason: string): void {
    refused.push({ peer, reason });
    if (refused.length > 100) refused.shift();
    ws.send(JSON.stringify({ t: 'refused', reason } satisfies RelayControl));
    ws.close(4003, reason.slice(0, 120));
  }

  function admit(ws: WebSocket, request: IncomingMessage): void {
    const query = new URL(request.url ?? '/', 'http://relay').searchParams;
    const [peer, auth, token, role] = ['peer', 'auth', 'token', 'role'].map((k) => query.get(k) ?? '');
    if (!token) return refuse(ws, peer, "a page needs the swarm's join token to use the relay: open the join link the dashboard shows");
    if (role !== 'coordinator' && role !== 'worker') return refuse(ws, peer, `role must be coordinator or worker, got "${role}"`);
    if (!peer || !options.vouch(peer, auth)) return refuse(ws, peer, `peer "${peer}" is not registered on the signaling server with this credential`);
    if (role === 'worker' && ![...clients.values()].some((c) => c.role === 'coordinator' && c.token === token)) {
      return refuse(ws, peer, 'no dashboard on the relay holds this join token: open the join link the dashboard shows');
    }
    clients.get(peer)?.ws.close(4000, 'replaced by a newer relay socket of the same page');
    const client: Client = { ws, peer, token, role, queued: 0, peakQueued: 0, blockedOn: new Set(), blocking: new Set(), conns: new Set() };
    clients.set(peer, client);
    ws.on('message', (data, isBinary) => (isBinary ? forward(client, toBuffer(data)) : onControl(client, toBuffer(data))));
    ws.on('close', () => leave(client));
    ws.on('error', () => ws.terminate());
    control(client, { t: 'welcome' });
  }

  function forward(from: Client, data: Buffer): void {
    const conn = data.byteLength >= RELAY_ENVELOPE_BYTES ? connections.get(data.readUInt32LE(0)) : undefined;
    const to = conn?.a === from ? conn.b : conn?.b === from ? conn.a : null;
    if (!conn || !to) {
      counters.framesDropped++;
      return;
    }
    const bytes = data.byteLength - RELAY_ENVELOPE_BYTES;
    counters.framesForwarded++;
    counters.bytesForwarded += bytes;
    write(to, data, from, () => {
      if (connections.has(conn.id)) control(from, { t: 'ack', conn: conn.id, bytes }, from);
    });
  }

  function onControl(from: Client, data: Buffer): void {
    let message: RelayControl;
    try {
      if (data.byteLength > MAX_RELAY_CONTROL_BYTES) throw new Error(`control message of ${data.byteLength} bytes`);
      message = JSON.parse(data.toString('utf8')) as RelayControl;
    } catch (e) {
      from.ws.close(1008, `bad control message: ${(e as Error).message}`.slice(0, 120));
      return;
    }
    if (message?.t === 'dial') dialFor(from, message);
    else if (message?.t === 'close') closeConnection(Number(message.conn), from);
  }

  function dialFor(from: Client, { ref, to, metadata }: { ref: number; to: string; metadata: unknown }): void {
    const fail = (reason: string) => control(from, { t: 'dial-failed', ref, reason }, from);
    const target = typeof to === 'string' ? clients.get(to) : undefined;
    if (!target || target.token !== from.token) return fail(`peer ${to} is not on the relay with this swarm's join token`);
    if (target === from) return fail('a page cannot dial itself');
    if (JSON.stringify(metadata ?? null).length > MAX_METADATA_BYTES) return fail(`metadata over ${MAX_METADATA_BYTES} bytes`);
    if (from.conns.size >= MAX_CONNECTIONS_PER_SOCKET || target.conns.size >= MAX_CONNECTIONS_PER_SOCKET) {
      return fail(`over ${MAX_CONNECTIONS_PER_SOCKET} relayed connections on one page`);
    }
    const conn: Connection = { id: nextConn++, a: from, b: target };
    connections.set(conn.id, conn);
    from.conns.add(conn.id);
    target.conns.add(conn.id);
    control(target, { t: 'incoming', conn: conn.id, from: from.peer, metadata }, from);
    control(from, { t: 'dialed', ref, conn: conn.id }, from);
  }

  function closeConnection(id: number, by: Client, reason = CLOSED_BY_OTHER_SIDE): void {
    const conn = connections.get(id);
    if (!conn || (conn.a !== by && conn.b !== by)) return;
    connections.delete(id);
    conn.a.conns.delete(id);
    conn.b.conns.delete(id);
    const other = conn.a === by ? conn.b : conn.a;
    control(other, { t: 'closed', conn: id, reason });
  }

  function leave(client: Client): void {
    if (clients.get(client.peer) === client) clients.delete(client.peer);
    for (const id of [...client.conns]) closeConnection(id, client, `peer ${client.peer} left the relay`);
    release(client);
    for (const receiver of client.blockedOn) receiver.blocking.delete(client);
    client.blockedOn.clear();
  }

  return {
    handleUpgrade(request, socket, head) {
      wss.handleUpgrade(request, socket, head, (ws) => admit(ws, request));
    },
    stats: () => ({
      sockets: [...clients.values()].map((c) => ({ peer: c.peer, role: c.role, queued: c.queued, peakQueued: c.peakQueued, paused: c.blockedOn.size > 0 })),
      connections: connections.size,
      ...counters,
      refused: [...refused],
    }),
    close() {
      for (const client of clients.values()) client.ws.terminate();
      clients.clear();
      connections.clear();
      wss.close();
    },
  };
}

function toBuffer(data: RawData): Buffer {
  return Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data);
}
