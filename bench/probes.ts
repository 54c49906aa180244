// The two measurements the cost model needs, taken in Chromium tabs like the workers': matmul
// throughput on the wasm EP (rank/throughput-probe.ts) and the tab↔tab data-channel link (the app's Link
// framing and flow control over a raw RTCPeerConnection between two probe pages).
import type { BrowserContext } from '@playwright/test';
import { fitLink, type LinkSpeed } from '../core/cost-model.ts';
import type { ThroughputProbe } from '../rank/throughput-probe.ts';
import { log, median, openProbePage } from './lib.ts';

type Bench = {
  throughput(ep: 'wasm' | 'webgpu', size: number, runs: number): Promise<ThroughputProbe>;
  linkOffer(): Promise<RTCSessionDescriptionInit>;
  linkAnswer(offer: RTCSessionDescriptionInit): Promise<RTCSessionDescriptionInit>;
  linkAccept(answer: RTCSessionDescriptionInit): Promise<void>;
  linkReady(): Promise<void>;
  linkExchange(bytes: number): Promise<number>;
  linkSend(bytes: number): Promise<void>;
  linkReceive(bytes: number): Promise<number>;
  linkClose(): void;
};
declare const bench: Bench;

export interface ThroughputReport {
  ep: 'wasm';
  /** the cost model's FLOP/s: the best of the repeats of the default probe (256³) */
  flops: number;
  /** the cost model's attention scores/s: the best of the same repeats */
  softmaxRate: number;
  probes: ThroughputProbe[];
}

export async function measureThroughput(
  context: BrowserContext,
  origin: string,
  repeats = 5,
): Promise<ThroughputReport> {
  const page = await openProbePage(context, origin);
  try {
    const probes: ThroughputProbe[] = [];
    for (let i = 0; i < repeats; i++)
      for (const size of [256, 512])
        probes.push(await page.evaluate(([n]) => bench.throughput('wasm', n, 7), [size] as const));
    // the best of the repeats: a short probe must not take another process's burst for the machine's speed
    const standard = probes.filter((p) => p.size === 256);
    return {
      ep: 'wasm',
      flops: Math.max(...standard.map((p) => p.flops)),
      softmaxRate: Math.max(...standard.map((p) => p.softmaxRate)),
      probes,
    };
  } finally {
    await page.close();
  }
}

export interface LinkReport {
  /** both tabs send at once, as every rank does in an all-to-all */
  direction: 'both ways at once';
  samples: { bytes: number; seconds: number }[];
  /** t = latency + bytes / bandwidth fitted to the median time of each size */
  fitted: LinkSpeed;
  /** bytes / seconds of the largest transfer, both ways at once (each way) */
  largestTransferBytesPerS: number;
  /** the same transfer one way only, the other tab silent: what a rank gets while its peer computes */
  oneWayBytesPerS: number;
}

/** the link probe's transfers, bytes: from where latency dominates to where bandwidth does */
export const LINK_PROBE_SIZES = [256 << 10, 1 << 20, 4 << 20, 8 << 20];

/** The link probe, tried up to `attempts` times: a data channel that never opens must not hang the bench. */
export async function measureLink(
  context: BrowserContext,
  origin: string,
  sizes = LINK_PROBE_SIZES,
  attempts = 3,
): Promise<LinkReport> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await probeLink(context, origin, sizes);
    } catch (e) {
      if (attempt >= attempts) throw e;
      log(`link probe attempt ${attempt} failed (${(e as Error).message.split('\n')[0]}); trying again`);
    }
  }
}

export function withTimeout<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>(
    (_, reject) => (timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms / 1000} s`)), ms)),
  );
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}

async function probeLink(context: BrowserContext, origin: string, sizes: number[], repeats = 3): Promise<LinkReport> {
  const [a, b] = [await openProbePage(context, origin), await openProbePage(context, origin)];
  const connect = async () => {
    const offer = await a.evaluate(() => bench.linkOffer());
    const answer = await b.evaluate((o) => bench.linkAnswer(o), offer);
    await a.evaluate((x) => bench.linkAccept(x), answer);
    await Promise.all([a.evaluate(() => bench.linkReady()), b.evaluate(() => bench.linkReady())]);
  };
  const measure = async (): Promise<LinkReport> => {
    // a link that does not open is tried again soon, not after the whole probe's time
    await withTimeout(connect(), 30_000, 'the probe link opening');
    await Promise.all([a, b].map((p) => p.evaluate(() => bench.linkExchange(64 << 10)))); // warm-up
    const samples: { bytes: number; seconds: number }[] = [];
    for (let r = 0; r < repeats; r++)
      for (const bytes of sizes) {
        const [ta, tb] = await Promise.all([a, b].map((p) => p.evaluate((n) => bench.linkExchange(n), bytes)));
        samples.push({ bytes, seconds: Math.max(ta, tb) });
      }
    const oneWay: number[] = [];
    for (let r = 0; r < repeats; r++) {
      const bytes = sizes[sizes.length - 1];
      const [, seconds] = await Promise.all([
        a.evaluate((n) => bench.linkSend(n), bytes),
        b.evaluate((n) => bench.linkReceive(n), bytes),
      ]);
      oneWay.push(bytes / seconds);
    }
    await Promise.all([a, b].map((p) => p.evaluate(() => bench.linkClose())));
    // medians per size: one transfer slowed by another process must not bend the fit
    const perSize = sizes.map((bytes) => ({
      bytes,
      seconds: median(samples.filter((s) => s.bytes === bytes).map((s) => s.seconds)),
    }));
    const largest = perSize[perSize.length - 1];
    return {
      direction: 'both ways at once',
      samples,
      fitted: fitLink(perSize),
      largestTransferBytesPerS: largest.bytes / largest.seconds,
      oneWayBytesPerS: median(oneWay),
    };
  };
  try {
    return await withTimeout(measure(), 120_000, 'the link probe');
  } finally {
    await a.close(); // also ends an evaluate still waiting on a channel that never opened
    await b.close();
  }
}
