// The three paths a link between two pages can take (issue 63, item 5): a direct WebRTC data
// channel, one relayed by a TURN server (a real coturn, started here, with every RTCPeerConnection
// forced through it: iceTransportPolicy 'relay'), and the ditswarm server's own WebSocket relay
// (forced), each on a server of its own with those settings. On each: the hand-off of a fixed
// payload between two pages that joined the server as a swarm's pages do (PeerJS, TURN credentials,
// the relay socket; the app's Link framing and flow control), one way and both ways at once; and the
// same P = 2 job's step time, its links as the report names them, and its latent against the direct
// run's. Writes bench/out/links.json.
//
//   npm run bench -- links [--frames 9 --height 256 --width 256 --steps 3 --payload-mib 8 --repeats 5
//     --model DIR]

import { spawnSync } from 'node:child_process';
import { parseArgs } from 'node:util';
import type { BrowserContext, Page } from '@playwright/test';
import type { JobOverrides } from '../app/automation.ts';
import type { Transport } from '../core/net/channel.ts';
import type { RelayRole } from '../core/net/relay-client.ts';
import { type JobParams } from '../core/job.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { startLocalSwarm, type LocalSwarmOptions } from '../server/cli/browser-swarm.ts';
import { JOB_FLAG_OPTIONS, jobFlagValues, type JobFlag } from '../server/cli/job-flags.ts';
import { startCoturn, TURNSERVER, type Coturn } from '../server/coturn.ts';
import type { RunningServer } from '../server/serve.ts';
import {
  BENCH_MODEL_PATH,
  benchModel,
  buildBenchPages,
  isMain,
  latentFromBase64,
  log,
  machine,
  maxAbs,
  median,
  NO_SPOT_CHECKS,
  openProbePage,
  round,
  serveBenchPages,
  SMOKE_MODEL_DIR,
  versions,
  waitForQuietMachine,
  writeReport,
  type OnModel,
} from './lib.ts';
import { withTimeout } from './probes.ts';

type Bench = {
  peerJoin(origin: string, token: string, role: RelayRole): Promise<string>;
  peerDial(to: string): Promise<Transport>;
  peerAccepted(): Promise<Transport>;
  linkExchange(bytes: number): Promise<number>;
  linkSend(bytes: number): Promise<void>;
  linkReceive(bytes: number): Promise<number>;
};
declare const bench: Bench;

export interface LinksOptions extends Pick<JobParams, 'frames' | 'height' | 'width' | 'steps'>, OnModel {
  /** the hand-off's payload, one tensor message */
  payloadBytes: number;
  /** hand-offs each way and both ways at once, of which the median counts */
  repeats: number;
}

export const DEFAULT_LINKS: LinksOptions = {
  frames: 9,
  height: 256,
  width: 256,
  steps: 3,
  payloadBytes: 8 << 20,
  repeats: 5,
};

/** `npm run bench -- --smoke`: one step at 16 tokens, a quarter-MiB hand-off once */
export const SMOKE_LINKS: LinksOptions = {
  model: SMOKE_MODEL_DIR,
  frames: 1,
  height: 32,
  width: 32,
  steps: 1,
  payloadBytes: 256 << 10,
  repeats: 1,
};

const PATHS = ['direct', 'turn', 'relay'] as const;
type LinkPath = (typeof PATHS)[number];

/**
 * The server's settings that send every link down `path`, and no other: the relay is off where it is
 * not the path measured, so that a data channel slow to open on a loaded machine fails the run (and
 * is tried again) rather than being measured as the relay.
 */
function pathSettings(
  path: LinkPath,
  coturn: Coturn,
): Pick<LocalSwarmOptions, 'relay' | 'turn' | 'iceTransportPolicy'> {
  switch (path) {
    case 'direct':
      return { relay: 'off' };
    case 'turn':
      return { relay: 'off', turn: coturn.turn, iceTransportPolicy: 'relay' };
    case 'relay':
      return { relay: 'force' };
  }
}

/** hand-offs tried before the run fails: a data channel may not open within the dial's time on a loaded machine */
const HAND_OFF_ATTEMPTS = 3;

/** What a link took: `transport` as the dialling page saw it, `accepted` as the other. */
export interface HandOff {
  transport: Transport;
  accepted: Transport;
  /** one page sends, the other is silent: MB/s (1e6 bytes) of the median repeat */
  oneWayMBs: number;
  /** both send at once, as ranks do in an all-to-all: MB/s each way of the median repeat */
  bothWaysMBs: number;
  oneWaySeconds: number[];
  bothWaysSeconds: number[];
}

/** The hand-off between two pages of a fresh swarm of `server` (a token of its own making). */
async function handOff(context: BrowserContext, server: RunningServer, o: LinksOptions): Promise<HandOff> {
  const token = server.joinTokens.issue();
  const pages: Page[] = [];
  try {
    const [accepting, dialling] = [await openProbePage(context, server.url), await openProbePage(context, server.url)];
    pages.push(accepting, dialling);
    for (const [page, who] of [
      [accepting, 'accepting page'],
      [dialling, 'dialling page'],
    ] as const)
      page.on('console', (m) => (m.type() === 'error' || m.type() === 'warning') && log(`[${who}] ${m.text()}`));
    // a transfer that hangs fails this attempt: closing its pages ends the evaluate waiting on it
    return await withTimeout(measureHandOff(accepting, dialling, server, token, o), HAND_OFF_MS, 'the hand-off');
  } finally {
    for (const page of pages) await page.close();
  }
}

/** how long one hand-off attempt may take, its link's opening and every transfer */
const HAND_OFF_MS = 300_000;

async function measureHandOff(
  accepting: Page,
  dialling: Page,
  server: RunningServer,
  token: string,
  o: LinksOptions,
): Promise<HandOff> {
  const pages = [accepting, dialling];
  const join = (page: Page, role: RelayRole) =>
    page.evaluate(([origin, t, r]) => bench.peerJoin(origin, t, r), [server.url, token, role] as const);
  // the accepting page joins the relay as its room's coordinator: it lets a worker in only beside one
  const to = await join(accepting, 'coordinator');
  await join(dialling, 'worker');
  const [transport, accepted] = await withTimeout(
    Promise.all([dialling.evaluate((id) => bench.peerDial(id), to), accepting.evaluate(() => bench.peerAccepted())]),
    60_000,
    'the hand-off link opening',
  );
  await Promise.all(pages.map((p) => p.evaluate(() => bench.linkExchange(64 << 10)))); // warm-up
  const oneWaySeconds: number[] = [];
  const bothWaysSeconds: number[] = [];
  // timed here, from asking both pages to both having every byte: a page's own clock starts when its evaluate
  // does, which on a loaded machine may be after the bytes arrived
  const timed = async (work: () => Promise<unknown>) => {
    const start = performance.now();
    await work();
    return (performance.now() - start) / 1000;
  };
  for (let r = 0; r < o.repeats; r++) {
    oneWaySeconds.push(
      await timed(() =>
        Promise.all([
          dialling.evaluate((n) => bench.linkSend(n), o.payloadBytes),
          accepting.evaluate((n) => bench.linkReceive(n), o.payloadBytes),
        ]),
      ),
    );
    bothWaysSeconds.push(
      await timed(() => Promise.all(pages.map((p) => p.evaluate((n) => bench.linkExchange(n), o.payloadBytes)))),
    );
  }
  const mbs = (seconds: number[]) => round(o.payloadBytes / median(seconds) / 1e6, 2);
  return {
    transport,
    accepted,
    oneWayMBs: mbs(oneWaySeconds),
    bothWaysMBs: mbs(bothWaysSeconds),
    oneWaySeconds: oneWaySeconds.map((s) => round(s, 4)),
    bothWaysSeconds: bothWaysSeconds.map((s) => round(s, 4)),
  };
}

export async function runLinks(options: Partial<LinksOptions> = {}) {
  const o = { ...DEFAULT_LINKS, ...options };
  const folder = await benchModel(options.model);
  const model = folder.config;
  const tokens = tokenGrid(model, latentShape(o, wan21Latent(model.inChannels))).count;
  await buildBenchPages();
  log(
    `links: ${folder.path} (D ${model.dim}, ${model.numLayers} blocks), ${tokens} tokens, ${o.steps} steps at P = 2; ` +
      `hand-off of ${o.payloadBytes} B × ${o.repeats}`,
  );
  const started = Date.now();
  const machineAtStart = machine();
  const coturn = await startCoturn();
  const job: JobOverrides = {
    prompt: 'a red ball bouncing on a wooden floor',
    frames: o.frames,
    height: o.height,
    width: o.width,
    steps: o.steps,
    guidance: 1,
    seed: 42,
    backend: 'swarm',
    workers: 2,
    shares: 'even',
    ep: 'wasm',
    model: BENCH_MODEL_PATH,
    spotCheckRate: NO_SPOT_CHECKS,
  };
  let directLatent: Float32Array | null = null;
  let browser = 'unknown';
  const results = {} as Record<LinkPath, Awaited<ReturnType<typeof runPath>>>;
  async function runPath(path: LinkPath) {
    const swarm = await startLocalSwarm({
      workers: 2,
      modelFolders: folder.modelFolders,
      log,
      // the probe pages come from Playwright's routes, which Chromium's Local Network Access checks take for a
      // public site: without this, their signaling socket to the server on this machine is blocked
      browserArgs: ['--disable-features=LocalNetworkAccessChecks'],
      ...pathSettings(path, coturn),
    });
    try {
      browser = swarm.browserVersion;
      const context = swarm.dashboard.context();
      await serveBenchPages(context);
      const load = await waitForQuietMachine();
      const link = await tried(() => handOff(context, swarm.server, o), `${path}: the hand-off`);
      log(
        `${path}: hand-off ${link.transport}/${link.accepted}: ${link.oneWayMBs} MB/s one way, ` +
          `${link.bothWaysMBs} MB/s each way both at once`,
      );
      const relayedBefore = swarm.server.relay.stats().bytesForwarded;
      const result = await swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), job);
      const { report } = result;
      const latent = latentFromBase64(result.latent);
      directLatent ??= latent;
      const stepsMs = report.steps.map((s) => round(s.ms, 1));
      const outcome = {
        handOff: link,
        job: {
          // the steps after the first: the first also pays onnxruntime's first-run allocations
          stepMs: round(median(stepsMs.length > 1 ? stepsMs.slice(1) : stepsMs), 1),
          stepsMs,
          links: report.links.map((l) => `${l.from}->${l.to}:${l.transport}`),
          exchangeBytes: report.steps.reduce((t, s) => t + s.ranks.reduce((u, r) => u + r.bytesSent, 0), 0),
          relayForwardedBytes: swarm.server.relay.stats().bytesForwarded - relayedBefore,
          maxAbsVsDirect: maxAbs(latent, directLatent),
        },
        loadAverage1m: { start: load.loadAverage1m, end: machine().loadAverage1m },
      };
      log(`${path}: P = 2 step ${outcome.job.stepMs} ms (${stepsMs.join('/')}); links ${outcome.job.links.join(', ')}`);
      return outcome;
    } finally {
      await swarm.close();
    }
  }
  try {
    for (const path of PATHS) results[path] = await runPath(path);
  } finally {
    await coturn.stop().catch(() => {});
  }
  return {
    benchmark: 'links',
    date: new Date(started).toISOString(),
    durationS: round((Date.now() - started) / 1000, 1),
    config: {
      model: { path: folder.path, ...model },
      tokens,
      frames: o.frames,
      height: o.height,
      width: o.width,
      steps: o.steps,
      guidance: 1,
      degree: 2,
      ep: 'wasm',
      payloadBytes: o.payloadBytes,
      repeats: o.repeats,
      paths: {
        direct: 'WebRTC data channels, host candidates, the relay off',
        turn: `coturn ${coturnVersion()} on the loopback, --ice-policy relay (every RTCPeerConnection), the relay off`,
        relay: "the ditswarm server's WebSocket relay, forced (--relay force)",
      },
      stepMsIs: 'the median of the steps after the first (the only step where there is one)',
      MBs: '1e6 bytes per second',
    },
    machine: { ...machineAtStart, chromium: browser, loadAverage1mAtEnd: machine().loadAverage1m },
    versions: versions(),
    paths: results,
  };
}

async function tried<T>(work: () => Promise<T>, what: string): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await work();
    } catch (e) {
      if (attempt >= HAND_OFF_ATTEMPTS) throw e;
      log(`${what}, attempt ${attempt}, failed (${(e as Error).message.split('\n')[0]}); trying again`);
    }
  }
}

function coturnVersion(): string {
  return spawnSync(TURNSERVER, ['--version'], { encoding: 'utf8' }).stdout.trim() || 'unknown';
}

export function parseLinksArgs(args: string[]): Partial<LinksOptions> {
  const { frames, height, width, steps } = JOB_FLAG_OPTIONS;
  const { values } = parseArgs({
    args,
    options: {
      frames,
      height,
      width,
      steps,
      'payload-mib': { type: 'string' },
      repeats: { type: 'string' },
      model: { type: 'string' },
    },
  });
  const job: Partial<Pick<JobParams, JobFlag>> = jobFlagValues(values);
  return {
    ...job,
    ...(values['payload-mib'] !== undefined && { payloadBytes: Math.round(Number(values['payload-mib']) * 2 ** 20) }),
    ...(values.repeats !== undefined && { repeats: Number(values.repeats) }),
    ...(values.model !== undefined && { model: values.model }),
  };
}

if (isMain(import.meta)) {
  const report = await runLinks(parseLinksArgs(process.argv.slice(2)));
  writeReport('links.json', report);
  console.log(JSON.stringify(report.paths, null, 2));
}
