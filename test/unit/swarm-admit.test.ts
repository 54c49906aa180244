import { describe, expect, it } from 'vitest';
import type { DataConnectionLike } from '../../core/net/channel.ts';
import { nonce } from '../../core/net/hmac.ts';
import { workerDial } from '../../core/net/join.ts';
import { encodeFrames, frameMessage } from '../../core/net/protocol.ts';
import { MAX_JOINING, MAX_REFUSALS, REFUSAL_CLOSE_MS, Swarm } from '../../coordinator/swarm.ts';
import { SinkChannel, stubSwarm } from './fixtures.ts';

// Pages that reach the dashboard's peer id with only what anyone can get: a join handshake answered
// with a wrong proof, or a first message declaring 64 MiB before any proof (issue 17, findings 12 and 13).
const swarmWithToken = (token: string) => {
  const swarm = stubSwarm('http://localhost:1', { token, dashboardKey: 'key' });
  return {
    swarm,
    admit: (conn: DataConnectionLike) =>
      (swarm as unknown as { admit(c: DataConnectionLike): Promise<void> }).admit(conn),
  };
};

/** what a worker holding `token` dials this test's dashboard with */
const dialed = (token: string, worker: string) => workerDial(token, { coordinator: 'ditswarm-c-test', worker });

function fakeConn(peer: string, metadata: unknown) {
  const handlers: Partial<Record<string, ((x?: unknown) => void)[]>> = {};
  const conn = {
    peer,
    metadata,
    open: true,
    dataChannel: new SinkChannel(),
    closed: false,
    on(event: string, cb: (x?: unknown) => void) {
      (handlers[event] ??= []).push(cb);
    },
    close() {
      conn.closed = true;
    },
    deliver(frame: ArrayBuffer) {
      for (const cb of handlers.data ?? []) cb(frame);
    },
  };
  return conn;
}

describe("the dashboard's door", () => {
  it(`remembers the last ${MAX_REFUSALS} refused pages, and closes each`, async () => {
    const { swarm, admit } = swarmWithToken('secret');
    const conns = Array.from({ length: 150 }, (_, i) =>
      fakeConn(`ditswarm-w-${i}`, dialed('secret', `ditswarm-w-${i}`)),
    );
    // in tens (the door holds MAX_JOINING pages joining at once)
    for (let i = 0; i < conns.length; i += 10) {
      const batch = conns.slice(i, i + 10);
      const admits = batch.map((c) => admit(c as unknown as DataConnectionLike));
      await new Promise((r) => setTimeout(r, 50)); // each was challenged
      // each answers with a proof made without the token
      for (const c of batch)
        for (const frame of encodeFrames(
          { kind: 'rpc', from: 0, body: { type: 'hello', proof: '0'.repeat(64) }, tensors: [] },
          1,
        ))
          c.deliver(frame);
      await Promise.all(admits);
    }
    expect(swarm.refusals[0].reason).toBe(
      'it did not prove it holds the join token: open the join link shown on the dashboard',
    );
    expect(swarm.refusals).toHaveLength(MAX_REFUSALS);
    expect(swarm.refusals.at(-1)?.peer).toBe('ditswarm-w-149');
    expect(conns.some((c) => c.closed)).toBe(false); // each link stays open while its refusal reaches the page
    await new Promise((r) => setTimeout(r, REFUSAL_CLOSE_MS + 100));
    expect(conns.every((c) => c.closed)).toBe(true);
    swarm.close();
  });

  it(`holds at most ${MAX_JOINING} pages joining at once: more are closed at once, unchallenged (issue 17, #12)`, async () => {
    const { swarm, admit } = swarmWithToken('secret');
    const conns = Array.from({ length: MAX_JOINING + 4 }, (_, i) =>
      fakeConn(`ditswarm-w-${i}`, dialed('secret', `ditswarm-w-${i}`)),
    );
    const admits = conns.map((c) => admit(c as unknown as DataConnectionLike));
    await new Promise((r) => setTimeout(r, 50));
    expect(conns.map((c) => c.closed)).toEqual(conns.map((_, i) => i >= MAX_JOINING));
    for (const c of conns)
      for (const frame of encodeFrames(
        { kind: 'rpc', from: 0, body: { type: 'hello', proof: '0'.repeat(64) }, tensors: [] },
        1,
      ))
        c.deliver(frame);
    await Promise.all(admits);
    expect(swarm.refusals).toHaveLength(MAX_JOINING);
    swarm.close();
  });

  it('a page of a banned browser, under a new peer id, is told it was banned and why before any proof: not left to time out in the handshake (issue 33)', async () => {
    const { swarm, admit } = swarmWithToken('secret');
    const liar = { id: 'ditswarm-w-liar', info: { browser: 'ab12' } } as unknown as Parameters<Swarm['evict']>[0];
    swarm.evict(
      { ...liar, api: {}, link: { close() {} } } as unknown as Parameters<Swarm['evict']>[0],
      'its recomputation was wrong',
      { ban: true },
    );
    const conn = fakeConn('ditswarm-w-new-id', { ...dialed('secret', 'ditswarm-w-new-id'), browser: 'ab12' });
    await admit(conn as unknown as DataConnectionLike);
    const reason = 'it was banned from this swarm for lying (its recomputation was wrong)';
    expect(swarm.refusals).toEqual([{ peer: 'ditswarm-w-new-id', reason, at: expect.any(Number) as number }]);
    const sent = Buffer.concat(conn.dataChannel.sent.map((f) => Buffer.from(f))).toString('latin1');
    expect(sent).toContain(JSON.stringify({ type: 'refused', reason }));
    expect(sent).not.toContain('"challenge"');
    swarm.close();
  });

  it('reserves nothing for a large message before the page has described itself: six first chunks declaring 64 MiB each hold no memory', async () => {
    const { swarm, admit } = swarmWithToken('secret');
    const conn = fakeConn('ditswarm-w-x', dialed('secret', 'ditswarm-w-x'));
    const joining = admit(conn as unknown as DataConnectionLike); // waits for its proof, which never comes
    await new Promise((r) => setImmediate(r));
    const first = new Uint8Array(
      frameMessage({ kind: 'rpc', from: 0, body: 'x', tensors: [new Float32Array((16 << 20) - 4096)] }, 1).frame(0),
    ).slice(); // just under the links' 64 MiB cap
    const before = process.memoryUsage().arrayBuffers;
    for (let id = 1; id <= 6; id++) {
      const frame = first.slice();
      new DataView(frame.buffer).setUint32(8, id, true); // msgId
      conn.deliver(frame.buffer);
    }
    const grown = process.memoryUsage().arrayBuffers - before;
    expect(grown).toBeLessThan(8 << 20); // not 6 × 64 MiB
    conn.close();
    swarm.close();
    void joining.catch(() => {});
  });
  it('gives no joining place to a dial that does not prove the token: a flood of them keeps no worker holding the link out (issue 33, finding 6)', async () => {
    const { swarm, admit } = swarmWithToken('secret');
    const flood = [
      ...Array.from({ length: 2 * MAX_JOINING }, (): unknown => ({ role: 'worker', nonce: nonce() })),
      ...Array.from({ length: 2 * MAX_JOINING }, (_, i) => dialed('the old link', `ditswarm-w-flood-${i}`)),
      ...Array.from({ length: 2 * MAX_JOINING }, () => dialed('secret', 'ditswarm-w-someone-else')),
    ].map((metadata, i) => fakeConn(`ditswarm-w-flood-${i}`, metadata));
    const floods = flood.map((c) => admit(c as unknown as DataConnectionLike));
    await new Promise((r) => setTimeout(r, 50));
    expect(flood.every((c) => c.closed)).toBe(true); // closed at once, unchallenged
    const honest = Array.from({ length: MAX_JOINING }, (_, i) =>
      fakeConn(`ditswarm-w-honest-${i}`, dialed('secret', `ditswarm-w-honest-${i}`)),
    );
    const joins = honest.map((c) => admit(c as unknown as DataConnectionLike));
    await new Promise((r) => setTimeout(r, 50));
    expect(honest.some((c) => c.closed)).toBe(false); // each holds a place, challenged
    for (const c of honest)
      for (const frame of encodeFrames(
        { kind: 'rpc', from: 0, body: { type: 'hello', proof: '0'.repeat(64) }, tensors: [] },
        1,
      ))
        c.deliver(frame);
    await Promise.all([...floods, ...joins]);
    swarm.close();
  });
});
