// An attacker page with only what the server hands to anyone: a page of the server's own origin
// (the worker page opened without a join link, which joins nothing), PeerJS (the library's
// published bundle) and /signaling.json. It
// registers a peer id of its choosing, dials whom it likes with the metadata it likes, speaks the
// wire protocol's RPC frames and records everything it is sent.
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import type { BrowserContext, Page } from '@playwright/test';
import { PROTOCOL_VERSION } from '../../../core/net/protocol.ts';

const PEERJS_BUNDLE = resolve(import.meta.dirname, '../../../node_modules/peerjs/dist/peerjs.min.js');

/** What a raw peer saw of one connection: who, with which metadata, when it opened and closed, every frame it was sent. */
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
  await page.addScriptTag({ content: await readFile(PEERJS_BUNDLE, 'utf8') });
  await page.evaluate(rawPeerScript, { id, retryMs, version: PROTOCOL_VERSION });
  return {
    page,
    id,
    connections: () => page.evaluate(() => (window as any).raw.connections.map(({ conn: _, ...seen }: any) => seen)),
    dial: (to, metadata) =>
      page.evaluate(({ to, metadata }) => (window as any).raw.dial(to, metadata), { to, metadata }),
    offerOnly: (to, metadata) =>
      page.evaluate(({ to, metadata }) => (window as any).raw.offerOnly(to, metadata), { to, metadata }),
    sendRpc: (index, bodies, from) =>
      page.evaluate(({ index, bodies, from }) => (window as any).raw.sendRpc(index, bodies, from), {
        index,
        bodies,
        from,
      }),
    destroy: () => page.evaluate(() => (window as any).raw.peer.destroy()),
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
  const { Peer } = (window as any).peerjs;
  const signaling = await (await fetch('/signaling.json')).json();
  const options = {
    host: location.hostname,
    port: Number(location.port),
    path: signaling.path,
    key: signaling.key,
    config: { iceServers: [] },
    debug: 0,
  };
  const deadline = Date.now() + retryMs;
  let peer: any;
  for (;;) {
    peer = new Peer(id, options);
    const error = await new Promise<any>((resolve) => {
      peer.once('open', () => resolve(null));
      peer.once('error', (e) => resolve(e));
    });
    if (!error) break;
    peer.destroy();
    if (error.type !== 'unavailable-id' || Date.now() > deadline)
      throw new Error(`could not register ${id}: ${error.type} ${error.message}`);
    await new Promise((r) => setTimeout(r, 300));
  }
  const connections: any[] = [];
  const latin1 = new TextDecoder('latin1');
  const track = (conn) => {
    const seen = {
      conn,
      peer: conn.peer,
      metadata: conn.metadata ?? null,
      openedAt: null as number | null,
      closedAt: null as number | null,
      received: [] as string[],
      bodies: [] as unknown[],
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
  (window as any).raw = {
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
      if (!conn.open) await new Promise((r) => conn.on('open', r));
      for (const body of bodies) conn.dataChannel.send(frameRpc(body, from));
    },
  };
}
