import { describe, expect, it } from 'vitest';
import type { SignalingOptions } from '../../core/net/peer-link.ts';
import { LOCAL_SIGNALING, stubSwarm } from './fixtures.ts';

// The links a dashboard hands out (issue 63): other machines get the server's https name, and where that name's
// certificate is the server's own CA's, the link names the CA, which a worker process pins.
const FINGERPRINT = 'ab'.repeat(32);
const signaling: SignalingOptions = {
  ...LOCAL_SIGNALING,
  lanOrigins: ['https://vm.local:5173', 'https://10.0.0.5:5173'],
  ca: { fingerprint: FINGERPRINT },
};
/** the links of a dashboard opened at `origin`, its server publishing `published` */
const links = (origin: string, published: SignalingOptions = signaling) => {
  const swarm = stubSwarm(origin, { token: 't', dashboardKey: 'key' }, published);
  return { joinUrl: swarm.joinUrl, lanJoinUrl: swarm.lanJoinUrl };
};

describe('the worker links a dashboard hands out', () => {
  it("at localhost: its own, and the server's first https LAN name's with the CA's fingerprint for other machines", () => {
    expect(links('http://localhost:5173')).toEqual({
      joinUrl: 'http://localhost:5173/worker.html#token=t',
      lanJoinUrl: `https://vm.local:5173/worker.html#token=t&ca=${FINGERPRINT}`,
    });
  });
  it("at one of the server's https names: that name's link, naming the CA", () => {
    expect(links('https://10.0.0.5:5173').lanJoinUrl).toBe(
      `https://10.0.0.5:5173/worker.html#token=t&ca=${FINGERPRINT}`,
    );
  });
  it('behind a proxy with a certificate of its own, or with --cert: no CA in the link, which a worker would pin wrongly', () => {
    expect(links('https://swarm.example.org').lanJoinUrl).toBe('https://swarm.example.org/worker.html#token=t');
    expect(links('http://localhost:5173', { ...signaling, ca: null }).lanJoinUrl).toBe(
      'https://vm.local:5173/worker.html#token=t',
    );
  });
});
