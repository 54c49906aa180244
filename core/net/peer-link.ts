import type { DataConnectionLike } from './channel.ts';
import { relayProof, roomOf } from './join-token.ts';
import { Link, type LinkOptions } from './link.ts';
import { RELAY_PATH, relayUrl, RelayClient, type RelayRole } from './relay-client.ts';
import { PacedChannel, type EmulatedWire } from './paced-channel.ts';

// The one place a PeerJS data connection becomes a Link, for both sides of the wire.

/** Peer ids say which side a peer is, so a worker can find dashboards on the signaling server. */
export const PEER_ID_PREFIX = { coordinator: 'ditswarm-c-', worker: 'ditswarm-w-' } as const;

export function newPeerId(side: keyof typeof PEER_ID_PREFIX): string {
  const random = Array.from(crypto.getRandomValues(new Uint8Array(6)), (b) => b.toString(16).padStart(2, '0')).join('');
  return PEER_ID_PREFIX[side] + random;
}

/** A STUN or TURN server for ICE, shaped like the browser's RTCIceServer. */
export interface IceServer {
  urls: string | string[];
  username?: string;
  credential?: string;
}

/** Where the PeerJS server of this origin listens, as the ditswarm server publishes it. */
export interface SignalingOptions {
  host: string;
  port: number;
  path: string;
  key: string;
  secure: boolean;
  /** the server's STUN/TURN list for every RTCPeerConnection; empty means host candidates only (one LAN) */
  iceServers: IceServer[];
  /** when links go through the server's relay instead of a data channel, and where it listens */
  relay: { mode: RelayMode; path: string };
  /** the server at its LAN addresses: where other machines reach it */
  lanOrigins: string[];
  /** every origin the server answers at (its loopback, names and addresses; http and https): one server, many names */
  origins: string[];
  /** the server's own certificate authority, which other machines trust once; null where it made none */
  ca: { fingerprint: string } | null;
  /** whether the server gives its pages TURN credentials (core/net/turn.ts) */
  turn?: boolean;
  /** `relay`: every RTCPeerConnection goes through TURN (the server's `--ice-policy relay`) */
  iceTransportPolicy?: IceTransportPolicy;
}

/** RTCPeerConnection's: `all` candidates, or `relay` (TURN) only. */
export type IceTransportPolicy = 'all' | 'relay';
export const ICE_TRANSPORT_POLICIES: readonly IceTransportPolicy[] = ['all', 'relay'];

/**
 * `fallback`: a data channel first, the relay for a link whose channel does not open within
 * RELAY_FALLBACK_MS; `force`: every link through the relay (networks known to block UDP, tests);
 * `off`: data channels only.
 */
export type RelayMode = 'fallback' | 'force' | 'off';
export const RELAY_MODES: readonly RelayMode[] = ['fallback', 'force', 'off'];
/** How long a data channel may take to open before the link goes through the relay. */
export const RELAY_FALLBACK_MS = 8_000;
/** A data channel from a peer not open by then is given up: the peer moved to the relay after RELAY_FALLBACK_MS. */
export const DIRECT_OPEN_TIMEOUT_MS = RELAY_FALLBACK_MS + 10_000;

/** What registers an id with the signaling server: PeerJS's Peer fits. */
export interface SignalingPeer {
  readonly id: string;
  once(event: 'open', cb: () => void): unknown;
  once(event: 'error', cb: (error: Error & { type?: string }) => void): unknown;
  destroy(): void;
}

/**
 * PeerJS's options for a page. Its token (what proves a page holds its id, to the signaling server
 * and the relay) comes from the crypto RNG: PeerJS's own default is Math.random.
 */
export function peerOptions(signaling: SignalingOptions) {
  const token = Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, '0')).join('');
  const { iceServers, iceTransportPolicy = 'all' } = signaling;
  return { ...signaling, token, config: { iceServers, iceTransportPolicy }, debug: 1 } as const;
}

/** A registered peer as staying registered needs it: PeerJS's Peer fits. */
export interface ReconnectingPeer {
  readonly id: string | null;
  readonly disconnected: boolean;
  readonly destroyed: boolean;
  reconnect(): void;
  on(event: 'disconnected', cb: () => void): unknown;
  once(event: 'open', cb: () => void): unknown;
}

/** How long a page waits for the signaling server to take it back under its id. */
const SIGNALING_RECONNECT_MS = 10_000;

/**
 * Keeps `peer` registered: the signaling server drops a page it stops hearing from (a tab its browser froze, a
 * machine that slept), and PeerJS then forgets the page's id until it reconnects under it, which it does not do by
 * itself. `until` says when to stop (the page left).
 */
export function stayRegistered(peer: ReconnectingPeer, until: () => boolean): void {
  peer.on('disconnected', () => {
    if (!until() && !peer.destroyed) peer.reconnect();
  });
}

/** The peer's id on the signaling server, once the server has it again where it had dropped the page. */
export async function registeredId(peer: ReconnectingPeer): Promise<string> {
  if (peer.id && !peer.disconnected) return peer.id;
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error('the signaling server has not taken this page back under its id')),
      SIGNALING_RECONNECT_MS,
    );
    peer.once('open', () => {
      clearTimeout(timer);
      resolve();
    });
    if (peer.disconnected && !peer.destroyed) peer.reconnect();
  });
  if (!peer.id) throw new Error('the signaling server took this page back without its id');
  return peer.id;
}

/** Registers a peer (`create` makes it, under a fresh id) with the signaling server. */
export async function registerPeer<P extends SignalingPeer>(create: () => P, server: string): Promise<P> {
  const peer = create();
  try {
    await new Promise<void>((resolve, reject) => {
      peer.once('open', () => resolve());
      peer.once('error', (e) => reject(e));
    });
    return peer;
  } catch (e) {
    peer.destroy();
    throw new Error(`could not register with the signaling server at ${server}: ${(e as Error).message}`, { cause: e });
  }
}

/** PeerJS's options for this server: where it listens and the ICE servers every RTCPeerConnection uses. */
export async function signalingOptions(origin: string): Promise<SignalingOptions> {
  const url = new URL(origin);
  const response = await fetch(new URL('/signaling.json', url));
  if (!response.ok)
    throw new Error(`no signaling server at ${url.origin} (HTTP ${response.status}); is this a ditswarm server?`);
  const published = (await response.json()) as {
    path: string;
    key: string;
    iceServers?: IceServer[];
    relay?: { mode: RelayMode; path: string };
    lanOrigins?: unknown;
    origins?: unknown;
    ca?: { fingerprint?: unknown } | null;
    turn?: unknown;
    iceTransportPolicy?: unknown;
  };
  const { path, key, iceServers = [], relay = { mode: 'off', path: RELAY_PATH } } = published;
  const urls = (list: unknown): string[] =>
    Array.isArray(list) ? list.filter((o): o is string => typeof o === 'string' && URL.canParse(o)) : [];
  const fingerprint = published.ca?.fingerprint;
  const secure = url.protocol === 'https:';
  return {
    host: url.hostname,
    port: Number(url.port) || (secure ? 443 : 80),
    path,
    key,
    secure,
    iceServers,
    relay,
    lanOrigins: urls(published.lanOrigins),
    origins: urls(published.origins),
    ca: typeof fingerprint === 'string' && /^[0-9a-f]{64}$/.test(fingerprint) ? { fingerprint } : null,
    turn: published.turn === true,
    iceTransportPolicy: published.iceTransportPolicy === 'relay' ? 'relay' : 'all',
  };
}

/**
 * Opens this page's relay socket; `auth` is the token its PeerJS id was registered with
 * (`peer.options.token`). The relay groups pages by their swarm's room, and admits a page that
 * proves it holds the room's join token (which leaves no page).
 */
export function connectRelay(
  origin: string,
  signaling: SignalingOptions,
  page: { peer: string; auth: string; token: string; role: RelayRole },
): Promise<RelayClient> {
  const { peer, auth, token, role } = page;
  return RelayClient.connect(
    relayUrl(origin, signaling.relay.path, {
      peer,
      auth,
      room: roomOf(token) ?? '',
      proof: relayProof(token, peer, auth),
      role,
    }),
  );
}

/** What dials a data channel: PeerJS's Peer fits. */
export interface PeerDialer {
  connect(peer: string, options: { serialization: 'raw'; reliable: true; metadata: unknown }): unknown;
}

/**
 * A connection to `to` that is open: a direct data channel, or — when `relay` is `force`, or the
 * channel does not open within `fallbackMs` — a connection through the relay, announced to the
 * other side with the same metadata. The side that accepts takes whichever opens.
 */
export async function dial(
  peer: PeerDialer,
  to: string,
  metadata: unknown,
  relay: { mode: RelayMode; client: () => Promise<RelayClient>; fallbackMs?: number },
): Promise<DataConnectionLike> {
  if (relay.mode === 'force') return (await relay.client()).dial(to, metadata);
  const conn = peer.connect(to, { serialization: 'raw', reliable: true, metadata }) as DataConnectionLike;
  const fallbackMs = relay.fallbackMs ?? RELAY_FALLBACK_MS;
  const failure = await new Promise<string | null>((resolve) => {
    if (conn.open) {
      resolve(null);
      return;
    }
    const timer = setTimeout(() => resolve(`no data channel to ${to} within ${fallbackMs / 1000} s`), fallbackMs);
    const settle = (why: string | null) => {
      clearTimeout(timer);
      resolve(why);
    };
    conn.on('open', () => settle(null));
    conn.on('error', (e) => settle(`the data channel to ${to} failed: ${e.message}`));
    conn.on('close', () => settle(`the data channel to ${to} closed before it opened`));
  });
  if (failure === null) return conn;
  conn.close();
  if (relay.mode === 'off') throw new Error(`${failure} (the relay is off on this server)`);
  try {
    return await (await relay.client()).dial(to, metadata);
  } catch (e) {
    throw new Error(`${failure}, and the relay did not help: ${(e as Error).message}`, { cause: e });
  }
}

export interface OpenLinkOptions extends LinkOptions {
  /** give up (and close the connection) if it is not open by then; the other side may be trying the relay */
  openTimeoutMs?: number;
  /** send as over this slower wire (benchmarks and tests) */
  emulate?: EmulatedWire;
}

/** Resolves with a Link once the connection is open; `onClose` runs once when it goes away. */
export function openLink(
  conn: DataConnectionLike,
  onClose: (reason: string) => void,
  options: OpenLinkOptions = {},
): Promise<Link> {
  return new Promise((resolve, reject) => {
    let link: Link | null = null;
    let closed = false;
    const { openTimeoutMs } = options;
    const timer =
      openTimeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            close(`not open within ${openTimeoutMs / 1000} s`);
            conn.close();
          }, openTimeoutMs);
    const close = (reason: string) => {
      if (closed) return;
      closed = true;
      clearTimeout(timer);
      link?.close(reason);
      if (!link) reject(new Error(`connection to ${conn.peer} failed: ${reason}`));
      onClose(reason);
    };
    const start = () => {
      if (closed || link) return;
      clearTimeout(timer);
      link = new Link(
        options.emulate ? new PacedChannel(conn.dataChannel, options.emulate) : conn.dataChannel,
        options,
      );
      resolve(link);
    };
    conn.on('data', (data) => {
      if (data instanceof ArrayBuffer || ArrayBuffer.isView(data)) link?.receive(data);
    });
    conn.on('close', () => close(`connection to ${conn.peer} closed`));
    conn.on('error', (e) => close(`connection to ${conn.peer} failed: ${e.message}`));
    if (conn.open) start();
    else conn.on('open', start);
  });
}
