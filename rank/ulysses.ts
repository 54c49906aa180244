import type { WanConfig } from '../core/model/config.ts';
import type { DType } from '../core/net/protocol.ts';
import { ropeTables, tokenGrid, type TokenGrid } from '../core/model/tokens.ts';
import { gatherLatent, headStart, planUlysses, scatterLatent, tokenStart, type UlyssesPlan } from '../core/parallel.ts';
import { concat, setCols, sliceCols, type Tensor } from '../core/tensor.ts';
import type { RankStats } from '../core/worker-api.ts';
import type { Activation, DeviceStageRunner, DeviceTensor, QKV, StageRunner } from './stages.ts';

/** Identifies one exchange of a job: which forward pass, which block, which phase. */
export interface ExchangeTag {
  job: number;
  step: number;
  pass: number; // 0 conditional, 1 unconditional
  block: number;
  phase: ExchangePhase;
}

export const enum ExchangePhase {
  /** q, k, v of the receiver's heads for the sender's tokens */
  QKV = 0,
  /** attention output of the receiver's tokens for the sender's heads */
  Output = 1,
  /** a timed all-to-all of fixed size at placement (rank/mesh-probe.ts), no model data */
  Probe = 2,
  /** k, v of the sender's tokens for all heads, the same to every peer (displaced.ts) */
  KeysValues = 3,
}

/**
 * One rank's side of the all-to-all: send parts[j] to rank j and resolve with what every rank j
 * sent to this one (parts[rank] comes back as is). Over WebRTC in pages, in memory in Node tests.
 */
export interface Exchange {
  readonly rank: number;
  readonly world: number;
  /** payload bytes this rank has sent so far */
  readonly bytesSent: number;
  /** how activations travel: float32, or float16 for half the bytes */
  readonly dtype: DType;
  allToAll(tag: ExchangeTag, parts: Float32Array[]): Promise<Float32Array[]>;
  /** how long to wait for a peer's part before naming it silent (an exchange over links) */
  waitAtMost?(ms: number): void;
  /** how many tensors a peer may send before this rank asks for them (a flood past it is the sender's fault) */
  allowAhead?(tensors: number): void;
}

export interface ForwardInput {
  patches: Float32Array; // this rank's [rows, C·pt·ph·pw]
  timestep: number;
  text: Float32Array; // [L, text_dim]
  grid: TokenGrid;
  tag: Omit<ExchangeTag, 'block' | 'phase'>;
}

export const noStats = (): RankStats => ({ computeMs: 0, commMs: 0, bytesDownloaded: 0, bytesKept: 0, deviceTensorsLeft: 0 });

/**
 * How one block's self-attention reaches the other ranks: q, k, v [Sl, D] of this rank's tokens
 * (all heads) → the attention output [Sl, D] for them. The parallel mode's one difference: Ulysses
 * (ulyssesAttention) by default, displaced (displaced.ts) beside it.
 */
export type BlockAttention = (block: number, qkv: QKV, io: BlockIO) => Promise<Float32Array>;

/** What a block's attention is given by the forward it is part of: its tags, and its clocks. */
export interface BlockIO {
  tag(block: number, phase: ExchangePhase): ExchangeTag;
  /** time spent computing */
  compute<T>(work: Promise<T>): Promise<T>;
  /** time spent waiting for peers */
  wait<T>(work: Promise<T>): Promise<T>;
}

/**
 * Ulysses: all-to-all so each rank has its heads for every token → attention over all tokens for
 * its heads → all-to-all back. Shares may be uneven (plan.heads, plan.rows): each part exchanged
 * has its own size.
 */
export function ulyssesAttention(cfg: WanConfig, plan: UlyssesPlan, stages: StageRunner, exchange: Exchange): BlockAttention {
  const { dim: D, headDim: d } = cfg;
  const { degree: P, rows } = plan;
  const me = exchange.rank;
  const Sl = rows[me];
  const W = plan.heads[me] * d;
  /** rank j's heads: columns [headStart(j)·d, +heads[j]·d) of a [*, D] activation */
  const cols = (j: number) => [headStart(plan, j) * d, plan.heads[j] * d] as const;
  return async (block, { q, k, v }, io) => {
    // one combined message per peer: its heads' q, k, v for my tokens, [3, Sl, W_j]
    const outgoing = Array.from({ length: P }, (_, j) => concat([q, k, v].map((m) => sliceCols(m, D, ...cols(j)))));
    const incoming = await io.wait(exchange.allToAll(io.tag(block, ExchangePhase.QKV), outgoing));
    // my heads for all tokens: rank j's part [3, rows[j], W] fills rows [tokenStart(j), +rows[j])
    const full = [0, 1, 2].map((which) => concat(incoming.map((part, j) => part.subarray(which * rows[j] * W, (which + 1) * rows[j] * W))));
    const o = await io.compute(stages.attention({ q: full[0], k: full[1], v: full[2] }, W)); // [S, W]

    const back = Array.from({ length: P }, (_, j) => o.slice(tokenStart(plan, j) * W, (tokenStart(plan, j) + rows[j]) * W));
    const returned = await io.wait(exchange.allToAll(io.tag(block, ExchangePhase.Output), back));
    const attn = new Float32Array(Sl * D); // [Sl, D]: rank j's heads fill its columns
    returned.forEach((part, j) => setCols(attn, D, cols(j)[0], part, cols(j)[1]));
    return attn;
  };
}

/**
 * One rank's share of a DiT forward pass: per block, q/k/v for the local tokens of all heads →
 * self-attention with the other ranks (`attend`: Ulysses unless given) → the rest of the block on
 * the local tokens. Returns proj_out rows [rows, ·].
 * The residual stream and the conditioning never leave the rank, so on a device runner they stay
 * device tensors; each is released once nothing reads it, and all are when the pass fails.
 */
export async function forwardRank(
  cfg: WanConfig,
  plan: UlyssesPlan,
  stages: DeviceStageRunner,
  exchange: Exchange,
  input: ForwardInput,
  stats: RankStats = noStats(),
  attend: BlockAttention = ulyssesAttention(cfg, plan, stages, exchange),
): Promise<Float32Array> {
  const me = exchange.rank;
  const now = () => performance.now();
  const timed = (kind: 'computeMs' | 'commMs') => async <T>(work: Promise<T>): Promise<T> => {
    const start = now();
    try {
      return await work;
    } finally {
      stats[kind] += now() - start;
    }
  };
  const io: BlockIO = { tag: (block, phase) => ({ ...input.tag, block, phase }), compute: timed('computeMs'), wait: timed('commMs') };
  const held = new Set<DeviceTensor>();
  const arrived = <A extends Activation>(a: A): A => {
    if (a instanceof Float32Array) stats.bytesDownloaded += a.byteLength;
    else {
      stats.bytesKept += 4 * a.floats;
      held.add(a);
    }
    return a;
  };
  const release = async (done: Activation[]) => {
    const tensors = done.filter((a): a is DeviceTensor => !(a instanceof Float32Array));
    tensors.forEach((t) => held.delete(t));
    if (tensors.length && stages.release) stats.deviceTensorsLeft = await stages.release(tensors);
  };

  const { cos, sin } = ropeTables(cfg, input.grid, tokenStart(plan, me), plan.rows[me]);
  try {
    const embedded = await io.compute(stages.embed(input.patches, input.timestep, input.text));
    const { temb, tproj, context } = embedded;
    let x = embedded.x;
    [x, temb, tproj, context].forEach(arrived);
    for (let block = 0; block < cfg.numLayers; block++) {
      const qkv = await io.compute(stages.preAttention(block, x, tproj, cos, sin));
      [qkv.q, qkv.k, qkv.v].forEach(arrived);
      const attn = arrived(await attend(block, qkv, io)); // [Sl, D]
      const next = arrived(await io.compute(stages.postAttention(block, x, attn, tproj, context)));
      await io.compute(release([x]));
      x = next;
    }
    const output = arrived(await io.compute(stages.head(x, temb)));
    await io.compute(release([...held]));
    return output;
  } catch (error) {
    await release([...held]).catch(() => {}); // the pass's own error says more than a failed cleanup
    throw error;
  }
}

/**
 * A whole forward pass with all P ranks in this process (the `local` backend, and tests):
 * scatter the latent's tokens, run every rank, gather their rows in token order. `heads`: each
 * rank's share of the heads (even without it); `attendOf`: each rank's block attention (Ulysses
 * without it).
 */
export async function forwardInProcess(
  cfg: WanConfig,
  stages: DeviceStageRunner,
  exchanges: Exchange[],
  latent: Tensor,
  timestep: number,
  text: Float32Array,
  tag: ForwardInput['tag'] = { job: 0, step: 0, pass: 0 },
  heads: number[] | number = exchanges.length,
  attendOf?: (exchange: Exchange, plan: UlyssesPlan) => BlockAttention,
): Promise<Tensor> {
  const grid = tokenGrid(cfg, latent.shape);
  const plan = planUlysses(cfg, grid.count, heads);
  if (plan.degree !== exchanges.length) throw new Error(`${exchanges.length} ranks for head shares ${plan.heads.join('/')}`);
  const patches = scatterLatent(cfg, plan, latent);
  const outputs = await Promise.all(
    exchanges.map((exchange) => forwardRank(cfg, plan, stages, exchange, { patches: patches[exchange.rank], timestep, text, grid, tag }, noStats(), attendOf?.(exchange, plan))),
  );
  return gatherLatent(cfg, plan, outputs, latent.shape);
}
