import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import {
  MAX_SIGNALING_CLIENTS,
  MAX_SIGNALING_CLIENTS_PER_ADDRESS,
  MAX_SIGNALING_CLIENTS_PER_PREFIX,
} from '../../server/peer-signaling.ts';
import { clientSource } from '../../server/rate-limit.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';

// One machine against the signaling server's concurrent-user limit (issue 33, finding 6): its
// loopback addresses and its IPv6 addresses are many, but count as one machine and one network.
describe('where a client connects from, as the limits count it', () => {
  it('is one address for all of loopback, IPv4-mapped or not; an IPv4 /24 or an IPv6 /64 is one network', () => {
    for (const loopback of ['127.0.0.1', '127.9.8.7', '::ffff:127.0.0.2', '::1', '0:0:0:0:0:0:0:1'])
      expect(clientSource(loopback)).toEqual({ address: 'loopback', prefix: 'loopback' });
    expect(clientSource('::ffff:10.1.2.3')).toEqual({ address: '10.1.2.3', prefix: '10.1.2.0/24' });
    expect(clientSource('10.1.2.200').prefix).toBe(clientSource('10.1.2.3').prefix);
    expect(clientSource('10.1.3.3').prefix).not.toBe(clientSource('10.1.2.3').prefix);
    const a = clientSource('2001:db8:1:2::1');
    const b = clientSource('2001:db8:1:2:aaaa:bbbb:cccc:dddd');
    expect(a.prefix).toBe('2001:db8:1:2::/64');
    expect(b.prefix).toBe(a.prefix);
    expect(b.address).not.toBe(a.address);
    expect(clientSource('2001:db8:1:3::1').prefix).not.toBe(a.prefix);
    expect(clientSource('fe80::1%eth0').prefix).toBe('fe80:0:0:0::/64');
    expect(clientSource('::ffff:0a01:0203')).toEqual(clientSource('::ffff:10.1.2.3'));
  });

  it('leaves room for other machines: no network takes more than a quarter of the limit', () => {
    expect(MAX_SIGNALING_CLIENTS_PER_PREFIX).toBeLessThanOrEqual(MAX_SIGNALING_CLIENTS / 4);
    expect(MAX_SIGNALING_CLIENTS_PER_ADDRESS).toBeLessThanOrEqual(MAX_SIGNALING_CLIENTS_PER_PREFIX);
  });
});

describe('the signaling server, against one machine with many loopback addresses', () => {
  let server: RunningServer;
  let signaling: { path: string; key: string };
  beforeAll(async () => {
    server = await startServer({ port: 0, quiet: true });
    signaling = (await (await fetch(`${server.url}/signaling.json`)).json()) as typeof signaling;
  });
  afterAll(async () => server.close());

  const socket = (id: string, localAddress: string) =>
    new Promise<WebSocket>((resolve, reject) => {
      const ws = new WebSocket(
        `ws://127.0.0.1:${server.port}${signaling.path}/peerjs?key=${signaling.key}&id=${id}&token=t${id}`,
        { localAddress },
      );
      ws.once('message', () => resolve(ws)); // peer's OPEN
      ws.once('error', reject);
    });

  it(`takes ${MAX_SIGNALING_CLIENTS_PER_ADDRESS} pages from it in all, whichever 127.x address each comes from`, async () => {
    const held = await Promise.all(
      Array.from({ length: MAX_SIGNALING_CLIENTS_PER_ADDRESS }, (_, i) =>
        socket(`loop-${i}`, `127.0.0.${2 + (i % 8)}`),
      ),
    );
    await expect(socket('from-another-loopback', '127.0.1.77')).rejects.toThrow(/429/);
    held[0].close();
    await expect
      .poll(() =>
        socket('after-one-left', '127.0.1.78').then(
          (ws) => (held.push(ws), true),
          () => false,
        ),
      )
      .toBe(true);
    for (const ws of held) ws.close();
  });
});
