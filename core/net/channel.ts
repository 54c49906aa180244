// What the links are built on, apart from any one implementation: a data channel's sending side,
// and a connection to a peer that is either a WebRTC data channel or a relayed one.

/**
 * How a link between two pages goes: a WebRTC data channel whose ICE pair is direct (host, or
 * through a NAT by STUN), one relayed by a TURN server, or through the ditswarm server's own relay.
 */
export type Transport = 'direct' | 'turn' | 'relay';

/** The part of RTCDataChannel a Link uses. */
export interface Channel {
  send(data: ArrayBuffer): void;
  readonly bufferedAmount: number;
  bufferedAmountLowThreshold: number;
  addEventListener(type: 'bufferedamountlow' | 'close', cb: () => void): void;
  removeEventListener(type: 'bufferedamountlow' | 'close', cb: () => void): void;
}

/**
 * A peer connection, typed structurally so core/ stays free of browser imports: PeerJS's
 * DataConnection and the relay's connection both fit.
 */
export interface DataConnectionLike {
  readonly peer: string;
  readonly metadata: unknown;
  readonly open: boolean;
  dataChannel: Channel;
  /** 'relay' on a connection through the server's relay; a PeerJS connection has none */
  readonly transport?: 'relay';
  /** a PeerJS connection's RTCPeerConnection: its stats say whether ICE went through TURN (core/net/turn.ts) */
  readonly peerConnection?: { getStats(): Promise<StatsReport> };
  on(event: 'open' | 'close', cb: () => void): unknown;
  on(event: 'data', cb: (data: unknown) => void): unknown;
  on(event: 'error', cb: (error: Error) => void): unknown;
  close(): void;
}

/** The part of RTCStatsReport (a browser's or werift's) that tells the ICE pair a connection took. */
export interface StatsReport {
  forEach(cb: (stat: { type: string; id: string } & Record<string, unknown>) => void): void;
}
