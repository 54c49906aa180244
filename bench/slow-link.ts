// The exchange as it costs between machines on a LAN (issue 20). Each worker is a machine of its
// own (bench/machines.ts: a Chromium pinned to a core and given `share` of it, so that four workers
// on a machine of fewer cores compute as four equal machines would, each at a fraction of the speed),
// and the rank-to-rank links are paced (core/net/paced-channel.ts: each page's uplink a set
// bandwidth, each frame a set latency) so that at P = 2 the exchange takes the same share of a step
// as the projection gives the real model on 20 TFLOP/s GPUs over 125 MB/s (bench/projection.ts).
// The bandwidth is found from a P = 2 run without pacing (its compute and bytes per step), then
// checked by a paced float32 run and corrected once where that run's ratio is off by more than
// CALIBRATION_SLACK. Under that link, each transport at each degree: step time, speed-up over one
// browser, and the latent's deviation from one browser's after every step, under Ulysses and under
// displaced patch parallelism (one exact step, then keys and values a step stale), Ulysses both with
// all heads at once and in head groups (attention over one group while the next is on the wire,
// and how much of the exchange that hid behind compute); then the real
// model's guided job (guidance 5: two passes a step), where P = 4 is CFG parallel × 2. One machine
// is timed before and after each of the two sections (bothEnds). Last, the
// trained demo's held-out accuracy in each mode (npm run eval-demo). Writes bench/out/slow-link.json.
//
//   npm run bench -- slow-link [--frames 9 --height 256 --width 256 --steps 6 --degrees 2,4 --share 0.45
//     --accuracy 1]
//
// Needs a writable cpu cgroup (root), as bench uneven does.

import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { JobOverrides } from '../app/automation.ts';
import { predictStep } from '../core/cost-model.ts';
import { defined } from '../core/defined.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { DTYPES, type DType } from '../core/net/protocol.ts';
import { MAX_HEAD_GROUPS } from '../core/parallel.ts';
import {
  BENCH_MODEL_PATH,
  buildBenchPages,
  benchModel,
  isMain,
  latentFromBase64,
  log,
  machine,
  maxAbs,
  median,
  NO_SPOT_CHECKS,
  OUT_DIR,
  ROOT,
  round,
  versions,
  writeReport,
} from './lib.ts';
import { startMachines } from './machines.ts';
import { LATENCY_S, WAN_480P_WORKLOAD } from './projection.ts';

export interface SlowLinkOptions {
  frames: number;
  height: number;
  width: number;
  steps: number;
  degrees: number[];
  /** of a core, each worker's machine */
  share: number;
  /** 1: measure the demo's held-out accuracy in each mode (minutes); 0: leave it out */
  accuracy: number;
  /** 1: the guided runs (two passes a step: CFG parallel beside displaced); 0: leave them out */
  guided: number;
  /** the transports of the Ulysses runs (each in one head group and in several) and of the displaced runs */
  transports: DType[];
  displacedTransports: DType[];
}

// 6 steps: the median step is a stale step that waits for the one before's gather (the first stale
// step waits for none: with fewer steps it weighs on the median, and a link-bound mode looks faster)
export const DEFAULT_SLOW_LINK: SlowLinkOptions = {
  frames: 9,
  height: 256,
  width: 256,
  steps: 6,
  degrees: [2, 4],
  share: 0.45,
  accuracy: 1,
  guided: 1,
  transports: ['f32', 'f16', 'i8'],
  // float16 sits between float32 and int8 in bytes and fidelity; int4 carries displaced deltas only
  displacedTransports: ['f32', 'i8', 'i4'],
};
/**
 * `npm run bench -- --smoke`: P = 2 on machines of a whole core, float32 and displaced int4, without the accuracy or
 * guided runs; at 128 tokens, as at fewer the link paced to the target ratio is so slow that the mesh probe's fixed
 * bytes take most of each job
 */
export const SMOKE_SLOW_LINK: Partial<SlowLinkOptions> = {
  frames: 5,
  height: 128,
  width: 128,
  steps: 2,
  degrees: [2],
  share: 1,
  accuracy: 0,
  guided: 0,
  transports: ['f32'],
  displacedTransports: ['i4'],
};
/** the LAN of the issue: 20 TFLOP/s GPUs, 125 MB/s links, float32 transport, P = 2 */
const TARGET = { deviceFlops: 20e12, bandwidth: 125e6, latencyS: LATENCY_S, degree: 2 };
/** a paced run's exchange/compute ratio this far from the target has the bandwidth corrected once */
const CALIBRATION_SLACK = 0.15;
/**
 * Ulysses runs in one head group (no overlap) and in this many (core/parallel.ts MAX_HEAD_GROUPS:
 * 6 heads a rank at P = 2, 3 at P = 4)
 */
const HEAD_GROUPS = [1, MAX_HEAD_GROUPS];
/** A run's row in the report: "P=2 i8", "P=2 i8 in 3 head groups", "P=2 displaced i4". */
const ulyssesRow = (degree: number, dtype: DType, headGroups: number): string =>
  `P=${degree} ${dtype}${headGroups > 1 ? ` in ${headGroups} head groups` : ''}`;
const displacedRow = (degree: number, dtype: DType): string => `P=${degree} displaced ${dtype}`;
/** displaced runs: one exact step, the rest stale (the median step is a stale one) */
const WARMUP_STEPS = 1;
/** the machines' CFS period (bench/machines.ts): short, as the kernel allows (a quota ≥ 1 ms: 0.45 of 4 ms is 1.8) */
const PERIOD_US = 4_000;
/** the real model's guidance (Wan2.1's model_index defaults): two passes a step */
const GUIDANCE = 5;

/** The projection's exchange time over compute time for the real model at P = 2 on the target LAN. */
export function projectedExchangeRatio(): { ratio: number; stepS: number; computeS: number; commS: number } {
  const { deviceFlops, bandwidth, latencyS, degree } = TARGET;
  const p = predictStep(
    WAN_480P_WORKLOAD,
    { ulyssesDegree: degree, cfgParallel: false },
    {
      workerFlops: Array<number>(degree).fill(deviceFlops),
      link: { bandwidth, latency: latencyS },
      bytesPerElement: 4,
    },
  );
  return { ratio: p.commS / p.computeS, stepS: p.stepS, computeS: p.computeS, commS: p.commS };
}

/**
 * One machine's step as the runs between two of its runs are measured against: the median of both
 * runs' steps, since the shared host's load drifts over the minutes between them. The latents are
 * the first run's (the same seed gives the same latent).
 */
function bothEnds<R extends { result: { stepMs: number; stepsMs: number[] } }>(first: R, last: R): R {
  const stepsMs = [...first.result.stepsMs, ...last.result.stepsMs];
  return {
    ...first,
    result: {
      ...first.result,
      stepMs: round(median(stepsMs), 1),
      stepsMs,
      stepMsEachRun: [first.result.stepMs, last.result.stepMs],
    },
  };
}

/** The largest difference after each step, and that over the reference's largest value then. */
function deviationPerStep(steps: Float32Array[], reference: Float32Array[]) {
  return steps.map((latent, i) => {
    const d = maxAbs(latent, reference[i]);
    const scale = reference[i].reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    return { maxAbs: round(d, 5), relative: round(d / scale, 5) };
  });
}

/**
 * The demo's held-out colour and direction accuracy (npm run eval-demo, in Node through the same
 * rank code) with these flags.
 */
function demoAccuracy(
  label: string,
  flags: string[],
): { colorAccuracy: number; directionAccuracy: number; flags: string[] } {
  const out = join(OUT_DIR, `demo-eval-${label}.json`);
  log(`demo accuracy, ${label}: npm run eval-demo -- ${flags.join(' ')}…`);
  const ran = spawnSync(
    process.execPath,
    ['--import', 'tsx', 'demo/cli/eval-demo.ts', '--seeds', '2', '--out', out, ...flags],
    { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] },
  );
  if (ran.status !== 0) throw new Error(`eval-demo ${flags.join(' ')} failed with status ${ran.status}`);
  const { colorAccuracy, directionAccuracy } = JSON.parse(readFileSync(out, 'utf8')) as {
    colorAccuracy: number;
    directionAccuracy: number;
  };
  return { colorAccuracy, directionAccuracy, flags };
}

export async function runSlowLink(options: Partial<SlowLinkOptions> = {}) {
  const o = { ...DEFAULT_SLOW_LINK, ...options };
  const folder = await benchModel();
  const model = folder.config;
  await buildBenchPages();
  const tokens = tokenGrid(model, latentShape(o, wan21Latent(model.inChannels))).count;
  const target = projectedExchangeRatio();
  const workers = Math.max(...o.degrees, o.guided ? 4 : 1); // the guided runs go to P = 4
  log(
    `slow-link: ${folder.path} (D ${model.dim}, ${model.numLayers} blocks), ${tokens} tokens, ${o.steps} steps, ` +
      `${workers} machines of ${o.share} of a core; target exchange/compute at P = 2: ${target.ratio.toFixed(2)} ` +
      "(the projection's real model on 20 TFLOP/s over 125 MB/s)",
  );
  // the dashboard on core 0 beside the even machines; the odd ones on core 1. A short CFS period: a
  // slower machine is slower all the time, not stopped for most of each period (a rank's every
  // message to its peers and engine would wait for its next one)
  const machines = await startMachines(
    Array.from({ length: workers }, (_, i) => ({ name: `machine-${i}`, core: i % 2, share: o.share })),
    { periodUs: PERIOD_US, model: folder },
  );
  const started = Date.now();
  try {
    const run = async (label: string, placement: JobOverrides) => {
      log(`${label}: generating…`);
      const job: JobOverrides = {
        prompt: 'a red ball bouncing on a wooden floor',
        frames: o.frames,
        height: o.height,
        width: o.width,
        steps: o.steps,
        guidance: 1,
        seed: 7,
        backend: 'swarm',
        ep: 'wasm',
        model: BENCH_MODEL_PATH,
        spotCheckRate: NO_SPOT_CHECKS,
        shares: 'even',
        cfgParallel: false,
        ...placement,
      };
      const out = await machines.dashboard.evaluate(([j, opts]) => window.ditswarm.generate(j, opts), [
        job,
        { stepLatents: true },
      ] as const);
      const { steps } = out.report;
      // the busiest rank of each step: its compute, and what it sent
      const computeMs = median(steps.map((s) => Math.max(...s.ranks.map((r) => r.computeMs))));
      const bytesPerStep = median(steps.map((s) => Math.max(...s.ranks.map((r) => r.bytesSent))));
      // the exchange hidden behind compute a step: the least any rank hid (the step waits for the others)
      const overlapMs = median(steps.map((s) => Math.min(...s.ranks.map((r) => r.overlapMs))));
      const { layout, settings } = out.report.placement;
      const { world, ulyssesDegree } = layout;
      const { parallel, dtype, headGroups } = settings;
      const cfgParallel = layout.cfgGroups === 2;
      const result = {
        world,
        ulyssesDegree,
        cfgParallel,
        parallel,
        dtype,
        headGroups,
        stepMs: round(out.report.medianStepMs, 1),
        stepsMs: steps.map((s) => round(s.ms, 0)),
        computeMs: round(computeMs, 1),
        overlapMs: round(overlapMs, 1),
        exchangeOverCompute: round((out.report.medianStepMs - computeMs) / computeMs, 2),
        bytesPerStep,
      };
      log(`${label}: ${JSON.stringify(result)}`);
      return { result, stepLatents: defined(out.stepLatents, 'the step latents asked for').map(latentFromBase64) };
    };
    type Run = Awaited<ReturnType<typeof run>>;
    const against = (one: Run, r: Run) => ({
      ...r.result,
      speedupOverOne: round(one.result.stepMs / r.result.stepMs, 3),
      latentMaxAbsVsOne: maxAbs(
        defined(r.stepLatents.at(-1), "a run's last latent"),
        defined(one.stepLatents.at(-1), "one machine's last latent"),
      ),
      deviationPerStep: deviationPerStep(r.stepLatents, one.stepLatents),
    });

    // a fresh tab's WebAssembly gets faster over its first seconds of compute (the browser optimises
    // what runs hot): every machine computes a job before any is timed
    await run('warm-up on every machine (not timed)', { workers });
    const one = await run('one machine', { workers: 1 });
    // the exchange's bytes and the compute of a step at P = 2 over loopback: what the pacing is set from
    const loopback = await run('P = 2 over loopback', { workers: TARGET.degree });
    // 2 all-to-alls a block, as the cost model counts them
    const latencyMsPerStep = 2 * model.numLayers * (TARGET.degree - 1) * TARGET.latencyS * 1000;
    const wireMs = target.ratio * loopback.result.computeMs - latencyMsPerStep;
    if (!(wireMs > 0))
      throw new Error(
        `the link's latency alone (${latencyMsPerStep} ms a step) passes the target exchange time: use a larger video`,
      );
    let emulateLink = {
      bandwidth: Math.round(loopback.result.bytesPerStep / (wireMs / 1000)),
      latencyMs: TARGET.latencyS * 1000,
    };
    const calibration: { bandwidth: number; exchangeOverCompute: number }[] = [];
    // the ratio is the exchange's with nothing hidden: all heads at once
    const exactRun = () =>
      run(`P = 2, ulysses f32, ${(emulateLink.bandwidth / 1e6).toFixed(2)} MB/s`, {
        workers: TARGET.degree,
        dtype: 'f32',
        parallel: 'ulysses',
        headGroups: 1,
        emulateLink,
      });
    let exact = await exactRun();
    calibration.push({ bandwidth: emulateLink.bandwidth, exchangeOverCompute: exact.result.exchangeOverCompute });
    if (Math.abs(exact.result.exchangeOverCompute / target.ratio - 1) > CALIBRATION_SLACK) {
      // the wire time scales with 1 / bandwidth: what it took over what it should have
      emulateLink = {
        ...emulateLink,
        bandwidth: Math.round((emulateLink.bandwidth * exact.result.exchangeOverCompute) / target.ratio),
      };
      exact = await exactRun();
      calibration.push({ bandwidth: emulateLink.bandwidth, exchangeOverCompute: exact.result.exchangeOverCompute });
    }
    log(
      `emulated link: ${(emulateLink.bandwidth / 1e6).toFixed(2)} MB/s per page, ${emulateLink.latencyMs} ms: ` +
        `exchange/compute ${exact.result.exchangeOverCompute} (target ${target.ratio.toFixed(2)})`,
    );

    const timed: [string, Run][] = [];
    for (const degree of o.degrees) {
      for (const dtype of o.transports)
        for (const headGroups of HEAD_GROUPS) {
          const r =
            degree === TARGET.degree && dtype === 'f32' && headGroups === 1
              ? exact
              : await run(`${ulyssesRow(degree, dtype, headGroups)}, ulysses`, {
                  workers: degree,
                  dtype,
                  parallel: 'ulysses',
                  headGroups,
                  emulateLink,
                });
          timed.push([ulyssesRow(degree, dtype, headGroups), r]);
        }
      for (const dtype of o.displacedTransports)
        timed.push([
          displacedRow(degree, dtype),
          await run(displacedRow(degree, dtype), {
            workers: degree,
            dtype,
            parallel: 'displaced',
            warmupSteps: WARMUP_STEPS,
            emulateLink,
          }),
        ]);
    }
    const oneMachine = bothEnds(one, await run('one machine, again', { workers: 1 }));
    const runs = Object.fromEntries(timed.map(([label, r]) => [label, against(oneMachine, r)]));

    // the real model's job has two passes a step: CFG parallel puts them on two groups at once, and a
    // group of two ranks runs displaced beside it (P = 4: CFG parallel × displaced 2)
    const guidedRuns = async () => {
      const guidedFirst = await run(`guidance ${GUIDANCE}: one machine`, { workers: 1, guidance: GUIDANCE });
      const guidedTimed: [string, Run][] = [];
      for (const [label, placement] of [
        ['P=2 CFG parallel', { workers: 1, cfgParallel: true }],
        ['P=2 displaced i4', { workers: 2, parallel: 'displaced', dtype: 'i4' }],
        ['P=4 CFG parallel × displaced i4', { workers: 2, cfgParallel: true, parallel: 'displaced', dtype: 'i4' }],
        ['P=4 CFG parallel × ulysses i8', { workers: 2, cfgParallel: true, dtype: 'i8', headGroups: 1 }],
      ] as const) {
        guidedTimed.push([
          label,
          await run(`guidance ${GUIDANCE}: ${label}`, {
            guidance: GUIDANCE,
            warmupSteps: WARMUP_STEPS,
            emulateLink,
            ...placement,
          }),
        ]);
      }
      const guidedOne = bothEnds(
        guidedFirst,
        await run(`guidance ${GUIDANCE}: one machine, again`, { workers: 1, guidance: GUIDANCE }),
      );
      const guided: Record<string, unknown> = {
        one: guidedOne.result,
        ...Object.fromEntries(guidedTimed.map(([label, r]) => [label, against(guidedOne, r)])),
      };
      return guided;
    };
    const guided = o.guided ? await guidedRuns() : null;

    // accuracy costs no browser: after the timed runs, so as not to slow them
    const accuracy = o.accuracy
      ? {
          'exact (ulysses P=2)': demoAccuracy('exact-p2', ['--ranks', '2']),
          'P=2 displaced f32': demoAccuracy('displaced-p2-f32', ['--ranks', '2', '--displaced']),
          'P=2 displaced i4': demoAccuracy('displaced-p2-i4', ['--ranks', '2', '--displaced', '--dtype', 'i4']),
          'P=4 displaced i4': demoAccuracy('displaced-p4-i4', ['--ranks', '4', '--displaced', '--dtype', 'i4']),
        }
      : null;
    const exactReport = runs[ulyssesRow(TARGET.degree, 'f32', 1)] as { exchangeOverCompute: number };
    const step = (r: unknown) => (r as { stepMs: number }).stepMs;
    const bestDisplaced = (degree: number) =>
      Math.min(...o.displacedTransports.map((d) => step(runs[displacedRow(degree, d)])));
    return {
      benchmark: 'slow-link',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: {
        model: { path: folder.path, ...model },
        tokens,
        ...o,
        guidance: [1, GUIDANCE],
        warmupSteps: WARMUP_STEPS,
        ep: 'wasm',
        shares: 'even',
        machines:
          `each worker tab a Chromium of its own pinned to core i % 2 with a CFS quota of ${o.share} of it ` +
          `(period ${PERIOD_US / 1000} ms), told it has one core; the dashboard's Chromium on core 0 unlimited`,
      },
      machine: machine(machines.browserVersion),
      versions: versions(),
      target: {
        ...TARGET,
        projected: {
          stepS: round(target.stepS, 2),
          computeS: round(target.computeS, 2),
          commS: round(target.commS, 2),
          exchangeOverCompute: round(target.ratio, 2),
        },
      },
      emulateLink,
      calibration,
      /** the exchange over compute the emulated link gave at P = 2 in float32, against the target */
      emulatedRatio: { measured: exactReport.exchangeOverCompute, target: round(target.ratio, 2) },
      runs: { one: oneMachine.result, loopbackP2: loopback.result, ...runs },
      guided,
      accuracy,
      meets: {
        'displaced at P = 2 at least 1.5× faster than one machine (guidance 1)':
          oneMachine.result.stepMs / bestDisplaced(2) >= 1.5,
        'displaced at P = 4 faster than at P = 2 (guidance 1)': o.degrees.includes(4)
          ? bestDisplaced(4) < bestDisplaced(2)
          : null,
        [`P = 4 (CFG parallel × displaced i4) faster than P = 2 displaced i4 (guidance ${GUIDANCE})`]: guided
          ? step(guided['P=4 CFG parallel × displaced i4']) < step(guided['P=2 displaced i4'])
          : null,
        'displaced accuracy within 3 points of exact': accuracy
          ? Object.values(accuracy).every(
              (a) =>
                Math.abs(a.colorAccuracy - accuracy['exact (ulysses P=2)'].colorAccuracy) <= 0.03 &&
                Math.abs(a.directionAccuracy - accuracy['exact (ulysses P=2)'].directionAccuracy) <= 0.03,
            )
          : null,
      },
      /**
       * Ulysses in head groups against all heads at once, each transport and degree: how much faster,
       * and the exchange hidden behind compute a step
       */
      overlap: Object.fromEntries(
        o.degrees.flatMap((degree) =>
          o.transports.map((dtype) => {
            const [whole, grouped] = HEAD_GROUPS.map(
              (g) => runs[ulyssesRow(degree, dtype, g)] as { stepMs: number; overlapMs: number },
            );
            return [
              ulyssesRow(degree, dtype, 1),
              {
                speedup: round(whole.stepMs / grouped.stepMs, 3),
                hiddenMs: grouped.overlapMs,
                hiddenMsInOneGroup: whole.overlapMs,
              },
            ];
          }),
        ),
      ),
    };
  } finally {
    await machines.close();
  }
}

export function parseSlowLinkArgs(args: string[]): Partial<SlowLinkOptions> {
  const { values } = parseArgs({
    args,
    options: Object.fromEntries(Object.keys(DEFAULT_SLOW_LINK).map((k) => [k, { type: 'string' as const }])),
  });
  const out: Partial<SlowLinkOptions> = {};
  for (const [k, v] of Object.entries(values)) {
    if (k === 'share') {
      const share = Number(v);
      if (!(share > 0 && share <= 1))
        throw new Error(`--share takes a fraction of a core, above 0 and at most 1, got ${v}`);
      out.share = share;
      continue;
    }
    if (k === 'transports' || k === 'displacedTransports') {
      const dtypes = defined(v, `--${k}'s value`).split(',');
      if (!dtypes.every((d): d is DType => (DTYPES as readonly string[]).includes(d)))
        throw new Error(`--${k} takes transports of ${DTYPES.join(', ')}, comma-separated, got ${v}`);
      out[k] = dtypes;
      continue;
    }
    const numbers = defined(v, `--${k}'s value`).split(',').map(Number);
    const least = k === 'accuracy' || k === 'guided' ? 0 : 1;
    if (!numbers.every((n) => Number.isInteger(n) && n >= least))
      throw new Error(
        `--${k} takes ${k === 'degrees' ? 'whole numbers ≥ 1, comma-separated' : `a whole number ≥ ${least}`}, ` +
          `got ${v}`,
      );
    if (k === 'degrees') out.degrees = numbers;
    else out[k as 'frames' | 'height' | 'width' | 'steps' | 'accuracy' | 'guided'] = numbers[0];
  }
  return out;
}

if (isMain(import.meta)) {
  const report = await runSlowLink(parseSlowLinkArgs(process.argv.slice(2)));
  writeReport('slow-link.json', report);
  console.log(
    JSON.stringify(
      {
        emulatedRatio: report.emulatedRatio,
        emulateLink: report.emulateLink,
        runs: report.runs,
        guided: report.guided,
        accuracy: report.accuracy,
        meets: report.meets,
      },
      null,
      2,
    ),
  );
}
