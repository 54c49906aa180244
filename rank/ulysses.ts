import type { WanConfig } from '../core/model/config.ts';
import type { DType } from '../core/net/protocol.ts';
import { allBlocks, holdsHead, type BlockRange, type HiddenState } from '../core/model/blocks.ts';
export type { HiddenState } from '../core/model/blocks.ts';
import { ropeTables, tokenGrid, type TokenGrid } from '../core/model/tokens.ts';
import { timestepLevels, timestepRows, type Timestep } from '../core/model/timesteps.ts';
import {
  gatherLatent,
  headGroup,
  headStart,
  planUlysses,
  scatterLatent,
  tokenStart,
  type UlyssesPlan,
} from '../core/parallel.ts';
import { concat, setCols, sliceCols, type Tensor } from '../core/tensor.ts';
import type { RankStats } from '../core/worker-api.ts';
import type { Activation, DeviceStageRunner, DeviceTensor, QKV, StageRunner } from './stages.ts';
import { judgeMatrices, stepLimits, type ColumnLimits, type ModelBounds } from './bounds.ts';

/** Identifies one exchange of a job: which forward pass, which block, which phase. */
export interface ExchangeTag {
  job: number;
  step: number;
  pass: number; // 0 conditional, 1 unconditional
  block: number;
  phase: ExchangePhase;
  /** the head group of a Ulysses exchange (core/parallel.ts headGroup); 0 in every other phase */
  group: number;
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
  /** a pipeline stage's hidden state, to the rank of the next stage that computes its tokens (hand-off.ts) */
  HandOff = 4,
}

/** A tensor header's phase, a peer's number, as the ExchangePhase it names, if any. */
export function exchangePhase(phase: number): ExchangePhase | undefined {
  switch (phase) {
    case 0:
      return ExchangePhase.QKV;
    case 1:
      return ExchangePhase.Output;
    case 2:
      return ExchangePhase.Probe;
    case 3:
      return ExchangePhase.KeysValues;
    case 4:
      return ExchangePhase.HandOff;
    default:
      return undefined;
  }
}

/**
 * Why rank `from`'s part is beyond what the model can produce (rank/bounds.ts), or null where it
 * is within: the exchange blames the sender for it before anything is computed from it.
 */
export type PeerPartJudge = (from: number, part: Float32Array) => string | null;

/**
 * One rank's side of the all-to-all: send parts[j] to rank j and resolve with what every rank j
 * sent to this one (parts[rank] comes back as is), each peer's part first judged by `judge`.
 * Over WebRTC in pages, in memory in Node tests.
 */
export interface Exchange {
  readonly rank: number;
  readonly world: number;
  /** payload bytes this rank has sent so far */
  readonly bytesSent: number;
  /** how activations travel: float32, or float16 for half the bytes */
  readonly dtype: DType;
  allToAll(tag: ExchangeTag, parts: Float32Array[], judge?: PeerPartJudge): Promise<Float32Array[]>;
  /** how long to wait for a peer's part before naming it silent (an exchange over links) */
  waitAtMost?(ms: number): void;
  /** how many tensors a peer may send before this rank asks for them (a flood past it is the sender's fault) */
  allowAhead?(tensors: number): void;
}

/**
 * One way between two ranks, where the all-to-all is both ways at once: a pipeline stage's rank hands its hidden state
 * to the next stage's (hand-off.ts). `receive` judges the part as allToAll does. Over WebRTC in pages, in memory in
 * Node tests.
 */
export interface PointToPoint {
  readonly rank: number;
  readonly dtype: DType;
  /** payload bytes this rank has sent so far */
  readonly bytesSent: number;
  send(tag: ExchangeTag, to: number, part: Float32Array): Promise<void>;
  receive(tag: ExchangeTag, from: number, judge?: PeerPartJudge): Promise<Float32Array>;
  /** how long to wait for the peer's part before naming it silent (over links) */
  waitAtMost?(ms: number): void;
  /** how many tensors the peer may send before this rank asks for them */
  allowAhead?(tensors: number): void;
}

export interface ForwardInput {
  patches: Float32Array; // this rank's [rows, C·pt·ph·pw]
  /** one for all tokens, or this rank's rows' own (core/model/timesteps.ts) */
  timestep: Timestep;
  text: Float32Array; // [L, text_dim]
  grid: TokenGrid;
  tag: Omit<ExchangeTag, 'block' | 'phase' | 'group'>;
  /** what the model's weights bound its exchanged activations by; without them, parts are not judged */
  bounds?: ModelBounds;
  /**
   * a step cache's forward (core/step-cache.ts): the blocks skipped, this residual [Sl, D] added to the embedding in
   * their place; or the blocks run and their residual handed to `keep`
   */
  residual?: { reuse: Float32Array } | { keep: (residual: Float32Array) => void };
}

export const noStats = (): RankStats => ({
  computeMs: 0,
  commMs: 0,
  overlapMs: 0,
  bytesDownloaded: 0,
  bytesKept: 0,
  deviceTensorsLeft: 0,
});

/**
 * How one block's self-attention reaches the other ranks: q, k, v [Sl, D] of this rank's tokens
 * (all heads) → the attention output [Sl, D] for them. The parallel mode's one difference: Ulysses
 * (ulyssesAttention) by default, displaced (displaced.ts) beside it.
 */
export type BlockAttention = (block: number, qkv: QKV, io: BlockIO) => Promise<Float32Array>;

/** What a block's attention is given by the forward it is part of: its tags, and its clocks. */
export interface BlockIO {
  tag(block: number, phase: ExchangePhase, group?: number): ExchangeTag;
  /** time spent computing */
  compute<T>(work: Promise<T>): Promise<T>;
  /** time spent waiting for peers */
  wait<T>(work: Promise<T>): Promise<T>;
  /** an exchange of this rank's, on the wire until it settles: what the rank computes meanwhile is overlap */
  onWire<T>(exchange: Promise<T>): Promise<T>;
  /** the largest |q|, |k|, |v| a peer's block can send in this forward, per column of D; null: not judged */
  limits(block: number): ColumnLimits | null;
}

/**
 * A forward's clocks (RankStats): time computing, time waiting for peers, and time computing while
 * an exchange of its own is on the wire (overlapMs: the exchange hidden behind compute). A forward's
 * stages run one after another, so at most one compute is open at a time; its exchanges may be many.
 */
class ForwardClocks implements Omit<BlockIO, 'tag' | 'limits'> {
  private computing = 0;
  private onWireCount = 0;
  private since = performance.now();
  private stopped = false;

  constructor(private readonly stats: RankStats) {}

  compute = <T>(work: Promise<T>): Promise<T> =>
    this.span(
      'computeMs',
      work,
      () => this.computing++,
      () => this.computing--,
    );
  wait = <T>(work: Promise<T>): Promise<T> => this.span('commMs', work);
  onWire = <T>(exchange: Promise<T>): Promise<T> =>
    this.span(
      null,
      exchange,
      () => this.onWireCount++,
      () => this.onWireCount--,
    );

  /** The forward is over: an exchange still on the wire (displaced mode's gather for the next step) counts no more. */
  stop(): void {
    this.tick();
    this.stopped = true;
  }

  private async span<T>(
    kind: 'computeMs' | 'commMs' | null,
    work: Promise<T>,
    open = () => {},
    close = () => {},
  ): Promise<T> {
    this.tick();
    open();
    const start = performance.now();
    try {
      return await work;
    } finally {
      this.tick();
      close();
      if (kind && !this.stopped) this.stats[kind] += performance.now() - start;
    }
  }

  private tick(): void {
    const now = performance.now();
    if (!this.stopped && this.computing > 0 && this.onWireCount > 0) this.stats.overlapMs += now - this.since;
    this.since = now;
  }
}

/**
 * Ulysses: all-to-all so each rank has its heads for every token → attention over all tokens for
 * its heads → all-to-all back, a head group at a time (core/parallel.ts headGroup): every group's
 * q, k, v go at once, each group's attention starts when that group has arrived, and its output
 * goes back while the next group computes. Shares may be uneven (plan.heads, plan.rows): each
 * part exchanged has its own size.
 */
export function ulyssesAttention(
  cfg: WanConfig,
  plan: UlyssesPlan,
  stages: StageRunner,
  exchange: Exchange,
): BlockAttention {
  const { dim: D, headDim: d } = cfg;
  const { degree: P, rows } = plan;
  const me = exchange.rank;
  const Sl = rows[me];
  const groups = Array.from({ length: plan.headGroups }, (_, g) => g);
  /** rank j's heads of group g: columns [·, +heads·d) of a [*, D] activation */
  const cols = (j: number, g: number) => {
    const { start, heads } = headGroup(plan, j, g);
    return [(headStart(plan, j) + start) * d, heads * d] as const;
  };
  return async (block, { q, k, v }, io) => {
    const limits = io.limits(block);
    const columns = (l: Float32Array, [start, width]: readonly [number, number]) => l.subarray(start, start + width);
    // a peer sends my heads' q, k, v of its tokens; and its heads' attention output, within their v
    const qkvJudge = (g: number) => {
      if (!limits) return undefined;
      const judge = judgeMatrices(
        (['q', 'k', 'v'] as const).map((name) => ({ name, limits: columns(limits[name], cols(me, g)) })),
        exchange.dtype,
      );
      return (_from: number, part: Float32Array) => judge(part);
    };
    const outputJudge = (g: number) => {
      if (!limits) return undefined;
      const judges = Array.from({ length: P }, (_, j) =>
        judgeMatrices([{ name: 'attention output', limits: columns(limits.v, cols(j, g)) }], exchange.dtype, 2),
      );
      return (from: number, part: Float32Array) => judges[from](part);
    };
    // per group, one combined message per peer: its heads' q, k, v for my tokens, [3, Sl, W_j]
    const arriving = groups.map((g) => {
      const outgoing = Array.from({ length: P }, (_, j) =>
        concat([q, k, v].map((m) => sliceCols(m, D, ...cols(j, g)))),
      );
      return io.onWire(exchange.allToAll(io.tag(block, ExchangePhase.QKV, g), outgoing, qkvJudge(g)));
    });
    // a failed group is awaited below: not an unhandled rejection meanwhile
    for (const part of arriving) part.catch(() => {});
    const returning: Promise<Float32Array[]>[] = [];
    for (const g of groups) {
      const incoming = await io.wait(arriving[g]);
      const W = cols(me, g)[1];
      // my group's heads for all tokens: rank j's part [3, rows[j], W] fills rows [tokenStart(j), +rows[j])
      const full = [0, 1, 2].map((which) =>
        concat(incoming.map((part, j) => part.subarray(which * rows[j] * W, (which + 1) * rows[j] * W))),
      );
      const o = await io.compute(stages.attention({ q: full[0], k: full[1], v: full[2] }, W)); // [S, W]
      const back = Array.from({ length: P }, (_, j) =>
        o.slice(tokenStart(plan, j) * W, (tokenStart(plan, j) + rows[j]) * W),
      );
      returning.push(io.onWire(exchange.allToAll(io.tag(block, ExchangePhase.Output, g), back, outputJudge(g))));
      returning[g].catch(() => {});
    }
    const attn = new Float32Array(Sl * D); // [Sl, D]: rank j's heads of group g fill their columns
    for (const g of groups)
      (await io.wait(returning[g])).forEach((part, j) => setCols(attn, D, cols(j, g)[0], part, cols(j, g)[1]));
    return attn;
  };
}

/** A forward's activation on the CPU side, read back where the runner keeps it on its device. */
async function hostCopy(stages: DeviceStageRunner, a: Activation, what: string): Promise<Float32Array> {
  if (a instanceof Float32Array) return a;
  if (!stages.read)
    throw new Error(`this runner keeps ${what} on its device but cannot read it back (DeviceStageRunner.read)`);
  return stages.read(a);
}

/** Where a stage's forward starts: the patches on the first stage, the last stage's hidden state after it. */
export type StageInput = Omit<ForwardInput, 'patches'> & ({ patches: Float32Array } | { hidden: HiddenState });

/** What a stage's forward ends with: the head's rows on the last stage, the hidden state for the next before it. */
export type StageOutput = { rows: Float32Array } | { hidden: HiddenState };

/**
 * One rank's share of a DiT forward pass: per block, q/k/v for the local tokens of all heads →
 * self-attention with the other ranks (`attend`: Ulysses unless given) → the rest of the block on
 * the local tokens. Returns proj_out rows [rows, ·].
 * The residual stream and the conditioning never leave the rank, so on a device runner they stay
 * device tensors; each is released once nothing reads it, and all are when the pass fails.
 */
/** An exchange that only says whose tokens a forward computes, for a forward that sends nothing (`what`). */
export function placeOnly(rank: number, world: number, what: string): Exchange {
  return {
    rank,
    world,
    bytesSent: 0,
    dtype: 'f32',
    allToAll: () => Promise.reject(new Error(`${what} exchanges nothing`)),
  };
}

export async function forwardRank(
  cfg: WanConfig,
  plan: UlyssesPlan,
  stages: DeviceStageRunner,
  exchange: Exchange,
  input: ForwardInput,
  stats: RankStats = noStats(),
  attend: BlockAttention = ulyssesAttention(cfg, plan, stages, exchange),
): Promise<Float32Array> {
  const out = await forwardStage(cfg, plan, stages, exchange, input, allBlocks(cfg), stats, attend);
  if (!('rows' in out)) throw new Error('a whole forward ends at the output head');
  return out.rows;
}

/**
 * One rank's share of a pipeline stage's blocks [from, to) of a forward (forwardRank: all of them):
 * from the patches where the stage holds the embedders, else from the previous stage's hidden
 * state; to the head's rows where it holds the head, else to the hidden state for the next stage.
 */
export async function forwardStage(
  cfg: WanConfig,
  plan: UlyssesPlan,
  stages: DeviceStageRunner,
  exchange: Exchange,
  input: StageInput,
  blocks: BlockRange,
  stats: RankStats = noStats(),
  attend: BlockAttention = ulyssesAttention(cfg, plan, stages, exchange),
): Promise<StageOutput> {
  const me = exchange.rank;
  const clocks = new ForwardClocks(stats);
  let limits: (ColumnLimits | null)[] | null = null;
  const io: BlockIO = {
    tag: (block, phase, group = 0) => ({ ...input.tag, block, phase, group }),
    compute: clocks.compute,
    wait: clocks.wait,
    onWire: clocks.onWire,
    limits: (block) => limits?.[block] ?? null,
  };
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
  const { values: timesteps, index: levels } = timestepLevels(input.timestep, plan.rows[me]);
  try {
    const embedded =
      'hidden' in input ? input.hidden : await io.compute(stages.embed(input.patches, timesteps, input.text));
    const { temb, tproj, context } = embedded;
    let x = embedded.x;
    [x, temb, tproj, context].forEach(arrived);
    const { bounds, residual } = input;
    if (residual && !(blocks.from === 0 && holdsHead(cfg, blocks)))
      throw new Error('a step cache skips or keeps all the blocks: it needs a rank that holds them all');
    // the blocks' input, which their residual is taken against
    const entering = residual && (await io.compute(hostCopy(stages, x, 'the residual stream')));
    const reused = residual && 'reuse' in residual ? residual.reuse : null;
    if (entering && reused) x = arrived(added(entering, reused));
    // this forward's modulation, which bounds v, as this rank computed it itself (a reuse exchanges nothing to judge)
    else if (bounds && plan.degree > 1)
      limits = stepLimits(bounds, await io.compute(hostCopy(stages, tproj, 'the timestep projection')));
    for (let block = blocks.from; block < (reused ? blocks.from : blocks.to); block++) {
      const qkv = await io.compute(stages.preAttention(block, x, tproj, levels, cos, sin));
      [qkv.q, qkv.k, qkv.v].forEach(arrived);
      const attn = arrived(await attend(block, qkv, io)); // [Sl, D]
      const next = arrived(await io.compute(stages.postAttention(block, x, attn, tproj, levels, context)));
      await io.compute(release([x]));
      x = next;
    }
    if (entering && 'keep' in residual)
      residual.keep(subtracted(await io.compute(hostCopy(stages, x, 'the residual stream')), entering));
    const output: StageOutput = holdsHead(cfg, blocks)
      ? { rows: arrived(await io.compute(stages.head(x, temb, levels))) }
      : {
          hidden: await io.compute(
            (async () => ({
              x: await hostCopy(stages, x, 'the residual stream'),
              temb: await hostCopy(stages, temb, 'temb'),
              tproj: await hostCopy(stages, tproj, 'the timestep projection'),
              context: await hostCopy(stages, context, 'the context'),
            }))(),
          ),
        };
    await io.compute(release([...held]));
    return output;
  } catch (error) {
    await release([...held]).catch(() => {}); // the pass's own error says more than a failed cleanup
    throw error;
  } finally {
    clocks.stop();
  }
}

/**
 * A whole forward pass with all P ranks in this process (the `local` backend, and tests):
 * scatter the latent's tokens, run every rank, gather their rows in token order. `heads`: each
 * rank's share of the heads (even without it); `attendOf`: each rank's block attention (Ulysses
 * without it); `residualOf`: each rank's step cache forward (core/step-cache.ts), none without it.
 */
export async function forwardInProcess(
  cfg: WanConfig,
  stages: DeviceStageRunner,
  exchanges: Exchange[],
  latent: Tensor,
  timestep: Timestep,
  text: Float32Array,
  tag: ForwardInput['tag'] = { job: 0, step: 0, pass: 0 },
  heads: number[] | number = exchanges.length,
  attendOf?: (exchange: Exchange, plan: UlyssesPlan) => BlockAttention,
  residualOf?: (rank: number) => ForwardInput['residual'],
): Promise<Tensor> {
  const grid = tokenGrid(cfg, latent.shape);
  const plan = planUlysses(cfg, grid.count, heads);
  if (plan.degree !== exchanges.length)
    throw new Error(`${exchanges.length} ranks for head shares ${plan.heads.join('/')}`);
  const patches = scatterLatent(cfg, plan, latent);
  const outputs = await Promise.all(
    exchanges.map((exchange) =>
      forwardRank(
        cfg,
        plan,
        stages,
        exchange,
        {
          patches: patches[exchange.rank],
          timestep: timestepRows(timestep, tokenStart(plan, exchange.rank), plan.rows[exchange.rank]),
          text,
          grid,
          tag,
          residual: residualOf?.(exchange.rank),
        },
        noStats(),
        attendOf?.(exchange, plan),
      ),
    ),
  );
  return gatherLatent(cfg, plan, outputs, latent.shape);
}

/** a + b, elementwise, as a new array: a residual reused must leave the one kept as it was */
function added(a: Float32Array, b: Float32Array): Float32Array {
  if (a.length !== b.length) throw new Error(`a residual of ${b.length} values for a stream of ${a.length}`);
  return a.map((v, i) => v + b[i]);
}

function subtracted(a: Float32Array, b: Float32Array): Float32Array {
  return a.map((v, i) => v - b[i]);
}
