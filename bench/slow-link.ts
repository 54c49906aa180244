// The exchange as it costs between machines on a LAN (issue 20): worker tabs of one machine talk
// over loopback, so their rank-to-rank links are paced (core/net/paced-channel.ts: each page's
// uplink a set bandwidth, each frame a set latency) so that at P = 2 the exchange takes the same
// share of a step as the projection gives the real model on 20 TFLOP/s GPUs over 125 MB/s
// (bench/projection.ts). The bandwidth is found from a P = 2 run without pacing: its compute and
// bytes per step. Then, under that link, each transport (float32, float16, int8) at each degree:
// step time, its speed-up over one browser, and the latent's deviation from one browser's, under
// Ulysses and under displaced patch parallelism (one exact step, then keys and values a step stale).
// Writes bench/out/slow-link.json.
//
//   npm run bench -- slow-link [--frames 9 --height 256 --width 256 --steps 4 --degrees 2,4]

import { parseArgs } from 'node:util';
import { predictStep } from '../core/cost-model.ts';
import { latentShape } from '../core/job.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import type { DType } from '../core/net/protocol.ts';
import type { ParallelMode } from '../core/parallel.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import { APP_MODEL_PATH, buildBenchPages, ensureBenchModel, isMain, latentFromBase64, log, machine, maxAbs, median, round, serveBenchFiles, versions, writeReport } from './lib.ts';
import { LATENCY_S, WAN_480P_WORKLOAD } from './projection.ts';

export interface SlowLinkOptions {
  frames: number;
  height: number;
  width: number;
  steps: number;
  degrees: number[];
}

export const DEFAULT_SLOW_LINK: SlowLinkOptions = { frames: 9, height: 256, width: 256, steps: 4, degrees: [2, 4] };
/** the LAN of the issue: 20 TFLOP/s GPUs, 125 MB/s links, float32 transport, P = 2 */
const TARGET = { deviceFlops: 20e12, bandwidth: 125e6, latencyS: LATENCY_S, degree: 2 };
const TRANSPORTS: DType[] = ['f32', 'f16', 'i8'];
const MODES: ParallelMode[] = ['ulysses', 'displaced'];
/** float16 sits between float32 and int8 in bytes and fidelity; int4 carries displaced deltas only */
const DISPLACED_TRANSPORTS: DType[] = ['f32', 'i8', 'i4'];
/** displaced runs: one exact step, the rest stale (the median step is a stale one) */
const WARMUP_STEPS = 1;

interface Report {
  steps: { ms: number; ranks: { rank: number; computeMs: number; bytesSent: number }[] }[];
  medianStepMs: number;
}

/** The projection's exchange time over compute time for the real model at P = 2 on the target LAN. */
export function projectedExchangeRatio(): { ratio: number; stepS: number; computeS: number; commS: number } {
  const { deviceFlops, bandwidth, latencyS, degree } = TARGET;
  const p = predictStep(WAN_480P_WORKLOAD, { ulyssesDegree: degree, cfgParallel: false }, { workerFlops: Array(degree).fill(deviceFlops), link: { bandwidth, latency: latencyS }, bytesPerElement: 4 });
  return { ratio: p.commS / p.computeS, stepS: p.stepS, computeS: p.computeS, commS: p.commS };
}

export async function runSlowLink(options: Partial<SlowLinkOptions> = {}) {
  const o = { ...DEFAULT_SLOW_LINK, ...options };
  const model = ensureBenchModel();
  await buildBenchPages();
  const tokens = tokenGrid(model, latentShape(o, model.inChannels)).count;
  const target = projectedExchangeRatio();
  log(`slow-link: bench-wan (D ${model.dim}, ${model.numLayers} blocks), ${tokens} tokens, ${o.steps} steps; target exchange/compute at P = 2: ${target.ratio.toFixed(2)} (the projection's real model on 20 TFLOP/s over 125 MB/s)`);
  const swarm = await startLocalSwarm({ workers: Math.max(...o.degrees), log });
  const started = Date.now();
  try {
    await serveBenchFiles(swarm.dashboard.context());
    const run = async (label: string, placement: Record<string, unknown>) => {
      log(`${label}: generating…`);
      const job = { prompt: 'a red ball bouncing on a wooden floor', frames: o.frames, height: o.height, width: o.width, steps: o.steps, guidance: 1, seed: 7, backend: 'swarm', ep: 'wasm', model: APP_MODEL_PATH, spotCheckRate: 0, shares: 'even', ...placement };
      const out = (await swarm.dashboard.evaluate((j) => (window as any).ditswarm.generate(j), job)) as { report: Report; latent: string };
      const { steps } = out.report;
      // the busiest rank of each step: its compute, and what it sent
      const computeMs = median(steps.map((s) => Math.max(...s.ranks.map((r) => r.computeMs))));
      const bytesPerStep = median(steps.map((s) => Math.max(...s.ranks.map((r) => r.bytesSent))));
      const result = { stepMs: round(out.report.medianStepMs, 1), computeMs: round(computeMs, 1), exchangeOverCompute: round((out.report.medianStepMs - computeMs) / computeMs, 2), bytesPerStep };
      log(`${label}: ${JSON.stringify(result)}`);
      return { result, latent: latentFromBase64(out.latent) };
    };

    const one = await run('one browser', { workers: 1 });
    // the exchange's bytes and the compute of a step at P = 2 over loopback: what the pacing is set from
    const loopback = await run('P = 2 over loopback', { workers: TARGET.degree });
    const latencyMsPerStep = 2 * model.numLayers * (TARGET.degree - 1) * TARGET.latencyS * 1000; // 2 all-to-alls a block, as the cost model counts them
    const wireMs = target.ratio * loopback.result.computeMs - latencyMsPerStep;
    if (!(wireMs > 0)) throw new Error(`the link's latency alone (${latencyMsPerStep} ms a step) passes the target exchange time: use a larger video`);
    const emulateLink = { bandwidth: Math.round(loopback.result.bytesPerStep / (wireMs / 1000)), latencyMs: TARGET.latencyS * 1000 };
    log(`emulated link: ${(emulateLink.bandwidth / 1e6).toFixed(2)} MB/s per page, ${emulateLink.latencyMs} ms`);

    const runs: Record<string, Record<string, unknown>> = {};
    for (const degree of o.degrees) {
      for (const parallel of MODES)
        for (const dtype of parallel === 'displaced' ? DISPLACED_TRANSPORTS : TRANSPORTS) {
          const { result, latent } = await run(`P = ${degree}, ${parallel} ${dtype}, emulated LAN`, { workers: degree, dtype, parallel, warmupSteps: WARMUP_STEPS, emulateLink });
          runs[`P=${degree} ${parallel === 'displaced' ? 'displaced ' : ''}${dtype}`] = { degree, parallel, dtype, ...result, speedupOverOne: round(one.result.stepMs / result.stepMs, 3), latentMaxAbsVsOne: maxAbs(latent, one.latent) };
        }
    }
    const exact = runs[`P=${TARGET.degree} f32`] as { exchangeOverCompute: number };
    return {
      benchmark: 'slow-link',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: { model: { path: 'bench/out/models/bench-wan', ...model }, tokens, ...o, guidance: 1, ep: 'wasm', shares: 'even', tabs: 'worker tabs of one Chromium on this machine' },
      machine: machine(swarm.browserVersion),
      versions: versions(),
      target: { ...TARGET, projected: { stepS: round(target.stepS, 2), computeS: round(target.computeS, 2), commS: round(target.commS, 2), exchangeOverCompute: round(target.ratio, 2) } },
      emulateLink,
      /** the exchange over compute the emulated link gave at P = 2 in float32, against the target */
      emulatedRatio: { measured: exact.exchangeOverCompute, target: round(target.ratio, 2) },
      runs: { one: one.result, loopbackP2: loopback.result, ...runs },
      notYet: 'overlap of the exchange with compute per head group: not built; the demo accuracy per mode and the deviation per step: not measured',
    };
  } finally {
    await swarm.close();
  }
}

export function parseSlowLinkArgs(args: string[]): Partial<SlowLinkOptions> {
  const { values } = parseArgs({ args, options: Object.fromEntries(Object.keys(DEFAULT_SLOW_LINK).map((k) => [k, { type: 'string' as const }])) });
  const out: Partial<SlowLinkOptions> = {};
  for (const [k, v] of Object.entries(values)) {
    const numbers = v!.split(',').map(Number);
    if (!numbers.every((n) => Number.isInteger(n) && n >= 1)) throw new Error(`--${k} takes ${k === 'degrees' ? 'whole numbers ≥ 1, comma-separated' : 'a whole number ≥ 1'}, got ${v}`);
    if (k === 'degrees') out.degrees = numbers;
    else out[k as Exclude<keyof SlowLinkOptions, 'degrees'>] = numbers[0];
  }
  return out;
}

if (isMain(import.meta)) {
  const report = await runSlowLink(parseSlowLinkArgs(process.argv.slice(2)));
  writeReport('slow-link.json', report);
  console.log(JSON.stringify({ emulatedRatio: report.emulatedRatio, emulateLink: report.emulateLink, runs: report.runs }, null, 2));
}
