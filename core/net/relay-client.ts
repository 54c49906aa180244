// The page side of the relay: when WebRTC cannot open a data channel (UDP blocked, NATs without
// TURN), a page sends its link frames to the ditswarm server over one WebSocket and the server
// forwards them to the other page. A relayed connection looks like a PeerJS DataConnection
// (peer, metadata, open/data/close events, a `dataChannel`), so Link, Swarm and the worker
// endpoint treat both alike; the frames are the same ArrayBuffers a data channel would carry.
//
// Wire: text messages are JSON control messages (RelayControl); binary messages are one link
// frame behind a 4-byte little-endian connection id, in both directions. The server acks every
// frame once it has written it to the receiver's socket: acks drive `bufferedAmount` down and
// fire `bufferedamountlow` from message events, so flow control needs no timers (worker pages
// are hidden tabs).

import type { Channel, DataConnectionLike } from './channel.ts';
import { Emitter } from '../events.ts';

export const RELAY_PATH = '/relay';
export const RELAY_ENVELOPE_BYTES = 4;
/** Frames a relayed connection keeps until its owner listens; the far side's flow control bounds them anyway. */
const MAX_EARLY_FRAMES = 256;
/** Largest control message either side accepts. */
export const MAX_RELAY_CONTROL_BYTES = 4096;

/** Why the relay closes a connection when the other page closed it; other reasons are errors. */
export const CLOSED_BY_OTHER_SIDE = 'closed by the other side';

export type RelayRole = 'coordinator' | 'worker';

/** How a page registers on the relay (the WebSocket URL's query). */
export interface RelayRegistration {
  /** this page's PeerJS id */
  peer: string;
  /** the token this page registered its PeerJS id with: the server vouches for the id by it */
  auth: string;
  /** the swarm's room (core/net/join-token.ts): the relay forwards only between pages of one room */
  room: string;
  /** that this page holds the room's join token (relayProof), which it never sends */
  proof: string;
  role: RelayRole;
}

export type RelayControl =
  | { t: 'welcome' }
  | { t: 'refused'; reason: string }
  | { t: 'dial'; ref: number; to: string; metadata: unknown }
  | { t: 'dialed'; ref: number; conn: number }
  | { t: 'dial-failed'; ref: number; reason: string }
  | { t: 'incoming'; conn: number; from: string; metadata: unknown }
  | { t: 'close'; conn: number }
  | { t: 'closed'; conn: number; reason: string }
  | { t: 'ack'; conn: number; bytes: number };

/** The part of a WebSocket the relay client uses: the browser's, or the `ws` package's in Node. */
export interface RelaySocket {
  binaryType: string;
  readonly readyState: number;
  send(data: string | ArrayBuffer): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: 'open' | 'error', cb: () => void): void;
  addEventListener(type: 'close', cb: (event: { code: number; reason: string }) => void): void;
  addEventListener(type: 'message', cb: (event: { data: unknown }) => void): void;
}

const OPEN = 1;

export function relayUrl(origin: string, path: string, registration: RelayRegistration): string {
  const url = new URL(path, origin);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  const query: Record<string, string> = { ...registration };
  for (const [key, value] of Object.entries(query)) url.searchParams.set(key, value);
  return url.href;
}

/** One page's WebSocket to the relay, and the relayed connections over it. */
export class RelayClient {
  private readonly connections = new Map<number, RelayConnection>();
  private readonly dials = new Map<
    number,
    { resolve: (c: RelayConnection) => void; reject: (e: Error) => void; to: string; metadata: unknown }
  >();
  private readonly acceptors = new Emitter<RelayConnection>();
  private readonly closes = new Emitter<string>();
  private nextRef = 1;
  private closedReason: string | null = null;

  private constructor(private readonly socket: RelaySocket) {}

  /** Opens the socket and registers; rejects with the server's reason when it refuses this page. */
  static connect(
    url: string,
    openSocket: (url: string) => RelaySocket = (u) => new WebSocket(u),
  ): Promise<RelayClient> {
    return new Promise((resolve, reject) => {
      const socket = openSocket(url);
      socket.binaryType = 'arraybuffer';
      const client = new RelayClient(socket);
      let welcomed = false;
      socket.addEventListener('message', (event) => {
        if (typeof event.data !== 'string') {
          client.onFrame(event.data);
          return;
        }
        const control = parseControl(event.data);
        if (control?.t === 'welcome' && !welcomed) {
          welcomed = true;
          resolve(client);
        } else if (control?.t === 'refused') {
          reject(new RelayRefused(control.reason));
          client.shut(`the relay refused this page: ${control.reason}`);
        } else if (control && welcomed) client.onControl(control);
      });
      socket.addEventListener('close', (event) => {
        const reason = `the relay closed its socket (${event.code}${event.reason ? `: ${event.reason}` : ''})`;
        if (!welcomed) reject(new Error(`could not register on the relay at ${url.split('?')[0]}: ${reason}`));
        client.shut(reason);
      });
    });
  }

  get closed(): boolean {
    return this.closedReason !== null;
  }

  /** Asks the server for a relayed connection to `to`, announced there with `metadata`. */
  dial(to: string, metadata: unknown): Promise<RelayConnection> {
    if (this.closedReason !== null)
      return Promise.reject(new Error(`cannot dial ${to} through the relay: ${this.closedReason}`));
    const ref = this.nextRef++;
    return new Promise((resolve, reject) => {
      this.dials.set(ref, { resolve, reject, to, metadata });
      this.sendControl({ t: 'dial', ref, to, metadata });
    });
  }

  /** Relayed connections other pages open to this one. Returns a function that removes the listener. */
  onConnection(cb: (conn: RelayConnection) => void): () => void {
    return this.acceptors.on(cb);
  }

  onClose(cb: (reason: string) => void): () => void {
    return this.closes.on(cb);
  }

  close(reason = 'relay client closed by its owner'): void {
    this.shut(reason);
  }

  /** @internal used by RelayConnection */
  sendFrame(conn: number, frame: ArrayBuffer): void {
    if (this.socket.readyState !== OPEN)
      throw new Error(`the relay socket is not open: ${this.closedReason ?? 'closing'}`);
    const envelope = new Uint8Array(RELAY_ENVELOPE_BYTES + frame.byteLength);
    new DataView(envelope.buffer).setUint32(0, conn, true);
    envelope.set(new Uint8Array(frame), RELAY_ENVELOPE_BYTES);
    this.socket.send(envelope.buffer);
  }

  /** @internal used by RelayConnection */
  closeConnection(conn: number): void {
    if (this.connections.delete(conn)) this.sendControl({ t: 'close', conn });
  }

  private sendControl(control: RelayControl): void {
    if (this.socket.readyState === OPEN) this.socket.send(JSON.stringify(control));
  }

  private onFrame(data: unknown): void {
    if (!(data instanceof ArrayBuffer) || data.byteLength < RELAY_ENVELOPE_BYTES) return;
    const conn = new DataView(data).getUint32(0, true);
    this.connections.get(conn)?.deliver(new Uint8Array(data, RELAY_ENVELOPE_BYTES));
  }

  private onControl(control: RelayControl): void {
    switch (control.t) {
      case 'dialed':
      case 'dial-failed': {
        const dial = this.dials.get(control.ref);
        if (!dial) return;
        this.dials.delete(control.ref);
        if (control.t === 'dial-failed') {
          dial.reject(new Error(`the relay could not connect to ${dial.to}: ${control.reason}`));
          return;
        }
        const conn = new RelayConnection(this, control.conn, dial.to, dial.metadata);
        this.connections.set(control.conn, conn);
        dial.resolve(conn);
        return;
      }
      case 'incoming': {
        const conn = new RelayConnection(this, control.conn, control.from, control.metadata);
        this.connections.set(control.conn, conn);
        this.acceptors.emit(conn);
        if (this.acceptors.size === 0) conn.close();
        return;
      }
      case 'ack':
        return this.connections.get(control.conn)?.dataChannel.acked(control.bytes);
      case 'closed': {
        const conn = this.connections.get(control.conn);
        this.connections.delete(control.conn);
        return conn?.shut(control.reason);
      }
    }
  }

  private shut(reason: string): void {
    if (this.closedReason !== null) return;
    this.closedReason = reason;
    for (const dial of this.dials.values())
      dial.reject(new Error(`cannot dial ${dial.to} through the relay: ${reason}`));
    this.dials.clear();
    const open = [...this.connections.values()];
    this.connections.clear();
    for (const conn of open) conn.shut(reason);
    if (this.socket.readyState <= OPEN) this.socket.close(1000, 'closed by the page');
    this.closes.emit(reason);
  }
}

/** The relay said no: a wrong or missing join token, or a peer id the signaling server does not vouch for. */
export class RelayRefused extends Error {
  override name = 'RelayRefused';
  constructor(readonly reason: string) {
    super(`the relay refused this page: ${reason}`);
  }
}

/** A connection through the relay, shaped like a PeerJS DataConnection; open from the start. */
export class RelayConnection implements DataConnectionLike {
  readonly transport = 'relay' as const;
  readonly dataChannel: RelayChannel;
  open = true;
  private readonly closes = new Emitter<void>();
  private readonly frames = new Emitter<Uint8Array>();
  private readonly errors = new Emitter<Error>();
  private readonly early: Uint8Array[] = [];

  constructor(
    private readonly client: RelayClient,
    readonly id: number,
    readonly peer: string,
    readonly metadata: unknown,
  ) {
    this.dataChannel = new RelayChannel((frame) => client.sendFrame(id, frame));
  }

  on(event: 'open' | 'close', cb: () => void): this;
  on(event: 'data', cb: (data: unknown) => void): this;
  on(event: 'error', cb: (error: Error) => void): this;
  on(event: 'open' | 'close' | 'data' | 'error', cb: (arg: never) => void): this {
    if (event === 'data') {
      this.frames.on(cb as (data: unknown) => void);
      // frames that came before anyone listened (the far side may speak first): after the caller's setup
      if (this.early.length > 0)
        queueMicrotask(() => {
          for (const frame of this.early.splice(0)) this.deliver(frame);
        });
    } else if (event === 'error') this.errors.on(cb as (error: Error) => void);
    else if (event === 'close') this.closes.on(cb as () => void);
    // open from the start: 'open', as on a PeerJS connection already open, never comes
    return this;
  }

  close(): void {
    this.client.closeConnection(this.id);
    this.shut(null);
  }

  /** @internal */
  deliver(frame: Uint8Array): void {
    if (this.frames.size === 0) {
      if (this.early.length < MAX_EARLY_FRAMES) this.early.push(frame);
      return;
    }
    this.frames.emit(frame);
  }

  /** @internal the connection ends: by this side (`reason` null), the other side, or the relay. */
  shut(reason: string | null): void {
    if (!this.open) return;
    this.open = false;
    this.dataChannel.shut();
    if (reason !== null && reason !== CLOSED_BY_OTHER_SIDE) this.errors.emit(new Error(reason));
    this.closes.emit();
  }
}

/** The Channel a Link sends through: `bufferedAmount` is what the relay has not yet acked. */
export class RelayChannel implements Channel {
  bufferedAmount = 0;
  bufferedAmountLowThreshold = 0;
  private closed = false;
  private readonly listeners = { bufferedamountlow: new Emitter<void>(), close: new Emitter<void>() };

  constructor(private readonly transmit: (frame: ArrayBuffer) => void) {}

  send(data: ArrayBuffer): void {
    if (this.closed) throw new Error('the relayed connection is closed');
    this.transmit(data);
    this.bufferedAmount += data.byteLength;
  }

  addEventListener(type: 'bufferedamountlow' | 'close', cb: () => void): void {
    this.listeners[type].on(cb);
  }

  removeEventListener(type: 'bufferedamountlow' | 'close', cb: () => void): void {
    this.listeners[type].off(cb);
  }

  /** The relay wrote `bytes` more of this channel's frames to the receiver. */
  acked(bytes: number): void {
    const before = this.bufferedAmount;
    this.bufferedAmount = Math.max(0, before - bytes);
    // like RTCDataChannel: fires when the buffer falls to the threshold, not while it stays below
    if (before > this.bufferedAmountLowThreshold && this.bufferedAmount <= this.bufferedAmountLowThreshold) {
      this.listeners.bufferedamountlow.emit();
    }
  }

  shut(): void {
    if (this.closed) return;
    this.closed = true;
    this.listeners.close.emit();
  }
}

function parseControl(text: string): RelayControl | null {
  if (text.length > MAX_RELAY_CONTROL_BYTES) return null;
  try {
    const control: unknown = JSON.parse(text);
    return typeof control === 'object' && control !== null && 't' in control && typeof control.t === 'string'
      ? (control as RelayControl)
      : null;
  } catch {
    return null;
  }
}
