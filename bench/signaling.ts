// How many workers one server can signal for (issue 63, item 6): the real server (`npm start`, server/main.ts) as a
// process of its own, so that its memory and CPU time are its own; a dashboard opens a swarm on it as the dashboard
// page does (a join token from the owner's machine, its PeerJS id registered and named to the server, its relay
// socket); then `workers` simulated worker pages join at once, each doing over the network what worker/endpoint.ts
// does: GET /signaling.json and /models.json, register its PeerJS id over the signaling websocket (OPEN, then a
// HEARTBEAT every 5 s as PeerJS sends), prove the join token to find the dashboard's id (FIND_PATH), open its relay
// socket (the fallback mode opens it before dialling), and send the dashboard an OFFER and its ICE candidates, which
// the dashboard answers with an ANSWER and its own. No browsers and no WebRTC: only what the server carries.
//
// A worker has joined once the dashboard's ANSWER reaches it. The dashboard sends its answers no faster than the
// server lets one page send (SIGNALING_BURST, SIGNALING_MESSAGES_PER_SECOND: past them the server cuts the socket),
// so with many workers arriving at once the answers queue at the dashboard: the report tells that wait apart from
// the server's own part (a worker's start to its OFFER sent).
//
// The server caps pages per source address and per network (server/peer-signaling.ts): workers come from
// `perAddress` pages per address, each address in a /24 of its own, as tabs of machines on other networks. Addresses
// other than the loopback need a private network namespace, in which this script runs itself again (unshare --net,
// as root), the whole 10.200.0.0/16 local on its lo; with `perAddress` ≥ `workers` all come from the loopback and
// the per-address cap is what is measured. Bounded in count and time: past `deadlineS` it stops and reports what it
// reached. Writes bench/out/signaling.json.
//
//   npm run bench -- signaling [--workers 200] [--per-address 4] [--candidates 2] [--deadline 60] [--hold 10]

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { parseArgs } from 'node:util';
import { WebSocket } from 'ws';
import { defined } from '../core/defined.ts';
import {
  findProof,
  FIND_PATH,
  registerProof,
  REGISTER_PATH,
  relayProof,
  roomOf,
  SWARMS_PATH,
  type SwarmAnswer,
} from '../core/net/join-token.ts';
import { PEER_ID_PREFIX } from '../core/net/peer-link.ts';
import { RELAY_PATH } from '../core/net/relay-client.ts';
import {
  MAX_SIGNALING_CLIENTS,
  MAX_SIGNALING_CLIENTS_PER_ADDRESS,
  MAX_SIGNALING_CLIENTS_PER_PREFIX,
  SIGNALING_BURST,
  SIGNALING_MESSAGES_PER_SECOND,
} from '../server/peer-signaling.ts';
import { isMain, log, machine, median, ROOT, round, waitForQuietMachine, writeReport } from './lib.ts';

export interface SignalingBenchOptions {
  workers: number;
  /** worker pages from one source address (tabs of one machine); ≥ workers: all from the loopback */
  perAddress: number;
  /** ICE candidates each side trickles after its OFFER or ANSWER (host candidates of a page without STUN) */
  candidates: number;
  /** how long the workers have to join, from the first one's start */
  deadlineS: number;
  /** how long the joined workers stay, heartbeating, before the server's memory is read again */
  holdS: number;
  /**
   * the dashboard answers at once, as PeerJS in a page does, not paced to the server's per-page rate: what happens
   * to a real dashboard when many workers arrive together
   */
  unpacedDashboard: boolean;
}

export const DEFAULT_SIGNALING: SignalingBenchOptions = {
  workers: 200,
  perAddress: 4,
  candidates: 2,
  deadlineS: 60,
  holdS: 10,
  unpacedDashboard: false,
};
/** `npm run bench -- --smoke`: a few workers, all from the loopback (no namespace, so no root needed) */
export const SMOKE_SIGNALING: SignalingBenchOptions = {
  workers: 8,
  perAddress: 8,
  candidates: 2,
  deadlineS: 20,
  holdS: 1,
  unpacedDashboard: false,
};

/** PeerJS's heartbeat, as the page sends it */
const HEARTBEAT_MS = 5000;
/** the addresses the workers come from, inside the namespace: all local on its lo */
const WORKER_NETWORK = '10.200.0.0/16';
/** set in the namespace this script runs itself in */
const INSIDE_NAMESPACE = 'DITSWARM_BENCH_SIGNALING_NETNS';
/** the dashboard's answers stay this far below the server's per-page burst: its heartbeats need room too */
const DASHBOARD_HEADROOM = 10;

export function parseSignalingArgs(args: string[]): SignalingBenchOptions {
  const { values } = parseArgs({
    args,
    options: {
      workers: { type: 'string' },
      'per-address': { type: 'string' },
      candidates: { type: 'string' },
      deadline: { type: 'string' },
      hold: { type: 'string' },
      'unpaced-dashboard': { type: 'boolean', default: false },
    },
  });
  const flags: Record<string, Exclude<keyof SignalingBenchOptions, 'unpacedDashboard'>> = {
    workers: 'workers',
    'per-address': 'perAddress',
    candidates: 'candidates',
    deadline: 'deadlineS',
    hold: 'holdS',
  };
  const o = { ...DEFAULT_SIGNALING, unpacedDashboard: values['unpaced-dashboard'] };
  for (const [flag, key] of Object.entries(flags)) {
    const v = values[flag as Exclude<keyof typeof values, 'unpaced-dashboard'>];
    if (v === undefined) continue;
    const least = key === 'candidates' || key === 'holdS' ? 0 : 1;
    if (!/^\d+$/.test(v) || Number(v) < least) throw new Error(`--${flag} takes a whole number ≥ ${least}, got ${v}`);
    o[key] = Number(v);
  }
  return o;
}

interface Usage {
  rssMiB: number;
  cpuS: number;
}

const CLOCK_TICKS = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

/** A process's resident memory now and its CPU time (user + system) so far, from /proc (Linux). */
function usage(pid: number): Usage {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  const ticks = Number(fields[11]) + Number(fields[12]); // utime, stime
  const rssKb = Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN);
  return { rssMiB: round(rssKb / 1024, 1), cpuS: round(ticks / CLOCK_TICKS, 2) };
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const hex = (bytes: number) => randomBytes(bytes).toString('hex');

/** `npm start -- --port 0` as a process of its own; settles once it says where it serves. */
async function startServerProcess(readyWithinMs = 180_000): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'server/main.ts', '--port', '0'], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const end = Date.now() + readyWithinMs;
  for (;;) {
    const port = /serving on port (\d+)/.exec(out)?.[1];
    if (port && /^ {2}relay /m.test(out)) return { child, port: Number(port) };
    if (child.exitCode !== null) throw new Error(`the server exited (${child.exitCode}) before serving:\n${out}`);
    if (Date.now() > end) {
      await stopProcess(child);
      throw new Error(`the server did not say where it serves within ${readyWithinMs / 1000} s:\n${out}`);
    }
    await sleep(100);
  }
}

/**
 * The server's usage once its resident memory has stopped falling (V8 hands back the startup's garbage over a few
 * seconds): what "idle" means here, so that what the workers add is not hidden under it.
 */
async function settled(pid: number, withinMs = 20_000): Promise<Usage> {
  const end = Date.now() + withinMs;
  let last = usage(pid);
  while (Date.now() < end) {
    await sleep(2000);
    const now = usage(pid);
    if (Math.abs(now.rssMiB - last.rssMiB) < 1) return now;
    last = now;
  }
  return last;
}

/** SIGTERM, and SIGKILL if it has not exited within 10 s. */
function stopProcess(child: ChildProcess): Promise<void> {
  return new Promise((done) => {
    if (child.exitCode !== null || child.signalCode !== null) {
      done();
      return;
    }
    const kill = setTimeout(() => child.kill('SIGKILL'), 10_000);
    child.once('exit', () => {
      clearTimeout(kill);
      done();
    });
    child.kill('SIGTERM');
  });
}

/** Why the server turned a page away: the HTTP status (0: the socket failed or closed) and what it said. */
interface Refusal {
  status: number;
  reason: string;
}

/** What one page says to the server: HTTP from its own source address, a browser's Origin on what it posts. */
class PageClient {
  constructor(
    private readonly port: number,
    private readonly agent: http.Agent,
    readonly address: string | undefined,
  ) {}

  get origin(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  call(method: 'GET' | 'POST', path: string, body?: unknown): Promise<{ status: number; text: string }> {
    return new Promise((resolve, reject) => {
      const request = http.request(
        {
          host: '127.0.0.1',
          port: this.port,
          method,
          path,
          agent: this.agent,
          localAddress: this.address,
          headers: body === undefined ? {} : { 'content-type': 'application/json', origin: this.origin },
        },
        (response) => {
          let text = '';
          response.on('data', (d: Buffer) => (text += d.toString()));
          response.on('end', () => resolve({ status: response.statusCode ?? 0, text }));
        },
      );
      request.on('error', reject);
      request.end(body === undefined ? undefined : JSON.stringify(body));
    });
  }

  /** GET or POST that must answer `expect`; else the server's refusal. */
  async ask(method: 'GET' | 'POST', path: string, expect: number, body?: unknown): Promise<string | Refusal> {
    const { status, text } = await this.call(method, path, body);
    return status === expect ? text : { status, reason: text.slice(0, 300) };
  }

  /**
   * A websocket at `path`, and the first message it hears (peer's OPEN, the relay's welcome): the socket with it,
   * or the server's refusal of the upgrade or of that first message.
   */
  openSocket(path: string): Promise<{ ws: WebSocket; first: string } | Refusal> {
    return new Promise((resolve) => {
      const ws = new WebSocket(`ws://127.0.0.1:${this.port}${path}`, {
        localAddress: this.address,
        headers: { origin: this.origin },
      });
      ws.once('message', (data: Buffer) => resolve({ ws, first: data.toString() }));
      ws.once('unexpected-response', (_request, response) => {
        let text = '';
        response.on('data', (d: Buffer) => (text += d.toString()));
        response.on('end', () => resolve({ status: response.statusCode ?? 0, reason: text.slice(0, 300) }));
      });
      ws.on('error', (e) => resolve({ status: 0, reason: e.message })); // later ones too: a cut socket is no crash
      ws.once('close', (code, why) => resolve({ status: 0, reason: `closed (${code}) ${why.toString()}` }));
    });
  }
}

const refused = (x: unknown): x is Refusal => typeof x === 'object' && x !== null && 'status' in x;

/** a PeerJS signaling registration as a page makes it (peerOptions: a 128-bit token of its own) */
const signalingPath = (key: string, id: string, token: string) =>
  `/peerjs/peerjs?key=${encodeURIComponent(key)}&id=${id}&token=${token}`;

/** What a page's signaling socket heard first: OPEN, or why it was turned away. */
function opened(first: string): Refusal | null {
  const message = JSON.parse(first) as { type?: string; payload?: { msg?: string } };
  return message.type === 'OPEN' ? null : { status: 0, reason: `${message.type}: ${message.payload?.msg ?? ''}` };
}

/** a relay registration as connectRelay (core/net/peer-link.ts) makes it */
function relayPath(peer: string, auth: string, token: string, role: 'coordinator' | 'worker'): string {
  const proof = relayProof(token, peer, auth);
  return `${RELAY_PATH}?${new URLSearchParams({ peer, auth, room: roomOf(token) ?? '', proof, role })}`;
}

/** A relay's first word: welcome, or its refusal. */
function welcomed(first: string): Refusal | null {
  const message = JSON.parse(first) as { t?: string; reason?: string };
  return message.t === 'welcome' ? null : { status: 0, reason: `relay: ${message.reason ?? first.slice(0, 200)}` };
}

/** What an SDP of a data channel weighs: the bytes the server carries, not a session anyone could open. */
const FAKE_SDP = `v=0\r\no=- ${'1'.repeat(19)} 2 IN IP4 127.0.0.1\r\n${'a=x'.padEnd(60, 'x')}\r\n`.repeat(14);
const candidate = (n: number) => ({
  candidate: `candidate:${n} 1 udp 2113937151 ${hex(8)}.local ${50000 + n} typ host generation 0`,
  sdpMid: '0',
  sdpMLineIndex: 0,
});

/** A token bucket like the server's per-page limit, a little under it: when the next message may go. */
function pacer(burst: number, perSecond: number) {
  let level = burst;
  let at = performance.now();
  return (): number => {
    const now = performance.now();
    level = Math.min(burst, level + ((now - at) * perSecond) / 1000);
    at = now;
    if (level >= 1) {
      level -= 1;
      return 0;
    }
    return ((1 - level) * 1000) / perSecond;
  };
}

interface Dashboard {
  token: string;
  peer: string;
  /** how long each ANSWER waited at the dashboard for the server's per-page rate */
  answerWaitsMs: number[];
  /** when (performance.now()) and how the server closed the dashboard's signaling socket, if it did */
  cut: { at: number; code: number } | null;
  close(): void;
}

/**
 * A dashboard as the page opens its swarm: a join token from its server (as a page of the server's own machine),
 * its PeerJS id registered and named to the server, its relay socket; it answers each OFFER with an ANSWER and
 * `candidates` candidates, no faster than the server lets one page send.
 */
async function openDashboard(
  page: PageClient,
  key: string,
  { candidates, unpacedDashboard }: SignalingBenchOptions,
): Promise<Dashboard> {
  const fail = (what: string, r: Refusal) => {
    throw new Error(`the dashboard could not ${what}: HTTP ${r.status} ${r.reason}`);
  };
  const swarm = await page.ask('POST', SWARMS_PATH, 200, {});
  if (refused(swarm)) return fail('get a join token (is the bench on the server’s machine?)', swarm);
  const { token, dashboardKey } = JSON.parse(swarm) as SwarmAnswer;
  const room = roomOf(token ?? '');
  if (!token || !dashboardKey || !room) throw new Error(`the server answered ${swarm} for a join token`);
  const peer = PEER_ID_PREFIX.coordinator + hex(6);
  const auth = hex(16);
  const signaling = await page.openSocket(signalingPath(key, peer, auth));
  if (refused(signaling)) return fail('register its PeerJS id', signaling);
  const notOpen = opened(signaling.first);
  if (notOpen) return fail('register its PeerJS id', notOpen);
  const named = await page.ask('POST', REGISTER_PATH, 204, {
    room,
    peer,
    proof: registerProof(dashboardKey, room, peer),
    auth,
  });
  if (refused(named)) return fail('name its id to the server', named);
  const relay = await page.openSocket(relayPath(peer, auth, token, 'coordinator'));
  if (refused(relay)) return fail('open its relay socket', relay);
  const notWelcome = welcomed(relay.first);
  if (notWelcome) return fail('open its relay socket', notWelcome);

  const ws = signaling.ws;
  const next = unpacedDashboard
    ? () => 0
    : pacer(SIGNALING_BURST - DASHBOARD_HEADROOM, 0.95 * SIGNALING_MESSAGES_PER_SECOND);
  const queue: { message: string; heardAt: number; answer: boolean }[] = [];
  const answerWaitsMs: number[] = [];
  let draining: NodeJS.Timeout | null = null;
  const drain = () => {
    draining = null;
    while (queue.length) {
      const wait = next();
      if (wait > 0) {
        draining = setTimeout(drain, wait);
        return;
      }
      const { message, heardAt, answer } = defined(queue.shift(), 'a queued message');
      if (ws.readyState !== WebSocket.OPEN) return;
      if (answer) answerWaitsMs.push(performance.now() - heardAt);
      ws.send(message);
    }
  };
  const send = (message: object, heardAt: number, answer = false) => {
    queue.push({ message: JSON.stringify(message), heardAt, answer });
    if (!draining) drain();
  };
  ws.on('message', (data: Buffer) => {
    const message = JSON.parse(data.toString()) as { type: string; src?: string; payload?: { connectionId?: string } };
    if (message.type !== 'OFFER' || !message.src) return;
    const heardAt = performance.now();
    const connectionId = message.payload?.connectionId;
    send(
      {
        type: 'ANSWER',
        dst: message.src,
        payload: { sdp: { type: 'answer', sdp: FAKE_SDP }, type: 'data', connectionId },
      },
      heardAt,
      true,
    );
    for (let n = 0; n < candidates; n++)
      send(
        { type: 'CANDIDATE', dst: message.src, payload: { candidate: candidate(n), type: 'data', connectionId } },
        heardAt,
      );
  });
  const heartbeat = setInterval(() => send({ type: 'HEARTBEAT' }, performance.now()), HEARTBEAT_MS);
  const dashboard: Dashboard = {
    token,
    peer,
    answerWaitsMs,
    cut: null,
    close() {
      clearInterval(heartbeat);
      if (draining) clearTimeout(draining);
      ws.close();
      relay.ws.close();
    },
  };
  ws.on('close', (code) => (dashboard.cut ??= { at: performance.now(), code }));
  return dashboard;
}

/** How far a worker got: each step of joining in order. */
const STAGES = ['config', 'registered', 'found', 'relay', 'offered', 'answered'] as const;
type Stage = (typeof STAGES)[number];

interface WorkerRun {
  /** ms from the worker's start to each step it reached */
  at: Partial<Record<Stage, number>>;
  refusal: (Refusal & { stage: Stage }) | null;
  sockets: WebSocket[];
  heartbeat: NodeJS.Timeout | null;
}

/** One worker page joining the dashboard's swarm, step by step as worker/endpoint.ts does; `run` says how far. */
async function joinAsWorker(page: PageClient, dashboard: Dashboard, candidates: number, run: WorkerRun) {
  const start = performance.now();
  const reached = (stage: Stage) => (run.at[stage] = round(performance.now() - start, 1));
  const stop = (stage: Stage, r: Refusal) => void (run.refusal = { stage, ...r });
  const config = await page.ask('GET', '/signaling.json', 200);
  if (refused(config)) {
    stop('config', config);
    return;
  }
  const models = await page.ask('GET', '/models.json', 200);
  if (refused(models)) {
    stop('config', models);
    return;
  }
  const { key, path } = JSON.parse(config) as { key: string; path: string };
  if (path !== '/peerjs') throw new Error(`the server's signaling path is ${path}; this bench dials /peerjs`);
  reached('config');
  const peer = PEER_ID_PREFIX.worker + hex(6);
  const auth = hex(16);
  const signaling = await page.openSocket(signalingPath(key, peer, auth));
  if (refused(signaling)) {
    stop('registered', signaling);
    return;
  }
  run.sockets.push(signaling.ws);
  const notOpen = opened(signaling.first);
  if (notOpen) {
    stop('registered', notOpen);
    return;
  }
  const ws = signaling.ws;
  run.heartbeat = setInterval(() => ws.send(JSON.stringify({ type: 'HEARTBEAT' })), HEARTBEAT_MS);
  reached('registered');
  const room = defined(roomOf(dashboard.token), "the room of the dashboard's token");
  const found = await page.ask('POST', FIND_PATH, 200, { room, peer, proof: findProof(dashboard.token, peer) });
  if (refused(found)) {
    stop('found', found);
    return;
  }
  const { coordinator } = JSON.parse(found) as { coordinator: string };
  if (coordinator !== dashboard.peer)
    throw new Error(`the server named ${coordinator}, not the dashboard's ${dashboard.peer}`);
  reached('found');
  const relay = await page.openSocket(relayPath(peer, auth, dashboard.token, 'worker'));
  if (refused(relay)) {
    stop('relay', relay);
    return;
  }
  run.sockets.push(relay.ws);
  const notWelcome = welcomed(relay.first);
  if (notWelcome) {
    stop('relay', notWelcome);
    return;
  }
  reached('relay');
  const answered = new Promise<void>((resolve) =>
    ws.on('message', (data: Buffer) => {
      if ((JSON.parse(data.toString()) as { type?: string }).type === 'ANSWER') resolve();
    }),
  );
  const connectionId = `dc_${hex(6)}`;
  // what PeerJS's DataConnection puts in its OFFER; the metadata is a dial's (core/net/join.ts), which the server
  // does not read
  const channel = { type: 'data', connectionId, label: connectionId, reliable: true, serialization: 'raw' };
  const metadata = { role: 'worker', nonce: hex(16), dial: hex(32) };
  const offer = { ...channel, sdp: { type: 'offer', sdp: FAKE_SDP }, metadata };
  ws.send(JSON.stringify({ type: 'OFFER', dst: coordinator, payload: offer }));

  for (let n = 0; n < candidates; n++)
    ws.send(
      JSON.stringify({
        type: 'CANDIDATE',
        dst: coordinator,
        payload: { candidate: candidate(n), type: 'data', connectionId },
      }),
    );
  reached('offered');
  await answered;
  reached('answered');
}

/** the `p`th percentile (0–100) of `values`, by the nearest rank; null for none */
function percentile(values: number[], p: number): number | null {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

const spread = (values: number[]) => ({
  p50: percentile(values, 50),
  p95: percentile(values, 95),
  max: percentile(values, 100),
});

/** Where worker `i` connects from: the loopback, or an address of its own machine's /24 in the namespace. */
function sourceAddress(i: number, o: SignalingBenchOptions): string | undefined {
  if (o.perAddress >= o.workers) return undefined;
  const machineIndex = Math.floor(i / o.perAddress);
  return `10.200.${machineIndex % 256}.${1 + Math.floor(machineIndex / 256)}`;
}

/** This script again, in a network namespace of its own where WORKER_NETWORK is local: its report. */
function inNamespace(o: SignalingBenchOptions): Promise<SignalingReport> {
  const flags = ['--workers', o.workers, '--per-address', o.perAddress, '--candidates', o.candidates];
  const args = [
    ...[...flags, '--deadline', o.deadlineS, '--hold', o.holdS].map(String),
    ...(o.unpacedDashboard ? ['--unpaced-dashboard'] : []),
  ];
  log(`signaling: workers from ${Math.ceil(o.workers / o.perAddress)} addresses: in a network namespace of its own`);
  return new Promise((resolve, reject) => {
    const child = spawn(
      'unshare',
      ['--net', '--', process.execPath, '--import', 'tsx', 'bench/signaling.ts', ...args],
      { cwd: ROOT, env: { ...process.env, [INSIDE_NAMESPACE]: '1' }, stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.on('error', reject);
    child.on('exit', (code) => {
      if (code === 0) {
        resolve(JSON.parse(out) as SignalingReport);
        return;
      }
      reject(
        new Error(
          `the bench in a network namespace of its own (unshare --net, which needs root) exited with ${code}: ` +
            `workers from ${Math.ceil(o.workers / o.perAddress)} addresses need one; give --per-address ${o.workers} ` +
            "to have them all come from the loopback, where the server's per-address cap is what is measured",
        ),
      );
    });
  });
}

/** Inside the namespace: its lo up, and every address of WORKER_NETWORK local on it (the workers' sources). */
function setUpNamespace(): void {
  for (const args of [
    ['link', 'set', 'lo', 'up'],
    ['route', 'add', 'local', WORKER_NETWORK, 'dev', 'lo'],
  ]) {
    const done = spawnSync('ip', args, { encoding: 'utf8' });
    if (done.status !== 0) throw new Error(`ip ${args.join(' ')} failed in the namespace: ${done.stderr.trim()}`);
  }
}

export type SignalingReport = Awaited<ReturnType<typeof measure>>;

export async function runSignaling(o: SignalingBenchOptions): Promise<SignalingReport> {
  const inside = process.env[INSIDE_NAMESPACE] === '1';
  if (o.perAddress < o.workers && !inside) return inNamespace(o);
  if (inside) setUpNamespace();
  return measure(o);
}

async function measure(o: SignalingBenchOptions) {
  const quiet = await waitForQuietMachine();
  const machineAtStart = machine();
  log('signaling: starting the server (server/main.ts)…');
  const { child, port } = await startServerProcess();
  const pid = defined(child.pid, "the server's pid");
  const agent = new http.Agent({ keepAlive: true });
  const runs: WorkerRun[] = [];
  let dashboard: Dashboard | null = null;
  try {
    const owner = new PageClient(port, agent, undefined);
    const key = (JSON.parse(await owner.ask('GET', '/signaling.json', 200).then(String)) as { key: string }).key;
    dashboard = await openDashboard(owner, key, o);
    const idle = await settled(pid);
    log(`signaling: ${o.workers} workers join at once (at most ${o.deadlineS} s)…`);
    const samples: (Usage & { s: number })[] = [];
    const started = performance.now();
    const sampling = setInterval(
      () => samples.push({ s: round((performance.now() - started) / 1000, 1), ...usage(pid) }),
      250,
    );
    const joining = Array.from({ length: o.workers }, (_, i) => {
      const run: WorkerRun = { at: {}, refusal: null, sockets: [], heartbeat: null };
      runs.push(run);
      const page = new PageClient(port, agent, sourceAddress(i, o));
      return joinAsWorker(page, defined(dashboard, 'the dashboard'), o.candidates, run).catch((e: unknown) => {
        run.refusal = {
          stage: STAGES.find((s) => run.at[s] === undefined) ?? 'answered',
          status: 0,
          reason: String(e),
        };
      });
    });
    const deadline = sleep(o.deadlineS * 1000).then(() => 'deadline' as const);
    const ended = await Promise.race([Promise.all(joining).then(() => 'all' as const), deadline]);
    const joiningS = (performance.now() - started) / 1000;
    clearInterval(sampling);
    const atJoined = usage(pid);
    const peakRssMiB = Math.max(idle.rssMiB, atJoined.rssMiB, ...samples.map((x) => x.rssMiB));
    const joined = runs.filter((r) => r.at.answered !== undefined);
    log(`signaling: ${joined.length} of ${o.workers} joined in ${joiningS.toFixed(1)} s; holding ${o.holdS} s…`);
    await sleep(o.holdS * 1000);
    const held = usage(pid);
    for (const run of runs) {
      if (run.heartbeat) clearInterval(run.heartbeat);
      for (const ws of run.sockets) ws.close();
    }
    const after = await settled(pid); // the server lets the closed pages go

    const byRefusal = new Map<string, { stage: Stage; status: number; count: number; reason: string }>();
    for (const { refusal } of runs) {
      if (!refusal) continue;
      const k = `${refusal.stage} ${refusal.status} ${refusal.reason.slice(0, 40)}`;
      const seen = byRefusal.get(k) ?? { ...refusal, count: 0 };
      seen.count++;
      byRefusal.set(k, seen);
    }
    const unfinished: Partial<Record<Stage | 'started', number>> = {};
    for (const run of runs.filter((r) => !r.refusal && r.at.answered === undefined)) {
      const last = [...STAGES].reverse().find((s) => run.at[s] !== undefined) ?? 'started';
      unfinished[last] = (unfinished[last] ?? 0) + 1;
    }
    const lastJoinS = Math.max(0, ...joined.map((r) => defined(r.at.answered, 'a join time'))) / 1000;
    const perWorker = (x: number) => (joined.length ? round(x / joined.length, 3) : null);
    return {
      config: {
        ...o,
        addresses: o.perAddress >= o.workers ? 1 : Math.ceil(o.workers / o.perAddress),
        sources: o.perAddress >= o.workers ? 'loopback' : `${WORKER_NETWORK}, one /24 per address`,
        /** the server's own limits, as it was built with them (server/peer-signaling.ts) */
        serverLimits: {
          signalingClients: MAX_SIGNALING_CLIENTS,
          perAddress: MAX_SIGNALING_CLIENTS_PER_ADDRESS,
          perNetwork: MAX_SIGNALING_CLIENTS_PER_PREFIX,
          messagesBurst: SIGNALING_BURST,
          messagesPerSecond: SIGNALING_MESSAGES_PER_SECOND,
        },
      },
      machine: machineAtStart,
      quiet,
      date: new Date().toISOString(),
      ended: ended === 'all' ? 'every worker joined or was refused' : `the deadline (${o.deadlineS} s) passed`,
      joined: joined.length,
      refused: [...byRefusal.values()],
      unfinished,
      /** joined workers over the time to the last join */
      joinsPerSecond: joined.length && lastJoinS > 0 ? round(joined.length / lastJoinS, 1) : null,
      allJoinedS: joined.length === o.workers ? round(lastJoinS, 2) : null,
      /** a worker's start to the dashboard's ANSWER reaching it */
      joinMs: spread(joined.map((r) => defined(r.at.answered, 'a join time'))),
      /** a worker's start to its OFFER sent: the server's own part (config, signaling, find, relay) */
      serverPartMs: spread(joined.map((r) => defined(r.at.offered, 'an offer time'))),
      /** median ms from a worker's start to each step */
      stepsMedianMs: Object.fromEntries(
        STAGES.map((s) => [s, round(median(runs.flatMap((r) => (r.at[s] === undefined ? [] : [r.at[s]]))), 1)]),
      ),
      /** the server closed the dashboard's signaling socket (1006: cut for its message rate), s after the start */
      dashboardCut: dashboard.cut && {
        afterS: round((dashboard.cut.at - started) / 1000, 2),
        code: dashboard.cut.code,
      },
      /** what the ANSWERs waited at the dashboard for the server's per-page message rate */
      dashboardAnswerWaitMs: spread(dashboard.answerWaitsMs.map((ms) => round(ms, 1))),
      server: {
        pid,
        idle,
        peakRssMiBWhileJoining: peakRssMiB,
        atJoined,
        held,
        after,
        samples,
        perWorker: {
          /** resident memory the joined workers held, after `holdS` s: (held − idle) / joined */
          rssKiB: perWorker((held.rssMiB - idle.rssMiB) * 1024),
          /** the same from the peak while they joined: what joining held at once */
          peakRssKiB: perWorker((peakRssMiB - idle.rssMiB) * 1024),
          /** CPU time the server spent on each join: (at joined − idle) / joined */
          joinCpuMs: perWorker((atJoined.cpuS - idle.cpuS) * 1000),
          /** CPU time a joined worker costs the server a minute while it only heartbeats */
          heldCpuMsPerMinute: o.holdS > 0 ? perWorker(((held.cpuS - atJoined.cpuS) * 1000 * 60) / o.holdS) : null,
        },
      },
    };
  } finally {
    for (const run of runs) {
      if (run.heartbeat) clearInterval(run.heartbeat);
      for (const ws of run.sockets) ws.terminate();
    }
    dashboard?.close();
    agent.destroy();
    await stopProcess(child);
  }
}

if (isMain(import.meta)) {
  const report = await runSignaling(parseSignalingArgs(process.argv.slice(2)));
  // in the namespace, the report goes back to the process that started it
  if (process.env[INSIDE_NAMESPACE] === '1') console.log(JSON.stringify(report));
  else writeReport('signaling.json', report);
}
