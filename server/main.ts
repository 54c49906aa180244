import { isIP } from 'node:net';
import { parseArgs } from 'node:util';
import { ICE_TRANSPORT_POLICIES, RELAY_MODES, type IceTransportPolicy, type RelayMode } from '../core/net/peer-link.ts';
import { turnServerFrom } from './turn-credentials.ts';
import { newPeerKey, parseIceServers } from './peer-signaling.ts';
import { join } from 'node:path';
import { CACHE_ROOT } from './model-folder.ts';
import { serverNames } from './origins.ts';
import { givenTls, localTls, type ServerTls } from './certificates.ts';
import { DEFAULT_PORT, localModelDir, servedOr, startServer } from './serve.ts';
import { DEFAULT_DATA_DIR, DEFAULTS as API_DEFAULTS, prepareApi, type VideoApi } from './api/api.ts';
import { allowedModelHosts } from './api/model-hosts.ts';
import { START_OPTIONS } from './start-flags.ts';
import { startBanner, workerLinkLines, workerLinks } from './start-banner.ts';

// `npm start [-- --model PATH|URL] [--lora FILE[:STRENGTH]]... [--port N] [--rebuild] [--peer-key K]
//   [--ice-servers LIST] [--relay fallback|force|off | --force-relay] [--allow-origin ORIGIN ...] [--host NAME ...]
//   [--cert FILE --key FILE]
//   [--turn-secret S --turn-url turn:HOST:PORT ... [--ice-policy all|relay]]
//   [--api [--local-workers N] [--data DIR] [--max-queue N] [--api-rate N] [--allow-model-host HOST ...]]`:
// build if needed, serve, print where to go. With --model the dashboard starts on that model
// folder: one on this machine (served to the pages, with Range requests) or a URL. The server
// answers to its own names (localhost, its LAN addresses, its machine name) and pages of its own
// origins, and of those --allow-origin names (a page of yours embedding the library). Other machines reach it over
// https on the same port (their pages are secure contexts only so): by a certificate of its own local CA, made on
// first start and trusted once on each of them (server/certificates.ts), or by --cert/--key. With --api it also
// serves the video API at /v1 (server/api), running its own coordinator in a headless Chromium.
const { values: flags } = parseArgs({ options: START_OPTIONS });

/** A whole number ≥ `min` from a flag, or its default; anything else ends the server, saying what it takes. */
function wholeFlag(name: 'local-workers' | 'max-queue' | 'api-rate', fallback: number, min: number): number {
  const given = flags[name];
  if (!flags.api && given !== undefined) {
    console.error(`--${name} is the video API's: give --api too`);
    process.exit(2);
  }
  const value = given === undefined ? fallback : Number(given);
  if (!Number.isInteger(value) || value < min) {
    console.error(`--${name} takes a whole number ≥ ${min}, got ${given}`);
    process.exit(2);
  }
  return value;
}
const localWorkers = wholeFlag('local-workers', API_DEFAULTS.localWorkers, 0);
const maxQueued = wholeFlag('max-queue', API_DEFAULTS.maxQueued, 1);
const requestsPerMinute = wholeFlag('api-rate', API_DEFAULTS.requestsPerMinute, 1);
if (flags.data !== undefined && !flags.api) {
  console.error("--data is the video API's folder: give --api too");
  process.exit(2);
}
if (flags['allow-model-host'].length && !flags.api) {
  console.error("--allow-model-host is where the video API's jobs may read models from: give --api too");
  process.exit(2);
}

const allowOrigins = flags['allow-origin'];
for (const origin of allowOrigins) {
  if (!URL.canParse(origin) || new URL(origin).origin !== origin.replace(/\/$/, '')) {
    console.error(
      `--allow-origin takes an origin such as https://example.org or http://10.0.0.5:8080, got ${JSON.stringify(origin)}`,
    );
    process.exit(2);
  }
}

const hosts = flags.host.map((host) => host.toLowerCase());
for (const host of hosts) {
  if (!/^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/.test(host) && isIP(host) === 0) {
    console.error(`--host takes a name or address other machines reach this one by, such as swarm.lan, got ${host}`);
    process.exit(2);
  }
}
// the state folder, where the join links given out and the local CA outlive a restart of the server
const stateDir = join(CACHE_ROOT, 'server');
const dataDir = flags.data ?? DEFAULT_DATA_DIR;
// an API server's join links are its data's, beside the coordinator's profile that holds its link: two servers of
// two data folders do not share a secret, and the link is revoked or kept with the data it belongs to
const joinStateDir = flags.api ? join(dataDir, 'server') : stateDir;
/** this server's certificate from its own CA, for its names now (made again where one is missing) */
const ownTls = () => localTls(join(stateDir, 'tls'), serverNames(hosts), (line) => console.error(`https: ${line}`));
let tls: ServerTls;
try {
  if ((flags.cert === undefined) !== (flags.key === undefined))
    throw new Error('--cert and --key go together: the certificate and its private key, PEM files');
  tls = flags.cert !== undefined && flags.key !== undefined ? givenTls(flags.cert, flags.key) : ownTls();
} catch (error) {
  console.error((error as Error).message);
  process.exit(2);
}

const requestedPort = Number(flags.port ?? process.env.PORT ?? DEFAULT_PORT);
if (!Number.isInteger(requestedPort) || requestedPort < 0 || requestedPort > 65535) {
  console.error(`--port/PORT must be an integer 0–65535, got ${flags.port ?? process.env.PORT}`);
  process.exit(2);
}

let iceServers;
try {
  iceServers = parseIceServers(flags['ice-servers'] ?? process.env.DITSWARM_ICE_SERVERS);
} catch (error) {
  console.error(`--ice-servers/DITSWARM_ICE_SERVERS: ${(error as Error).message}`);
  process.exit(2);
}

const relay = (flags['force-relay'] ? 'force' : (flags.relay ?? process.env.DITSWARM_RELAY ?? 'fallback')) as RelayMode;
if (!RELAY_MODES.includes(relay)) {
  console.error(`--relay/DITSWARM_RELAY must be one of ${RELAY_MODES.join(', ')}, got ${relay}`);
  process.exit(2);
}

let turn;
try {
  turn = turnServerFrom(flags['turn-secret'] ?? process.env.DITSWARM_TURN_SECRET, flags['turn-url']);
} catch (error) {
  console.error((error as Error).message);
  process.exit(2);
}
const icePolicy = (flags['ice-policy'] ?? process.env.DITSWARM_ICE_POLICY ?? 'all') as IceTransportPolicy;
if (!ICE_TRANSPORT_POLICIES.includes(icePolicy)) {
  console.error(
    `--ice-policy/DITSWARM_ICE_POLICY must be one of ${ICE_TRANSPORT_POLICIES.join(', ')} ` +
      `(relay: every link through TURN), got ${icePolicy}`,
  );
  process.exit(2);
}

const model = servedOr({ model: flags.model, loras: flags.lora }, (why) => {
  console.error(why);
  process.exit(2);
});

let api: VideoApi | undefined;
try {
  api = flags.api
    ? prepareApi({
        dataDir,
        localWorkers,
        maxQueued,
        requestsPerMinute,
        modelHosts: allowedModelHosts(flags['allow-model-host']),
        keyFromEnv: process.env.DITSWARM_API_KEY,
        model: model.defaultModel,
        defaultModelDir: localModelDir(model),
        log: (line) => console.error(line),
      })
    : undefined;
} catch (e) {
  console.error(`--api: ${(e as Error).message}`);
  process.exit(2);
}

const server = await startServer({
  api: api && ((origins) => api.router(origins)),
  port: requestedPort,
  rebuild: flags.rebuild,
  peerKey: flags['peer-key'] ?? process.env.DITSWARM_KEY ?? newPeerKey(),
  iceServers,
  turn,
  iceTransportPolicy: icePolicy,
  relay,
  allowOrigins,
  stateDir: joinStateDir,
  tls,
  hosts,
  ...model,
}).catch((error: unknown) => {
  // what the server refuses to start with (a relay policy without TURN, every port busy) is the user's to mend
  console.error((error as Error).message);
  return process.exit(2);
});
// a machine that moves to another network has new addresses: its certificate names them within a minute
const RENEW_CHECK_MS = 60_000;
if (server.ca)
  setInterval(() => {
    if (serverNames(hosts).every((name) => tls.covers(name))) return;
    tls = ownTls();
    server.renewTls(tls);
    console.log(`  LAN links   now ${server.lanOrigins().join(', ')}`);
  }, RENEW_CHECK_MS).unref();

const iceUrls = iceServers.flatMap((s) => s.urls); // credentials stay out of the log
console.log(
  startBanner({
    url: server.url,
    port: server.port,
    requestedPort,
    lanOrigins: server.lanOrigins(),
    // a dashboard of another machine proves it is the owner's with the key in its link's fragment
    ownerKey: server.joinTokens.ownerKey(),
    caFingerprint: server.ca?.fingerprint ?? null,
    model: flags.model,
    loras: flags.lora,
    api: api && { keyWhere: api.key.where, dataDir },
    peerKey: server.peerKey,
    iceUrls,
    turn: turn ? { urls: turn.urls, relayOnly: icePolicy === 'relay' } : undefined,
    relay,
  }).join('\n'),
);
// a worker link carries its swarm's token, which the dashboard is given as it opens: printed then, once a swarm
const printedSwarms = new Set<string>();
if (!api)
  server.joinTokens.onRegister((room) => {
    const token = server.joinTokens.standing(room);
    if (token === null || printedSwarms.has(room)) return;
    printedSwarms.add(room);
    const { local, lan } = workerLinks(server.url, server.lanOrigins(), token, server.ca?.fingerprint ?? null);
    console.log(workerLinkLines(local, lan).join('\n'));
  });

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    void (api?.close() ?? Promise.resolve())
      .catch(() => {})
      .then(() => server.close())
      .finally(() => process.exit(0));
  });
}

if (api) {
  console.error(`api: opening the coordinator${localWorkers ? ` and ${localWorkers} local worker tab(s)` : ''}…`);
  try {
    const host = await api.start(server.url);
    const { joinUrl, lanJoinUrl } = await host.swarm();
    console.log(
      [...workerLinkLines(joinUrl, lanJoinUrl && lanJoinUrl !== joinUrl ? [lanJoinUrl] : []), 'api: ready'].join('\n'),
    );
  } catch (e) {
    console.error(`api: could not open the coordinator: ${(e as Error).message}`);
    await api.close().catch(() => {});
    await server.close();
    process.exit(1);
  }
}
