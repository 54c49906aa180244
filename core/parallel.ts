import type { WanConfig } from './model/config.ts';
import { patchify, unpatchify } from './model/tokens.ts';
import { sliceRows, type Tensor } from './tensor.ts';

/**
 * The Ulysses layout of one forward pass: S tokens split into P equal slices of ceil(S/P) tokens
 * (the last padded with zero tokens), H heads split into P groups of H/P. Rank r owns tokens
 * [r·Sl, (r+1)·Sl) outside attention and heads [r·H/P, (r+1)·H/P) inside it.
 */
export interface UlyssesPlan {
  degree: number; // P
  tokens: number; // S, real tokens
  localTokens: number; // Sl = ceil(S/P)
  paddedTokens: number; // Sl·P
  headsPerRank: number; // H/P
  /** columns of one rank's heads in a [*, D] activation: (H/P)·d */
  headWidth: number;
}

/**
 * Which rank does what in one placement, as xDiT's RankGenerator: `cfgGroups` groups (two with CFG
 * parallel: group 0 runs the conditional pass, group 1 the unconditional one) of `ulyssesDegree`
 * ranks, each group a Ulysses mesh of its own. Rank r is rank r mod P of group ⌊r/P⌋. Nobody else
 * does this arithmetic.
 */
export class RankLayout {
  readonly world: number;

  constructor(
    readonly ulyssesDegree: number,
    readonly cfgGroups: 1 | 2 = 1,
  ) {
    if (!Number.isInteger(ulyssesDegree) || ulyssesDegree < 1) throw new ParallelConfigError(`a Ulysses degree is a whole number of ranks, got ${ulyssesDegree}`);
    this.world = ulyssesDegree * cfgGroups;
  }

  get cfgParallel(): boolean {
    return this.cfgGroups === 2;
  }

  groupOf(rank: number): number {
    return Math.floor(rank / this.ulyssesDegree);
  }

  /** The rank's place in its group's mesh. */
  localRank(rank: number): number {
    return rank % this.ulyssesDegree;
  }

  globalRank(group: number, localRank: number): number {
    return group * this.ulyssesDegree + localRank;
  }

  /** The ranks of one group, in mesh order. */
  groupRanks(group: number): number[] {
    return Array.from({ length: this.ulyssesDegree }, (_, i) => this.globalRank(group, i));
  }

  /** The group that runs a forward pass: pass p on group p with CFG parallel, every pass on group 0 otherwise. */
  groupForPass(pass: number): number {
    return this.cfgParallel ? pass : 0;
  }

  /** The rank's mesh: its group's ranks, their peers, and a session of the group's own. */
  meshOf(rank: number, peers: string[], session: string): { rank: number; world: number; peers: string[]; session: string } {
    const group = this.groupOf(rank);
    return {
      rank: this.localRank(rank),
      world: this.ulyssesDegree,
      peers: this.groupRanks(group).map((r) => peers[r]),
      session: this.cfgParallel ? `${session}.${group}` : session,
    };
  }

  /** Every pair of ranks that share a mesh, the higher rank first (it dials). */
  meshPairs(): [number, number][] {
    return Array.from({ length: this.world }, (_, from) => this.groupRanks(this.groupOf(from)).filter((to) => to < from).map((to): [number, number] => [from, to])).flat();
  }

  describe(rank: number): string {
    return `rank ${rank} of ${this.world}${this.cfgParallel ? ` (${this.groupOf(rank) === 0 ? 'conditional' : 'unconditional'} group)` : ''}`;
  }
}

export class ParallelConfigError extends Error {
  override name = 'ParallelConfigError';
}

/** Degrees that divide the head count, up to the number of workers available. */
export function validDegrees(numHeads: number, maxWorkers = numHeads): number[] {
  return Array.from({ length: Math.min(numHeads, maxWorkers) }, (_, i) => i + 1).filter((p) => numHeads % p === 0);
}

/** The largest valid degree that `liveWorkers` allow (at least 1). */
export function defaultDegree(numHeads: number, liveWorkers: number): number {
  return Math.max(1, ...validDegrees(numHeads, liveWorkers));
}

export function checkDegree(numHeads: number, degree: number, liveWorkers = Infinity): void {
  const valid = validDegrees(numHeads);
  if (!Number.isInteger(degree) || degree < 1 || numHeads % degree !== 0) {
    throw new ParallelConfigError(`ulyssesDegree ${degree} does not divide the model's ${numHeads} heads; valid degrees: ${valid.join(', ')}`);
  }
  if (degree > liveWorkers) {
    const usable = validDegrees(numHeads, liveWorkers);
    throw new ParallelConfigError(
      `ulyssesDegree ${degree} needs ${degree} worker${degree === 1 ? '' : 's'} but ${liveWorkers} ${liveWorkers === 1 ? 'is' : 'are'} live; ` +
        (usable.length ? `valid degrees now: ${usable.join(', ')}, or open more worker pages` : 'open a worker page first'),
    );
  }
}

export function planUlysses(cfg: WanConfig, tokens: number, degree: number): UlyssesPlan {
  checkDegree(cfg.numHeads, degree);
  const localTokens = Math.ceil(tokens / degree);
  const headsPerRank = cfg.numHeads / degree;
  return { degree, tokens, localTokens, paddedTokens: localTokens * degree, headsPerRank, headWidth: headsPerRank * cfg.headDim };
}

/** Rank r's first token. */
export const tokenStart = (plan: UlyssesPlan, rank: number): number => rank * plan.localTokens;

/** Attention bias over all padded keys: 0 for real tokens, a large negative for padding. */
export function keyPaddingBias(plan: UlyssesPlan): Float32Array {
  return Float32Array.from({ length: plan.paddedTokens }, (_, s) => (s < plan.tokens ? 0 : -1e9));
}

/** Rows of rank r from a [S, width] matrix, zero-padded to Sl rows. */
export function scatterRows(plan: UlyssesPlan, rows: Float32Array, width: number, rank: number): Float32Array {
  return sliceRows(rows, width, tokenStart(plan, rank), plan.localTokens);
}

/** Ranks' [Sl, width] outputs in rank order → [S, width], padding dropped. */
export function gatherRows(plan: UlyssesPlan, parts: Float32Array[], width: number): Float32Array {
  const out = new Float32Array(plan.tokens * width);
  parts.forEach((part, rank) => {
    const start = tokenStart(plan, rank);
    const count = Math.max(0, Math.min(plan.localTokens, plan.tokens - start));
    out.set(part.subarray(0, count * width), start * width);
  });
  return out;
}

/** Payload floats one rank sends per transformer block: 4·Sl·D·(P−1)/P (q, k, v out; attention back). */
export const exchangeFloatsPerBlock = (plan: UlyssesPlan, dim: number): number => (4 * plan.localTokens * dim * (plan.degree - 1)) / plan.degree;

/** A latent's tokens as each rank's patch rows, in rank order: rank r gets [Sl, C·pt·ph·pw]. */
export function scatterLatent(cfg: WanConfig, plan: UlyssesPlan, latent: Tensor): Float32Array[] {
  const patches = patchify(cfg, latent);
  return Array.from({ length: plan.degree }, (_, rank) => scatterRows(plan, patches.data, patches.shape[1], rank));
}

/** The ranks' output rows [Sl, pt·ph·pw·C] in rank order → the output, shaped like the latent. */
export function gatherLatent(cfg: WanConfig, plan: UlyssesPlan, rows: Float32Array[], shape: number[]): Tensor {
  return unpatchify(cfg, gatherRows(plan, rows, rows[0].length / plan.localTokens), shape);
}
