// What the cost model predicts for the real thing: Wan2.1-T2V-1.3B at 480p (832×480, 81 frames →
// 21 × 30 × 52 = 32,760 tokens), 50 steps with classifier-free guidance, on P = 1, 2, 3, 4, 6
// browsers for three link speeds, three device speeds and fp32/fp16 transport. Pure arithmetic,
// no browser, held to one measurement: the full-size model's block as bench/block-cost.ts timed it
// (bench/out/block-cost.json, when there is one). Writes bench/out/projection.json and .md, with
// Wan2.1-T2V-14B on a pooled swarm at their end (pooled-projection.ts).
//
//   npm run bench -- projection

import { predictStep, type Hardware, type ModelShape, type Workload } from '../core/cost-model.ts';
import { bytesPerElement } from '../core/net/protocol.ts';
import { staleKeysValuesBytes } from '../core/parallel.ts';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { BlockCostReport } from './block-cost.ts';
import { pooledMarkdown, pooledProjection } from './pooled-projection.ts';
import { wan14bMarkdown, wan14bNeeds } from './wan14b-480p.ts';
import { isMain, machine, OUT_DIR, round, versions, writeReport } from './lib.ts';
import { defined } from '../core/defined.ts';

/** The last full-size block measured (bench/block-cost.ts), if any. */
function lastBlockCost(): BlockCostReport | null {
  const path = join(OUT_DIR, 'block-cost.json');
  return existsSync(path) ? (JSON.parse(readFileSync(path, 'utf8')) as BlockCostReport) : null;
}

export const WAN_1_3B: ModelShape = {
  numHeads: 12,
  headDim: 128,
  dim: 1536,
  ffnDim: 8960,
  numLayers: 30,
  inChannels: 16,
  outChannels: 16,
  patchSize: [1, 2, 2],
  textDim: 4096,
  freqDim: 256,
};
/** 480p, 81 frames, guided */
export const WAN_480P_WORKLOAD: Workload = { model: WAN_1_3B, tokens: 32760, textTokens: 512, passes: 2 };
/** Wan2.2-TI2V-5B's transformer (server/wan22-layout.ts) */
export const WAN22_TI2V_5B_SHAPE: ModelShape = {
  numHeads: 24,
  headDim: 128,
  dim: 3072,
  ffnDim: 14336,
  numLayers: 30,
  inChannels: 48,
  outChannels: 48,
  patchSize: [1, 2, 2],
  textDim: 4096,
  freqDim: 256,
};
/** its published job: 704×1280, 121 frames → latent 31 × 44 × 80 (16× in space) → 31 · 22 · 40 tokens, guided */
export const TI2V_720P_WORKLOAD: Workload = { model: WAN22_TI2V_5B_SHAPE, tokens: 27280, textTokens: 512, passes: 2 };
const TI2V_DEGREES = [1, 2, 3, 4, 6, 8];

/** Wan2.2-TI2V-5B at 720p × 121 frames on GPUs of 20 TFLOP/s over 1 Gbit/s links, float16 transport, by degree. */
function ti2v720pProjection() {
  const hw: Hardware = {
    workerFlops: Array<number>(8).fill(20e12),
    link: { bandwidth: 125e6, latency: LATENCY_S },
    bytesPerElement: 2,
  };
  const one = predictStep(
    TI2V_720P_WORKLOAD,
    { ulyssesDegree: 1, cfgParallel: false },
    { ...hw, coordinatorLink: null },
  );
  return {
    video: '704×1280, 121 frames → latent 31 × 44 × 80 → 27,280 tokens; 50 guided steps',
    hardware: '20 TFLOP/s a worker, 125 MB/s links, float16 activations',
    rows: TI2V_DEGREES.map((degree) => {
      const p = degree === 1 ? one : predictStep(TI2V_720P_WORKLOAD, { ulyssesDegree: degree, cfgParallel: false }, hw);
      return {
        degree,
        stepS: round(p.stepS),
        videoMin: round((p.stepS * STEPS) / 60, 1),
        speedup: round(one.stepS / p.stepS),
      };
    }),
  };
}
const STEPS = 50;
const DEGREES = [1, 2, 3, 4, 6];
const LINKS_MB_S = [12.5, 125, 1250]; // 100 Mbit/s, 1 Gbit/s, 10 Gbit/s
const DEVICES_TFLOP_S = [5, 20, 80];
const TRANSPORTS = [
  { name: 'fp32', bytesPerElement: 4 },
  { name: 'fp16', bytesPerElement: 2 },
] as const;
/** one-way link latency of a LAN */
export const LATENCY_S = 0.001;
/** displaced mode's transports: its keys' and values' deltas as int8 or int4 with a scale per 64 values */
const DISPLACED_TRANSPORTS = (['i8', 'i4'] as const).map((dtype) => ({
  name: dtype === 'i8' ? 'int8' : 'int4',
  bytesPerElement: bytesPerElement(dtype),
}));

export function runProjection(blockCost: BlockCostReport | null = lastBlockCost()) {
  const rows: {
    linkMBs: number;
    deviceTFLOPs: number;
    transport: string;
    degree: number;
    stepS: number;
    computeS: number;
    commS: number;
    videoS: number;
    speedup: number;
    bytesPerRankPerStep: number;
  }[] = [];
  const best: {
    linkMBs: number;
    deviceTFLOPs: number;
    transport: string;
    bestDegree: number;
    bestStepS: number;
    oneWorkerStepS: number;
    worthIt: boolean;
  }[] = [];
  for (const transport of TRANSPORTS)
    for (const linkMBs of LINKS_MB_S)
      for (const deviceTFLOPs of DEVICES_TFLOP_S) {
        const hw: Hardware = {
          workerFlops: Array<number>(6).fill(deviceTFLOPs * 1e12),
          link: { bandwidth: linkMBs * 1e6, latency: LATENCY_S },
          bytesPerElement: transport.bytesPerElement,
        };
        // one browser runs alone (the local backend: no coordinator link); a swarm is driven over the link
        const one = predictStep(
          WAN_480P_WORKLOAD,
          { ulyssesDegree: 1, cfgParallel: false },
          { ...hw, coordinatorLink: null },
        );
        for (const degree of DEGREES) {
          const p =
            degree === 1 ? one : predictStep(WAN_480P_WORKLOAD, { ulyssesDegree: degree, cfgParallel: false }, hw);
          rows.push({
            linkMBs,
            deviceTFLOPs,
            transport: transport.name,
            degree,
            stepS: round(p.stepS),
            computeS: round(p.computeS),
            commS: round(p.commS),
            videoS: round(p.stepS * STEPS, 1),
            speedup: round(one.stepS / p.stepS),
            bytesPerRankPerStep: p.bytesPerRank,
          });
        }
        const fastest = rows
          .filter((r) => r.linkMBs === linkMBs && r.deviceTFLOPs === deviceTFLOPs && r.transport === transport.name)
          .reduce((a, b) => (b.stepS < a.stepS ? b : a));
        best.push({
          linkMBs,
          deviceTFLOPs,
          transport: transport.name,
          bestDegree: fastest.degree,
          bestStepS: fastest.stepS,
          oneWorkerStepS: round(one.stepS),
          worthIt: fastest.degree > 1,
        });
      }
  // CFG parallel: the conditional and unconditional passes on two browsers (or two Ulysses pairs);
  // the only bytes between the groups are one pass's output per step
  const cfgParallel: {
    linkMBs: number;
    deviceTFLOPs: number;
    transport: string;
    browsers: number;
    stepS: number;
    speedup: number;
  }[] = [];
  for (const transport of TRANSPORTS)
    for (const linkMBs of LINKS_MB_S)
      for (const deviceTFLOPs of DEVICES_TFLOP_S) {
        const hw: Hardware = {
          workerFlops: Array<number>(6).fill(deviceTFLOPs * 1e12),
          link: { bandwidth: linkMBs * 1e6, latency: LATENCY_S },
          bytesPerElement: transport.bytesPerElement,
        };
        const one = predictStep(
          WAN_480P_WORKLOAD,
          { ulyssesDegree: 1, cfgParallel: false },
          { ...hw, coordinatorLink: null },
        );
        for (const degree of [1, 2]) {
          const p = predictStep(WAN_480P_WORKLOAD, { ulyssesDegree: degree, cfgParallel: true }, hw);
          cfgParallel.push({
            linkMBs,
            deviceTFLOPs,
            transport: transport.name,
            browsers: 2 * degree,
            stepS: round(p.stepS),
            speedup: round(one.stepS / p.stepS),
          });
        }
      }
  // displaced patch parallelism past its warm-up: each rank's all-gather of keys and values hides
  // behind the next forward of its pass; it holds every rank's keys and values of each pass and block
  const displaced: {
    linkMBs: number;
    deviceTFLOPs: number;
    transport: string;
    degree: number;
    stepS: number;
    speedup: number;
    staleGB: number;
  }[] = [];
  for (const transport of DISPLACED_TRANSPORTS)
    for (const linkMBs of LINKS_MB_S)
      for (const deviceTFLOPs of DEVICES_TFLOP_S) {
        const hw: Hardware = {
          workerFlops: Array<number>(6).fill(deviceTFLOPs * 1e12),
          link: { bandwidth: linkMBs * 1e6, latency: LATENCY_S },
          bytesPerElement: transport.bytesPerElement,
        };
        const one = predictStep(
          WAN_480P_WORKLOAD,
          { ulyssesDegree: 1, cfgParallel: false },
          { ...hw, coordinatorLink: null },
        );
        for (const degree of DEGREES.filter((d) => d > 1)) {
          const p = predictStep(
            WAN_480P_WORKLOAD,
            { ulyssesDegree: degree, cfgParallel: false, mode: 'displaced' },
            hw,
          );
          displaced.push({
            linkMBs,
            deviceTFLOPs,
            transport: transport.name,
            degree,
            stepS: round(p.stepS),
            speedup: round(one.stepS / p.stepS),
            staleGB: round(staleKeysValuesBytes(WAN_480P_WORKLOAD, degree) / 1e9, 1),
          });
        }
      }
  // the uplink at which P browsers take exactly as long as one: bytes / (t₁ − compute_P − latency terms)
  const breakEven: { deviceTFLOPs: number; transport: string; degree: number; linkMBs: number | null }[] = [];
  for (const deviceTFLOPs of DEVICES_TFLOP_S)
    for (const transport of TRANSPORTS)
      for (const degree of DEGREES.filter((d) => d > 1)) {
        const at = (bandwidth: number) =>
          predictStep(
            WAN_480P_WORKLOAD,
            { ulyssesDegree: degree, cfgParallel: false },
            {
              workerFlops: Array<number>(6).fill(deviceTFLOPs * 1e12),
              link: { bandwidth, latency: LATENCY_S },
              bytesPerElement: transport.bytesPerElement,
            },
          );
        const one = predictStep(
          WAN_480P_WORKLOAD,
          { ulyssesDegree: 1, cfgParallel: false },
          {
            workerFlops: [deviceTFLOPs * 1e12],
            link: { bandwidth: 1, latency: 0 },
            bytesPerElement: transport.bytesPerElement,
            coordinatorLink: null,
          },
        );
        // time over the link ∝ 1/bandwidth: exchange bytes per rank plus the coordinator's patches and rows
        const ideal = at(Infinity);
        const linkBytes = (at(1e6).stepS - ideal.stepS) * 1e6; // step time = ideal + linkBytes / bandwidth
        const slack = one.stepS - ideal.stepS;
        breakEven.push({
          deviceTFLOPs,
          transport: transport.name,
          degree,
          linkMBs: slack > 0 ? round(linkBytes / slack / 1e6, 1) : null,
        });
      }
  return {
    benchmark: 'projection',
    date: new Date().toISOString(),
    config: {
      model: 'Wan2.1-T2V-1.3B',
      shape: WAN_1_3B,
      video: '480p: 832×480, 81 frames → latent 21 × 60 × 104 → 32,760 tokens',
      steps: STEPS,
      guidance: 'classifier-free (2 forward passes per step, one after the other: no CFG parallel)',
      textTokens: WAN_480P_WORKLOAD.textTokens,
      degrees: DEGREES,
      linksMBs: LINKS_MB_S,
      devicesTFLOPs: DEVICES_TFLOP_S,
      latencyS: LATENCY_S,
      assumptions: [
        'each browser sustains the stated FLOP/s on the whole forward (matmul-dominated; elementwise ops not counted)',
        'a rank sends its 4·ceil(S/P)·D·(P−1)/P elements per block through its own uplink at the stated bandwidth',
        'the two passes of a step run at once on one group: ' +
          "each pass's all-to-alls wait only for what the other pass's compute does not hide",
        'one pass a group (CFG parallel): ' +
          'q, k, v in as many head groups (1 to 3) as the cost model predicts fastest, ' +
          'all of the attention but the last group’s hidden behind the exchange',
        'P=1 is one browser alone (local backend); ' +
          'a swarm also pays the coordinator sending patches and gathering rows (fp32) over the link each pass',
        '2 all-to-alls per block each cost (P−1)·latency; latency 1 ms',
      ],
    },
    machine: machine(),
    versions: versions(),
    rows,
    best,
    breakEven,
    /** Wan2.1-T2V-14B on a pooled swarm: pipeline stages and PipeFusion against Ulysses alone (pooled-projection.ts) */
    pooled14b: pooledProjection(),
    /** what a 480p Wan2.1-T2V-14B job needs: the plan that fits, its link bytes a step against its compute */
    wan14b480p: wan14bNeeds(),
    /** Wan2.2-TI2V-5B's published 720p × 121-frame job by Ulysses degree */
    ti2v720p: ti2v720pProjection(),
    cfgParallel,
    displaced,
    /** the full-size block measured on this machine, against the cost model's prediction for it */
    measuredBlock: blockCost && {
      date: blockCost.date,
      tokens: blockCost.config.tokens,
      ...blockCost.measured,
      predicted: blockCost.predicted,
      probe: blockCost.probe,
      stepAt480pS: blockCost.stepAt480pS,
    },
  };
}

function markdown(r: ReturnType<typeof runProjection>): string {
  const fmt = (s: number) => (s >= 100 ? s.toFixed(0) : s >= 10 ? s.toFixed(1) : s.toFixed(2));
  const lines = [
    '# Projection: Wan2.1-T2V-1.3B at 480p on a browser swarm',
    '',
    `Predicted seconds per denoising step (${STEPS} steps with CFG per video; ×${STEPS} for the whole video) ` +
      `by \`core/cost-model.ts\`, for ${r.config.video}.`,
    'Each cell: step time, and in brackets the speed-up over one browser. **Bold**: the fastest degree in the row.',
    '',
  ];
  for (const transport of TRANSPORTS.map((t) => t.name)) {
    lines.push(
      `## ${transport} transport`,
      '',
      `| link | device | ${DEGREES.map((d) => `P=${d}`).join(' | ')} | best |`,
      `|---|---|${DEGREES.map(() => '---:').join('|')}|---|`,
    );
    for (const linkMBs of LINKS_MB_S)
      for (const deviceTFLOPs of DEVICES_TFLOP_S) {
        const cells = r.rows.filter(
          (x) => x.transport === transport && x.linkMBs === linkMBs && x.deviceTFLOPs === deviceTFLOPs,
        );
        const b = defined(
          r.best.find((x) => x.transport === transport && x.linkMBs === linkMBs && x.deviceTFLOPs === deviceTFLOPs),
          'the best degree of a row',
        );
        const text = cells.map((c) =>
          c.degree === b.bestDegree ? `**${fmt(c.stepS)} s (${c.speedup}×)**` : `${fmt(c.stepS)} s (${c.speedup}×)`,
        );
        lines.push(`| ${linkMBs} MB/s | ${deviceTFLOPs} TFLOP/s | ${text.join(' | ')} | P=${b.bestDegree} |`);
      }
    lines.push('');
  }
  lines.push(
    '## CFG parallel',
    '',
    'The two passes of a guided step on two groups of browsers at once: ' +
      'between the groups only one pass’s output travels per step, ' +
      'so two browsers nearly halve the step on any link; four are two Ulysses pairs.',
    '',
    '| link | device | P=1 | fp32: 2 browsers | 4 browsers | fp16: 2 browsers | 4 browsers |',
    '|---|---|---:|---:|---:|---:|---:|',
  );
  for (const linkMBs of LINKS_MB_S)
    for (const deviceTFLOPs of DEVICES_TFLOP_S) {
      const one = defined(
        r.rows.find(
          (x) => x.transport === 'fp32' && x.linkMBs === linkMBs && x.deviceTFLOPs === deviceTFLOPs && x.degree === 1,
        ),
        'the one-browser row',
      );
      const cells = TRANSPORTS.flatMap((t) =>
        [2, 4].map((browsers) =>
          defined(
            r.cfgParallel.find(
              (c) =>
                c.transport === t.name &&
                c.linkMBs === linkMBs &&
                c.deviceTFLOPs === deviceTFLOPs &&
                c.browsers === browsers,
            ),
            'a CFG-parallel row',
          ),
        ),
      );
      lines.push(
        `| ${linkMBs} MB/s | ${deviceTFLOPs} TFLOP/s | ${fmt(one.stepS)} s | ` +
          `${cells.map((c) => `${fmt(c.stepS)} s (${c.speedup}×)`).join(' | ')} |`,
      );
    }
  const displacedColumns = DISPLACED_TRANSPORTS.flatMap((t) =>
    DEGREES.filter((d) => d > 1).map((d) => `${t.name} P=${d}`),
  );
  lines.push(
    '',
    '## Displaced patch parallelism',
    '',
    'Each rank attends with its own fresh keys and values and the other ranks’ of the step before, ' +
      'gathered in the background (int8 or int4 deltas with error feedback): ' +
      'past the warm-up the exchange waits only for what a forward cannot hide. ' +
      'Not exact (bench slow-link and eval-demo measure what it costs). ' +
      'Each rank holds every rank’s keys and values of each pass and block, in float32: the last column.',
    '',
    `| link | device | P=1 | ${displacedColumns.join(' | ')} | stale keys and values per rank |`,
    `|---|---|---:|${displacedColumns.map(() => '---:').join('|')}|---|`,
  );
  for (const linkMBs of LINKS_MB_S)
    for (const deviceTFLOPs of DEVICES_TFLOP_S) {
      const one = defined(
        r.rows.find(
          (x) => x.transport === 'fp32' && x.linkMBs === linkMBs && x.deviceTFLOPs === deviceTFLOPs && x.degree === 1,
        ),
        'the one-browser row',
      );
      const cells = r.displaced.filter((c) => c.linkMBs === linkMBs && c.deviceTFLOPs === deviceTFLOPs);
      const stale = [...new Set(cells.map((c) => `P=${c.degree} ${c.staleGB} GB`))].join(', ');
      lines.push(
        `| ${linkMBs} MB/s | ${deviceTFLOPs} TFLOP/s | ${fmt(one.stepS)} s | ` +
          `${cells.map((c) => `${fmt(c.stepS)} s (${c.speedup}×)`).join(' | ')} | ${stale} |`,
      );
    }
  lines.push('', '## Where adding browsers stops paying off', '');
  for (const transport of TRANSPORTS.map((t) => t.name))
    for (const linkMBs of LINKS_MB_S) {
      const rowsHere = r.best.filter((x) => x.transport === transport && x.linkMBs === linkMBs);
      const parts = rowsHere.map((b) => {
        const cells = r.rows.filter(
          (x) => x.transport === transport && x.linkMBs === linkMBs && x.deviceTFLOPs === b.deviceTFLOPs,
        );
        const comm = defined(
          cells.find((c) => c.degree === b.bestDegree),
          'the best degree of a row',
        );
        return b.worthIt
          ? `${b.deviceTFLOPs} TFLOP/s → up to P=${b.bestDegree} ` +
              `(${fmt(b.bestStepS)} s vs ${fmt(b.oneWorkerStepS)} s alone; ` +
              `the exchange is ${Math.round((100 * comm.commS) / comm.stepS)}% of it)`
          : `${b.deviceTFLOPs} TFLOP/s → stay on one browser (${fmt(b.oneWorkerStepS)} s; every swarm is slower)`;
      });
      lines.push(`- **${linkMBs} MB/s, ${transport}**: ${parts.join('; ')}.`);
    }
  lines.push(
    '',
    '### Link speed each browser needs for P browsers to beat one',
    '',
    'Compute per rank shrinks as 1/P; the bytes each rank sends per step shrink only as (P−1)/P² — ' +
      'so the slower the link and the faster the device, the fewer browsers pay off.',
    'Break-even uplink per browser (MB/s) below which P browsers are slower than one:',
    '',
    `| device | transport | ${DEGREES.filter((d) => d > 1)
      .map((d) => `P=${d}`)
      .join(' | ')} |`,
    `|---|---|${DEGREES.filter((d) => d > 1)
      .map(() => '---:')
      .join('|')}|`,
  );
  for (const deviceTFLOPs of DEVICES_TFLOP_S)
    for (const transport of TRANSPORTS.map((t) => t.name)) {
      const cells = r.breakEven
        .filter((b) => b.deviceTFLOPs === deviceTFLOPs && b.transport === transport)
        .map((b) => (b.linkMBs === null ? 'never' : fmt(b.linkMBs)));
      lines.push(`| ${deviceTFLOPs} TFLOP/s | ${transport} | ${cells.join(' | ')} |`);
    }
  const b = r.measuredBlock;
  lines.push(
    '',
    '## Held to a measurement',
    '',
    b
      ? `One block of the full-size model (bench/block-cost.ts, ${b.date.slice(0, 10)}: ` +
          `the published layout's first block, ${b.tokens} tokens, the 512-row text, ` +
          'WASM on one thread of this machine) ' +
          `took **${fmt(b.blockMs / 1000)} s**: ${b.effectiveGflopS} GFLOP/s over its ${b.blockGflop} GFLOP, ` +
          `where the probe's matrix multiply ran at ${b.probe.gflopS}. ` +
          `The cost model predicted ${fmt(b.predicted.blockMs / 1000)} s for it from the probe rates ` +
          `(measured / predicted = ${b.predicted.measuredOverPredicted}). ` +
          "The device column above is such an effective rate over whole blocks, not a GPU's peak. " +
          `Scaled by FLOPs, this machine alone would take ${fmt(b.stepAt480pS)} s per 480p step.`
      : 'No full-size block has been measured on this machine yet: ' +
          '`npm run bench -- block-cost` times one and this section compares it with the cost model.',
  );
  const perRank = (t: string) =>
    DEGREES.filter((d) => d > 1)
      .map(
        (d) =>
          `P=${d} ${(
            defined(
              r.rows.find((x) => x.transport === t && x.degree === d),
              'a row',
            ).bytesPerRankPerStep / 1e9
          ).toFixed(1)} GB`,
      )
      .join(', ');
  lines.push(
    '',
    `Bytes each rank sends per step (both passes, 30 blocks): fp32 ${perRank('fp32')}; fp16 ${perRank('fp16')}.`,
    '',
    `Assumptions: ${r.config.assumptions.join('; ')}.`,
    '',
    pooledMarkdown(r.pooled14b),
    wan14bMarkdown(r.wan14b480p),
  );
  const ti2v = r.ti2v720p;
  lines.push(
    '',
    `## Wan2.2-TI2V-5B at 720p (${ti2v.video})`,
    '',
    `${ti2v.hardware}: ` +
      ti2v.rows.map((row) => `P=${row.degree} ${row.stepS} s a step, ${row.videoMin} min (${row.speedup}×)`).join('; '),
  );
  return lines.join('\n');
}

if (isMain(import.meta)) {
  const report = runProjection();
  writeReport('projection.json', report);
  writeReport('projection.md', markdown(report));
}

export { markdown as projectionMarkdown };
