// How other machines reach this server: https beside plain http on one port, the links they open, and the page a
// plain-http LAN address shows instead of the app (a page there would have no WebGPU, wasm threads, WebCodecs or
// crypto.subtle: it says how to trust this server's CA once, and goes on to the https page).
import type http from 'node:http';
import type https from 'node:https';
import net from 'node:net';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import type { Express } from 'express';
import { DIST_DIR } from './app-build.ts';
import type { ServerTls } from './certificates.ts';
import { lanAddresses } from './origins.ts';
import { CA_PATH, TLS_PROBE_PATH } from '../core/net/local-ca.ts';

/** the pages of the app, which a plain-http LAN address answers with the trust page */
const APP_PAGES = new Set(['/', '/index.html', '/worker.html', '/api.html', '/trust.html']);
const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]']);

/**
 * Where other machines reach this server: its `--host` names, then its LAN addresses; over https those its
 * certificate covers (a certificate given with --cert may name only some), else over plain http.
 */
export function lanOrigins(port: number, hosts: readonly string[], tls: ServerTls | undefined): string[] {
  const names = [...new Set([...hosts, ...lanAddresses()])];
  const bracketed = (name: string) => (net.isIPv6(name) ? `[${name}]` : name);
  if (!tls) return names.map((name) => `http://${bracketed(name)}:${port}`);
  return names.filter((name) => tls.covers(name)).map((name) => `https://${bracketed(name)}:${port}`);
}

/**
 * how long a connection may say nothing before its first byte: a browser's preconnect sends its request by then, and
 * a socket opened only to be held is let go
 */
const FIRST_BYTE_MS = 10_000;

/** One port for both: a TLS connection starts with a handshake record (0x16); anything else is plain http. */
export function sniffingServer(plain: http.Server, secure: https.Server): net.Server & { closeAllConnections(): void } {
  const TLS_HANDSHAKE = 0x16;
  // neither http server listens, so neither tracks the connections it is handed (closeAllConnections finds none),
  // nor knows one before its first byte: this one keeps them all
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
    socket.setTimeout(FIRST_BYTE_MS, () => socket.destroy());
    socket.once('error', () => socket.destroy()); // a peer gone before its first byte
    socket.once('data', (first: Buffer) => {
      socket.setTimeout(0);
      socket.pause();
      socket.unshift(first);
      (first[0] === TLS_HANDSHAKE ? secure : plain).emit('connection', socket);
      process.nextTick(() => socket.resume());
    });
  });
  return Object.assign(server, {
    /** lets go every connection, idle keep-alives and those that sent nothing yet: a closing server waits for them */
    closeAllConnections: () => {
      for (const socket of sockets) socket.destroy();
    },
  });
}

const overTls = (request: http.IncomingMessage): boolean => (request.socket as Partial<TLSSocket>).encrypted === true;

/**
 * The CA's download, the probe, and the trust page in place of the app's pages on a plain-http LAN address (the same
 * path, so that the page keeps its link's fragment, the join token, for the https page it goes on to).
 */
export function mountTrustPage(app: Express, tls: ServerTls): void {
  const { ca } = tls;
  if (ca)
    app.get(CA_PATH, (_request, response) => {
      response
        .type('application/x-x509-ca-cert')
        .setHeader('Content-Disposition', 'attachment; filename="ditswarm-ca.crt"')
        .send(ca.pem);
    });
  app.get(TLS_PROBE_PATH, (request, response) => {
    // read by the trust page, an http origin: CORS lets it see the answer, which only a trusting browser gets
    response.setHeader('Access-Control-Allow-Origin', '*').sendStatus(overTls(request) ? 204 : 404);
  });
  app.use((request, response, next) => {
    const host = new URL(`http://${request.headers.host ?? 'localhost'}`).hostname;
    if (overTls(request) || LOOPBACK.has(host) || request.method !== 'GET' || !APP_PAGES.has(request.path)) {
      next();
      return;
    }
    // a certificate of the user's needs no trusting: straight on (a browser keeps the fragment through a redirect)
    if (ca) response.sendFile(join(DIST_DIR, 'trust.html'));
    else response.redirect(302, `https://${request.headers.host ?? ''}${request.originalUrl}`);
  });
}
