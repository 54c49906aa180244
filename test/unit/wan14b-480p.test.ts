// The arithmetic of what a 480p Wan2.1-T2V-14B job needs (bench/wan14b-480p.ts): the bytes its links carry a step
// and the plans the planner's cut fits, from the model's sizes alone.
import { describe, expect, it } from 'vitest';
import { WAN_14B } from '../../bench/pooled-projection.ts';
import { stepBytes, TOKENS_480P, wan14bNeeds } from '../../bench/wan14b-480p.ts';

const JOB = { tokens: TOKENS_480P, textTokens: 512 };
/** x [rows, 5120] of a rank's tokens, and the conditioning (temb, tproj [7, 5120], context [512, 5120]) in f32 */
const conditioning = 519 * 5120 * 4;

describe("a step's link bytes at 480p", () => {
  it('480p, 81 frames is 32,760 tokens; a stage boundary carries every token’s x once a pass: 671 MB in f32', () => {
    expect(TOKENS_480P).toBe(32_760);
    const plan = { stages: 4, degree: 1, cfgGroups: 1, blocks: 10 } as const;
    expect(stepBytes(WAN_14B, JOB, plan, 4).handOffPerBoundaryPass).toBe(32_760 * 5120 * 4);
    expect(32_760 * 5120 * 4).toBe(670_924_800);
    expect(stepBytes(WAN_14B, JOB, plan, 2).handOffPerBoundaryPass).toBe(32_760 * 5120 * 2);
  });

  it('4 stages × Ulysses 2: the busiest rank hands on half the tokens a pass, and all-to-alls 4 of their 20 heads’ rows a block', () => {
    const bytes = stepBytes(WAN_14B, JOB, { stages: 4, degree: 2, cfgGroups: 1, blocks: 10 }, 2);
    expect(bytes.handOffPerRank).toBe(2 * (16_380 * 5120 * 2 + conditioning));
    // q, k, v of its 16,380 tokens for the other rank's 20 heads, and its 20 heads' output for the other 16,380 tokens
    expect(bytes.ulyssesPerRank).toBe(2 * 10 * (3 * 16_380 * 20 * 128 + 20 * 16_380 * 128) * 2);
    expect(bytes.cfgCombine).toBe(0);
  });

  it('CFG groups run one pass each and combine one noise prediction [32,760, 64] in f32 a step; one stage hands on nothing', () => {
    const bytes = stepBytes(WAN_14B, JOB, { stages: 1, degree: 1, cfgGroups: 2, blocks: 40 }, 2);
    expect(bytes).toEqual({
      handOffPerRank: 0,
      handOffPerBoundaryPass: 0,
      ulyssesPerRank: 0,
      cfgCombine: 32_760 * 64 * 4,
    });
  });
});

describe('the plans that fit', () => {
  const rows = wan14bNeeds();
  const at = (browsers: number, memoryGB: number, budget: string, linkMBs: number) =>
    rows.find(
      (r) => r.browsers === browsers && r.memoryGB === memoryGB && r.budget === budget && r.linkMBs === linkMBs,
    );

  it('4 browsers at half of a reported 8 GiB pool 17 GB of the 28.6 GB: refused, saying how much is missing', () => {
    expect(at(4, 8, 'reported', 125)?.plan).toBeNull();
    expect(at(4, 8, 'reported', 125)?.refused).toContain('it needs 11.95 GB more');
  });

  it('8 browsers at 4 GiB each hold the model in 8 stages of 5 blocks, the first 3.98 GB with the embedders', () => {
    const row = at(8, 8, 'reported', 1250);
    expect([row?.plan, row?.blocks, row?.heldGB]).toEqual([
      '8 stages × Ulysses 1 × CFG 1',
      [5, 5, 5, 5, 5, 5, 5, 5],
      3.98,
    ]);
  });
});
