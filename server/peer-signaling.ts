import { randomBytes } from 'node:crypto';
import { createHook } from 'node:async_hooks';
import type { IncomingMessage, Server } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Express } from 'express';
import { ExpressPeerServer } from 'peer';
import { WebSocketServer } from 'ws';
import type { IceServer } from '../core/net/peer-link.ts';
import type { Origins } from './origins.ts';
import { clientSource, perAddressCap, rateLimit } from './rate-limit.ts';
import { MAX_SIGNALING_CLIENTS } from './signaling-capacity.ts';

/** Where pages find the PeerServer: `new Peer(id, { host, port, path: SIGNALING_PATH, key })`. */
export const SIGNALING_PATH = '/peerjs';
/**
 * A fresh PeerServer key per server start: only pages this server handed it to (through
 * /signaling.json) can register peers or list them; it is not a secret, the join token is.
 */
export const newPeerKey = (): string => `ditswarm-${randomBytes(6).toString('hex')}`;

/**
 * The STUN/TURN servers every page hands to RTCPeerConnection, from `--ice-servers` or
 * DITSWARM_ICE_SERVERS: either a JSON array of RTCIceServer objects
 * (`[{"urls":"turn:turn.example.org:3478","username":"u","credential":"p"}]`) or a comma-separated
 * list of STUN URLs (`stun:stun.example.org:3478`). Empty text is no servers: host candidates
 * only, which is enough on one LAN. A TURN server without credentials is rejected here, as the
 * browser would reject it in every page.
 */
export function parseIceServers(text: string | undefined): IceServer[] {
  const trimmed = text?.trim() ?? '';
  if (!trimmed) return [];
  let servers: unknown;
  if (trimmed.startsWith('[')) {
    try {
      servers = JSON.parse(trimmed);
    } catch (error) {
      throw new Error(
        `ICE servers: not valid JSON (${(error as Error).message}); expected [{"urls":"stun:host:3478"}, …]`,
        { cause: error },
      );
    }
  } else {
    servers = trimmed.split(',').map((url) => ({ urls: url.trim() }));
  }
  if (!Array.isArray(servers)) throw new Error('ICE servers: expected a JSON array of {urls, username?, credential?}');
  return servers.map((server, i) => checkIceServer(server, i));
}

function checkIceServer(server: unknown, index: number): IceServer {
  const where = `ICE server ${index + 1}`;
  if (typeof server !== 'object' || server === null)
    throw new Error(`${where}: expected an object {urls, username?, credential?}, got ${JSON.stringify(server)}`);
  const { urls, username, credential } = server as Record<string, unknown>;
  const list = typeof urls === 'string' ? [urls] : urls;
  if (!Array.isArray(list) || list.length === 0 || !list.every((u) => typeof u === 'string')) {
    throw new Error(`${where}: "urls" must be a URL or a non-empty list of URLs, got ${JSON.stringify(urls)}`);
  }
  for (const url of list) {
    const scheme = /^(stuns?|turns?):[^\s]+$/.exec(url)?.[1];
    if (!scheme)
      throw new Error(
        `${where}: "${url}" is not a stun:, stuns:, turn: or turns: URL (e.g. stun:stun.example.org:3478)`,
      );
    if (scheme.startsWith('turn') && (typeof username !== 'string' || typeof credential !== 'string')) {
      throw new Error(
        `${where}: ${url} needs "username" and "credential" (browsers refuse TURN without them); use the JSON form`,
      );
    }
  }
  if (username !== undefined && typeof username !== 'string') throw new Error(`${where}: "username" must be text`);
  if (credential !== undefined && typeof credential !== 'string')
    throw new Error(`${where}: "credential" must be text`);
  return {
    urls: urls as string | string[],
    ...(username !== undefined && { username: username }),
    ...(credential !== undefined && { credential: credential }),
  };
}

export interface Signaling {
  /** Takes over an HTTP upgrade for the PeerServer's websocket (any other path is answered 400). */
  handleUpgrade(request: IncomingMessage, socket: Duplex, head: Buffer): void;
  /** Whether a page holds `peer` on this PeerServer, registered with `token` (PeerJS's per-page secret). */
  vouch: (peer: string, token: string) => boolean;
  /** Whether a page holds `peer` on this PeerServer now (its signaling socket is open). */
  holds: (peer: string) => boolean;
  /** Hears each id its page lets go (the page closed or lost the server). */
  onRelease(listener: (peer: string) => void): void;
  /** Stops the PeerServer's housekeeping timers (the server closes the sockets). */
  close(): void;
}

/** an OFFER or ANSWER with its ICE candidates is a few KB; peer's own default is 100 MiB */
export const MAX_SIGNALING_MESSAGE_BYTES = 64 * 1024;
export { MAX_SIGNALING_CLIENTS };
/** of them from one address: a machine's tabs (a NAT's machines share one), not the whole limit */
export const MAX_SIGNALING_CLIENTS_PER_ADDRESS = 64;
/**
 * of them from one network (an IPv4 /24, an IPv6 /64, this machine's loopback): a lab's LAN, not the
 * whole limit, so that one machine with many addresses leaves room for the others
 */
export const MAX_SIGNALING_CLIENTS_PER_PREFIX = MAX_SIGNALING_CLIENTS / 4;
/**
 * signaling messages one page may send in a burst, and a second on average: a data channel's offer
 * and its ICE candidates are a few dozen, heartbeats one every few seconds
 */
export const SIGNALING_BURST = 200;
export const SIGNALING_MESSAGES_PER_SECOND = 20;

/**
 * Mounts the PeerJS signaling server on `app` at SIGNALING_PATH. Its websocket endpoint is
 * `${SIGNALING_PATH}/peerjs?key=…`, reached through `handleUpgrade` (the server routes upgrades:
 * the relay shares the port). No peer discovery: a worker link names its dashboard, and a list of
 * ids would tell anyone which one to take over when its owner goes. Signaling messages are small
 * (an SDP offer is a few KB): larger ones are refused, as are clients past a few hundred.
 */
export function mountSignaling(
  app: Express,
  server: Server,
  key: string,
  origins: Origins,
  /** whether the server listens (over TLS too, where `server` is only its plain-http side) */
  listening: () => boolean,
): Signaling {
  let websockets: WebSocketServer | null = null;
  const peerServer = ExpressPeerServer(server, {
    path: '/',
    key,
    allow_discovery: false,
    // CORS for this server's own origins and the allowed ones only, not whichever asks
    corsOptions: {
      origin: (origin: string | undefined, allow: (error: Error | null, allowed: boolean) => void) =>
        allow(null, origins.originAllowed(origin)),
    },
    concurrent_limit: MAX_SIGNALING_CLIENTS,
    // Left on the http server, peer's WebSocketServer would answer every other upgrade path (the relay's) with 400.
    createWebSocketServer: (options) =>
      (websockets = new WebSocketServer({
        path: options.path,
        noServer: true,
        maxPayload: MAX_SIGNALING_MESSAGE_BYTES,
      })),
  });
  // peer re-emits the http server's own errors (a busy port during listen) and every bad client
  // socket as 'error'; unheard, that would throw and end the process.
  peerServer.on('error', (error) => {
    if (listening()) console.warn(`signaling: ${error.message}`);
  });
  // Who holds which id, by the token PeerJS registered it with: the relay trusts an id only with it.
  const registered = new Map<string, string>();
  type Client = { getId(): string; getToken(): string };
  peerServer.on('connection', (client: Client) => registered.set(client.getId(), client.getToken()));
  const releaseListeners = new Set<(peer: string) => void>();
  peerServer.on('disconnect', (client: Client) => {
    if (registered.get(client.getId()) !== client.getToken()) return;
    registered.delete(client.getId());
    for (const listener of releaseListeners) listener(client.getId());
  });
  const perAddress = perAddressCap(MAX_SIGNALING_CLIENTS_PER_ADDRESS);
  const perPrefix = perAddressCap(MAX_SIGNALING_CLIENTS_PER_PREFIX);
  /** a place for one more page from this address and network, as the function that gives it back; else why not */
  const takePlace = (remoteAddress: string | undefined): (() => void) | string => {
    const { address, prefix } = clientSource(remoteAddress);
    const releaseAddress = perAddress(address);
    if (!releaseAddress) return `${MAX_SIGNALING_CLIENTS_PER_ADDRESS} pages of this address are registered already`;
    const releasePrefix = perPrefix(prefix);
    if (releasePrefix)
      return () => {
        releaseAddress();
        releasePrefix();
      };
    releaseAddress();
    return `${MAX_SIGNALING_CLIENTS_PER_PREFIX} pages of this network (${prefix}) are registered already`;
  };
  const housekeeping = trackTimersStartedBy(() => app.use(SIGNALING_PATH, peerServer));
  return {
    handleUpgrade(request, socket, head) {
      if (!websockets) throw new Error('the PeerServer has no websocket server: mountSignaling did not mount it');
      const wss = websockets;
      const release = takePlace(request.socket.remoteAddress);
      if (typeof release === 'string')
        return void socket.end(`HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\n\r\n${release}`);
      socket.once('close', release); // a refused upgrade too
      wss.handleUpgrade(request, socket, head, (ws) => {
        // heard before peer's own listener: a page past its rate is cut before its message is handled
        const within = rateLimit(SIGNALING_BURST, (SIGNALING_BURST / SIGNALING_MESSAGES_PER_SECOND) * 1000);
        ws.on('message', () => {
          if (!within()) ws.terminate();
        });
        wss.emit('connection', ws, request);
      });
    },
    vouch: (peer, token) => token !== '' && registered.get(peer) === token,
    holds: (peer) => registered.has(peer),
    onRelease: (listener) => void releaseListeners.add(listener),
    close() {
      housekeeping.stop();
    },
  };
}

/**
 * peer 1.0.2 has no close(): mounting it starts two setTimeout loops (message expiry and the
 * broken-connection check) that re-arm forever and would keep Node alive. They are found by
 * async ancestry: a Timeout created during `start`, or by the callback of one already tracked.
 */
function trackTimersStartedBy(start: () => void): { stop(): void } {
  const live = new Map<number, NodeJS.Timeout>();
  let starting = true;
  const hook = createHook({
    init(asyncId, type, triggerAsyncId, resource) {
      if (type === 'Timeout' && (starting || live.has(triggerAsyncId))) live.set(asyncId, resource as NodeJS.Timeout);
    },
    destroy(asyncId) {
      live.delete(asyncId);
    },
  }).enable();
  try {
    start();
  } finally {
    starting = false;
  }
  return {
    stop() {
      hook.disable();
      for (const timer of live.values()) clearTimeout(timer);
      live.clear();
    },
  };
}
