// What a 480p Wan2.1-T2V-14B job needs of a swarm: 832×480, 81 frames (32,760 tokens), 50 steps, guidance 5 (two
// passes a step), on 4 and 8 browsers of 8 and 16 GB over 125 MB/s and 1.25 GB/s links. For each setting, the
// plans (pipeline stages × Ulysses degree × CFG groups, every browser used) whose weights the planner's cut
// (cutStages, by memoryBudget) fits, the fastest of them by the cost model, and the link bytes a step of it sends:
// the hand-off between stages (direct, rank to rank), the Ulysses all-to-all within a stage, and the CFG combine,
// against its compute.
// Pure arithmetic; a part of `npm run bench -- projection`.
import { hiddenStateFloats } from '../core/model/blocks.ts';
import { forwardFlops, predictStagedStep, type Hardware, type ModelShape } from '../core/cost-model.ts';
import { exchangeFloatsPerBlock, planUlysses, validDegrees } from '../core/parallel.ts';
import { handOffEvidence, largestRows, oversized, recomputeMessages } from '../coordinator/message-sizes.ts';
import {
  cutStages,
  memoryBudget,
  STAGE_MEMORY_SHARE,
  stagedModel,
  wholeModelBytes,
  type StageWorker,
} from '../coordinator/stage-plan.ts';
import { DEVICE_TFLOP_S, RESERVE_GB, WAN_14B } from './pooled-projection.ts';
import { formatBytes, MAX_MESSAGE_FLOATS } from '../core/worker-api.ts';
import { round } from './lib.ts';

/** 21 latent frames of 30 × 52 patches: 832×480, 81 frames */
export const TOKENS_480P = 21 * 30 * 52;
const TEXT_TOKENS = 512;
const PASSES = 2;
const STEPS = 50;
const BROWSERS = [4, 8];
const MEMORY_GB = [8, 16];
const LINKS_MB_S = [125, 1250];
/** what a browser reports of its memory at most (navigator.deviceMemory), whatever its machine has */
const REPORTED_GIB_CAP = 8;

/** A staged plan's shape: stages of `degree` ranks each, in `cfgGroups` groups, its busiest stage's blocks. */
export interface StagedShape {
  stages: number;
  degree: number;
  cfgGroups: 1 | 2;
  /** blocks of the stage that holds the most */
  blocks: number;
}

/** Bytes a step of a staged plan sends over links, at `bytesPerElement` a value of the activations on the wire. */
export interface StepBytes {
  /** the busiest rank's hand-off to the next stage, rank to rank: its tokens' x [rows, D] and conditioning in f32 */
  handOffPerRank: number;
  /** the x [S, D] of every token crossing one stage boundary in one pass */
  handOffPerBoundaryPass: number;
  /** the busiest rank's Ulysses all-to-all within its stage (q, k, v out, attention output back) */
  ulyssesPerRank: number;
  /** the CFG combine: one group's noise prediction [S, pt·ph·pw·C] in f32, once a step; 0 without CFG groups */
  cfgCombine: number;
}

const patchVolume = (m: ModelShape) => m.patchSize.reduce((a, b) => a * b, 1);

/**
 * The link bytes of one step of `plan` on `model` at `tokens` tokens: each group runs both passes (one with CFG
 * groups); the busiest rank is the one planUlysses gives the most tokens and heads.
 */
export function stepBytes(
  model: ModelShape,
  { tokens, textTokens }: { tokens: number; textTokens: number },
  plan: StagedShape,
  bytesPerElement: number,
): StepBytes {
  const passesPerGroup = plan.cfgGroups === 2 ? 1 : PASSES;
  const rows = largestRows(model.numHeads, tokens, plan.degree);
  // the conditioning (temb, tproj, context) travels in f32 beside x, as the cost model has it
  const conditioning = hiddenStateFloats(model.dim, 0, textTokens) * 4;
  const handOff = plan.stages > 1 ? rows * model.dim * bytesPerElement + conditioning : 0;
  const ulysses = plan.degree > 1 ? exchangeFloatsPerBlock(planUlysses(model, tokens, plan.degree), 0) : 0;
  return {
    handOffPerRank: passesPerGroup * handOff,
    handOffPerBoundaryPass: plan.stages > 1 ? tokens * model.dim * bytesPerElement : 0,
    ulyssesPerRank: passesPerGroup * plan.blocks * ulysses * bytesPerElement,
    cfgCombine: plan.cfgGroups === 2 ? tokens * model.outChannels * patchVolume(model) * 4 : 0,
  };
}

const planName = (p: { stages: number; degree: number; cfgGroups: number }) =>
  `${p.stages} stage${p.stages === 1 ? '' : 's'} × Ulysses ${p.degree} × CFG ${p.cfgGroups}`;

/** How a browser's memory becomes the bytes of weights its stage may hold (memoryBudget). */
type Budget = 'reported' | 'set on page';

export interface Wan14bRow {
  browsers: number;
  memoryGB: number;
  budget: Budget;
  /** the weights' bytes a browser's stage may hold, GB */
  budgetGB: number;
  linkMBs: number;
  /** e.g. "4 stages × Ulysses 2 × CFG 1", or null where no plan fits */
  plan: string | null;
  /** why no plan fits, where none does */
  refused: string | null;
  stages: number;
  degree: number;
  cfgGroups: 1 | 2;
  /** blocks of each stage, in order */
  blocks: number[];
  /** the weights the busiest rank holds, GB */
  heldGB: number;
  /** MB a step: the busiest rank's hand-off in f32 and f16, its Ulysses all-to-all in f32 and f16, the CFG combine */
  handOffMB: { f32: number; f16: number };
  handOffPerBoundaryPassMB: { f32: number; f16: number };
  ulyssesMB: { f32: number; f16: number };
  cfgCombineMB: number;
  /** seconds a step: the busiest rank's compute, its link time (f16 activations), the step as the cost model has it */
  computeS: number;
  linkS: number;
  stepS: number;
  videoMin: number;
  /**
   * a staged plan's spot check: the largest message it sends through the coordinator (the hidden state of every token a
   * stage's recomputation starts from, the busiest rank's hand-off as evidence), MB, and whether it fits one
   */
  spotCheck: { MB: number; fits: boolean } | null;
}

const mb = (bytes: number) => round(bytes / 1e6, 1);

/** The plans of `browsers` browsers that use them all: stages × degree × CFG groups, degree at most the heads. */
function shapesOf(browsers: number): { stages: number; degree: number; cfgGroups: 1 | 2 }[] {
  return ([1, 2] as const).flatMap((cfgGroups) =>
    validDegrees(WAN_14B.numHeads, browsers)
      .filter((degree) => browsers % (degree * cfgGroups) === 0)
      .map((degree) => ({ stages: browsers / (degree * cfgGroups), degree, cfgGroups }))
      .filter(({ stages }) => stages <= WAN_14B.numLayers),
  );
}

export function wan14bNeeds(): Wan14bRow[] {
  const model = stagedModel(WAN_14B, 'float16');
  const work = { model: WAN_14B, tokens: TOKENS_480P, textTokens: TEXT_TOKENS, passes: PASSES } as const;
  const rows: Wan14bRow[] = [];
  for (const browsers of BROWSERS)
    for (const memoryGB of MEMORY_GB)
      for (const budget of ['reported', 'set on page'] as const) {
        const worker: Pick<StageWorker, 'memoryGiB' | 'modelMemoryGiB'> =
          budget === 'reported'
            ? { memoryGiB: Math.min(memoryGB, REPORTED_GIB_CAP) }
            : {
                memoryGiB: Math.min(memoryGB, REPORTED_GIB_CAP),
                modelMemoryGiB: ((memoryGB - RESERVE_GB) * 1e9) / 2 ** 30,
              };
        const budgetBytes = memoryBudget(worker);
        for (const linkMBs of LINKS_MB_S) {
          const hw: Hardware = {
            workerFlops: Array<number>(browsers).fill(DEVICE_TFLOP_S * 1e12),
            link: { bandwidth: linkMBs * 1e6, latency: 0.001 },
            bytesPerElement: 2,
          };
          let refused = '';
          const placed = shapesOf(browsers).flatMap((shape) => {
            const members = shape.degree * shape.cfgGroups;
            const groups = Array.from({ length: shape.stages }, (_, s) => ({
              workers: Array.from({ length: members }, (_, i) => `w${s * members + i}`),
              memoryBytes: budgetBytes,
              reserveBytes: 0,
              speed: 1,
            }));
            const cut = cutStages(model, groups);
            if ('refused' in cut) {
              refused ||= cut.refused;
              return [];
            }
            // cutStages drops a group it cannot give a block: the plan is as many stages as it kept
            const stages = cut.stages.length;
            const blocks = cut.stages.map((s) => s.blocks[1] - s.blocks[0]);
            const most = Math.max(...blocks);
            const p = predictStagedStep(
              work,
              {
                stages,
                ulyssesDegree: shape.degree,
                cfgParallel: shape.cfgGroups === 2,
                mode: 'exact',
                paceBlocks: most,
              },
              hw,
            );
            return [{ ...shape, stages, blocks, most, p, held: Math.max(...cut.stages.map((s) => s.heldBytes)) }];
          });
          const best = placed.reduce<(typeof placed)[number] | null>(
            (a, b) => (!a || b.p.stepS < a.p.stepS ? b : a),
            null,
          );
          const base = { browsers, memoryGB, budget, budgetGB: round(budgetBytes / 1e9, 2), linkMBs };
          if (!best) {
            rows.push({
              ...base,
              plan: null,
              refused,
              stages: 0,
              degree: 0,
              cfgGroups: 1,
              blocks: [],
              heldGB: 0,
              handOffMB: { f32: 0, f16: 0 },
              handOffPerBoundaryPassMB: { f32: 0, f16: 0 },
              ulyssesMB: { f32: 0, f16: 0 },
              cfgCombineMB: 0,
              computeS: 0,
              linkS: 0,
              stepS: 0,
              videoMin: 0,
              spotCheck: null,
            });
            continue;
          }
          const shape = { stages: best.stages, degree: best.degree, cfgGroups: best.cfgGroups, blocks: best.most };
          const f32 = stepBytes(WAN_14B, work, shape, 4);
          const f16 = stepBytes(WAN_14B, work, shape, 2);
          const passesPerGroup = best.cfgGroups === 2 ? 1 : PASSES;
          const flops = forwardFlops({ ...WAN_14B, numLayers: best.most }, TOKENS_480P, TEXT_TOKENS, best.degree).total;
          const computeS = (passesPerGroup * flops) / (DEVICE_TFLOP_S * 1e12);
          const sentF16 = f16.handOffPerRank + f16.ulyssesPerRank + f16.cfgCombine;
          const mesh = { tokens: TOKENS_480P, textTokens: TEXT_TOKENS, heads: best.degree };
          rows.push({
            ...base,
            plan: planName(best),
            refused: null,
            stages: best.stages,
            degree: best.degree,
            cfgGroups: best.cfgGroups,
            blocks: best.blocks,
            heldGB: round(best.held / 1e9, 2),
            handOffMB: { f32: mb(f32.handOffPerRank), f16: mb(f16.handOffPerRank) },
            handOffPerBoundaryPassMB: { f32: mb(f32.handOffPerBoundaryPass), f16: mb(f16.handOffPerBoundaryPass) },
            ulyssesMB: { f32: mb(f32.ulyssesPerRank), f16: mb(f16.ulyssesPerRank) },
            cfgCombineMB: mb(f16.cfgCombine),
            computeS: round(computeS, 2),
            linkS: round(sentF16 / (linkMBs * 1e6), 2),
            stepS: round(best.p.stepS, 2),
            videoMin: round((best.p.stepS * STEPS) / 60, 1),
            spotCheck: best.stages > 1 ? spotCheckOf(mesh) : null,
          });
        }
      }
  return rows;
}

export const WAN_14B_ASSUMPTIONS = [
  `Wan2.1-T2V-14B held as float16 (bfloat16 alike: 2 bytes a weight), ` +
    `${round(wholeModelBytes(stagedModel(WAN_14B, 'float16')) / 1e9, 1)} GB; 480p: ${TOKENS_480P} tokens, ` +
    `${TEXT_TOKENS} text tokens, ${STEPS} steps of ${PASSES} passes (guidance 5)`,
  `each browser computes at an effective ${DEVICE_TFLOP_S} TFLOP/s over whole blocks (as the pooled projection)`,
  `a browser's weight budget is the planner's memoryBudget: "reported", half of what the browser reports ` +
    `(at most ${REPORTED_GIB_CAP} GiB, so ${REPORTED_GIB_CAP * STAGE_MEMORY_SHARE} GiB); ` +
    `"set on page", its memory less ${RESERVE_GB} GB for activations`,
  "the plans placed are every browser's: stages × Ulysses degree × CFG groups, blocks cut by cutStages; " +
    'of those that fit, the fastest by the cost model (exact stages, f16 activations on the wire, 1 ms latency)',
  "hand-off: the busiest rank sends its tokens' x [rows, 5120] and the conditioning " +
    '(temb, tproj, context: 519 × 5120, ' +
    "f32) to its peer of the next stage, directly; the link time is the busiest rank's f16 bytes over its link",
];

/** A staged plan's spot check: its largest message through the coordinator, and whether it fits one. */
function spotCheckOf(mesh: { tokens: number; textTokens: number; heads: number }): { MB: number; fits: boolean } {
  const messages = [handOffEvidence(WAN_14B, mesh), ...recomputeMessages(WAN_14B, mesh)];
  const largest = messages.reduce((a, b) => (b.floats > a.floats ? b : a));
  return { MB: mb(4 * largest.floats), fits: messages.every((m) => oversized(m) === null) };
}

/** A staged plan's spot check, in words. */
function spotCheckCell(r: Wan14bRow): string {
  if (!r.spotCheck) return 'no stages';
  const verdict = r.spotCheck.fits ? 'checked' : `off (${formatBytes(4 * MAX_MESSAGE_FLOATS)} a message at most)`;
  return `${r.spotCheck.MB} MB a message: ${verdict}`;
}

/** The markdown section for projection.md. */
export function wan14bMarkdown(rows: Wan14bRow[]): string {
  const lines = [
    '## What a 480p Wan2.1-T2V-14B job needs',
    '',
    'Per setting, the fastest plan whose weights fit (stages × Ulysses degree × CFG groups), what its busiest rank ' +
      'holds, and the bytes a step sends over the links against its compute. Hand-off and Ulysses bytes are the ' +
      "busiest rank's per step, f32 / f16; a boundary carries every token's x once a pass " +
      `(${mb(TOKENS_480P * WAN_14B.dim * 4)} MB in f32, ${mb(TOKENS_480P * WAN_14B.dim * 2)} MB in f16).`,
    '',
    '| browsers × memory | weight budget a browser | link | plan (blocks a stage) | held a rank | ' +
      'hand-off MB/step f32 / f16 | Ulysses MB/step f32 / f16 | CFG combine MB/step | compute s/step | ' +
      'link s/step (f16) | step s, video min | spot check of a stage |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|',
  ];
  for (const r of rows) {
    const setting = `| ${r.browsers} × ${r.memoryGB} GB | ${r.budget}: ${r.budgetGB} GB | ${r.linkMBs} MB/s |`;
    if (!r.plan) {
      lines.push(`${setting} none fits: ${r.refused} | | | | | | | | |`);
      continue;
    }
    lines.push(
      `${setting} ${r.plan} (${r.blocks.join('/')}) | ${r.heldGB} GB | ${r.handOffMB.f32} / ${r.handOffMB.f16} | ` +
        `${r.ulyssesMB.f32} / ${r.ulyssesMB.f16} | ${r.cfgCombineMB} | ${r.computeS} | ${r.linkS} | ` +
        `${r.stepS} s, ${r.videoMin} min | ${spotCheckCell(r)} |`,
    );
  }
  const staged = rows.filter((r) => r.spotCheck);
  const unchecked = staged.filter((r) => !r.spotCheck?.fits).length;
  lines.push(
    '',
    "Every stage hands its hidden state to the next stage's ranks directly, so none of it crosses the coordinator " +
      `and no plan is refused for its size; a spot check of a stage still sends one message of every token's hidden ` +
      `state, which does not fit in ${unchecked} of the ${staged.length} staged plans: there the planner runs the ` +
      'stages unchecked (ask spotCheckRate 0 to say so, or fewer tokens to check them).',
    '',
    `Assumptions: ${WAN_14B_ASSUMPTIONS.join('; ')}.`,
    '',
  );
  return lines.join('\n');
}
