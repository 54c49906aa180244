import type { WanConfig } from '../core/model/config.ts';
import type { DType } from '../core/protocol.ts';
import { patchify, ropeTables, tokenGrid, unpatchify, type TokenGrid } from '../core/model/tokens.ts';
import { gatherRows, keyPaddingBias, planUlysses, scatterRows, tokenStart, type UlyssesPlan } from '../core/parallel.ts';
import { concat, setCols, sliceCols, type Tensor } from '../core/tensor.ts';
import type { StageRunner } from './stages.ts';

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
}

export interface ForwardInput {
  patches: Float32Array; // this rank's [Sl, C·pt·ph·pw]
  timestep: number;
  text: Float32Array; // [L, text_dim]
  grid: TokenGrid;
  tag: Omit<ExchangeTag, 'block' | 'phase'>;
}

/** Time a rank spent computing and waiting for peers during one forward pass. */
export interface RankTiming {
  computeMs: number;
  commMs: number;
}

/**
 * One rank's share of a DiT forward pass under Ulysses sequence parallelism: per block, q/k/v for
 * the local tokens of all heads → all-to-all → attention over all tokens for the local heads →
 * all-to-all back → the rest of the block on the local tokens. Returns proj_out rows [Sl, ·].
 */
export async function forwardRank(
  cfg: WanConfig,
  plan: UlyssesPlan,
  stages: StageRunner,
  exchange: Exchange,
  input: ForwardInput,
  timing: RankTiming = { computeMs: 0, commMs: 0 },
): Promise<Float32Array> {
  const { dim: D } = cfg;
  const { localTokens: Sl, headWidth: W, degree: P } = plan;
  const now = () => performance.now();
  const timed = async <T>(kind: keyof RankTiming, work: Promise<T>): Promise<T> => {
    const start = now();
    try {
      return await work;
    } finally {
      timing[kind] += now() - start;
    }
  };

  const { cos, sin } = ropeTables(cfg, input.grid, tokenStart(plan, exchange.rank), Sl);
  const keyBias = keyPaddingBias(plan);
  const { x: x0, temb, tproj, context } = await timed('computeMs', stages.embed(input.patches, input.timestep, input.text));
  let x = x0;
  for (let block = 0; block < cfg.numLayers; block++) {
    const { q, k, v } = await timed('computeMs', stages.preAttention(block, x, tproj, cos, sin));
    // one combined message per peer: its heads' q, k, v for my tokens, [3, Sl, W]
    const outgoing = Array.from({ length: P }, (_, j) => concat([q, k, v].map((m) => sliceCols(m, D, j * W, W))));
    const incoming = await timed('commMs', exchange.allToAll({ ...input.tag, block, phase: ExchangePhase.QKV }, outgoing));
    // my heads for all tokens: rank j's slice fills rows [j·Sl, (j+1)·Sl)
    const full = [0, 1, 2].map((which) => concat(incoming.map((part) => part.subarray(which * Sl * W, (which + 1) * Sl * W))));
    const o = await timed('computeMs', stages.attention({ q: full[0], k: full[1], v: full[2] }, keyBias)); // [S_pad, W]

    const back = Array.from({ length: P }, (_, j) => o.slice(j * Sl * W, (j + 1) * Sl * W));
    const returned = await timed('commMs', exchange.allToAll({ ...input.tag, block, phase: ExchangePhase.Output }, back));
    const attn = new Float32Array(Sl * D); // [Sl, D]: rank j's heads fill columns [j·W, (j+1)·W)
    returned.forEach((part, j) => setCols(attn, D, j * W, part, W));
    x = await timed('computeMs', stages.postAttention(block, x, attn, tproj, context));
  }
  return timed('computeMs', stages.head(x, temb));
}

/**
 * A whole forward pass with all P ranks in this process (the `local` backend, and tests):
 * scatter the latent's tokens, run every rank, gather their rows in token order.
 */
export async function forwardInProcess(
  cfg: WanConfig,
  stages: StageRunner,
  exchanges: Exchange[],
  latent: Tensor,
  timestep: number,
  text: Float32Array,
  tag: ForwardInput['tag'] = { job: 0, step: 0, pass: 0 },
): Promise<Tensor> {
  const grid = tokenGrid(cfg, latent.shape);
  const plan = planUlysses(cfg, grid.count, exchanges.length);
  const patches = patchify(cfg, latent);
  const width = patches.shape[1];
  const outputs = await Promise.all(
    exchanges.map((exchange) =>
      forwardRank(cfg, plan, stages, exchange, { patches: scatterRows(plan, patches.data, width, exchange.rank), timestep, text, grid, tag }),
    ),
  );
  const outWidth = outputs[0].length / plan.localTokens;
  return unpatchify(cfg, gatherRows(plan, outputs, outWidth), latent.shape);
}
