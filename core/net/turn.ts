// TURN for a page. A server started with a TURN secret (coturn's `use-auth-secret`) gives short-lived
// credentials to the pages of its swarms only: a worker that proves its join token, a dashboard that
// proves its dashboard key (whoever holds them relays through that TURN server, at its owner's cost).
// A page asks before it makes its PeerJS peer, so that every RTCPeerConnection has them, and again
// before they expire. Once a link is open its ICE pair says whether it went through TURN.
import type { DataConnectionLike, StatsReport, Transport } from './channel.ts';
import { joinProof } from './hmac.ts';
import { roomOf, type CoordinatorRequest, type SwarmKeys } from './join-token.ts';
import type { IceServer, SignalingOptions } from './peer-link.ts';

/** Where a page asks its server for TURN credentials (with a CoordinatorRequest for its own peer id). */
export const ICE_PATH = '/swarms/ice';

/** The TURN servers with this page's credentials, and when those expire (unix ms). */
export interface IceAnswer {
  iceServers: IceServer[];
  expiresAt: number;
}

export const workerIceProof = (token: string, peer: string): string =>
  joinProof(token, 'ice', roomOf(token) ?? '', peer);
export const dashboardIceProof = (dashboardKey: string, room: string, peer: string): string =>
  joinProof(dashboardKey, 'ice', room, peer);

/** What a worker shows the server to be given TURN credentials for its id `peer`: a proof of the join token. */
export function workerIceRequest(token: string, peer: string): CoordinatorRequest {
  return { room: roomOf(token) ?? '', peer, proof: workerIceProof(token, peer) };
}

/** What a dashboard shows the server to be given TURN credentials for its id `peer`: a proof of its dashboard key. */
export function dashboardIceRequest(keys: SwarmKeys, peer: string): CoordinatorRequest {
  const room = roomOf(keys.token) ?? '';
  return { room, peer, proof: dashboardIceProof(keys.dashboardKey, room, peer) };
}

/** TURN credentials from the server at `origin` for the page that makes `request`. */
export async function askTurn(origin: string, request: CoordinatorRequest): Promise<IceAnswer> {
  const response = await fetch(new URL(ICE_PATH, origin), {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(request),
  });
  if (!response.ok) {
    const why = (await response.text()).slice(0, 300);
    throw new Error(`the server at ${origin} gave no TURN credentials: HTTP ${response.status} ${why}`);
  }
  const answer = (await response.json()) as Partial<IceAnswer>;
  if (!Array.isArray(answer.iceServers) || typeof answer.expiresAt !== 'number')
    throw new Error(
      `the server at ${origin} answered ${JSON.stringify(answer).slice(0, 200)} for TURN credentials; ` +
        'expected {iceServers, expiresAt}',
    );
  return { iceServers: answer.iceServers, expiresAt: answer.expiresAt };
}

/** A page's PeerJS peer as fresh credentials reach it: PeerJS reads `options.config` for each new RTCPeerConnection. */
export interface TurnPeer {
  readonly destroyed: boolean;
  // PeerJS types it as any
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  readonly options: { config?: any };
}

/** Credentials are asked for again at this fraction of their lifetime, so that a failed ask has time to be retried. */
const REFRESH_AT = 0.5;
/** how soon a failed ask is retried */
const RETRY_MS = 60_000;

/**
 * What a page makes its peer with where its server has TURN (`signaling.turn`): the server's own
 * STUN list and the TURN servers with credentials that `ask` gets for the peer's id; and
 * `keepFresh`, which asks again before they expire for as long as the peer lives. Where the server
 * has none, or gives none, the page goes on without TURN (it says why in the console): links whose
 * data channel does not open then go through the server's relay.
 */
export async function turnSignaling(
  signaling: SignalingOptions,
  ask: (() => Promise<IceAnswer>) | null,
): Promise<{ signaling: SignalingOptions; keepFresh(peer: TurnPeer): void }> {
  const none = { signaling, keepFresh: () => {} };
  if (!signaling.turn || !ask) return none;
  const withTurn = (answer: IceAnswer) => [...signaling.iceServers, ...answer.iceServers];
  let first: IceAnswer;
  try {
    first = await ask();
  } catch (e) {
    console.warn(`no TURN for this page: ${(e as Error).message}`);
    return none;
  }
  return {
    signaling: { ...signaling, iceServers: withTurn(first) },
    keepFresh(peer) {
      const refreshIn = (answer: IceAnswer) => Math.max(0, (answer.expiresAt - Date.now()) * REFRESH_AT);
      const schedule = (ms: number) => {
        const timer = setTimeout(() => {
          if (peer.destroyed) return;
          ask().then(
            (answer) => {
              if (peer.destroyed) return;
              // eslint-disable-next-line @typescript-eslint/no-unsafe-assignment -- PeerJS's config is any
              peer.options.config = { ...peer.options.config, iceServers: withTurn(answer) };
              schedule(refreshIn(answer));
            },
            (e: unknown) => {
              console.warn(`TURN credentials not renewed (asking again in a minute): ${(e as Error).message}`);
              schedule(RETRY_MS);
            },
          );
        }, ms);
        // a Node worker process ends when its work does, not when its credentials would have been renewed
        (timer as { unref?: () => void }).unref?.();
      };
      schedule(refreshIn(first));
    },
  };
}

/**
 * How an open link goes: through the server's relay, or a data channel whose selected ICE pair has a
 * relayed candidate on either end (through TURN) or none (direct). Stats that name no selected pair
 * (a connection that is closing) leave a data channel 'direct', as it was opened.
 */
export async function linkTransport(conn: DataConnectionLike): Promise<Transport> {
  if (conn.transport === 'relay') return 'relay';
  let report: StatsReport | undefined;
  try {
    report = await conn.peerConnection?.getStats();
  } catch {
    return 'direct';
  }
  if (!report) return 'direct';
  return selectedPairRelayed(report) ? 'turn' : 'direct';
}

/** Whether the ICE pair a connection's stats name as selected has a relay candidate on either end. */
export function selectedPairRelayed(report: StatsReport): boolean {
  const stats = new Map<string, Record<string, unknown>>();
  report.forEach((stat) => stats.set(stat.id, stat));
  const all = [...stats.values()];
  // Chromium names the pair on its transport; Firefox marks it `selected`; werift and older browsers only nominate it
  const selectedId = all.find((s) => s.type === 'transport' && typeof s.selectedCandidatePairId === 'string')
    ?.selectedCandidatePairId as string | undefined;
  const pair =
    (selectedId === undefined ? undefined : stats.get(selectedId)) ??
    all.find((s) => s.type === 'candidate-pair' && s.selected === true) ??
    all.find((s) => s.type === 'candidate-pair' && s.nominated === true && s.state === 'succeeded');
  if (!pair) return false;
  const typeOf = (id: unknown) => (typeof id === 'string' ? stats.get(id)?.candidateType : undefined);
  return typeOf(pair.localCandidateId) === 'relay' || typeOf(pair.remoteCandidateId) === 'relay';
}
