import { afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { WorkerError } from '../../coordinator/executor.ts';
import { defined } from '../../core/defined.ts';
import { passing } from '../../core/net/check.ts';
import { checkPulse } from '../../core/worker-api.ts';
import type { Channel } from '../../core/net/channel.ts';
import {
  announceStop,
  answerHeartbeats,
  askWhileSilent,
  COORDINATOR_SILENT_MS,
  DEAD_AFTER_MS,
  HEARTBEAT_INTERVAL_MS,
  LOADING_DEAD_AFTER_MS,
  MAX_SILENT_MS,
  SILENCE_MARGIN,
  Silences,
  watchHeartbeats,
  type Death,
} from '../../core/net/heartbeat.ts';
import { MAX_STRETCHES } from '../../coordinator/call-watch.ts';
import { RPC_TIMEOUT_MS as STALL_FLOOR_MS, STALL_STEP_MULTIPLE, timeoutsOf } from '../../coordinator/planner.ts';
import { TimeoutError } from '../../coordinator/executor.ts';
import { Link } from '../../core/net/link.ts';
import { COORDINATOR, encodeFrames, HEADER_BYTES, type FrameHeader, type Message } from '../../core/net/protocol.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { RankLayout } from '../../core/parallel.ts';
import { referenceStages } from '../../rank/stages.ts';
import { SinkChannel, stubEngine, tinyModelFiles } from './fixtures.ts';
import { InProcessExecutor, type Transport } from './in-process-executor.ts';

// How the coordinator tells a live worker from a lost one, on vitest's fake clock: a frozen peer
// and a peer that sends only garbage die on the same beat, one that answers heartbeats (or streams
// a long reply) lives; a busy machine's late answers stretch the silence a worker is allowed, a
// gone link or a frozen page does not wait for it; a collective call fails on the first rank that
// errs, not at the timeout, and on a rank whose engine stopped moving, never on one that moves.

const START = Date.UTC(2026, 0, 1);
/** The first beat that finds the peer silent for more than DEAD_AFTER_MS. */
const DEAD_ON_BEAT = DEAD_AFTER_MS + HEARTBEAT_INTERVAL_MS;

/** The coordinator's own rule for what a worker may send it (coordinator/swarm.ts). */
const coordinatorAccept = (h: FrameHeader) =>
  h.kind !== 'rpc' ? 'a worker may only send RPC messages to the coordinator' : null;

function watched(link: Link, silences?: Silences, present?: () => Promise<boolean>) {
  const deaths: number[] = [];
  const causes: Death[] = [];
  const pulses: unknown[] = [];
  watchHeartbeats(
    link,
    COORDINATOR,
    {
      onDead: (death) => {
        deaths.push(death.silentMs);
        causes.push(death);
      },
      onPulse: (p) => pulses.push(p),
      present,
    },
    { silences },
  );
  return { deaths, causes, pulses };
}

/** Two links whose channels deliver each frame at once: an echo arrives on its beat's own millisecond. */
function wiredPair(): [Link, Link] {
  const channel = (deliver: (frame: ArrayBuffer) => void): Channel => ({
    bufferedAmount: 0,
    bufferedAmountLowThreshold: 0,
    send: (frame) => deliver(frame),
    addEventListener() {},
    removeEventListener() {},
  });
  const a: Link = new Link(channel((f) => b.receive(f)));
  const b: Link = new Link(channel((f) => a.receive(f)));
  return [a, b];
}

const echo = (from: number): Extract<Message, { kind: 'rpc' }> => ({
  kind: 'rpc',
  from,
  body: { type: 'heartbeat-echo', pulse: { state: 'ready', framesDropped: 0 } },
  tensors: [],
});

describe('heartbeats', () => {
  beforeEach(() => {
    vi.useFakeTimers();
    vi.setSystemTime(START);
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('a frozen peer is declared dead once, on the first beat after DEAD_AFTER_MS of silence (3.5 s), not at 3 s nor at 3.499 s; then the beats stop', async () => {
    const channel = new SinkChannel();
    const link = new Link(channel, { accept: coordinatorAccept });
    const { deaths } = watched(link);

    await vi.advanceTimersByTimeAsync(DEAD_AFTER_MS);
    expect(deaths).toEqual([]); // silent for exactly 3000 ms: not yet
    expect(channel.sent).toHaveLength(DEAD_AFTER_MS / HEARTBEAT_INTERVAL_MS); // 6 beats, one per 500 ms
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS - 1);
    expect(deaths).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(deaths).toEqual([DEAD_ON_BEAT]);

    await vi.advanceTimersByTimeAsync(10 * DEAD_AFTER_MS);
    expect(deaths).toEqual([DEAD_ON_BEAT]); // onDead once
    expect(channel.sent).toHaveLength(6); // no beat on the tick that found it dead, nor after
    expect(vi.getTimerCount()).toBe(0);
  });

  it('a peer whose last answer said it is loading a model may be silent for up to a minute, not 3 s; its closed link still counts at once', async () => {
    const [coordinator, worker] = wiredPair();
    const { deaths } = watched(coordinator);
    await worker.send({
      kind: 'rpc',
      from: 0,
      body: { type: 'heartbeat-echo', pulse: { state: 'loading', framesDropped: 0 } },
      tensors: [],
    });
    await vi.advanceTimersByTimeAsync(LOADING_DEAD_AFTER_MS);
    expect(deaths).toEqual([]);
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect(deaths).toEqual([LOADING_DEAD_AFTER_MS + HEARTBEAT_INTERVAL_MS]);

    const [coordinator2, worker2] = wiredPair();
    const second = watched(coordinator2);
    await worker2.send({
      kind: 'rpc',
      from: 0,
      body: { type: 'heartbeat-echo', pulse: { state: 'loading', framesDropped: 0 } },
      tensors: [],
    });
    coordinator2.close('its tab closed');
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect(second.deaths).toEqual([HEARTBEAT_INTERVAL_MS]);
  });

  it('beats queued behind a long message to the peer do not count its silence; once they reach it, a peer that does not answer dies as usual', async () => {
    // a data channel that takes what is sent into its buffer and drains only when told to
    const listeners: { low?: () => void } = {};
    const channel: { -readonly [K in keyof Channel]: Channel[K] } & { sent: number } = {
      bufferedAmount: 0,
      bufferedAmountLowThreshold: 0,
      sent: 0,
      send(frame: ArrayBuffer) {
        this.sent++;
        this.bufferedAmount += frame.byteLength;
      },
      addEventListener: (type: string, cb: () => void) => {
        if (type === 'bufferedamountlow') listeners.low = cb;
      },
      removeEventListener() {},
    };
    const link = new Link(channel, { accept: coordinatorAccept });
    const { deaths } = watched(link);
    const delivery = { sent: false };
    void link
      .send({
        kind: 'tensor',
        from: COORDINATOR,
        tag: { job: 0, step: 0, pass: 0, block: 0, phase: 0, group: 0 },
        dtype: 'f32',
        shape: [2 << 20],
        data: new Uint8Array(8 << 20),
      })
      .then(() => (delivery.sent = true));
    await vi.advanceTimersByTimeAsync(10_000); // the channel is stuck: 8 MB and every beat wait
    expect(deaths).toEqual([]);
    while (!delivery.sent) {
      channel.bufferedAmount = 0;
      defined(listeners.low, "the channel's drain listener")();
      await vi.advanceTimersByTimeAsync(0);
    }
    channel.bufferedAmount = 0;
    defined(listeners.low, "the channel's drain listener")();
    await vi.advanceTimersByTimeAsync(DEAD_AFTER_MS);
    expect(deaths).toEqual([]);
    await vi.advanceTimersByTimeAsync(2 * HEARTBEAT_INTERVAL_MS);
    expect(deaths).toHaveLength(1);
  });

  it("time the coordinator's own page was not running does not count as a peer's silence", async () => {
    const link = new Link(new SinkChannel(), { accept: coordinatorAccept });
    const { deaths } = watched(link);
    await vi.advanceTimersByTimeAsync(2 * HEARTBEAT_INTERVAL_MS);
    vi.setSystemTime(Date.now() + 10_000); // ten seconds pass without a tick: this page was starved
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect(deaths).toEqual([]);
    // from then on the peer's silence counts again, and it is dead on the usual beat
    await vi.advanceTimersByTimeAsync(DEAD_AFTER_MS);
    expect(deaths).toEqual([]);
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect(deaths).toEqual([DEAD_ON_BEAT]);
  });

  it(`a worker whose answers came 2 s apart on a busy machine lives through 3.6 s of silence: its limit is ${SILENCE_MARGIN} × 2 s; past that it dies`, async () => {
    const link = new Link(new SinkChannel(), { accept: coordinatorAccept });
    const { deaths, causes } = watched(link);
    let id = 0;
    const hearAt = async (ms: number) => {
      await vi.advanceTimersByTimeAsync(START + ms - Date.now());
      for (const f of encodeFrames(echo(0), id++)) link.receive(f);
    };
    await hearAt(500);
    await hearAt(1_000);
    await hearAt(3_000); // 2 s late: its page was starved
    await vi.advanceTimersByTimeAsync(3_600);
    expect(deaths).toEqual([]); // the silence that let an honest tab go
    const limitMs = SILENCE_MARGIN * 2_000;
    await vi.advanceTimersByTimeAsync(START + 3_000 + limitMs - Date.now());
    expect(deaths).toEqual([]);
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect(deaths).toEqual([limitMs + HEARTBEAT_INTERVAL_MS]);
    expect(causes[0]).toMatchObject({ cause: 'silent', limitMs });
  });

  it(`a worker silent past its limit whose page the server still holds is starved or hung, not gone: it dies at ${MAX_SILENT_MS / 1000} s; where the server let its page go, or cannot say, it dies once the server has answered`, async () => {
    const asked: string[] = [];
    /** the server's answer after `ms`, as the swarm's question to it would take */
    const server =
      (answer: boolean | Error, ms = 200) =>
      () => {
        asked.push(String(answer));
        return new Promise<boolean>((resolve, reject) =>
          setTimeout(() => (answer instanceof Error ? reject(answer) : resolve(answer)), ms),
        );
      };
    const held = watched(new Link(new SinkChannel(), { accept: coordinatorAccept }), undefined, server(true));
    await vi.advanceTimersByTimeAsync(MAX_SILENT_MS);
    expect(held.deaths).toEqual([]);
    expect(asked).toEqual(['true']); // once a silence
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect(held.causes).toEqual([
      { cause: 'silent', silentMs: MAX_SILENT_MS + HEARTBEAT_INTERVAL_MS, limitMs: MAX_SILENT_MS },
    ]);

    for (const answer of [false, new Error('the server at http://x would not answer')]) {
      const gone = watched(new Link(new SinkChannel(), { accept: coordinatorAccept }), undefined, server(answer));
      await vi.advanceTimersByTimeAsync(DEAD_ON_BEAT);
      expect(gone.deaths, 'asked on the beat past the limit, not yet answered').toEqual([]);
      await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
      expect(gone.causes).toEqual([
        { cause: 'silent', silentMs: DEAD_ON_BEAT + HEARTBEAT_INTERVAL_MS, limitMs: DEAD_AFTER_MS },
      ]);
    }
  });

  it(`a server that never answers whether the page is there keeps a silent worker alive only until ${MAX_SILENT_MS / 1000} s`, async () => {
    let asked = 0;
    const { causes } = watched(new Link(new SinkChannel(), { accept: coordinatorAccept }), undefined, () => {
      asked++;
      return new Promise<boolean>(() => {});
    });
    await vi.advanceTimersByTimeAsync(MAX_SILENT_MS);
    expect([asked, causes]).toEqual([1, []]);
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect(causes).toEqual([
      { cause: 'silent', silentMs: MAX_SILENT_MS + HEARTBEAT_INTERVAL_MS, limitMs: MAX_SILENT_MS },
    ]);
  });

  it(`a page the server let go is gone though its last answer said it was loading, or every worker is late together: it dies once the server has answered, not at ${LOADING_DEAD_AFTER_MS / 1000} s or ${MAX_SILENT_MS / 1000} s; where the server holds it or cannot say, it has those`, async () => {
    const server = (answer: boolean | Error) => () =>
      new Promise<boolean>((resolve, reject) =>
        setTimeout(() => (answer instanceof Error ? reject(answer) : resolve(answer)), 200),
      );
    const loadingWorker = async (answer: boolean | Error) => {
      const [coordinator, worker] = wiredPair();
      const watch = watched(coordinator, undefined, server(answer));
      await worker.send({
        kind: 'rpc',
        from: 0,
        body: { type: 'heartbeat-echo', pulse: { state: 'loading', framesDropped: 0 } },
        tensors: [],
      });
      return watch;
    };
    const crashed = await loadingWorker(false);
    const [held, unknown] = [await loadingWorker(true), await loadingWorker(new Error('the server would not answer'))];
    await vi.advanceTimersByTimeAsync(DEAD_ON_BEAT + HEARTBEAT_INTERVAL_MS);
    expect(crashed.causes).toEqual([
      { cause: 'silent', silentMs: DEAD_ON_BEAT + HEARTBEAT_INTERVAL_MS, limitMs: DEAD_AFTER_MS },
    ]);
    await vi.advanceTimersByTimeAsync(LOADING_DEAD_AFTER_MS - DEAD_ON_BEAT - HEARTBEAT_INTERVAL_MS);
    expect([held.deaths, unknown.deaths]).toEqual([[], []]);
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect([held.deaths, unknown.deaths]).toEqual([
      [LOADING_DEAD_AFTER_MS + HEARTBEAT_INTERVAL_MS],
      [LOADING_DEAD_AFTER_MS + HEARTBEAT_INTERVAL_MS],
    ]);

    const loaded = new Silences();
    const [gone, starved] = [false, true].map((answer) =>
      watched(new Link(new SinkChannel(), { accept: coordinatorAccept }), loaded, server(answer)),
    );
    await vi.advanceTimersByTimeAsync(DEAD_ON_BEAT + HEARTBEAT_INTERVAL_MS);
    expect([gone.deaths, starved.deaths]).toEqual([[DEAD_ON_BEAT + HEARTBEAT_INTERVAL_MS], []]);
    await vi.advanceTimersByTimeAsync(MAX_SILENT_MS - DEAD_ON_BEAT);
    expect(starved.causes).toEqual([
      { cause: 'silent', silentMs: MAX_SILENT_MS + HEARTBEAT_INTERVAL_MS, limitMs: MAX_SILENT_MS },
    ]);
  });

  it('what the server said holds for one silence: a worker heard again is judged afresh, and asked about again', async () => {
    let present = true;
    const asked: boolean[] = [];
    const link = new Link(new SinkChannel(), { accept: coordinatorAccept });
    const { causes } = watched(link, undefined, () => {
      asked.push(present);
      return Promise.resolve(present);
    });
    await vi.advanceTimersByTimeAsync(5_000); // past its limit at 3.5 s: the server holds its page
    for (const f of encodeFrames(echo(0), 0)) link.receive(f);
    present = false;
    // its ended silence of 5 s is the swarm's load now: its limit is 3 × that, and past it the server is asked again
    const limitMs = SILENCE_MARGIN * 5_000;
    await vi.advanceTimersByTimeAsync(limitMs + HEARTBEAT_INTERVAL_MS);
    expect([asked, causes]).toEqual([[true, false], []]);
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect(causes).toEqual([{ cause: 'silent', silentMs: limitMs + 2 * HEARTBEAT_INTERVAL_MS, limitMs }]);
  });

  it(`every worker of a swarm silent together is load, not failure: none dies at ${DEAD_AFTER_MS / 1000} s, each past ${MAX_SILENT_MS / 1000} s; where one still answers, the silent ones die as usual`, async () => {
    const loaded = new Silences();
    const [a, b] = [0, 1].map(() => watched(new Link(new SinkChannel(), { accept: coordinatorAccept }), loaded));
    await vi.advanceTimersByTimeAsync(MAX_SILENT_MS);
    expect([a.deaths, b.deaths]).toEqual([[], []]);
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect([a.deaths, b.deaths]).toEqual([
      [MAX_SILENT_MS + HEARTBEAT_INTERVAL_MS],
      [MAX_SILENT_MS + HEARTBEAT_INTERVAL_MS],
    ]);

    const swarm = new Silences();
    const [coordinator, worker] = wiredPair();
    answerHeartbeats(worker, 0, () => ({ state: 'ready', framesDropped: 0 }));
    const answering = watched(coordinator, swarm);
    const [c, d] = [0, 1].map(() => watched(new Link(new SinkChannel(), { accept: coordinatorAccept }), swarm));
    await vi.advanceTimersByTimeAsync(DEAD_ON_BEAT);
    expect([c.deaths, d.deaths]).toEqual([[DEAD_ON_BEAT], [DEAD_ON_BEAT]]);
    expect(answering.deaths).toEqual([]);
  });

  it('a gone link, or a page that says its browser froze it, is dead on the next beat, though every worker is late together', async () => {
    const loaded = new Silences();
    const [coordinator, worker] = wiredPair();
    const frozen = watched(coordinator, loaded);
    const closing = watched(new Link(new SinkChannel(), { accept: coordinatorAccept }), loaded);
    const closedLink = new Link(new SinkChannel(), { accept: coordinatorAccept });
    const closed = watched(closedLink, loaded);
    await vi.advanceTimersByTimeAsync(10_000); // all three silent: the limit is stretched
    expect([frozen.deaths, closing.deaths, closed.deaths]).toEqual([[], [], []]);
    announceStop(worker, 0);
    closedLink.close('its tab closed');
    await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
    expect(frozen.causes).toMatchObject([{ cause: 'frozen' }]);
    expect(closed.causes).toMatchObject([{ cause: 'closed' }]);
    expect(closing.deaths).toEqual([]);
  });

  // Each kind of frame a peer may send that the link drops; none may keep the peer alive.
  const garbage: [string, (msgId: number) => ArrayBuffer][] = [
    ['shorter than a header', () => new ArrayBuffer(7)],
    ['bad magic', (id) => corrupt(encodeFrames(echo(0), id)[0], 0, 0x00)],
    ['another protocol version', (id) => corrupt(encodeFrames(echo(0), id)[0], 2, 9)],
    [
      'refused by accept (a tensor)',
      (id) =>
        encodeFrames(
          {
            kind: 'tensor',
            from: 0,
            tag: { job: 1, step: 0, pass: 0, block: 0, phase: 0, group: 0 },
            dtype: 'f32',
            shape: [4],
            data: new Uint8Array(16),
          },
          id,
        )[0],
    ],
    ['a replay of a delivered message', () => encodeFrames(echo(0), 0)[0]],
    [
      'a duplicate chunk of an open message',
      () => encodeFrames({ ...echo(0), tensors: [new Float32Array(64)] }, 1, 200)[0],
    ],
    [
      'an RPC message whose body is not UTF-8 JSON',
      (id) => corrupt(encodeFrames(echo(0), id)[0], HEADER_BYTES + 8, 0xff),
    ],
  ];

  it.each(garbage)(
    'a peer that sends only garbage (%s) is as dead as a silent one: every frame dropped, none refreshes lastHeardAt',
    async (_kind, frame) => {
      const link = new Link(new SinkChannel(), { accept: coordinatorAccept });
      // at START: one whole message (msgId 0) and the first chunk of an unfinished one (msgId 1), both signs of life
      for (const f of encodeFrames(echo(0), 0)) link.receive(f);
      link.receive(encodeFrames({ ...echo(0), tensors: [new Float32Array(64)] }, 1, 200)[0]);
      expect(link.stats).toMatchObject({ messagesReceived: 1, framesDropped: 0 });
      const { deaths } = watched(link);

      let sent = 0;
      const feed = async (ms: number) => {
        for (let t = 0; t < ms; t += 100) {
          await vi.advanceTimersByTimeAsync(100);
          link.receive(frame(1000 + sent++));
        }
      };
      await feed(DEAD_AFTER_MS); // a garbage frame every 100 ms, the last at 3000
      expect(deaths).toEqual([]);
      await vi.advanceTimersByTimeAsync(HEARTBEAT_INTERVAL_MS);
      expect(deaths).toEqual([DEAD_ON_BEAT]);
      expect(sent).toBe(30);
      expect(link.stats).toMatchObject({ messagesReceived: 1, framesDropped: 30 });
      expect(link.lastHeardAt).toBe(START);
    },
  );

  it('valid heartbeat echoes keep a worker alive for 30 s (60 pulses); frozen after that, it dies 3.5 s after its last echo', async () => {
    const [coordinator, worker] = wiredPair();
    const stopAnswering = answerHeartbeats(worker, 0, () => ({
      state: 'ready',
      framesDropped: worker.stats.framesDropped,
    }));
    const { deaths, pulses } = watched(coordinator);

    const clockAt = (ms: number) => vi.advanceTimersByTimeAsync(START + ms - Date.now());

    await clockAt(30_000);
    expect(deaths).toEqual([]);
    expect(pulses).toHaveLength(30_000 / HEARTBEAT_INTERVAL_MS);
    expect(pulses.at(-1)).toEqual({ state: 'ready', framesDropped: 0 });
    expect(coordinator.lastHeardAt).toBe(START + 30_000);

    stopAnswering();
    await clockAt(30_000 + DEAD_AFTER_MS);
    expect(deaths).toEqual([]);
    await clockAt(30_000 + DEAD_ON_BEAT);
    expect(deaths).toEqual([DEAD_ON_BEAT]);
    expect(pulses).toHaveLength(60);
  });

  it('a long reply arriving one frame per 200 ms keeps its sender alive, though no whole message arrives for over 8 s', async () => {
    const link = new Link(new SinkChannel(), { accept: coordinatorAccept });
    const { deaths } = watched(link);
    const frames = encodeFrames(
      {
        kind: 'rpc',
        from: 0,
        body: { type: 'reply', id: 1, ok: true, result: { $tensor: 0 } },
        tensors: [new Float32Array(10_000)],
      },
      0,
      1060,
    );
    expect(frames.length).toBe(41);
    for (const f of frames) {
      await vi.advanceTimersByTimeAsync(200);
      link.receive(f);
    }
    expect(link.stats).toMatchObject({ messagesReceived: 1, framesDropped: 0 });
    expect(link.lastHeardAt).toBe(START + 41 * 200);
    expect(deaths).toEqual([]);
  });
});

function corrupt(frame: ArrayBuffer, offset: number, value: number): ArrayBuffer {
  const bytes = new Uint8Array(frame.slice(0));
  bytes[offset] = value;
  return bytes.buffer;
}

// ------------------------------------------------------------------ fail fast

describe.each<Transport>(['direct', 'rpc'])('collectiveRpc over %s calls', (transport) => {
  let model: WanModel;
  beforeAll(async () => {
    model = await loadTransformer(tinyModelFiles);
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('one rank that errs fails the call at once (0 ms on the clock, with a 60 s timeout), though another rank never answers', async () => {
    const RPC_TIMEOUT_MS = 60_000;
    const engine = stubEngine(referenceStages(model), model.config);
    const executor = new InProcessExecutor(
      { config: model.config, modelUrl: '/models/tiny-wan', rpcTimeoutMs: RPC_TIMEOUT_MS, layout: new RankLayout(3) },
      engine,
      transport,
    );
    await executor.initialize();
    executor.fault = (rank, method) =>
      method !== 'ping' ? null : rank === 1 ? { throws: 'out of GPU memory' } : rank === 2 ? { silent: true } : null;

    // the clock only moves when the test moves it; messages still flow (setImmediate stays real)
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date'] });
    vi.setSystemTime(START);
    const outcome: { failure?: { error: unknown; at: number } } = {};
    executor.collectiveRpc('ping').then(
      () => {},
      (error: unknown) => (outcome.failure = { error, at: Date.now() }),
    );
    for (let turn = 0; turn < 1000 && !outcome.failure; turn++) await new Promise((r) => setImmediate(r));

    expect(outcome.failure).toBeDefined();
    const { error, at } = defined(outcome.failure, 'the failure');
    expect(at - START).toBe(0); // no timer had to fire: far under RPC_TIMEOUT_MS
    expect(error).toBeInstanceOf(WorkerError);
    expect(error).toMatchObject({
      rank: 1,
      method: 'ping',
      remoteMessage: 'out of GPU memory',
      blame: null,
      breach: false,
    });
    expect(executor.received.map((methods) => methods.at(-1))).toEqual(['ping', 'ping', 'ping']); // rank 2 was asked, and is still silent
    expect(vi.getTimerCount()).toBe(0); // the failed call's watch stopped with it
  });
});

// ------------------------------------------------------------------ slow is not hung

/** An in-process executor whose ranks' engines move when the test says (as their pulses would say). */
class ProgressingExecutor extends InProcessExecutor {
  readonly done = [0, 0, 0];
  protected override progressOf(rank: number): number | null {
    return this.done[rank];
  }
}

describe('a collective call gives up on a rank whose engine stopped moving, never on one that moves (call-watch.ts)', () => {
  const LIMIT_MS = 60_000;
  let model: WanModel;
  beforeAll(async () => {
    model = await loadTransformer(tinyModelFiles);
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  /** three ranks; `silent` never answer ping; the call's outcome and when, on the fake clock */
  async function pinging(silent: number[]) {
    const executor = new ProgressingExecutor(
      { config: model.config, modelUrl: '/models/tiny-wan', rpcTimeoutMs: LIMIT_MS, layout: new RankLayout(3) },
      stubEngine(referenceStages(model), model.config),
      'direct',
    );
    await executor.initialize();
    executor.fault = (rank, method) => (method === 'ping' && silent.includes(rank) ? { silent: true } : null);
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date'] });
    vi.setSystemTime(START);
    const outcome: { error?: unknown; at?: number } = {};
    executor.collectiveRpc('ping').then(
      () => (outcome.at = Date.now()),
      (error: unknown) => Object.assign(outcome, { error, at: Date.now() }),
    );
    for (let turn = 0; turn < 100; turn++) await new Promise((r) => setImmediate(r));
    return { executor, outcome };
  }

  it('a rank whose engine keeps moving is waited for, though its call takes 20 times the limit; once it stops, it is named after the limit', async () => {
    const { executor, outcome } = await pinging([2]);
    for (let t = 0; t < 20 * LIMIT_MS; t += LIMIT_MS / 2) {
      executor.done[2]++; // a stage finished, far slower than planned
      await vi.advanceTimersByTimeAsync(LIMIT_MS / 2);
    }
    expect(outcome).toEqual({});
    const lastMove = Date.now();
    executor.done[2]++;
    await vi.advanceTimersByTimeAsync(LIMIT_MS);
    expect(outcome).toEqual({});
    await vi.advanceTimersByTimeAsync(2_000); // the move is seen at the watch's next look, within a second
    expect(outcome.error).toBeInstanceOf(TimeoutError);
    expect(outcome.error).toMatchObject({ method: 'ping', silentRanks: [2], timeoutMs: LIMIT_MS });
    expect(defined(outcome.at, 'when') - lastMove).toBeGreaterThan(LIMIT_MS);
  });

  it('a rank whose engine never moves is named when the limit runs out, while the other ranks answered', async () => {
    const { outcome } = await pinging([1, 2]);
    await vi.advanceTimersByTimeAsync(LIMIT_MS);
    expect(outcome).toEqual({});
    await vi.advanceTimersByTimeAsync(1_000);
    expect(outcome.error).toMatchObject({ method: 'ping', silentRanks: [1, 2], timeoutMs: LIMIT_MS });
  });

  it(`every rank of a call late together is load: the limit doubles ${MAX_STRETCHES} times before the ranks are named`, async () => {
    const { outcome } = await pinging([0, 1, 2]);
    const stretched = LIMIT_MS * 2 ** MAX_STRETCHES;
    await vi.advanceTimersByTimeAsync(LIMIT_MS + 1_000);
    expect(outcome).toEqual({}); // where one rank answers, the others are named here
    await vi.advanceTimersByTimeAsync(stretched - LIMIT_MS - 1_000);
    expect(outcome).toEqual({});
    await vi.advanceTimersByTimeAsync(1_000);
    expect(outcome.error).toMatchObject({ method: 'ping', silentRanks: [0, 1, 2], timeoutMs: stretched });
  });

  it(`the limit is ${STALL_STEP_MULTIPLE} predicted steps, at least ${STALL_FLOOR_MS / 1000} s; a rank names a silent peer within half of it; a job's own limit is kept`, () => {
    expect(timeoutsOf(undefined, 30_000)).toMatchObject({ rpcMs: STALL_STEP_MULTIPLE * 30_000, exchangeMs: 300_000 });
    expect(timeoutsOf(undefined, 100).rpcMs).toBe(STALL_FLOOR_MS);
    expect(timeoutsOf(undefined, null).rpcMs).toBe(STALL_FLOOR_MS);
    expect(timeoutsOf(5_000, 30_000).rpcMs).toBe(5_000);
  });
});

describe("a worker's pulse, judged where the coordinator receives it (checkPulse)", () => {
  const honest = {
    state: 'ready',
    framesDropped: 2,
    mesh: [{ peer: 'ditswarm-w-1', transport: 'direct' }],
    threads: 2,
    modelMemoryGiB: 3.5,
    load: { bytes: 1, totalBytes: 2, networkBytes: 1, elapsedMs: 5, note: '' },
  };
  it('passes an honest one whole, and drops fields it does not know', () => {
    expect(checkPulse({ ...honest, extra: 'x' }, 'pulse')).toEqual(honest);
    expect(checkPulse({ state: 'idle', framesDropped: 0 }, 'pulse')).toEqual({ state: 'idle', framesDropped: 0 });
    expect(checkPulse({ ...honest, modelMemoryGiB: null }, 'pulse').modelMemoryGiB).toBeNull();
  });
  // what once threw after a job's last step (the link report read mesh.find) and broke the swarm table
  it.each([
    ['mesh: "not-an-array"', { mesh: 'not-an-array' }],
    ['a mesh entry without a peer', { mesh: [{ transport: 'direct' }] }],
    ['a transport that is neither', { mesh: [{ peer: 'p', transport: 'carrier pigeon' }] }],
    ['257 mesh entries', { mesh: Array.from({ length: 257 }, (_, i) => ({ peer: `p${i}`, transport: 'relay' })) }],
    ['framesDropped −1', { framesDropped: -1 }],
    ['threads 0', { threads: 0 }],
    ['memory for the model of 0 GiB', { modelMemoryGiB: 0 }],
    ['memory for the model of NaN GiB', { modelMemoryGiB: NaN }],
    ['memory for the model of 1e9 GiB', { modelMemoryGiB: 1e9 }],
    ['a load with NaN bytes', { load: { ...honest.load, bytes: NaN } }],
    ['a 100 kB state', { state: 'x'.repeat(100_000) }],
  ])('refuses %s', (_, change) => {
    expect(passing(checkPulse, { ...honest, ...change }, 'pulse')).toBeUndefined();
  });
  it('refuses what is not a pulse at all', () => {
    for (const value of [null, 'ready', 42, [], { state: 'ready' }])
      expect(passing(checkPulse, value, 'pulse')).toBeUndefined();
  });
});

describe('a worker whose dashboard is silent asks the server where it is (askWhileSilent)', () => {
  beforeEach(() => vi.useFakeTimers({ now: START }));
  afterEach(() => vi.useRealTimers());

  /** a worker's link last heard at heard(), and a server that answers where the dashboard is */
  const asked = (answer: { coordinator: string } | { waiting: string }, heard: () => number) => {
    let questions = 0;
    let gone = 0;
    const link = {
      get lastHeardAt() {
        return heard();
      },
      closed: false,
    };
    const find = () => {
      questions++;
      return Promise.resolve(answer);
    };
    askWhileSilent(link, find, 'dashboard-1', () => gone++);
    return { questions: () => questions, gone: () => gone };
  };

  it('asks nothing while the dashboard beats, and lets the link go only when the server names no dashboard or another', async () => {
    const beating = asked({ waiting: 'no dashboard' }, () => Date.now());
    await vi.advanceTimersByTimeAsync(10 * COORDINATOR_SILENT_MS);
    expect([beating.questions(), beating.gone()]).toEqual([0, 0]);

    const busy = asked({ coordinator: 'dashboard-1' }, () => START);
    await vi.advanceTimersByTimeAsync(3 * COORDINATOR_SILENT_MS);
    expect([busy.questions(), busy.gone()]).toEqual([3, 0]); // silent but still named: a busy dashboard

    const left = asked({ waiting: 'no dashboard' }, () => START);
    await vi.advanceTimersByTimeAsync(COORDINATOR_SILENT_MS);
    expect(left.gone()).toBe(1);

    const replaced = asked({ coordinator: 'dashboard-2' }, () => START);
    await vi.advanceTimersByTimeAsync(COORDINATOR_SILENT_MS);
    expect(replaced.gone()).toBe(1);
  });
});
