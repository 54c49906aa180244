// Time-limited TURN credentials, as coturn checks them with `use-auth-secret` (the TURN REST API
// scheme): the username is `<expiry, unix seconds>:<id>`, the credential base64(HMAC-SHA1(secret,
// username)). The TURN server recomputes the credential from the username and refuses one past its
// expiry, so this server and coturn share only the secret and keep no list of users.
import { createHmac } from 'node:crypto';
import type { IceServer } from '../core/net/peer-link.ts';
import type { IceAnswer } from '../core/net/turn.ts';

/** How long credentials last: a day, as the TURN REST API draft advises. Pages ask again halfway. */
export const TURN_CREDENTIAL_LIFETIME_S = 86_400;

/** A TURN server sharing `secret` with this one (`--turn-secret`, `--turn-url`). */
export interface TurnServer {
  secret: string;
  urls: string[];
}

/** coturn's credential for `username` under `secret`. */
export function turnCredential(secret: string, username: string): string {
  return createHmac('sha1', secret).update(username).digest('base64');
}

/** The TURN servers with credentials for `id` (a peer id: the TURN server's log names it), for a day from `nowMs`. */
export function issueTurnCredentials(turn: TurnServer, id: string, nowMs = Date.now()): IceAnswer {
  const expires = Math.floor(nowMs / 1000) + TURN_CREDENTIAL_LIFETIME_S;
  const username = `${expires}:${id}`;
  const server: IceServer = { urls: turn.urls, username, credential: turnCredential(turn.secret, username) };
  return { iceServers: [server], expiresAt: expires * 1000 };
}

/**
 * The TURN server of a command line's `--turn-secret` (or DITSWARM_TURN_SECRET) and `--turn-url`
 * flags, or null where neither is given; one without the other, or a URL that is no turn:/turns:
 * one, is refused with what to give instead.
 */
export function turnServerFrom(secret: string | undefined, urls: readonly string[]): TurnServer | null {
  if (!secret && urls.length === 0) return null;
  if (!secret)
    throw new Error(
      '--turn-url needs the secret the TURN server was started with (its static-auth-secret): give --turn-secret S ' +
        'or DITSWARM_TURN_SECRET',
    );
  if (urls.length === 0)
    throw new Error('--turn-secret needs where the TURN server listens: give --turn-url turn:HOST:3478 (repeatable)');
  for (const url of urls)
    if (!/^turns?:[^\s?]+(\?transport=(udp|tcp))?$/.test(url))
      throw new Error(
        `--turn-url ${JSON.stringify(url)} is no TURN URL: give turn:HOST:PORT or turns:HOST:PORT, ` +
          'optionally with ?transport=udp or ?transport=tcp',
      );
  return { secret, urls: [...urls] };
}
