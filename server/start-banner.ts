// What `npm start` prints: where to go. docs/command-line.md quotes it, and test/unit/docs.test.ts holds the quotation
// to these functions. The dashboard's link at localhost comes first (the one to open on this machine), the links for
// other machines under it; a worker link carries its swarm's join token, which the dashboard is given as it opens, so
// the server prints it then (workerLinkLines), not before.
import { OWNER_KEY_PARAM, workerLink } from '../core/net/join-token.ts';
import { spacedFingerprint } from '../core/net/local-ca.ts';
import { TURN_CREDENTIAL_LIFETIME_S } from './turn-credentials.ts';
import type { RelayMode } from '../core/net/peer-link.ts';

/** a line's label, padded to the column its value starts at */
const label = (name: string) => `  ${name.padEnd(12)}`;
const more = label('');

export interface StartFacts {
  /** http://localhost:<port> */
  url: string;
  port: number;
  requestedPort: number;
  /** where other machines reach the server (https), its `--host` names first */
  lanOrigins: string[];
  ownerKey: string;
  /** the fingerprint of the server's own CA (hex), or null with a certificate of --cert */
  caFingerprint: string | null;
  model?: string;
  loras: string[];
  /** the video API's key's whereabouts and its data folder, with --api */
  api?: { keyWhere: string; dataDir: string };
  peerKey: string;
  iceUrls: string[];
  turn?: { urls: string[]; relayOnly: boolean };
  relay: RelayMode;
}

/** The lines `npm start` prints once it serves. */
export function startBanner(facts: StartFacts): string[] {
  const { url, port, requestedPort, lanOrigins, api } = facts;
  // port 0 asks for any free one
  const moved = port !== requestedPort && requestedPort !== 0;
  return [
    '',
    `ditswarm is serving on port ${port}${moved ? ` (${requestedPort} was busy)` : ''}`,
    `${label('dashboard')}${url}/${api ? "  (the video API's queue and swarm: api.html)" : ''}`,
    ...lanOrigins.map(
      (origin) =>
        `${more}${origin}/#${OWNER_KEY_PARAM}=${facts.ownerKey} ` +
        '(from your other machines: yours alone, it opens swarms here)',
    ),
    api
      ? `${label('worker')}the API's coordinator's link, printed here when it opens`
      : `${label('worker')}the dashboard's link: printed here when the dashboard opens, shown on it with a QR code`,
    ...(facts.model ? [`${label('model')}${facts.model} (the dashboard's default)`] : []),
    ...facts.loras.map(
      (lora) => `${label('LoRA')}${lora} (every job's, unless the dashboard's LoRA field says otherwise)`,
    ),
    ...(facts.caFingerprint !== null && lanOrigins.length > 0
      ? [
          `${label('trust once')}each other machine trusts this server's CA once:`,
          `${more}${lanOrigins[0].replace(/^https:/, 'http:')}/ shows how`,
          `${more}(its SHA-256 ${spacedFingerprint(facts.caFingerprint)})`,
        ]
      : []),
    ...(lanOrigins.length === 0 && facts.caFingerprint === null
      ? ["  (--cert names none of this machine's names or LAN addresses: give --host NAME for the one it names)"]
      : []),
    ...(api
      ? [
          `${label('video API')}${url}/v1/videos  (key: ${api.keyWhere}; see ${url}/v1/openapi.json)`,
          `${label('data')}${api.dataDir}`,
        ]
      : []),
    `${label('signaling')}${url}/peerjs  key "${facts.peerKey}"`,
    `${label('ICE servers')}${
      facts.iceUrls.length
        ? facts.iceUrls.join(', ')
        : 'none (host candidates only: pages on one LAN; pass --ice-servers for STUN/TURN)'
    }`,
    ...(facts.turn
      ? [
          `${label('TURN')}${facts.turn.urls.join(', ')}: credentials for ${TURN_CREDENTIAL_LIFETIME_S / 3600} h ` +
            'to pages that prove their join token' +
            (facts.turn.relayOnly ? '; every link goes through it (--ice-policy relay)' : ''),
        ]
      : []),
    `${label('relay')}${
      {
        fallback: `${url.replace(/^http/, 'ws')}/relay for links whose data channel does not open within 8 s`,
        force: 'every link goes through this server (--force-relay)',
        off: 'off: data channels only',
      }[facts.relay]
    }`,
    '',
  ];
}

/**
 * The lines printed when a swarm's dashboard opens: its worker link at localhost, for tabs of this machine, and at
 * each LAN origin, for other machines (these pin the server's CA where it is the server's own, as the dashboard's do).
 */
export function workerLinkLines(local: string, lan: string[]): string[] {
  return [
    `${label('worker')}${local}  (tabs of this machine)`,
    ...lan.map((link) => `${more}${link}  (other machines: a tab, or npx ditswarm worker '…')`),
  ];
}

/** A swarm's worker links, at localhost and at each LAN origin, as the dashboard shows them. */
export function workerLinks(
  url: string,
  lanOrigins: string[],
  token: string,
  caFingerprint: string | null,
): { local: string; lan: string[] } {
  return {
    local: workerLink(url, token, null),
    lan: lanOrigins.map((origin) => workerLink(origin, token, caFingerprint)),
  };
}
