// Per-step latency of the bench-size model on P = 1, 2, 3 worker tabs (wasm EP, one thread each),
// measured in one run on one swarm: each rank's compute, communication wait and idle time, bytes
// sent, speed-up over P = 1, parity with P = 1, and the cost model's prediction next to it.
// Writes bench/out/scaling.json.
//
//   npm run bench -- scaling [--frames 45 --height 512 --width 512 --steps 2 --guidance 1
//                             --degrees 1,2,3 --no-fp16 --no-cfg]

import { cpus } from 'node:os';
import { parseArgs } from 'node:util';
import type { JobOverrides, JobResult } from '../app/automation.ts';
import { forwardBytes, predictStep, type Hardware, type Workload } from '../core/cost-model.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { type JobParams } from '../core/job.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import { JOB_FLAG_OPTIONS, jobFlagValues, type JobFlag } from '../server/cli/job-flags.ts';
import {
  buildBenchPages,
  benchModel,
  isMain,
  latentFromBase64,
  log,
  machine,
  maxAbs,
  round,
  serveBenchPages,
  versions,
  waitForQuietMachine,
  writeReport,
  SMOKE_MODEL_DIR,
  type OnModel,
  BENCH_MODEL_PATH,
  NO_SPOT_CHECKS,
} from './lib.ts';
import { LINK_PROBE_SIZES, measureLink, measureThroughput } from './probes.ts';
import { defined } from '../core/defined.ts';

export interface ScalingOptions extends Pick<JobParams, JobFlag> {
  degrees: number[];
  /** also run the largest degree ≤ 2 with fp16 transport (the job's dtype 'f16') */
  fp16: boolean;
  /** also compare a guided job on one worker with CFG parallel on two */
  cfg: boolean;
  /** the tab↔tab link probe's transfer sizes, bytes (probes.ts) */
  linkSizes: number[];
  /** the matmul throughput probe's repeats, whose best is taken (probes.ts) */
  probeRepeats: number;
}

/** 45 frames at 512×512: 12 latent frames × 32 × 32 = 12,288 tokens. */
export const DEFAULT_SCALING: ScalingOptions = {
  frames: 45,
  height: 512,
  width: 512,
  steps: 2,
  guidance: 1,
  seed: 42,
  degrees: [1, 2, 3],
  fp16: true,
  cfg: true,
  linkSizes: LINK_PROBE_SIZES,
  probeRepeats: 5,
};
/** `npm run bench -- --smoke`: every path of the bench (P = 1 and 2, float16, CFG parallel) at 16 tokens */
export const SMOKE_SCALING: Partial<ScalingOptions> & OnModel = {
  model: SMOKE_MODEL_DIR,
  frames: 1,
  height: 32,
  width: 32,
  steps: 1,
  degrees: [1, 2],
  linkSizes: [64 << 10, 256 << 10],
  probeRepeats: 1,
};
/** the CFG-parallel comparison's job: 13 frames at the bench size (4,096 tokens), guided */
const CFG_JOB = { frames: 13, guidance: 5 } as const;

interface RankReport {
  rank: number;
  computeMs: number;
  commMs: number;
  bytesSent: number;
}

export async function runScaling(options: Partial<ScalingOptions> & OnModel = {}) {
  const o = { ...DEFAULT_SCALING, ...options };
  const folder = await benchModel(options.model);
  const model = folder.config;
  await buildBenchPages();
  const shape = latentShape(o, wan21Latent(model.inChannels));
  const tokens = tokenGrid(model, shape).count;
  const workload: Workload = { model, tokens, textTokens: 32, passes: o.guidance !== 1 ? 2 : 1 };
  log(
    `scaling: ${folder.path} (D ${model.dim}, ${model.numLayers} blocks), ${tokens} tokens, ${o.steps} steps, ` +
      `${workload.passes} pass(es)/step, P = ${o.degrees.join(', ')}`,
  );

  const workerTabs = Math.max(...o.degrees);
  const swarm = await startLocalSwarm({ workers: workerTabs, modelFolders: folder.modelFolders, log: (l) => log(l) });
  const started = Date.now();
  const machineAtStart = machine(swarm.browserVersion);
  try {
    const context = swarm.dashboard.context();
    await serveBenchPages(context);
    log('probing matmul throughput and the tab↔tab link…');
    const throughput = await measureThroughput(context, swarm.server.url, o.probeRepeats);
    log(
      `probe: ${(throughput.flops / 1e9).toFixed(1)} GFLOP/s per thread (256³ matmul), ` +
        `${(throughput.softmaxRate / 1e9).toFixed(2)} G scores/s (bias + softmax)`,
    );
    const link = await measureLink(context, swarm.server.url, o.linkSizes);
    log(
      `probe: link ${(link.fitted.bandwidth / 1e6).toFixed(2)} MB/s, ` +
        `latency ${(link.fitted.latency * 1000).toFixed(1)} ms`,
    );

    const generate = async (degree: number, extra: JobOverrides = {}) => {
      const job: JobOverrides = {
        prompt: 'a red ball bouncing on a wooden floor',
        frames: o.frames,
        height: o.height,
        width: o.width,
        steps: o.steps,
        guidance: o.guidance,
        seed: o.seed,
        backend: 'swarm',
        workers: degree,
        ep: 'wasm',
        model: BENCH_MODEL_PATH,
        spotCheckRate: NO_SPOT_CHECKS,
        ...extra,
      };
      const out = await swarm.dashboard.evaluate((j) => window.ditswarm.generate(j), job);
      return { report: out.report, latent: latentFromBase64(out.latent) };
    };

    const runs: Record<string, ReturnType<typeof summarise> & { loadAverage1m: { start: number; end: number } }> = {};
    let reference: Float32Array | null = null;
    const latents = new Map<number, Float32Array>();
    const failures: Record<string, string> = {};
    for (const degree of o.degrees) {
      const load = await waitForQuietMachine();
      log(`P = ${degree}: generating… (load ${load.loadAverage1m})`);
      try {
        const { report, latent } = await generate(degree);
        reference ??= latent;
        latents.set(degree, latent);
        const run = {
          ...summarise(degree, report, maxAbs(latent, reference), predictionFor(degree)),
          loadAverage1m: { start: load.loadAverage1m, end: machine().loadAverage1m },
        };
        runs[degree] = run;
        log(
          `P = ${degree}: step ${run.stepMs.toFixed(0)} ms (predicted ${run.predicted.stepMs.toFixed(0)}), ` +
            `parity ${run.parityMaxAbs.toExponential(2)}`,
        );
      } catch (e) {
        failures[degree] = (e as Error).message.split('\n')[0];
        log(`P = ${degree} failed: ${failures[degree]}`);
        if (degree === 1)
          throw new Error(`the P = 1 baseline failed, nothing to compare with: ${failures[degree]}`, { cause: e });
      }
    }
    const measured = o.degrees.filter((d) => Object.hasOwn(runs, d));

    function predictionFor(degree: number, bytesPerElement: 2 | 4 = 4) {
      // ranks on one machine share its cores: with more ranks than cores each gets a share
      const share = Math.min(1, cpus().length / degree);
      const hw: Hardware = {
        workerFlops: Array<number>(degree).fill(throughput.flops * share),
        workerSoftmaxRates: Array<number>(degree).fill(throughput.softmaxRate * share),
        link: link.fitted,
        bytesPerElement,
      };
      const p = predictStep(workload, { ulyssesDegree: degree, cfgParallel: false }, hw);
      return {
        stepMs: p.stepS * 1000,
        computeMs: p.computeS * 1000,
        commMs: p.commS * 1000,
        ioMs: p.ioS * 1000,
        bytesPerRank: p.bytesPerRank,
        flopsPerRank: p.flopsPerRank,
        coreShare: share,
      };
    }

    // fp16 activation transport (the job's dtype) at the largest degree ≤ 2, against the fp32 run of that degree
    let fp16: {
      degree: number;
      bytesRatio: number | null;
      maxAbsVsFp32: number | null;
      maxAbsVsP1: number | null;
      stepMs: number | null;
      note: string;
    } | null = null;
    const fp16Degree = Math.max(...measured.filter((d) => d > 1 && d <= 2));
    if (o.fp16 && Number.isFinite(fp16Degree)) {
      await waitForQuietMachine();
      log(`P = ${fp16Degree}, fp16 transport: generating…`);
      try {
        const { report, latent } = await generate(fp16Degree, { dtype: 'f16' });
        fp16 = {
          degree: fp16Degree,
          bytesRatio: round(sumBytes(report.steps) / sumBytes(runs[fp16Degree].steps), 4),
          maxAbsVsFp32: maxAbs(latent, defined(latents.get(fp16Degree), `the fp32 latent of P = ${fp16Degree}`)),
          maxAbsVsP1: maxAbs(latent, defined(reference, 'the P = 1 latent')),
          stepMs: report.steps[report.steps.length - 1].ms,
          note: 'fp16 activation transport (job dtype "f16") vs the fp32 run of the same degree',
        };
      } catch (e) {
        fp16 = {
          degree: fp16Degree,
          bytesRatio: null,
          maxAbsVsFp32: null,
          maxAbsVsP1: null,
          stepMs: null,
          note: `the fp16 run failed: ${(e as Error).message.split('\n')[0]}`,
        };
      }
      log(`fp16: ${fp16.note}`);
    }

    // CFG parallel: a guided job (two passes per step) on one worker vs its passes on two groups of one
    let cfg: Record<string, unknown> | null = null;
    if (o.cfg && workerTabs >= 2) {
      const job = { frames: CFG_JOB.frames, height: o.height, width: o.width, guidance: CFG_JOB.guidance };
      const cfgWork: Workload = {
        ...workload,
        tokens: tokenGrid(model, latentShape(job, wan21Latent(model.inChannels))).count,
        passes: 2,
      };
      try {
        await waitForQuietMachine();
        log(`CFG parallel: ${cfgWork.tokens} tokens, guidance ${CFG_JOB.guidance}, one worker…`);
        const one = await generate(1, job);
        await waitForQuietMachine();
        log('CFG parallel: two groups of one…');
        const two = await generate(1, { ...job, cfgParallel: true }); // workers = the Ulysses degree of each group
        const last = (r: JobResult['report']) => r.steps[r.steps.length - 1].ms;
        const hw: Hardware = {
          workerFlops: [throughput.flops, throughput.flops],
          workerSoftmaxRates: [throughput.softmaxRate, throughput.softmaxRate],
          link: link.fitted,
          bytesPerElement: 4,
        };
        const predicted = (cfgParallel: boolean) =>
          round(predictStep(cfgWork, { ulyssesDegree: 1, cfgParallel }, hw).stepS * 1000, 1);
        cfg = {
          tokens: cfgWork.tokens,
          guidance: CFG_JOB.guidance,
          oneWorkerStepMs: last(one.report),
          cfgParallelStepMs: last(two.report),
          speedup: round(last(one.report) / last(two.report)),
          parityMaxAbs: maxAbs(two.latent, one.latent),
          reportSaysCfgParallel: two.report.placement.layout.cfgGroups === 2,
          predicted: { oneWorkerStepMs: predicted(false), cfgParallelStepMs: predicted(true) },
        };
        log(`CFG parallel: ${JSON.stringify(cfg)}`);
      } catch (e) {
        cfg = { failed: (e as Error).message.split('\n')[0] };
      }
    }

    const speedup = Object.fromEntries(
      o.degrees
        .filter((d) => d > 1)
        .map((d) => [String(d), Object.hasOwn(runs, d) ? round(runs[1].stepMs / runs[d].stepMs) : null]),
    );
    const predictionError = Object.fromEntries(
      o.degrees.map((d) => [String(d), Object.hasOwn(runs, d) ? runs[d].predictionError : null]),
    );
    return {
      benchmark: 'scaling',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: {
        model: {
          path: folder.path,
          servedAs: `${BENCH_MODEL_PATH} (the server, with Range)`,
          ...model,
        },
        tokens,
        latentShape: shape,
        frames: o.frames,
        height: o.height,
        width: o.width,
        steps: o.steps,
        guidance: o.guidance,
        passesPerStep: workload.passes,
        seed: o.seed,
        backend: 'swarm',
        ep: 'wasm',
        threadsPerWorker: 1,
        spotCheckRate: NO_SPOT_CHECKS,
        workerTabsOpen: workerTabs,
        transport: 'fp32',
        stepMsIs:
          'the last step (the first one also pays onnxruntime first-run allocation); every step is listed under runs',
      },
      machine: { ...machineAtStart, loadAverage1mAtEnd: machine().loadAverage1m },
      versions: versions(),
      probes: { throughput, link },
      runs,
      failures,
      speedup,
      predictionError,
      fp16BytesRatio: fp16?.bytesRatio ?? null,
      fp16MaxAbs: fp16?.maxAbsVsFp32 ?? null,
      fp16,
      cfgParallel: cfg,
      expectedBytesPerRankPerStep: Object.fromEntries(
        o.degrees.map((d) => [String(d), forwardBytes(model, tokens, d, 4) * workload.passes]),
      ),
    };
  } finally {
    await swarm.close();
  }
}

const sumBytes = (steps: { ranks: RankReport[] }[]) =>
  steps.reduce((n, s) => n + s.ranks.reduce((m, r) => m + r.bytesSent, 0), 0);

/** One run: every step split per rank into compute, comm wait and idle (the step's wall time minus both). */
function summarise(
  degree: number,
  report: JobResult['report'],
  parityMaxAbs: number,
  predicted: {
    stepMs: number;
    computeMs: number;
    commMs: number;
    ioMs: number;
    bytesPerRank: number;
    flopsPerRank: number;
    coreShare: number;
  },
) {
  const steps = report.steps.map((s) => {
    // the rank that waited least in the exchange waited only for the bytes; the others also for a slower peer
    const transferMs = Math.min(...s.ranks.map((r) => r.commMs));
    return {
      ms: round(s.ms, 1),
      ranks: s.ranks.map((r) => ({
        rank: r.rank,
        computeMs: round(r.computeMs, 1),
        commMs: round(r.commMs, 1),
        peerWaitMs: round(r.commMs - transferMs, 1),
        idleMs: round(s.ms - r.computeMs - r.commMs, 1),
        bytesSent: r.bytesSent,
      })),
    };
  });
  const last = steps[steps.length - 1];
  const mean = (f: (r: (typeof last.ranks)[number]) => number) =>
    round(last.ranks.reduce((a, r) => a + f(r), 0) / last.ranks.length, 1);
  return {
    degree,
    workers: report.workers.map((w) => w.id),
    setupMs: round(report.setupMs, 0),
    totalMs: round(report.totalMs, 0),
    stepMs: last.ms,
    meanStepMs: round(steps.reduce((a, s) => a + s.ms, 0) / steps.length, 1),
    /** the last step, mean over ranks */
    split: {
      computeMs: mean((r) => r.computeMs),
      /** exchange time: the bytes on the wire plus waiting for a slower peer */
      commMs: mean((r) => r.commMs),
      peerWaitMs: mean((r) => r.peerWaitMs),
      /** the step's wall time outside this rank's forward: coordinator patches out, rows back, RPC, Euler step */
      idleMs: mean((r) => r.idleMs),
      bytesSent: mean((r) => r.bytesSent),
    },
    steps,
    parityMaxAbs,
    latentSha256: report.latentSha256,
    predicted: {
      ...predicted,
      stepMs: round(predicted.stepMs, 1),
      computeMs: round(predicted.computeMs, 1),
      commMs: round(predicted.commMs, 1),
      ioMs: round(predicted.ioMs, 1),
    },
    predictionError: round(Math.abs(predicted.stepMs - last.ms) / last.ms),
    /** what the dashboard itself predicted for this job (from the workers' own probes), and its error */
    dashboardPredictedStepMs: report.placement.prediction
      ? round(report.placement.prediction.predictedStepMs, 1)
      : null,
    dashboardPredictionError: report.placement.prediction
      ? round((report.placement.prediction.predictedStepMs - last.ms) / last.ms)
      : null,
  };
}

export function parseScalingArgs(args: string[]): Partial<ScalingOptions> {
  const { values } = parseArgs({
    args,
    options: {
      ...JOB_FLAG_OPTIONS,
      degrees: { type: 'string' },
      'no-fp16': { type: 'boolean', default: false },
      'no-cfg': { type: 'boolean', default: false },
    },
  });
  const out: Partial<ScalingOptions> = jobFlagValues(values);
  if (values.degrees) out.degrees = values.degrees.split(',').map(Number);
  if (values['no-fp16']) out.fp16 = false;
  if (values['no-cfg']) out.cfg = false;
  if (out.degrees && out.degrees[0] !== 1)
    throw new Error(`--degrees must start with 1 (the baseline), got ${values.degrees}`);
  return out;
}

if (isMain(import.meta)) {
  const report = await runScaling(parseScalingArgs(process.argv.slice(2)));
  writeReport('scaling.json', {
    ...report,
    localOverhead: null,
    localOverheadNote: 'run `npm run bench` for the local-backend overhead',
  });
}
