import { existsSync, statSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { basename, join, resolve } from 'node:path';
import express, { type RequestHandler } from 'express';
import { DIST_DIR, ensureAppBuilt, PUBLIC_DIR } from './app-build.ts';
import type { Duplex } from 'node:stream';
import type { IceServer, IceTransportPolicy, RelayMode } from '../core/net/peer-link.ts';
import { issueTurnCredentials, type TurnServer } from './turn-credentials.ts';
import { RELAY_PATH } from '../core/net/relay-client.ts';
import { newPeerKey, SIGNALING_PATH, mountSignaling } from './peer-signaling.ts';
import { mountJoinTokens, openJoinTokens, type JoinTokens } from './join-tokens.ts';
import { ownOrigins, serverOrigins, type Origins } from './origins.ts';
import type { LocalCa, ServerTls } from './certificates.ts';
import { lanOrigins, mountTrustPage, sniffingServer } from './lan-https.ts';
import { createRelay, type Relay } from './relay.ts';
import { digestsOf, listsFolders, serveModelFile, serveModelFolder } from './model-route.ts';
import { parseLoraFlag, type LoraRef } from '../core/model/lora.ts';
import { TRANSFORMER_CONFIG } from '../core/model/transformer.ts';
import { DEFAULT_MODEL_URL } from '../core/job.ts';

export const DEFAULT_PORT = 5173;
const PORTS_TO_TRY = 21; // the asked port and the next 20

export interface ServerOptions {
  /** 0 lets the OS pick; a busy port moves on to the next free one (up to +20). */
  port?: number;
  /** Rebuild dist/ even if it looks up to date. */
  rebuild?: boolean;
  /** No build log. */
  quiet?: boolean;
  /** PeerServer key; every page must connect with the same one (they read /signaling.json). */
  peerKey?: string;
  /** STUN/TURN servers published to every page; the default (none) works within one LAN. */
  iceServers?: IceServer[];
  /** a TURN server sharing a secret with this one: pages that prove their swarm's token are given credentials for it */
  turn?: TurnServer | null;
  /** `relay`: every page's RTCPeerConnections use TURN candidates only (`--ice-policy relay`); needs a TURN server */
  iceTransportPolicy?: IceTransportPolicy;
  /** `fallback` (default): links whose data channel does not open go through this server; `force`: all; `off`: none. */
  relay?: RelayMode;
  /** bytes the relay may hold queued for all pages at once */
  relayBudgetBytes?: number;
  /** model folders on this machine, served under these URL paths (with Range: pages read shards tensor by tensor) */
  modelFolders?: Record<string, string>;
  /** the model the dashboard's form starts with (GET /models.json); the bundled demo model without it */
  defaultModel?: string;
  /** LoRA files on this machine, each served alone under its URL path (servedLoras) */
  loraFiles?: Record<string, string>;
  /** the adapters the dashboard's jobs start with (GET /models.json) */
  defaultLoras?: LoraRef[];
  /**
   * The smallest model the dashboard has joining workers preload and warm up (GET /models.json): every one unless
   * given. A test or benchmark harness, whose jobs are not the form's, gives PRELOAD_LARGE_ONLY.
   */
  preloadFromBytes?: number;
  /** origins beyond this server's own whose pages may use it (a page embedding the library: `openSwarm(origin)`) */
  allowOrigins?: string[];
  /** where the join tokens' secret and revocations outlive restarts (npm start); else a fresh secret each start */
  stateDir?: string;
  /** the video API's router (server/api), mounted at /v1 under the server's Host and Origin rules */
  api?: (origins: Origins) => express.Router;
  /**
   * https beside http on the same port (a connection's first byte tells them apart): other machines' pages are
   * secure contexts only over https. Without it, plain http only (tests, `npm run generate`: localhost pages).
   */
  tls?: ServerTls;
  /** names other machines reach this server by beyond its own (`--host`): answered to, and put in links */
  hosts?: string[];
}

/** Where a model folder given as a local path is served (`--model PATH`). */
export const LOCAL_MODEL_PATH = '/models/local';

/**
 * What `--model PATH|URL` means for a server: a model folder on this machine is served at
 * LOCAL_MODEL_PATH (pages fetch it from there); an http(s) URL, or a path of a model this server ships
 * (`/models/…`), is fetched by the pages as given. Anything else is refused before the server starts,
 * saying what to give instead: a path that is no folder would otherwise reach the pages as a URL and
 * fail a job minutes later. A folder must hold `needs`, the config of the part the command runs: the
 * transformer's for jobs, the VAE's for `npm run decode`.
 */
export function servedModel(
  model: string | undefined,
  needs: string = TRANSFORMER_CONFIG,
): Pick<ServerOptions, 'modelFolders' | 'defaultModel'> {
  if (model === undefined) return {};
  if (/^https?:\/\//i.test(model)) return { defaultModel: model };
  const part = needs.split('/')[0];
  const giveInstead =
    `give the model folder (the one holding model_index.json and ${part}/, as diffusers publishes it; ` +
    '`npm run make-model` writes one) or its http(s) URL';
  if (existsSync(model)) {
    if (!statSync(model).isDirectory()) throw new Error(`--model ${model} is a file: ${giveInstead}`);
    if (!existsSync(join(model, needs)))
      throw new Error(`--model ${model} is no model folder: it has no ${needs}; ${giveInstead}`);
    return { modelFolders: { [LOCAL_MODEL_PATH]: resolve(model) }, defaultModel: LOCAL_MODEL_PATH };
  }
  if (model.startsWith('/models/') && existsSync(join(PUBLIC_DIR, model, needs))) return { defaultModel: model };
  throw new Error(`--model ${model}: no such folder on this machine, and no http(s) URL: ${giveInstead}`);
}

/** Where a LoRA given as a file (`--lora FILE[:STRENGTH]`) is served: one path per file, nothing beside it. */
export const LORA_PATH = '/loras';

/**
 * What `--lora FILE[:STRENGTH]` flags mean for a server: each file on this machine served alone at
 * LORA_PATH/<n>/<its name>, and the adapters every job starts with. A flag that names no file is refused,
 * before the server starts.
 */
export function servedLoras(flags: readonly string[]): Pick<ServerOptions, 'loraFiles' | 'defaultLoras'> {
  const loraFiles: Record<string, string> = {};
  const defaultLoras = flags.map((flag, n) => {
    const { url: file, strength } = parseLoraFlag(flag);
    // an adapter elsewhere is fetched from there by the workers, which this server's /models.json lets read it
    if (/^https?:\/\//i.test(file)) return { url: file, strength };
    if (!existsSync(file) || !statSync(file).isFile())
      throw new Error(`--lora ${flag}: ${file} is no file on this machine; give a LoRA's .safetensors file`);
    const path = `${LORA_PATH}/${n}/${encodeURIComponent(basename(file))}`;
    loraFiles[path] = resolve(file);
    return { url: path, strength };
  });
  return flags.length ? { loraFiles, defaultLoras } : {};
}

/** What a command line's --model and --lora flags serve; what they refuse goes to `refuse`, which says so and exits. */
/** The folder on this machine of the model pages run unless told another (the bundled demo where none is given). */
export function localModelDir({
  modelFolders = {},
  defaultModel = DEFAULT_MODEL_URL,
}: Pick<ServerOptions, 'modelFolders' | 'defaultModel'>): string | null {
  if (defaultModel in modelFolders) return modelFolders[defaultModel];
  return defaultModel.startsWith('/models/') ? join(PUBLIC_DIR, defaultModel) : null;
}

export function servedOr(
  {
    model,
    needs,
    loras = [],
  }: {
    model: string | undefined;
    /** the file of the part the command runs (servedModel); the transformer's config unless given */
    needs?: string;
    loras?: readonly string[];
  },
  refuse: (why: string) => never,
): Pick<ServerOptions, 'modelFolders' | 'defaultModel' | 'loraFiles' | 'defaultLoras'> {
  try {
    return { ...servedModel(model, needs), ...servedLoras(loras) };
  } catch (e) {
    return refuse((e as Error).message);
  }
}

export interface RunningServer {
  /** http://localhost:<port> — a secure context, so WebGPU and cross-origin isolation work. */
  url: string;
  port: number;
  /** where other machines reach this server (https with `tls`), its `--host` names first */
  lanOrigins(): string[];
  /** the local CA other machines trust once, where the server made its own certificate */
  readonly ca: LocalCa | null;
  /** serves https with `tls` from the next connection on (a certificate made again for new addresses) */
  renewTls(tls: ServerTls): void;
  peerKey: string;
  relay: Relay;
  joinTokens: JoinTokens;
  close(): Promise<void>;
}

/** Serves the built app and the PeerJS signaling server on one port. */
export async function startServer(options: ServerOptions = {}): Promise<RunningServer> {
  const {
    port = DEFAULT_PORT,
    rebuild = false,
    quiet = false,
    peerKey = newPeerKey(),
    iceServers = [],
    relay: relayMode = 'fallback',
    turn = null,
    iceTransportPolicy = 'all',
  } = options;
  const anyTurn = turn !== null || iceServers.some((s) => [s.urls].flat().some((url) => url.startsWith('turn')));
  if (iceTransportPolicy === 'relay' && !anyTurn)
    throw new Error(
      'the ICE policy relay sends every link through TURN, but this server has no TURN server: give --turn-secret ' +
        'and --turn-url (or a TURN entry in --ice-servers), or leave the policy at all',
    );
  await ensureAppBuilt({ force: rebuild, quiet });

  const app = express();
  const plain = http.createServer(app);
  let tls = options.tls;
  const secure = tls && https.createServer({ key: tls.key, cert: tls.cert }, app);
  const server = secure ? sniffingServer(plain, secure) : plain;
  let boundPort: number | null = null;
  const hosts = options.hosts ?? [];
  const origins = serverOrigins(options.allowOrigins ?? [], () => boundPort, hosts);
  const lanOriginsAt = (port: number) => lanOrigins(port, hosts, tls);
  app.use((request, response, next) => {
    if (origins.hostAllowed(request.headers.host)) {
      next();
      return;
    }
    response
      .status(421)
      .type('text')
      .send(
        `this server does not answer to the host ${JSON.stringify(request.headers.host ?? '')}: ` +
          'open it at localhost or its LAN address',
      );
  });
  // before isolation's headers: the trust page is no secure context, where they mean nothing (and browsers say so)
  if (tls) mountTrustPage(app, tls);
  app.use(crossOriginIsolation);
  app.use(sharedWith(options.allowOrigins ?? []));
  const signaling = mountSignaling(app, plain, peerKey, origins, () => server.listening);
  const joinTokens = openJoinTokens(options.stateDir);
  mountJoinTokens(
    app,
    joinTokens,
    origins,
    signaling.vouch,
    signaling.holds,
    turn && ((peer) => issueTurnCredentials(turn, peer)),
  );
  // a dashboard's id is named to its workers only while its page holds it: once it is gone, the id is anyone's
  signaling.onRelease((peer) => joinTokens.forgetCoordinator(peer));
  const relay = createRelay({ vouch: signaling.vouch, tokens: joinTokens, budgetBytes: options.relayBudgetBytes });
  // One port for the app, the signaling websocket and the relay: upgrades are routed by path.
  const upgraded = new Set<Duplex>();
  const upgrade = (request: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    upgraded.add(socket);
    socket.once('close', () => upgraded.delete(socket));
    if (!origins.hostAllowed(request.headers.host) || !origins.originAllowed(request.headers.origin)) {
      socket.end('HTTP/1.1 403 Forbidden\r\nConnection: close\r\n\r\n');
      return;
    }
    const path = (request.url ?? '/').split('?')[0]; // as ws matches paths; never throws on a hostile URL
    if (path === RELAY_PATH && relayMode !== 'off') relay.handleUpgrade(request, socket, head);
    else signaling.handleUpgrade(request, socket, head);
  };
  plain.on('upgrade', upgrade);
  secure?.on('upgrade', upgrade);
  app.get('/signaling.json', (request, response) => {
    const port = request.socket.localPort ?? boundPort ?? 0;
    response.json({
      path: SIGNALING_PATH,
      key: peerKey,
      iceServers,
      relay: { mode: relayMode, path: RELAY_PATH },
      // credentials only to a page that proves its swarm's token (core/net/turn.ts), never here
      turn: turn !== null,
      iceTransportPolicy,
      lanOrigins: lanOriginsAt(port),
      origins: ownOrigins(port, hosts, secure !== undefined),
      ca: tls?.ca ? { fingerprint: tls.ca.fingerprint } : null,
    });
  });
  app.get('/models.json', (_request, response) => {
    response.json({
      default: options.defaultModel ?? null,
      loras: options.defaultLoras ?? [],
      ...(options.preloadFromBytes !== undefined && { preloadFromBytes: options.preloadFromBytes }),
    });
  });
  // a missing file or a range past a file's end is the reader's to report: answer its status, log nothing
  // express tells an error handler by its 4 parameters, so `_next` stays
  const statusOnly: express.ErrorRequestHandler = (error: { status?: number }, _request, response, _next) => {
    response.sendStatus(error.status ?? 500);
  };
  for (const [path, dir] of Object.entries(options.modelFolders ?? {}))
    app.use(path, ...serveModelFolder(dir), statusOnly);
  for (const [path, file] of Object.entries(options.loraFiles ?? {})) app.get(path, serveModelFile(file));
  if (options.api) {
    app.use('/v1', options.api(origins));
    // a person opening the server sees the API's queue and swarm (api.html), not a coordinator of their own
    app.get('/', (_request, response) => response.redirect(302, '/api.html'));
  }
  // the bundled models are the app's files: their listings and digests too
  app.use('/models', listsFolders(join(DIST_DIR, 'models')), ...digestsOf(join(DIST_DIR, 'models')));
  app.use(express.static(DIST_DIR));

  boundPort = await listenOnFreePort(server, port);
  const bound = boundPort;
  return {
    url: `http://localhost:${boundPort}`,
    port: boundPort,
    lanOrigins: () => lanOriginsAt(bound),
    get ca() {
      return tls?.ca ?? null;
    },
    renewTls(next) {
      if (!secure) throw new Error('this server was started without https (no tls option): nothing to renew');
      secure.setSecureContext({ key: next.key, cert: next.cert });
      tls = next;
    },
    peerKey,
    relay,
    joinTokens,
    close: () =>
      new Promise<void>((resolve, reject) => {
        signaling.close();
        relay.close();
        for (const socket of upgraded) socket.destroy();
        server.close((error) => (error ? reject(error) : resolve()));
        // the sniffing server holds every connection of both sides: handed on, the http servers track none
        server.closeAllConnections();
      }),
  };
}

// Multi-threaded wasm (SharedArrayBuffer) needs the pages cross-origin isolated.
const crossOriginIsolation: RequestHandler = (_request, response, next) => {
  response.setHeader('Cross-Origin-Opener-Policy', 'same-origin');
  response.setHeader('Cross-Origin-Embedder-Policy', 'require-corp');
  response.setHeader('Cross-Origin-Resource-Policy', 'same-origin');
  next();
};

/**
 * A page of an --allow-origin origin embeds the library (`openSwarm(thisServer)`): it reads this server's signaling
 * settings and model files across origins, by Range (so it sees Content-Range), as the pages of this server do.
 */
function sharedWith(allowOrigins: readonly string[]): RequestHandler {
  const allowed = new Set(allowOrigins.map((origin) => new URL(origin).origin));
  return (request, response, next) => {
    const { origin } = request.headers;
    if (origin && allowed.has(origin))
      response
        .setHeader('Access-Control-Allow-Origin', origin)
        .setHeader('Vary', 'Origin')
        .setHeader('Access-Control-Expose-Headers', 'Content-Range, Content-Length, ETag, Last-Modified')
        .setHeader('Cross-Origin-Resource-Policy', 'cross-origin');
    next();
  };
}

async function listenOnFreePort(server: net.Server, firstPort: number): Promise<number> {
  const lastPort = firstPort === 0 ? 0 : firstPort + PORTS_TO_TRY - 1;
  for (let port = firstPort; port <= lastPort; port++) {
    try {
      await listen(server, port);
      const address = server.address();
      if (address === null || typeof address === 'string') throw new Error(`expected a TCP address, got ${address}`);
      return address.port;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw error;
    }
  }
  throw new Error(`ports ${firstPort}–${lastPort} are all in use; pass --port or PORT to pick another range`);
}

function listen(server: net.Server, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const fail = (error: Error) => reject(error);
    server.once('error', fail);
    server.listen(port, () => {
      server.off('error', fail);
      resolve();
    });
  });
}
