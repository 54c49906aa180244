import { EventEmitter } from 'node:events';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { WebSocket } from 'ws';
import { findCoordinator } from '../../core/net/join-token.ts';
import { Swarm } from '../../coordinator/swarm.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';

// Revoke against the real server (issue 33, finding 6): the dashboard's PeerJS peer is a stand-in
// that registers its id on the server's signaling socket as PeerJS does (Node has no WebRTC).
vi.mock('peerjs', () => ({
  Peer: class extends EventEmitter {
    private readonly socket: WebSocket;
    destroyed = false;
    constructor(
      readonly id: string,
      readonly options: { host: string; port: number; path: string; key: string; token: string },
    ) {
      super();
      const { host, port, path, key, token } = options;
      this.socket = new WebSocket(`ws://${host}:${port}${path}/peerjs?key=${key}&id=${id}&token=${token}`);
      this.socket.once('message', () => this.emit('open')); // peer's OPEN
      this.socket.once('error', (e) => this.emit('error', e));
    }
    destroy() {
      this.destroyed = true;
      this.socket.close();
    }
  },
}));

let server: RunningServer;
beforeAll(async () => {
  server = await startServer({ port: 0, quiet: true, relay: 'off' });
});
afterAll(async () => server.close());

describe("a dashboard's Revoke", () => {
  it('moves it to a fresh id: the old link finds nothing, and the id it knew is let go; the new link finds the new id', async () => {
    const swarm = await Swarm.open(server.url);
    const [oldId, oldToken] = [swarm.id, swarm.token];
    expect(await findCoordinator(server.url, oldToken, 'ditswarm-w-someone')).toEqual({ coordinator: oldId });
    const oldPeer = (swarm as unknown as { peer: { destroyed: boolean } }).peer;

    await swarm.revokeJoinLink();
    expect(swarm.token).not.toBe(oldToken);
    expect(swarm.id).not.toBe(oldId);
    expect(swarm.id).toMatch(/^ditswarm-c-/);
    expect(oldPeer.destroyed).toBe(true); // nobody who knew the old id reaches this dashboard at it
    expect(await findCoordinator(server.url, oldToken, 'ditswarm-w-someone')).toMatchObject({
      refused: expect.stringMatching(/revoked/) as unknown,
    });
    expect(await findCoordinator(server.url, swarm.token, 'ditswarm-w-someone')).toEqual({ coordinator: swarm.id });
    swarm.close();
  });
});
