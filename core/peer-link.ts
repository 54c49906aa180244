import { Link, type Channel, type LinkOptions } from './link.ts';

/**
 * The one place a PeerJS data connection becomes a Link, for both sides of the wire. Typed
 * structurally so core/ stays free of browser imports; PeerJS's DataConnection fits.
 */
export interface DataConnectionLike {
  readonly peer: string;
  readonly metadata: unknown;
  readonly open: boolean;
  dataChannel: Channel;
  on(event: 'open' | 'close', cb: () => void): unknown;
  on(event: 'data', cb: (data: unknown) => void): unknown;
  on(event: 'error', cb: (error: Error) => void): unknown;
  close(): void;
}

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
}

export async function signalingOptions(origin: string): Promise<SignalingOptions> {
  const url = new URL(origin);
  const response = await fetch(new URL('/signaling.json', url));
  if (!response.ok) throw new Error(`no signaling server at ${url.origin} (HTTP ${response.status}); is this a ditswarm server?`);
  const { path, key, iceServers = [] } = (await response.json()) as { path: string; key: string; iceServers?: IceServer[] };
  const secure = url.protocol === 'https:';
  return { host: url.hostname, port: Number(url.port) || (secure ? 443 : 80), path, key, secure, iceServers };
}

/** Resolves with a Link once the connection is open; `onClose` runs once when it goes away. */
export function openLink(conn: DataConnectionLike, onClose: (reason: string) => void, options?: LinkOptions): Promise<Link> {
  return new Promise((resolve, reject) => {
    let link: Link | null = null;
    let closed = false;
    const close = (reason: string) => {
      if (closed) return;
      closed = true;
      link?.close(reason);
      if (!link) reject(new Error(`connection to ${conn.peer} failed: ${reason}`));
      onClose(reason);
    };
    const start = () => {
      link = new Link(conn.dataChannel, options);
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
