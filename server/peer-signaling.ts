import { createHook } from 'node:async_hooks';
import type { Server } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Express } from 'express';
import { ExpressPeerServer } from 'peer';

/** Where pages find the PeerServer: `new Peer(id, { host, port, path: SIGNALING_PATH, key })`. */
export const SIGNALING_PATH = '/peerjs';
export const DEFAULT_PEER_KEY = 'ditswarm';

export interface Signaling {
  /** Drops every signaling websocket and stops the PeerServer's housekeeping timers. */
  close(): void;
}

/**
 * Mounts the PeerJS signaling server on `app` at SIGNALING_PATH, sharing `server`'s port.
 * Its websocket endpoint is `${SIGNALING_PATH}/peerjs?key=…`; peer discovery is
 * `GET ${SIGNALING_PATH}/<key>/peers`.
 */
export function mountSignaling(app: Express, server: Server, key: string): Signaling {
  const peerServer = ExpressPeerServer(server, { path: '/', key, allow_discovery: true });
  // peer re-emits the http server's own errors (a busy port during listen) and every bad client
  // socket as 'error'; unheard, that would throw and end the process.
  peerServer.on('error', (error) => {
    if (server.listening) console.warn(`signaling: ${error.message}`);
  });
  const housekeeping = trackTimersStartedBy(() => app.use(SIGNALING_PATH, peerServer));
  // peer 1.0.2 never hands out its WebSocketServer, so its sockets are collected at the upgrade.
  const websockets = new Set<Duplex>();
  server.on('upgrade', (_request, socket: Duplex) => {
    websockets.add(socket);
    socket.once('close', () => websockets.delete(socket));
  });
  return {
    close() {
      housekeeping.stop();
      for (const socket of websockets) socket.destroy();
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
