import { attention } from '../core/model/ops.ts';
import {
  embedConditions,
  embedPatches,
  head,
  postAttention,
  preAttention,
  type WanModel,
} from '../core/model/reference.ts';
import { forward, type MethodNames } from './forwarding.ts';

/**
 * A tensor that a runner keeps on its device (a WebGPU buffer) for the rank's next stages, by
 * handle: it never crosses to the CPU side unless a stage reads it there. Plain data, so it
 * passes through comlink to the engine's Web Worker and back.
 */
export interface DeviceTensor {
  readonly deviceTensor: number; // the runner's id for it
  readonly floats: number;
}

/** A stage output on its way to another stage of the same rank: its values, or a device tensor. */
export type Activation = Float32Array | DeviceTensor;

/** The values of an activation that must be on the CPU side; a device tensor here is a bug. */
export function hostValues(a: Activation): Float32Array {
  if (a instanceof Float32Array) return a;
  throw new Error(
    `device tensor ${a.deviceTensor} (${a.floats} floats) reached a runner that only reads CPU values: ` +
      'pass device tensors back to the runner that made them',
  );
}

/**
 * What a rank computes between exchanges, one call per stage graph. Matrices are row-major with
 * their row count implied by the length: x and o [Sl, D], q/k/v after the exchange [S, (H/P)·d].
 * What only feeds the rank's own next stages (x, temb, tproj, context) is an `Activation` and may
 * stay on the device; what crosses ranks or leaves the rank (q/k/v, o, rows) is a Float32Array.
 */
export interface Embedded {
  x: Activation; // [Sl, D]
  temb: Activation; // [T, D]: one per distinct timestep (core/model/timesteps.ts)
  tproj: Activation; // [6T, D]
  context: Activation; // [L, D]
}

export interface QKV {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
}

/**
 * `timesteps` are a forward's distinct ones [T], `levels` [Sl] each token's index into them (core/model/timesteps.ts):
 * per-row inputs like RoPE's cos and sin.
 */
export interface StageRunner {
  embed(patches: Float32Array, timesteps: Float32Array, text: Float32Array): Promise<Embedded>;
  preAttention(
    block: number,
    x: Activation,
    tproj: Activation,
    levels: Int32Array,
    cos: Float32Array,
    sin: Float32Array,
  ): Promise<QKV>;
  /**
   * self-attention of `width` = heads·d columns: q [Sq, width] over k, v [Sk, width] → [Sq, width]
   * (Ulysses: every token for this rank's heads, Sq = Sk; displaced: this rank's tokens over all)
   */
  attention(qkv: QKV, width: number): Promise<Float32Array>;
  postAttention(
    block: number,
    x: Activation,
    o: Float32Array,
    tproj: Activation,
    levels: Int32Array,
    context: Activation,
  ): Promise<Activation>;
  head(x: Activation, temb: Activation, levels: Int32Array): Promise<Float32Array>;
}

/**
 * A runner whose outputs may stay on the device: each device tensor it returns lives until
 * released. One without `release` never returns device tensors.
 */
export interface DeviceStageRunner extends StageRunner {
  /** Frees these device tensors; resolves with how many the runner still keeps (0 between passes). */
  release?(tensors: DeviceTensor[]): Promise<number>;
  /** A device tensor's values, read back; it stays on the device (a rank reads its small ones: rank/bounds.ts). */
  read?(tensor: DeviceTensor): Promise<Float32Array>;
}

/**
 * A queue of work that runs one item at a time, in order: onnxruntime-web's WebGPU backend refuses
 * overlapping session runs, and its WASM heap is not to be shared by runs of sessions at once.
 */
export function oneAtATime(): <T>(work: () => Promise<T>) => Promise<T> {
  let queue: Promise<unknown> = Promise.resolve();
  return <T>(work: () => Promise<T>): Promise<T> => {
    const next = queue.then(work, work);
    queue = next.catch(() => {});
    return next;
  };
}

/** A runner's methods by name, for the wrappers that pass them on (forwarding.ts). */
export const STAGE_METHODS: MethodNames<DeviceStageRunner> = {
  embed: true,
  preAttention: true,
  attention: true,
  postAttention: true,
  head: true,
  release: true,
  read: true,
};

/**
 * A runner whose stages run one at a time, whoever calls them (ranks in one process, a guided
 * step's two passes), as a worker's engine runs them.
 */
export function serialStages<R extends DeviceStageRunner>(runner: R): R {
  const serial = oneAtATime();
  const serialized = forward(STAGE_METHODS, (call) => serial(() => call(runner)));
  // a runner without release never returns device tensors: so does its serial one
  if (!runner.release) delete serialized.release;
  if (!runner.read) delete serialized.read;
  return { ...runner, ...serialized };
}

/** What `compute` returns, as a promise, and what it throws as a rejection: a synchronous stage as an async one. */
function settled<T>(compute: () => T): Promise<T> {
  return new Promise((resolve) => {
    resolve(compute());
  });
}

/** The plain TypeScript reference behind the same interface (the `reference` backend). */
export function referenceStages(m: WanModel): StageRunner {
  const { headDim } = m.config;
  const cpu = hostValues;
  return {
    embed: (patches, timesteps, text) =>
      settled(() => ({ x: embedPatches(m, patches), ...embedConditions(m, timesteps, text) })),
    preAttention: (block, x, tproj, levels, cos, sin) =>
      settled(() => preAttention(m, block, cpu(x), cpu(tproj), levels, cos, sin)),
    attention: ({ q, k, v }, width) => settled(() => attention(q, k, v, headDim, width)),
    postAttention: (block, x, o, tproj, levels, context) =>
      settled(() =>
        postAttention(
          m,
          block,
          cpu(x),
          o,
          { temb: new Float32Array(0), tproj: cpu(tproj), context: cpu(context) },
          levels,
        ),
      ),
    head: (x, temb, levels) => settled(() => head(m, cpu(x), cpu(temb), levels)),
  };
}
