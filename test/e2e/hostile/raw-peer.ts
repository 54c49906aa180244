// An attacker page with only what the server hands to anyone: a page of the server's own origin
// (the worker page opened without a join link, which joins nothing), PeerJS (the library's
// published bundle) and /signaling.json. It
// registers a peer id of its choosing, dials whom it likes with the metadata it likes, speaks the
// wire protocol's RPC frames and records everything it is sent.
import type { BrowserContext, Page } from '@playwright/test';
import type { DataConnection, Peer } from 'peerjs';
import { PROTOCOL_VERSION } from '../../../core/net/protocol.ts';
import { addPeerJs } from '../peerjs-bundle.ts';

/**
 * What a raw peer saw of one connection: who, with which metadata, when it opened and closed,
 * every frame it was sent.
 */
export interface RawConnection {
  peer: string;
  metadata: unknown;
  openedAt: number | null;
  closedAt: number | null;
  /** every binary message, as latin1 text (so a test can search it for a secret) */
  received: string[];
  /** the JSON bodies of the single-frame RPC messages among them */
  bodies: unknown[];
}

export interface RawPeer {
  page: Page;
  id: string;
  /** connections dialed to it (listen) and by it (dial), in order */
  connections(): Promise<RawConnection[]>;
  /** dials `to` with `metadata`; the index of the connection in connections() */
  dial(to: string, metadata: unknown): Promise<number>;
  /**
   * Sends `to` an offer of a data channel with `metadata` and nothing after it: no ICE candidate,
   * no answer taken. Its channel never opens; the other side holds a peer connection for it until it gives up.
   */
  offerOnly(to: string, metadata: unknown): Promise<void>;
  /** sends each body as a single-frame RPC message `from` this side on connection `index`, when it is open */
  sendRpc(index: number, bodies: unknown[], from: number): Promise<void>;
  destroy(): Promise<void>;
}

/**
 * Opens the attacker page and registers `id` (a fresh one by default) on the signaling server; an
 * id the server still holds for a moment is tried again for up to `retryMs`.
 */
export async function openRawPeer(
  context: BrowserContext,
  baseURL: string,
  id = `attacker-${Date.now().toString(36)}`,
  retryMs = 10_000,
): Promise<RawPeer> {
  const page = await context.newPage();
  await page.goto(`${baseURL}/worker.html`); // without a token it asks for a link and joins nothing
  await addPeerJs(page);
  await page.evaluate(rawPeerScript, { id, retryMs, version: PROTOCOL_VERSION });
  return {
    page,
    id,
    connections: () =>
      page.evaluate(() =>
        window.raw.connections.map(({ peer, metadata, openedAt, closedAt, received, bodies }) => ({
          peer,
          metadata,
          openedAt,
          closedAt,
          received,
          bodies,
        })),
      ),
    dial: (to, metadata) => page.evaluate(({ to, metadata }) => window.raw.dial(to, metadata), { to, metadata }),
    offerOnly: (to, metadata) =>
      page.evaluate(({ to, metadata }) => window.raw.offerOnly(to, metadata), { to, metadata }),
    sendRpc: (index, bodies, from) =>
      page.evaluate(({ index, bodies, from }) => window.raw.sendRpc(index, bodies, from), { index, bodies, from }),
    destroy: () => page.evaluate(() => window.raw.peer.destroy()),
  };
}

/** Runs in the attacker page, with PeerJS loaded. */
async function rawPeerScript({
  id,
  retryMs,
  version,
}: {
  id: string;
  retryMs: number;
  version: number;
}): Promise<void> {
  const { Peer } = window.peerjs;
  const signaling = (await (await fetch('/signaling.json')).json()) as { path: string; key: string };
  const options = {
    host: location.hostname,
    port: Number(location.port),
    path: signaling.path,
    key: signaling.key,
    config: { iceServers: [] },
    debug: 0,
  };
  const deadline = Date.now() + retryMs;
  let peer: Peer;
  for (;;) {
    // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- a bag, not a class
    const dialing = new Peer(id, options);
    peer = dialing;
    const error = await new Promise<{ type: string; message: string } | null>((resolve) => {
      dialing.once('open', () => resolve(null));
      dialing.once('error', (e) => resolve(e));
    });
    if (!error) break;
    peer.destroy();
    if (error.type !== 'unavailable-id' || Date.now() > deadline)
      throw new Error(`could not register ${id}: ${error.type} ${error.message}`);
    await new Promise((r) => setTimeout(r, 300));
  }
  const connections: RawPageConnection[] = [];
  const latin1 = new TextDecoder('latin1');
  const track = (conn: DataConnection) => {
    const seen: RawPageConnection = {
      conn,
      peer: conn.peer,
      metadata: (conn.metadata as unknown) ?? null,
      openedAt: null,
      closedAt: null,
      received: [],
      bodies: [],
    };
    connections.push(seen);
    conn.on('open', () => (seen.openedAt = Date.now()));
    conn.on('close', () => (seen.closedAt ??= Date.now()));
    conn.on('error', () => (seen.closedAt ??= Date.now()));
    conn.on('data', (data: unknown) => {
      if (!(data instanceof ArrayBuffer)) return;
      const bytes = new Uint8Array(data);
      seen.received.push(latin1.decode(bytes));
      const v = new DataView(data);
      // a single-frame RPC message: its JSON body
      if (bytes.length >= 68 && v.getUint16(0, true) === 0x5744 && bytes[3] === 1 && v.getUint32(16, true) === 1) {
        const jsonBytes = v.getUint32(60, true);
        const start = 60 + 8 + 4 * v.getUint32(64, true);
        try {
          seen.bodies.push(JSON.parse(new TextDecoder().decode(bytes.subarray(start, start + jsonBytes))));
        } catch {
          seen.bodies.push('unparsable');
        }
      }
    });
    return connections.length - 1;
  };
  peer.on('connection', track);
  let msgId = 0;
  const frameRpc = (body: unknown, from: number): ArrayBuffer => {
    const json = new TextEncoder().encode(JSON.stringify(body));
    const pad = (4 - ((8 + json.byteLength) % 4)) % 4;
    const total = 8 + json.byteLength + pad;
    const out = new Uint8Array(60 + total);
    const v = new DataView(out.buffer);
    v.setUint16(0, 0x5744, true);
    v.setUint8(2, version);
    v.setUint8(3, 1);
    v.setUint8(5, from);
    v.setUint32(8, msgId++, true);
    v.setUint32(16, 1, true);
    v.setUint32(20, 64 * 1024 - 60, true);
    v.setUint32(24, total, true);
    v.setUint32(60, json.byteLength, true);
    out.set(json, 68);
    return out.buffer;
  };
  window.raw = {
    peer,
    connections,
    dial: (to: string, metadata: unknown) =>
      track(peer.connect(to, { serialization: 'raw', reliable: true, metadata })),
    async offerOnly(to: string, metadata: unknown) {
      const pc = new RTCPeerConnection();
      pc.createDataChannel('offer-only');
      const offer = await pc.createOffer();
      pc.close(); // what it offered will never answer a connectivity check
      const connectionId = `dc_${Math.random().toString(36).slice(2)}`;
      peer.socket.send({
        type: 'OFFER',
        payload: {
          sdp: offer,
          type: 'data',
          connectionId,
          label: connectionId,
          reliable: true,
          serialization: 'raw',
          metadata,
        },
        dst: to,
      });
    },
    async sendRpc(index: number, bodies: unknown[], from: number) {
      const { conn } = connections[index];
      if (!conn.open) await new Promise<void>((r) => conn.on('open', () => r()));
      for (const body of bodies) conn.dataChannel.send(frameRpc(body, from));
    },
  };
}

/** A connection of the attacker page, as it keeps it. */
interface RawPageConnection extends RawConnection {
  conn: DataConnection;
}

declare global {
  interface Window {
    /** the attacker page's side of RawPeer, once rawPeerScript ran */
    raw: {
      peer: Peer;
      connections: RawPageConnection[];
      dial(to: string, metadata: unknown): number;
      offerOnly(to: string, metadata: unknown): Promise<void>;
      sendRpc(index: number, bodies: unknown[], from: number): Promise<void>;
    };
  }
}
