// The relay: pages that cannot open a data channel to each other send their link frames here
// over one WebSocket each, and the server forwards them (see core/net/relay-client.ts for the wire).
//
// - Who: a page registers with its PeerJS id, the token it registered that id with on the
//   signaling server (so nobody can take another page's id), its swarm's room and its proof that
//   it holds the room's join token, a token this server made (server/join-tokens.ts: a made-up or
//   revoked one opens nothing). A dashboard opens a swarm's room; a worker is admitted only to a
//   room a dashboard holds, and frames go only between pages of one room. A revoked room's pages
//   are let go.
// - How much: every connection has a credit each way, what an honest Link keeps in flight at
//   most (its high-water mark and one frame): frames are acked to the sender once written to
//   the receiver's socket, which is what the page's `bufferedAmount` and `bufferedamountlow` are
//   made of, so an honest sender waits for acks. A sender past its credit ignores them: that one
//   connection is closed. A page that never reads stalls only the connections to it, never its
//   senders' other connections (heartbeats to the dashboard among them), and the server never
//   stops reading a socket. A page that does not read its own acks and controls (past
//   MAX_CONTROL_QUEUE_BYTES) is let go; past `budgetBytes` queued for all pages together, so is
//   the page with the most queued for it (the one not reading); and past `roomBudgetBytes` queued
//   for the pages of one room, that room's page with the most: a join token's holders, whose
//   pages all may be one client's, cannot take more of the server's memory than that.

import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer, type RawData, type WebSocket } from 'ws';
import { MAX_HIGH_WATER_BYTES } from '../core/net/link.ts';
import { MAX_FRAME_BYTES } from '../core/net/protocol.ts';
import { relayProof } from '../core/net/join-token.ts';
import {
  CLOSED_BY_OTHER_SIDE,
  MAX_RELAY_CONTROL_BYTES,
  RELAY_ENVELOPE_BYTES,
  type RelayControl,
  type RelayRole,
} from '../core/net/relay-client.ts';
import { sameProof, type JoinTokens } from './join-tokens.ts';

/** what one connection may have in flight one way: an honest Link's high-water mark, a frame, and the envelopes */
export const CONNECTION_CREDIT_BYTES = MAX_HIGH_WATER_BYTES + 2 * MAX_FRAME_BYTES;
/** what all pages may have queued at once: above what honest pages reach (each connection's credit, both ways) */
export const DEFAULT_RELAY_BUDGET_BYTES = 1024 * 1024 * 1024;
/**
 * what the pages of one room (one join token) may have queued at once: an honest swarm's pages read
 * as they are sent, a room's credit is what one client holding a token can make the server hold
 */
export const DEFAULT_ROOM_BUDGET_BYTES = 256 * 1024 * 1024;
/** acks and controls queued for one page that does not read them: an honest page reads them as they come */
export const MAX_CONTROL_QUEUE_BYTES = 1024 * 1024;
const MAX_CONNECTIONS_PER_SOCKET = 64;
const MAX_METADATA_BYTES = 1024;

export interface RelayOptions {
  /** Whether `peer` is registered on the signaling server with `auth` as its token. */
  vouch(peer: string, auth: string): boolean;
  /** the join tokens this server made and stands by */
  tokens: Pick<JoinTokens, 'standing' | 'onRevoke'>;
  /** bytes all connections may have queued at once */
  budgetBytes?: number;
  /** bytes the connections of one room may have queued at once */
  roomBudgetBytes?: number;
}

export interface RelaySocketStats {
  peer: string;
  role: RelayRole;
  /** bytes handed to the socket and not yet written out */
  queued: number;
  /** the most it ever had queued */
  peakQueued: number;
}

export interface RelayStats {
  sockets: RelaySocketStats[];
  connections: number;
  framesForwarded: number;
  bytesForwarded: number;
  /** frames for a connection that is not the sender's (closed meanwhile, or never its own), or past its credit */
  framesDropped: number;
  /** connections closed because a sender went past its credit */
  connectionsCut: number;
  /** pages let go for not reading what the relay sent them */
  socketsCut: number;
  /** bytes queued for all sockets now */
  queued: number;
  /** of them, for each room's pages */
  roomsQueued: Record<string, number>;
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
  room: string;
  role: RelayRole;
  queued: number;
  /** of it, acks and controls */
  controlQueued: number;
  peakQueued: number;
  conns: Set<number>;
}

interface Connection {
  id: number;
  a: Client;
  b: Client;
  /** bytes each side sent on it that are not yet written to the other */
  inFlight: Map<Client, number>;
}

export function createRelay(options: RelayOptions): Relay {
  const budget = options.budgetBytes ?? DEFAULT_RELAY_BUDGET_BYTES;
  const roomBudget = options.roomBudgetBytes ?? DEFAULT_ROOM_BUDGET_BYTES;
  /** bytes queued for each room's pages */
  const roomQueued = new Map<string, number>();
  const addRoomQueued = (room: string, bytes: number) => {
    const left = (roomQueued.get(room) ?? 0) + bytes;
    if (left > 0) roomQueued.set(room, left);
    else roomQueued.delete(room);
  };
  /** the page with the most queued for it among `to` (which may have been replaced meanwhile) and the others */
  const mostQueued = (to: Client, others: Iterable<Client>) =>
    [...others].reduce((most, c) => (c.queued > most.queued ? c : most), to);
  const wss = new WebSocketServer({
    noServer: true,
    maxPayload: RELAY_ENVELOPE_BYTES + MAX_FRAME_BYTES,
    perMessageDeflate: false,
  });
  const clients = new Map<string, Client>();
  const connections = new Map<number, Connection>();
  const counters = { framesForwarded: 0, bytesForwarded: 0, framesDropped: 0, connectionsCut: 0, socketsCut: 0 };
  let queuedTotal = 0;
  const refused: RelayStats['refused'] = [];
  let nextConn = 1;
  options.tokens.onRevoke((room) => {
    for (const client of clients.values())
      if (client.room === room)
        client.ws.close(4003, 'the join link was revoked: open the one the dashboard shows now');
  });

  /** Queues `data` on `to`; `written` once the socket has taken it. A page that does not read is let go. */
  function write(to: Client, data: Buffer | string, written?: () => void): void {
    if (to.ws.readyState !== to.ws.OPEN) return;
    const control = typeof data === 'string';
    const size = control ? Buffer.byteLength(data) : data.byteLength;
    to.queued += size;
    if (control) to.controlQueued += size;
    queuedTotal += size;
    addRoomQueued(to.room, size);
    to.peakQueued = Math.max(to.peakQueued, to.queued);
    to.ws.send(data, { binary: !control }, (error) => {
      to.queued -= size;
      if (control) to.controlQueued -= size;
      queuedTotal -= size;
      addRoomQueued(to.room, -size);
      if (!error) written?.();
    });
    if (to.controlQueued > MAX_CONTROL_QUEUE_BYTES) cut(to);
    else if ((roomQueued.get(to.room) ?? 0) > roomBudget)
      cut(
        mostQueued(
          to,
          [...clients.values()].filter((c) => c.room === to.room),
        ),
      );
    else if (queuedTotal > budget) cut(mostQueued(to, clients.values()));
  }

  /** Lets go a page that does not read what it is sent: its connections close, the others are told. */
  function cut(client: Client): void {
    counters.socketsCut++;
    client.ws.terminate();
  }

  const control = (to: Client, message: RelayControl) => write(to, JSON.stringify(message));

  function refuse(ws: WebSocket, peer: string, reason: string): void {
    refused.push({ peer, reason });
    if (refused.length > 100) refused.shift();
    ws.send(JSON.stringify({ t: 'refused', reason } satisfies RelayControl));
    ws.close(4003, reason.slice(0, 120));
  }

  function admit(ws: WebSocket, request: IncomingMessage): void {
    const query = new URL(request.url ?? '/', 'http://relay').searchParams;
    const [peer, auth, room, proof, role] = ['peer', 'auth', 'room', 'proof', 'role'].map((k) => query.get(k) ?? '');
    if (role !== 'coordinator' && role !== 'worker') {
      refuse(ws, peer, `role must be coordinator or worker, got "${role}"`);
      return;
    }
    if (!peer || !options.vouch(peer, auth)) {
      refuse(ws, peer, `peer "${peer}" is not registered on the signaling server with this credential`);
      return;
    }
    const token = options.tokens.standing(room);
    if (!token || !sameProof(proof, relayProof(token, peer, auth))) {
      refuse(
        ws,
        peer,
        'this page does not hold a join token this server stands by (made up, revoked, or from another server): ' +
          'open the join link the dashboard shows now',
      );
      return;
    }
    if (role === 'worker' && ![...clients.values()].some((c) => c.role === 'coordinator' && c.room === room)) {
      refuse(ws, peer, 'no dashboard of this join link is on the relay: open the join link the dashboard shows');
      return;
    }
    clients.get(peer)?.ws.close(4000, 'replaced by a newer relay socket of the same page');
    const client: Client = { ws, peer, room, role, queued: 0, controlQueued: 0, peakQueued: 0, conns: new Set() };
    clients.set(peer, client);
    ws.on('message', (data, isBinary) =>
      isBinary ? forward(client, toBuffer(data)) : onControl(client, toBuffer(data)),
    );
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
    const inFlight = (conn.inFlight.get(from) ?? 0) + data.byteLength;
    if (inFlight > CONNECTION_CREDIT_BYTES) {
      const over =
        `${from.peer} sent ${inFlight} bytes its receiver has not taken, ` +
        `past the connection's credit of ${CONNECTION_CREDIT_BYTES}`;
      counters.framesDropped++;
      counters.connectionsCut++;
      closeConnection(conn.id, from, over);
      control(from, { t: 'closed', conn: conn.id, reason: over });
      return;
    }
    conn.inFlight.set(from, inFlight);
    counters.framesForwarded++;
    counters.bytesForwarded += bytes;
    write(to, data, () => {
      conn.inFlight.set(from, (conn.inFlight.get(from) ?? 0) - data.byteLength);
      if (connections.has(conn.id)) control(from, { t: 'ack', conn: conn.id, bytes });
    });
  }

  function onControl(from: Client, data: Buffer): void {
    let message: unknown;
    try {
      if (data.byteLength > MAX_RELAY_CONTROL_BYTES) throw new Error(`control message of ${data.byteLength} bytes`);
      message = JSON.parse(data.toString('utf8'));
    } catch (e) {
      from.ws.close(1008, `bad control message: ${(e as Error).message}`.slice(0, 120));
      return;
    }
    if (typeof message !== 'object' || message === null) return;
    // a page's claims: dialFor checks the target it names, and only the page's own connections close
    const { t, conn } = message as Partial<Record<string, unknown>>;
    if (t === 'dial') dialFor(from, message as Extract<RelayControl, { t: 'dial' }>);
    else if (t === 'close') closeConnection(Number(conn), from);
  }

  function dialFor(from: Client, { ref, to, metadata }: { ref: number; to: string; metadata: unknown }): void {
    const fail = (reason: string) => control(from, { t: 'dial-failed', ref, reason });
    const target = typeof to === 'string' ? clients.get(to) : undefined;
    if (!target || target.room !== from.room) {
      fail(`peer ${to} is not on the relay in this swarm's room`);
      return;
    }
    if (target === from) {
      fail('a page cannot dial itself');
      return;
    }
    if (JSON.stringify(metadata ?? null).length > MAX_METADATA_BYTES) {
      fail(`metadata over ${MAX_METADATA_BYTES} bytes`);
      return;
    }
    if (from.conns.size >= MAX_CONNECTIONS_PER_SOCKET || target.conns.size >= MAX_CONNECTIONS_PER_SOCKET) {
      fail(`over ${MAX_CONNECTIONS_PER_SOCKET} relayed connections on one page`);
      return;
    }
    const conn: Connection = { id: nextConn++, a: from, b: target, inFlight: new Map() };
    connections.set(conn.id, conn);
    from.conns.add(conn.id);
    target.conns.add(conn.id);
    control(target, { t: 'incoming', conn: conn.id, from: from.peer, metadata });
    control(from, { t: 'dialed', ref, conn: conn.id });
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
  }

  return {
    handleUpgrade(request, socket, head) {
      wss.handleUpgrade(request, socket, head, (ws) => admit(ws, request));
    },
    stats: () => ({
      sockets: [...clients.values()].map((c) => ({
        peer: c.peer,
        role: c.role,
        queued: c.queued,
        peakQueued: c.peakQueued,
      })),
      connections: connections.size,
      ...counters,
      queued: queuedTotal,
      roomsQueued: Object.fromEntries(roomQueued),
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
