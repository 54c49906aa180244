import type { WanConfig } from './model/config.ts';
import { patchify, unpatchify } from './model/tokens.ts';
import { sliceRows, type Tensor } from './tensor.ts';

/**
 * The Ulysses layout of one forward pass: the H heads shared among P ranks (`heads`, each at
 * least one, in rank order; equal where P divides H, else as near as can be, or in proportion to
 * each rank's speed) and the S tokens in proportion to them (`rows`), so each rank's share of a
 * block's work, outside attention and inside it, is its share of the heads. Rank r owns tokens
 * [tokenStart(r), tokenStart(r) + rows[r]) outside attention and heads [headStart(r),
 * headStart(r) + heads[r]) inside it. No padding: every token is some rank's.
 */
export interface UlyssesPlan {
  degree: number; // P
  tokens: number; // S
  /** heads of each rank: whole, at least one, summing to H */
  heads: number[];
  /** tokens of each rank: at least one, summing to S */
  rows: number[];
  headDim: number;
  /**
   * the head groups a block's exchange goes in (headGroup): 1, all of a rank's heads at once, or
   * more, so that attention overlaps the exchange; at most the fewest heads a rank has
   */
  headGroups: number;
}

/**
 * Which rank does what in one placement, as xDiT's RankGenerator: `cfgGroups` groups (two with CFG
 * parallel: group 0 runs the conditional pass, group 1 the unconditional one), each a pipeline of
 * `stages` stages (the transformer's blocks cut in contiguous runs: one stage holds them all unless
 * the placement pools memory), each stage a Ulysses mesh of `ulyssesDegree` ranks. Rank r is rank
 * r mod P of mesh m = ⌊r/P⌋, which is stage m mod S of group ⌊m/S⌋. Nobody else does this
 * arithmetic. `heads`: each group's ranks' shares of the heads (planUlysses), where they are not
 * even (ranks of unequal speed); every stage of a group shares them alike.
 */
export class RankLayout {
  readonly world: number;

  constructor(
    readonly ulyssesDegree: number,
    readonly cfgGroups: 1 | 2 = 1,
    readonly heads: number[][] | null = null,
    readonly stages = 1,
  ) {
    if (!Number.isInteger(ulyssesDegree) || ulyssesDegree < 1)
      throw new ParallelConfigError(`a Ulysses degree is a whole number of ranks, got ${ulyssesDegree}`);
    if (!Number.isInteger(stages) || stages < 1)
      throw new ParallelConfigError(`pipeline stages are a whole number ≥ 1, got ${stages}`);
    if (heads && (heads.length !== cfgGroups || heads.some((g) => g.length !== ulyssesDegree))) {
      throw new ParallelConfigError(
        `head shares ${JSON.stringify(heads)} are not ${cfgGroups} group(s) of ${ulyssesDegree} ranks`,
      );
    }
    this.world = ulyssesDegree * stages * cfgGroups;
  }

  /** The heads of each rank of `group` (planUlysses takes either): shares where given, else the degree (even). */
  headsOf(group: number): number[] | number {
    return this.heads?.[group] ?? this.ulyssesDegree;
  }

  get cfgParallel(): boolean {
    return this.cfgGroups === 2;
  }

  /** The same ranks doing the same shares: a placement on this layout serves `other`. */
  sameAs(other: RankLayout): boolean {
    return (
      this.ulyssesDegree === other.ulyssesDegree &&
      this.cfgGroups === other.cfgGroups &&
      this.stages === other.stages &&
      JSON.stringify(this.heads) === JSON.stringify(other.heads)
    );
  }

  /** The rank's CFG group. */
  groupOf(rank: number): number {
    return Math.floor(rank / (this.ulyssesDegree * this.stages));
  }

  /** The rank's pipeline stage in its group (0 where the placement has one stage). */
  stageOf(rank: number): number {
    return Math.floor(rank / this.ulyssesDegree) % this.stages;
  }

  /** The rank's place in its stage's mesh. */
  localRank(rank: number): number {
    return rank % this.ulyssesDegree;
  }

  globalRank(group: number, localRank: number, stage = 0): number {
    return (group * this.stages + stage) * this.ulyssesDegree + localRank;
  }

  /** The ranks of one stage of a group, in mesh order. */
  stageRanks(group: number, stage: number): number[] {
    return Array.from({ length: this.ulyssesDegree }, (_, i) => this.globalRank(group, i, stage));
  }

  /** The ranks that hold a stage's blocks: its ranks in every CFG group (every rank, where there is one stage). */
  stageHolders(stage: number): number[] {
    return Array.from({ length: this.cfgGroups }, (_, group) => this.stageRanks(group, stage)).flat();
  }

  /** The ranks of one group, stage after stage, each stage's in mesh order. */
  groupRanks(group: number): number[] {
    return Array.from({ length: this.stages }, (_, stage) => this.stageRanks(group, stage)).flat();
  }

  /** The ranks that share `rank`'s mesh (its stage of its group), in mesh order. */
  meshRanks(rank: number): number[] {
    return this.stageRanks(this.groupOf(rank), this.stageOf(rank));
  }

  /** The group that runs a forward pass: pass p on group p with CFG parallel, every pass on group 0 otherwise. */
  groupForPass(pass: number): number {
    return this.cfgParallel ? pass : 0;
  }

  /** The rank's mesh: its stage's ranks, their peers, their head shares, and a session of the mesh's own. */
  meshOf(
    rank: number,
    peers: string[],
    session: string,
  ): { rank: number; world: number; peers: string[]; session: string; heads?: number[] } {
    const group = this.groupOf(rank);
    const mesh = [this.cfgParallel ? `.${group}` : '', this.stages > 1 ? `.stage${this.stageOf(rank)}` : ''];
    return {
      rank: this.localRank(rank),
      world: this.ulyssesDegree,
      peers: this.meshRanks(rank).map((r) => peers[r]),
      session: `${session}${mesh.join('')}`,
      ...(this.heads && { heads: this.heads[group] }),
    };
  }

  /**
   * The rank's hand-off links: from the rank of its group's stage before at its place in the mesh, and to the stage
   * after's (every stage of a group shares its head shares, so the two compute the same tokens); none with one stage.
   */
  stageLinksOf(rank: number, peers: string[], session: string): { before?: PairMesh; after?: PairMesh } | undefined {
    if (this.stages === 1) return undefined;
    const group = this.groupOf(rank);
    const stage = this.stageOf(rank);
    const local = this.localRank(rank);
    // sender rank 0, receiver rank 1 (rank/hand-off.ts), a session for each pair
    const pair = (from: number, self: 0 | 1): PairMesh => {
      const sender = this.globalRank(group, local, from);
      const receiver = this.globalRank(group, local, from + 1);
      return {
        rank: self,
        world: 2,
        peers: [peers[sender], peers[receiver]],
        session: `${session}.handoff.${group}.${from}.${local}`,
      };
    };
    return {
      ...(stage > 0 && { before: pair(stage - 1, 1) }),
      ...(stage < this.stages - 1 && { after: pair(stage, 0) }),
    };
  }

  /** The global rank of a rank's hand-off partner (RankLost.stage), of the stage before or after, at its place. */
  stagePartner(rank: number, which: 'before' | 'after'): number | null {
    const stage = this.stageOf(rank) + (which === 'before' ? -1 : 1);
    if (stage < 0 || stage >= this.stages) return null;
    return this.globalRank(this.groupOf(rank), this.localRank(rank), stage);
  }

  /** The heads and tokens of a sequence of `tokens` that `rank` computes (planUlysses' shares). */
  shareOf(rank: number, numHeads: number, tokens: number): { heads: number; tokens: number } {
    const plan = planUlysses({ numHeads, headDim: 1 }, tokens, this.headsOf(this.groupOf(rank)));
    const local = this.localRank(rank);
    return { heads: plan.heads[local], tokens: plan.rows[local] };
  }

  /** Every pair of ranks that share a mesh, the higher rank first (it dials). */
  meshPairs(): [number, number][] {
    return Array.from({ length: this.world }, (_, from) =>
      this.meshRanks(from)
        .filter((to) => to < from)
        .map((to): [number, number] => [from, to]),
    ).flat();
  }

  /** With a job (its model's heads and its tokens), the rank's share of it; else its heads where they are uneven. */
  describe(rank: number, job?: { numHeads: number; tokens: number }): string {
    const share = job && this.shareOf(rank, job.numHeads, job.tokens);
    const notes = [
      this.cfgParallel && `${this.groupOf(rank) === 0 ? 'conditional' : 'unconditional'} group`,
      this.stages > 1 && `pipeline stage ${this.stageOf(rank) + 1} of ${this.stages}`,
      share
        ? `${share.heads} heads, ${share.tokens} tokens`
        : this.heads && `${this.heads[this.groupOf(rank)][this.localRank(rank)]} heads`,
    ].filter(Boolean);
    return `rank ${rank} of ${this.world}${notes.length ? ` (${notes.join(', ')})` : ''}`;
  }
}

/** A mesh of two ranks a pipeline stage's hidden state crosses, sender rank 0 (core/worker-api.ts HandOffMesh). */
interface PairMesh {
  rank: 0 | 1;
  world: 2;
  peers: string[];
  session: string;
}

export class ParallelConfigError extends Error {
  override name = 'ParallelConfigError';
}

/**
 * Ulysses degrees a model of `numHeads` heads allows (each rank at least one head), up to the number of workers
 * available.
 */
export function validDegrees(numHeads: number, maxWorkers = numHeads): number[] {
  return Array.from({ length: Math.max(0, Math.min(numHeads, maxWorkers)) }, (_, i) => i + 1);
}

/**
 * The degrees worth trying on workers of equal speed: each the fewest ranks for its busiest rank's
 * heads, ⌈H/P⌉ (12 heads: 1, 2, 3, 4, 6, 12 — five ranks wait for ranks of 3 heads as four do).
 */
export function evenDegrees(numHeads: number, maxWorkers = numHeads): number[] {
  return validDegrees(numHeads, maxWorkers).filter(
    (p) => p === 1 || Math.ceil(numHeads / p) < Math.ceil(numHeads / (p - 1)),
  );
}

/** The degree to take before the workers are measured: the largest even degree `liveWorkers` allow (at least 1). */
export function defaultDegree(numHeads: number, liveWorkers: number): number {
  return Math.max(1, ...evenDegrees(numHeads, liveWorkers));
}

export function checkDegree(numHeads: number, degree: number, liveWorkers = Infinity): void {
  if (!Number.isInteger(degree) || degree < 1 || degree > numHeads) {
    throw new ParallelConfigError(
      `ulyssesDegree ${degree} is not a whole number of ranks from 1 to the model's ${numHeads} heads ` +
        '(each rank takes at least one)',
    );
  }
  if (degree > liveWorkers) {
    throw new ParallelConfigError(
      `ulyssesDegree ${degree} needs ${degree} worker${degree === 1 ? '' : 's'} ` +
        `but ${liveWorkers} ${liveWorkers === 1 ? 'is' : 'are'} live; ` +
        (liveWorkers >= 1
          ? `at most ${Math.min(liveWorkers, numHeads)} now, or open more worker pages`
          : 'open a worker page first'),
    );
  }
}

/**
 * `total` split into whole shares, at least one each, as near to `weights`' proportions as whole
 * numbers allow: the split whose largest share per weight (a rank's time, where weights are
 * speeds) is least — each unit past the proportional floors goes where it costs the least time,
 * ties to the lower rank, so the same weights give the same split on every page.
 */
export function proportionalShares(total: number, weights: number[]): number[] {
  const n = weights.length;
  if (n < 1 || n > total)
    throw new ParallelConfigError(`${total} cannot be shared among ${n} ranks with at least one each`);
  if (!weights.every((w) => Number.isFinite(w) && w > 0))
    throw new ParallelConfigError(`shares need positive weights, got ${weights.join(', ')}`);
  const sum = weights.reduce((a, b) => a + b, 0);
  const floors = weights.map((w) => Math.max(1, Math.floor((total * w) / sum)));
  const shares = floors.reduce((a, b) => a + b, 0) <= total ? floors : new Array<number>(n).fill(1);
  for (let left = total - shares.reduce((a, b) => a + b, 0); left > 0; left--) {
    let best = 0;
    for (let i = 1; i < n; i++) if ((shares[i] + 1) / weights[i] < (shares[best] + 1) / weights[best]) best = i;
    shares[best]++;
  }
  return shares;
}

/** Heads as equal as they can be: P | H gives H/P each, else the first ranks one more. */
export const evenHeads = (numHeads: number, degree: number): number[] =>
  proportionalShares(numHeads, new Array<number>(degree).fill(1));

/**
 * The plan of a forward over `tokens` tokens: `heads` as given (a rank's share each), or that many
 * ranks with even heads; tokens in proportion to the heads; the exchange in `headGroups` head
 * groups, or as many as the rank with the fewest heads has where that is fewer.
 */
export function planUlysses(
  cfg: Pick<WanConfig, 'numHeads' | 'headDim'>,
  tokens: number,
  heads: number | number[],
  headGroups = 1,
): UlyssesPlan {
  const shares = typeof heads === 'number' ? (checkDegree(cfg.numHeads, heads), evenHeads(cfg.numHeads, heads)) : heads;
  checkDegree(cfg.numHeads, shares.length);
  if (!shares.every((h) => Number.isInteger(h) && h >= 1) || shares.reduce((a, b) => a + b, 0) !== cfg.numHeads) {
    throw new ParallelConfigError(
      `head shares ${shares.join('/')} are not whole shares of at least one ` +
        `summing to the model's ${cfg.numHeads} heads`,
    );
  }
  if (tokens < shares.length)
    throw new ParallelConfigError(
      `${tokens} tokens cannot be shared among ${shares.length} ranks: use fewer workers or a larger video`,
    );
  if (!(Number.isInteger(headGroups) && headGroups >= 1))
    throw new ParallelConfigError(`headGroups is a whole number of head groups ≥ 1, got ${headGroups}`);
  return {
    degree: shares.length,
    tokens,
    heads: shares,
    rows: proportionalShares(tokens, shares),
    headDim: cfg.headDim,
    headGroups: Math.min(headGroups, ...shares),
  };
}

const sumBefore = (xs: number[], r: number) => xs.slice(0, r).reduce((a, b) => a + b, 0);

/** Rank r's first token. */
export const tokenStart = (plan: UlyssesPlan, rank: number): number => sumBefore(plan.rows, rank);

/** Rank r's first head. */
export const headStart = (plan: UlyssesPlan, rank: number): number => sumBefore(plan.heads, rank);

/** Rows of rank r from a [S, width] matrix. */
export function scatterRows(plan: UlyssesPlan, rows: Float32Array, width: number, rank: number): Float32Array {
  return sliceRows(rows, width, tokenStart(plan, rank), plan.rows[rank]);
}

/** Ranks' [rows[r], width] outputs in rank order → [S, width]. */
export function gatherRows(plan: UlyssesPlan, parts: Float32Array[], width: number): Float32Array {
  const out = new Float32Array(plan.tokens * width);
  parts.forEach((part, rank) => out.set(part.subarray(0, plan.rows[rank] * width), tokenStart(plan, rank) * width));
  return out;
}

/**
 * Payload floats rank r sends per transformer block: q, k, v of its tokens for the other ranks'
 * heads, and its heads' attention output for the other ranks' tokens.
 */
export function exchangeFloatsPerBlock(plan: UlyssesPlan, rank: number): number {
  const H = plan.heads.reduce((a, b) => a + b, 0);
  return (
    (3 * plan.rows[rank] * (H - plan.heads[rank]) + plan.heads[rank] * (plan.tokens - plan.rows[rank])) * plan.headDim
  );
}

/**
 * Most head groups the cost model weighs for a Ulysses block's exchange (core/cost-model.ts).
 * Attention over one group's heads starts once that group has arrived, while the next groups are
 * still on the wire, and its output goes back while the next group computes (rank/ulysses.ts): all
 * of a block's attention but the last group's can hide behind the exchange, at the cost of an
 * engine call and a message per peer for each group past the first.
 */
export const MAX_HEAD_GROUPS = 3;

/** Rank r's heads in head group g, counted from its first head: its heads shared as evenly as they can be. */
export function headGroup(plan: UlyssesPlan, rank: number, group: number): { start: number; heads: number } {
  const shares = evenHeads(plan.heads[rank], plan.headGroups);
  return { start: sumBefore(shares, group), heads: shares[group] };
}

/**
 * The floats of one exchanged part from rank `from` to rank `to`: q, k, v [3, rows[from],
 * heads·d] of `to`'s heads in head group `group`, or attention output [rows[to], heads·d] of
 * `from`'s heads in it (Ulysses); or k, v of all heads [2, rows[from], H·d] (displaced).
 */
export function partFloats(
  plan: UlyssesPlan,
  phase: 'qkv' | 'output' | 'kv',
  from: number,
  to: number,
  group = 0,
): number {
  const H = plan.heads.reduce((a, b) => a + b, 0);
  if (phase === 'kv') return 2 * plan.rows[from] * H * plan.headDim;
  return phase === 'qkv'
    ? 3 * plan.rows[from] * headGroup(plan, to, group).heads * plan.headDim
    : plan.rows[to] * headGroup(plan, from, group).heads * plan.headDim;
}

/**
 * How a group's ranks share a block's self-attention: Ulysses (exact, on the critical path) or displaced (one step
 * stale, off it: rank/displaced.ts).
 */
export type ParallelMode = 'ulysses' | 'displaced';

/**
 * Whether a forward attends to stale keys and values: displaced mode, or PipeFusion's patches of pipeline stages
 * (rank/pipefusion.ts), past their warm-up, where the ranks hold the pass's keys and values of the step before
 * (`previousStep`: the last step the pass ran on these ranks, undefined if none).
 */
export function attendsStale(
  mode: ParallelMode | 'pipefusion',
  warmupSteps: number,
  step: number,
  previousStep: number | undefined,
): boolean {
  return mode !== 'ulysses' && step >= warmupSteps && previousStep === step - 1;
}

/**
 * Bytes a rank holds in displaced mode: every rank's keys and values [2, S, D] in float32, for
 * each pass and block, of the last two steps (rank/displaced.ts: the step before's is what a spot
 * check of the last step's forward recomputes it from), at degree P with even shares.
 */
export function staleKeysValuesBytes(
  work: { model: Pick<WanConfig, 'numLayers' | 'dim'>; tokens: number; passes: number },
  degree: number,
): number {
  return degree < 2 ? 0 : 2 * work.passes * work.model.numLayers * 2 * work.tokens * work.model.dim * 4;
}

/**
 * Payload floats rank r sends per transformer block in displaced mode: k, v of its tokens, all heads, to each other
 * rank.
 */
export function displacedFloatsPerBlock(plan: UlyssesPlan, rank: number): number {
  return partFloats(plan, 'kv', rank, 0) * (plan.degree - 1);
}

/** A latent's tokens as each rank's patch rows, in rank order: rank r gets [rows[r], C·pt·ph·pw]. */
export function scatterLatent(cfg: WanConfig, plan: UlyssesPlan, latent: Tensor): Float32Array[] {
  const patches = patchify(cfg, latent);
  return Array.from({ length: plan.degree }, (_, rank) => scatterRows(plan, patches.data, patches.shape[1], rank));
}

/** The ranks' output rows [rows[r], pt·ph·pw·C] in rank order → the output, shaped like the latent. */
export function gatherLatent(cfg: WanConfig, plan: UlyssesPlan, rows: Float32Array[], shape: number[]): Tensor {
  return unpatchify(cfg, gatherRows(plan, rows, rows[0].length / plan.rows[0]), shape);
}
