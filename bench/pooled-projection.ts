// What pooled memory buys for Wan2.1-T2V-14B (bfloat16 weights, 28.6 GB: no consumer GPU holds it):
// each plan's predicted step on 4 and 8 browsers of 8 and 16 GB GPUs over 125 MB/s and 1250 MB/s
// links, at 480p and 720p, PipeFusion × Ulysses × CFG parallel and exact stages against Ulysses
// alone (every rank holding the whole model), with what each rank holds and sends. Pure arithmetic
// (core/cost-model.ts predictStagedStep); a part of `npm run bench -- projection`.
import {
  modelWeights,
  predictStagedStep,
  storedWeightBytes,
  type Hardware,
  type ModelShape,
  type PartWeights,
  type Workload,
} from '../core/cost-model.ts';
import { evenDegrees } from '../core/parallel.ts';
import { round } from './lib.ts';

export const WAN_14B: ModelShape = {
  numHeads: 40,
  headDim: 128,
  dim: 5120,
  ffnDim: 13824,
  numLayers: 40,
  inChannels: 16,
  outChannels: 16,
  patchSize: [1, 2, 2],
  textDim: 4096,
  freqDim: 256,
};
/** 81 frames: 21 latent frames of 60 × 104 (480p) or 90 × 160 (720p), in 2 × 2 patches */
const RESOLUTIONS = [
  { name: '480p', tokens: 21 * 30 * 52 },
  { name: '720p', tokens: 21 * 45 * 80 },
];
const BROWSERS = [4, 8];
const GPU_GB = [8, 16];
const LINKS_MB_S = [125, 1250];
/** an effective rate over whole blocks of a consumer GPU in half precision */
export const DEVICE_TFLOP_S = 40;
const STEPS = 50;
/** what a rank needs beside weights and stale keys and values while it computes: activations, the runtime */
export const RESERVE_GB = 1.5;

export interface PooledRow {
  resolution: string;
  browsers: number;
  gpuGB: number;
  linkMBs: number;
  /** e.g. "PipeFusion 4 stages × Ulysses 2" */
  plan: string;
  stages: number;
  ulyssesDegree: number;
  cfgParallel: boolean;
  mode: 'ulysses' | 'exact' | 'pipefusion';
  stepS: number;
  videoMin: number;
  /** what the busiest rank holds, GB: weights, and PipeFusion's keys and values of the step before */
  weightsGB: number;
  staleGB: number;
  fits: boolean;
  /** bytes a rank sends per step: to the next stage, and within its stage's Ulysses group */
  boundaryGBPerRank: number;
  exchangeGBPerRank: number;
}

export function pooledProjection(): PooledRow[] {
  const rows: PooledRow[] = [];
  const weights = modelWeights(WAN_14B);
  const stored = (part: PartWeights) => storedWeightBytes(part, 'float16');
  const wholeGB = (WAN_14B.numLayers * stored(weights.block) + stored(weights.embedders) + stored(weights.head)) / 1e9;
  for (const { name, tokens } of RESOLUTIONS)
    for (const browsers of BROWSERS)
      for (const gpuGB of GPU_GB)
        for (const linkMBs of LINKS_MB_S) {
          const work: Workload = { model: WAN_14B, tokens, textTokens: 512, passes: 2 };
          const hw: Hardware = {
            workerFlops: Array<number>(browsers).fill(DEVICE_TFLOP_S * 1e12),
            link: { bandwidth: linkMBs * 1e6, latency: 0.001 },
            bytesPerElement: 2,
          };
          for (const cfgParallel of [false, true]) {
            const perPipeline = cfgParallel ? browsers / 2 : browsers;
            for (const stages of [1, 2, 4, 8].filter((s) => perPipeline % s === 0)) {
              const degree = perPipeline / stages;
              if (!evenDegrees(WAN_14B.numHeads, degree).includes(degree)) continue;
              for (const mode of stages === 1 ? (['exact'] as const) : (['exact', 'pipefusion'] as const)) {
                const p = predictStagedStep(work, { stages, ulyssesDegree: degree, cfgParallel, mode }, hw);
                const weightsGB = stages === 1 ? wholeGB : p.weightBytesPerRank / 1e9;
                const staleGB = p.staleKeysValuesBytesPerRank / 1e9;
                const kind = stages === 1 ? 'ulysses' : mode;
                rows.push({
                  resolution: name,
                  browsers,
                  gpuGB,
                  linkMBs,
                  plan:
                    (stages === 1
                      ? `Ulysses ${degree}`
                      : `${mode === 'pipefusion' ? 'PipeFusion' : 'exact'} ${stages} stages × Ulysses ${degree}`) +
                    (cfgParallel ? ' × CFG 2' : ''),
                  stages,
                  ulyssesDegree: degree,
                  cfgParallel,
                  mode: kind,
                  stepS: round(p.stepS),
                  videoMin: round((p.stepS * STEPS) / 60, 1),
                  weightsGB: round(weightsGB, 1),
                  staleGB: round(staleGB, 1),
                  fits: weightsGB + staleGB + RESERVE_GB <= gpuGB,
                  boundaryGBPerRank: round(p.boundaryBytesPerRank / 1e9, 2),
                  exchangeGBPerRank: round(p.exchangeBytesPerRank / 1e9, 2),
                });
              }
            }
          }
        }
  return rows;
}

export const POOLED_ASSUMPTIONS = [
  `Wan2.1-T2V-14B in bfloat16 (${round((2 * 14_288_491_584) / 1e9, 1)} GB of weights), 50 guided steps`,
  `each browser's GPU computes at an effective ${DEVICE_TFLOP_S} TFLOP/s over whole blocks`,
  'activations travel as float16; links have 1 ms latency',
  `a rank needs ${RESERVE_GB} GB beside its weights and stale keys and values`,
  'PipeFusion with twice as many patches as stages, its first steps exact (not counted)',
];

/** The markdown section for projection.md: per setting, the fastest plan that fits against Ulysses alone. */
export function pooledMarkdown(rows: PooledRow[]): string {
  const lines = [
    '## Wan2.1-T2V-14B on a pooled swarm',
    '',
    'Ulysses alone gives every rank the whole model: 28.6 GB in bfloat16, more than any of these GPUs holds. ' +
      'Pipeline stages cut the blocks over the browsers (each holds a stage; the embedders ride with the first), ' +
      'and hand one hidden state per stage boundary to the next instead of four all-to-alls a block. ' +
      'Exact stages give the same latent as one worker; PipeFusion keeps every stage busy by sending patches ' +
      "through the pipeline, each attending to the step before's keys and values where the step's are not there yet " +
      '(not exact; those keys and values are what it holds beside the weights).',
    '',
    '| resolution | browsers × GPU | link | Ulysses alone | fastest exact plan that fits | fastest plan that fits | ' +
      'its step, video | per rank: weights + stale k/v | sent per rank per step: to next stage, within stage |',
    '|---|---|---|---|---|---|---|---|---|',
  ];
  const settings = [...new Set(rows.map((r) => `${r.resolution}|${r.browsers}|${r.gpuGB}|${r.linkMBs}`))];
  for (const key of settings) {
    const here = rows.filter((r) => `${r.resolution}|${r.browsers}|${r.gpuGB}|${r.linkMBs}` === key);
    const [first] = here;
    const fastest = (list: PooledRow[]) =>
      list.reduce<PooledRow | null>((a, b) => (!a || b.stepS < a.stepS ? b : a), null);
    const ulysses = fastest(here.filter((r) => r.mode === 'ulysses'));
    const exact = fastest(here.filter((r) => r.fits && r.mode !== 'pipefusion'));
    const best = fastest(here.filter((r) => r.fits));
    const cell = (r: PooledRow | null) => (r ? `${r.plan}: ${r.stepS} s` : 'none fits');
    lines.push(
      `| ${first.resolution} | ${first.browsers} × ${first.gpuGB} GB | ${first.linkMBs} MB/s | ` +
        `${ulysses ? `${ulysses.stepS} s if it fit (${ulysses.weightsGB} GB a rank): does not` : '—'} | ` +
        `${cell(exact)} | ${cell(best)} | ${best ? `${best.stepS} s, ${best.videoMin} min` : '—'} | ` +
        `${best ? `${best.weightsGB} + ${best.staleGB} GB` : '—'} | ` +
        `${best ? `${best.boundaryGBPerRank} GB, ${best.exchangeGBPerRank} GB` : '—'} |`,
    );
  }
  lines.push('', `Assumptions: ${POOLED_ASSUMPTIONS.join('; ')}.`, '');
  return lines.join('\n');
}
