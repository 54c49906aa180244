// The one size rule: every message a placement sends through the coordinator is sized by the busiest rank's share as
// planUlysses gives it, not by ⌈tokens/degree⌉, which an uneven split of the heads exceeds.
import { hiddenStateFloats } from '../../core/model/blocks.ts';
import { describe, expect, it } from 'vitest';
import {
  checkMessages,
  handOffEvidence,
  handedOnFloats,
  itemsPerMessage,
  largestRows,
  MessageTooLarge,
  oversized,
  patchesIn,
  recomputeMessages,
  rowsOut,
} from '../../coordinator/message-sizes.ts';
import { MAX_MESSAGE_FLOATS } from '../../core/worker-api.ts';

/** Wan2.1-14B's width: 40 heads of 128, 16 latent channels in 1×2×2 patches */
const WAN_14B = {
  numHeads: 40,
  dim: 5120,
  inChannels: 16,
  outChannels: 16,
  patchSize: [1, 2, 2] as [number, number, number],
};
/** 480×832, 81 frames: 21 × 30 × 52 tokens; the text's 512 */
const JOB = { tokens: 32_760, textTokens: 512 };

describe('the largest share a plan gives', () => {
  it('even heads share the tokens evenly: 40 heads on 8 ranks give each 4,095 of 32,760 tokens', () => {
    expect(largestRows(40, 32_760, 8)).toBe(4_095);
  });

  it('13 ranks on 40 heads: the first has 4 heads and 3,276 tokens, not ⌈32,760/13⌉ = 2,520', () => {
    expect(Math.ceil(32_760 / 13)).toBe(2_520);
    expect(largestRows(40, 32_760, 13)).toBe(3_276);
  });

  it('uneven head shares, as a layout gives them: the rank of the most heads has the most tokens', () => {
    expect(largestRows(40, 32_760, [10, 30])).toBe(24_570);
  });
});

describe('a hidden state: x [rows, D], temb [D], tproj [6, D], context [L, D]', () => {
  it("the 14B's hidden state of every 480p token is 32,760 × 5,120 floats of x beside 519 × 5,120 of conditioning", () => {
    expect(hiddenStateFloats(5120, 32_760, 512)).toBe((32_760 + 519) * 5120);
  });

  it("13 ranks of the 14B hand on 77.7 MB from their busiest rank: its evidence for a spot check is over one message's 62.9 MB; ⌈S/P⌉ rows would fit", () => {
    const floats = handedOnFloats(WAN_14B, { ...JOB, heads: 13 });
    expect(floats).toBe((3_276 + 519) * 5120);
    expect(floats).toBeGreaterThan(MAX_MESSAGE_FLOATS);
    expect(hiddenStateFloats(5120, 2_520, 512)).toBeLessThanOrEqual(MAX_MESSAGE_FLOATS);
    expect(oversized(handOffEvidence(WAN_14B, { ...JOB, heads: 13 }))).toBe(
      "a rank's hand-off between pipeline stages, as a spot check takes it from its receiver would be 77.7 MB, more " +
        'than the 62.9 MB one message carries: ask spotCheckRate 0, or more workers a stage (ulyssesDegree), which ' +
        'share the tokens',
    );
  });

  it('a spot check of a stage sends the hidden state of every token: 681.6 MB for the 14B at 480p', () => {
    expect(recomputeMessages(WAN_14B, JOB).map(oversized)[0]).toBe(
      "the hidden state of every token that a stage's recomputation starts from would be 681.6 MB, more than the " +
        '62.9 MB one message carries',
    );
  });
});

describe('checking the messages of a placement', () => {
  it('patches in and rows out are the busiest rank’s rows × 64 floats, far inside one message', () => {
    const mesh = { ...JOB, heads: 13 };
    expect([patchesIn(WAN_14B, mesh).floats, rowsOut(WAN_14B, mesh).floats]).toEqual([3_276 * 64, 3_276 * 64]);
    expect(() => checkMessages([patchesIn(WAN_14B, mesh), rowsOut(WAN_14B, mesh)])).not.toThrow();
  });

  it('the first message that does not fit is thrown as data: which message, and its floats', () => {
    const over = handOffEvidence(WAN_14B, { ...JOB, heads: 13 });
    const thrown = (() => {
      try {
        checkMessages([patchesIn(WAN_14B, { ...JOB, heads: 13 }), over]);
      } catch (e) {
        return e;
      }
    })();
    expect(thrown).toBeInstanceOf(MessageTooLarge);
    expect((thrown as MessageTooLarge).sent).toEqual(over);
  });

  it('exactly one message fits; a float more does not', () => {
    expect(oversized({ what: 'x', floats: MAX_MESSAGE_FLOATS })).toBeNull();
    expect(oversized({ what: 'x', floats: MAX_MESSAGE_FLOATS + 1 })).toBe(
      'x would be 62.9 MB, more than the 62.9 MB one message carries',
    );
  });

  it('items per message: as many whole items as fit, and at least one', () => {
    expect(itemsPerMessage(MAX_MESSAGE_FLOATS / 4)).toBe(4);
    expect(itemsPerMessage(MAX_MESSAGE_FLOATS / 4 + 1)).toBe(3);
    expect(itemsPerMessage(2 * MAX_MESSAGE_FLOATS)).toBe(1);
  });
});
