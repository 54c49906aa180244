// WebRTC for a worker process: the `peerjs` client the worker page uses, unchanged, on werift (WebRTC in
// pure TypeScript, so that the worker installs anywhere without a native build). PeerJS reads the browser's
// globals, so werift's classes are put where it looks, before it is loaded: it checks for
// RTCPeerConnection once, as it loads.
import type { Peer } from 'peerjs';
import type { peerOptions } from '../../core/net/peer-link.ts';
import {
  RTCPeerConnection,
  RTCSessionDescription,
  type PeerConfig,
  type RTCIceCandidate,
  type RTCIceCandidateInit,
  type RTCLocalSessionDescriptionInit,
  type SessionDescription as WeriftDescription,
} from 'werift';
import { WebSocket } from 'ws';

/**
 * The largest message one data channel send may carry, as Chromium advertises it: werift advertises 64 KiB
 * unless told, and a link's frames may be larger (core/net/link.ts).
 */
const MAX_MESSAGE_BYTES = 262_144;

/**
 * A browser's candidate under an mDNS name (`<uuid>.local`), which hides its address from pages. werift looks such a
 * name up before it goes on (an IPv4 query with a 10 s limit, which a browser hiding an IPv6 address never answers),
 * and the link falls back to the relay meanwhile. Dropped instead: the browser's connectivity checks reach this
 * process at the addresses werift gave it, and werift learns the browser's address from them.
 */
export const hiddenCandidate = (candidate: string): boolean => /^(a=)?candidate:(\S+ ){4}\S+\.local /.test(candidate);

/** `sdp` without its hidden candidates' lines */
export const withoutHiddenCandidates = (sdp: string): string =>
  sdp
    .split('\r\n')
    .filter((line) => !hiddenCandidate(line))
    .join('\r\n');

/**
 * werift's peer connection as PeerJS needs it. werift gathers its ICE candidates inside setLocalDescription
 * and announces them before that resolves, while PeerJS sends its offer or answer only after: the candidates
 * would reach the other side before the description they belong to, which a browser refuses and another
 * werift never connects through. So no candidate is trickled: the description PeerJS sends is given
 * werift's final SDP, which carries every candidate gathered.
 */
class PeerConnection extends RTCPeerConnection {
  constructor(config: Partial<PeerConfig> = {}) {
    super({ maxMessageSize: MAX_MESSAGE_BYTES, ...config });
  }

  override get onicecandidate(): null {
    return null;
  }

  override set onicecandidate(_listener: unknown) {
    // no trickle: the SDP carries the candidates
  }

  override setLocalDescription(description: { type: 'rollback' }): Promise<void>;
  override setLocalDescription(description?: RTCLocalSessionDescriptionInit): Promise<WeriftDescription>;
  override async setLocalDescription(
    description?: RTCLocalSessionDescriptionInit | { type: 'rollback' },
  ): Promise<WeriftDescription | void> {
    if (description?.type === 'rollback') return super.setLocalDescription({ type: 'rollback' });
    const set = await super.setLocalDescription(description);
    const sdp = this.localDescription?.sdp;
    // the object PeerJS passed is the one it then sends
    if (description && sdp) Object.defineProperty(description, 'sdp', { value: sdp, enumerable: true, writable: true });
    return set;
  }

  override addIceCandidate(candidate?: RTCIceCandidate | RTCIceCandidateInit | null): Promise<void> {
    return candidate?.candidate && hiddenCandidate(candidate.candidate)
      ? Promise.resolve()
      : super.addIceCandidate(candidate);
  }
}

/**
 * The W3C constructor, `new RTCSessionDescription({ type, sdp })`, which PeerJS calls with the other side's
 * description; werift's is (sdp, type). Its hidden candidates are left out (hiddenCandidate).
 */
class SessionDescription extends RTCSessionDescription {
  constructor(init: { sdp: string; type: 'offer' | 'answer' | 'pranswer' }) {
    super(withoutHiddenCandidates(init.sdp), init.type);
  }
}

let loaded: Promise<typeof Peer> | null = null;

/** PeerJS's Peer class in this process, on werift (its globals put in place at the first call). */
function peerClass(): Promise<typeof Peer> {
  loaded ??= (async () => {
    Object.assign(globalThis, { RTCPeerConnection: PeerConnection, RTCSessionDescription: SessionDescription });
    // PeerJS's signaling socket, and the relay's (core/net/relay-client.ts): Node 20 has no WebSocket of its own
    if (!('WebSocket' in globalThis)) Object.assign(globalThis, { WebSocket });
    // PeerJS is CommonJS: its classes are named exports of a dynamic import, or on its default export
    const peerjs = (await import('peerjs')) as { Peer?: typeof Peer; default?: { Peer?: typeof Peer } };
    const NodePeer = peerjs.Peer ?? peerjs.default?.Peer;
    if (!NodePeer) throw new Error('the peerjs package has no Peer class: reinstall it (npm ci)');
    return NodePeer;
  })();
  return loaded;
}

/**
 * How this process makes PeerJS peers, once PeerJS is loaded on werift. PeerJS reads `location` for `secure` where it
 * is not given: it is, here (core/net/peer-link.ts: peerOptions).
 */
export async function nodePeers(): Promise<(id: string, options: ReturnType<typeof peerOptions>) => Peer> {
  const NodePeer = await peerClass();
  // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- a plain object, as PeerJS's docs
  return (id, options) => new NodePeer(id, options);
}
