import { afterEach, describe, expect, it, vi } from 'vitest';
import type { DataConnectionLike, StatsReport } from '../../core/net/channel.ts';
import type { SignalingOptions } from '../../core/net/peer-link.ts';
import { linkTransport, selectedPairRelayed, turnSignaling, type IceAnswer } from '../../core/net/turn.ts';
import { LOCAL_SIGNALING } from './fixtures.ts';

// A page's side of TURN (issue 63, item 4): which path an open link took, told by its ICE stats, and
// credentials kept fresh on its peer. The stats are shaped as Chromium 156 reported them for a pair
// of RTCPeerConnections forced through coturn (iceTransportPolicy 'relay').
type Stat = { type: string; id: string } & Record<string, unknown>;
const report = (stats: Stat[]): StatsReport => ({ forEach: (cb) => stats.forEach((s) => cb(s)) });
const candidates = (local: string, remote: string): Stat[] => [
  { type: 'local-candidate', id: 'IL', candidateType: local, address: '127.0.0.1' },
  { type: 'remote-candidate', id: 'IR', candidateType: remote, address: '127.0.0.1' },
  { type: 'local-candidate', id: 'IH', candidateType: 'host', address: '127.0.0.1' },
];

describe("a link's path", () => {
  it("is TURN where the transport's selected pair has a relay candidate on either end", () => {
    const chromium = (local: string, remote: string) =>
      report([
        { type: 'transport', id: 'T01', selectedCandidatePairId: 'CP' },
        { type: 'candidate-pair', id: 'CP', localCandidateId: 'IL', remoteCandidateId: 'IR', state: 'succeeded' },
        { type: 'candidate-pair', id: 'CQ', localCandidateId: 'IH', remoteCandidateId: 'IR', state: 'failed' },
        ...candidates(local, remote),
      ]);
    expect(selectedPairRelayed(chromium('relay', 'relay'))).toBe(true);
    expect(selectedPairRelayed(chromium('host', 'relay'))).toBe(true);
    expect(selectedPairRelayed(chromium('relay', 'srflx'))).toBe(true);
    expect(selectedPairRelayed(chromium('host', 'host'))).toBe(false);
    expect(selectedPairRelayed(chromium('srflx', 'prflx'))).toBe(false);
  });

  it('is read from a pair marked selected, or nominated and succeeded, where no transport names one', () => {
    const pair = (marks: Record<string, unknown>) =>
      report([
        { type: 'candidate-pair', id: 'CP', localCandidateId: 'IL', remoteCandidateId: 'IR', ...marks },
        ...candidates('relay', 'host'),
      ]);
    expect(selectedPairRelayed(pair({ selected: true }))).toBe(true);
    expect(selectedPairRelayed(pair({ nominated: true, state: 'succeeded' }))).toBe(true);
    expect(selectedPairRelayed(pair({ nominated: true, state: 'in-progress' }))).toBe(false);
    expect(selectedPairRelayed(report(candidates('relay', 'relay')))).toBe(false);
  });

  it("is the server's relay for a relayed connection, and direct for a data channel whose stats fail or say nothing", async () => {
    const conn = (extra: Partial<DataConnectionLike>) => ({ peer: 'p', ...extra }) as DataConnectionLike;
    expect(await linkTransport(conn({ transport: 'relay' }))).toBe('relay');
    expect(await linkTransport(conn({}))).toBe('direct');
    const failing = { getStats: () => Promise.reject(new Error('closed')) };
    expect(await linkTransport(conn({ peerConnection: failing }))).toBe('direct');
    const turned = {
      getStats: () =>
        Promise.resolve(
          report([
            { type: 'candidate-pair', id: 'CP', selected: true, localCandidateId: 'IL', remoteCandidateId: 'IR' },
            ...candidates('relay', 'relay'),
          ]),
        ),
    };
    expect(await linkTransport(conn({ peerConnection: turned }))).toBe('turn');
  });
});

describe("a page's TURN credentials", () => {
  afterEach(() => {
    vi.useRealTimers();
  });
  const signaling: SignalingOptions = {
    ...LOCAL_SIGNALING,
    iceServers: [{ urls: 'stun:stun.example.org' }],
    relay: { mode: 'fallback', path: '/relay' },
    turn: true,
  };
  const answer = (n: number, expiresAt: number): IceAnswer => ({
    iceServers: [{ urls: 'turn:t:3478', username: `u${n}`, credential: `c${n}` }],
    expiresAt,
  });

  it('come after the STUN list, and are asked for again halfway to their expiry while the peer lives', async () => {
    vi.useFakeTimers({ now: 0 });
    const day = 86_400_000;
    let asked = 0;
    const ask = () => Promise.resolve(answer(++asked, Date.now() + day));
    const turn = await turnSignaling(signaling, ask);
    expect(turn.signaling.iceServers).toEqual([{ urls: 'stun:stun.example.org' }, answer(1, day).iceServers[0]]);
    const peer = {
      destroyed: false,
      options: { config: { iceServers: turn.signaling.iceServers, iceTransportPolicy: 'relay' } },
    };
    turn.keepFresh(peer);
    await vi.advanceTimersByTimeAsync(day / 2 - 1);
    expect(asked).toBe(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(asked).toBe(2);
    expect(peer.options.config).toEqual({
      iceServers: [{ urls: 'stun:stun.example.org' }, answer(2, 0).iceServers[0]],
      iceTransportPolicy: 'relay',
    });
    peer.destroyed = true;
    await vi.advanceTimersByTimeAsync(day);
    expect(asked).toBe(2);
  });

  it('are asked for again a minute after a refusal; a page the server gives none goes on with the STUN list alone', async () => {
    vi.useFakeTimers({ now: 0 });
    vi.spyOn(console, 'warn').mockImplementation(() => {});
    const replies: (IceAnswer | Error)[] = [answer(1, 120_000), new Error('HTTP 503'), answer(3, 10_000_000)];
    const ask = () => {
      const next = replies.shift() ?? new Error('no more');
      return next instanceof Error ? Promise.reject(next) : Promise.resolve(next);
    };
    const turn = await turnSignaling(signaling, ask);
    const peer = { destroyed: false, options: { config: {} as Record<string, unknown> } };
    turn.keepFresh(peer);
    await vi.advanceTimersByTimeAsync(60_000); // halfway: refused
    expect(peer.options.config.iceServers).toBeUndefined();
    await vi.advanceTimersByTimeAsync(60_000); // a minute on: given
    expect(peer.options.config.iceServers).toEqual([{ urls: 'stun:stun.example.org' }, answer(3, 0).iceServers[0]]);

    const refused = await turnSignaling(signaling, () => Promise.reject(new Error('HTTP 403')));
    expect(refused.signaling).toBe(signaling);
    const noTurn = { ...signaling, turn: false };
    expect((await turnSignaling(noTurn, ask)).signaling).toBe(noTurn);
  });
});
