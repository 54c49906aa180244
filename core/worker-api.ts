// The coordinator↔worker contract: one interface that a rank's runtime implements (rank/runtime.ts)
// and the coordinator calls through `remote()` (core/net/rpc.ts), and one table of checks that judges
// every call's arguments where the worker receives them and every reply where the coordinator
// receives it. The compiler holds the table to the interface, down to each optional field
// (FieldChecks), and the client and the served methods are the table's keys: the sides cannot drift.
import type { CacheMode } from './step-cache.ts';
import type { BlockRange, HiddenState } from './model/blocks.ts';
import { LORA_LIMITS, type LoraRef } from './model/lora.ts';
import { RANK_SETTINGS_CHECKS, type RankSettings } from './rank-settings.ts';
import {
  fail,
  fields,
  floats,
  hexOf,
  int,
  list,
  none,
  nullable,
  num,
  oneOf,
  optional,
  text,
  type Check,
  type FieldChecks,
} from './net/check.ts';
import { TIMESTEP_RANGE, type Timestep } from './model/timesteps.ts';
import type { ApiContract, Remote } from './net/rpc.ts';
import type { MeshSigning } from './net/signing.ts';
import type { Transport } from './net/channel.ts';

/** An onnxruntime-web execution provider a worker can run on. */
export type ExecutionProvider = 'webgpu' | 'wasm';
export const EXECUTION_PROVIDERS: readonly ExecutionProvider[] = ['webgpu', 'wasm'];

export type WorkerState = 'idle' | 'initialized' | 'loading' | 'ready' | 'computing';

/** what a worker's user may let the model's weights take (the worker page's field), in GiB */
export const MIN_MODEL_MEMORY_GIB = 2 ** -10;
export const MAX_MODEL_MEMORY_GIB = 4096;

/** Where a worker runs: a browser tab, or a Node process (`npm run worker`, worker/node/). */
export type WorkerKind = 'tab' | 'node';

/**
 * What a worker process's onnxruntime-node computes on (worker/node/native-devices.ts): its CPU, an NVIDIA GPU
 * through CUDA, or a GPU through WebGPU (Dawn). The engine calls it its 'wasm' EP: the EP that is not the browser's
 * WebGPU.
 */
export type NativeDevice = 'cpu' | 'cuda' | 'webgpu';
export const NATIVE_DEVICES: readonly NativeDevice[] = ['cpu', 'cuda', 'webgpu'];

/** What a worker says about itself when it joins. */
export interface WorkerInfo {
  /** absent: a tab */
  kind?: WorkerKind;
  /** a process's machine, by its host name (a tab cannot tell) */
  host?: string;
  /** what a process's 'wasm' EP computes on natively; absent: WebAssembly (a tab's, or a process's without it) */
  nativeDevice?: NativeDevice;
  ep: ExecutionProvider;
  adapter: string;
  /**
   * the WebGPU adapter computes on the CPU (WebGPU's isFallbackAdapter: SwiftShader, llvmpipe),
   * the CPU WASM has: 'auto' never takes it (it is far slower than WASM on the same CPU)
   */
  softwareAdapter: boolean;
  threads: number;
  memoryGiB: number | null;
  /**
   * what its user lets the model's weights take on it, in GiB (the worker page's field): a pipeline stage
   * holds no more (stage-plan.ts: memoryBudget). Absent: not set.
   */
  modelMemoryGiB?: number;
  userAgent: string;
  /**
   * an id the worker tabs of one browser share (worker/cores.ts): they compute on its machine's
   * cores and exchange through its loopback. Absent: a page that cannot say, taken as on a machine of its own.
   */
  browser?: string;
  /** its machine's cores, as its page or process is told them (navigator.hardwareConcurrency, availableParallelism) */
  cores: number;
  /**
   * a hint of the machine it computes on: a hash of what two browsers on one machine both see (rank/machine-hint.ts),
   * MACHINE_HINT_BYTES as hex; a process's, of the OS's machine id. Workers with one hint are taken as sharing its
   * `cores` (core/cost-model.ts coreShares). A hint, not an identity: one that lies about it changes only the
   * predictions of plans it is in.
   */
  machine: string;
}

/** the bytes of a machine hint (WorkerInfo.machine): a hash cut to 128 bits, enough that two machines rarely meet */
export const MACHINE_HINT_BYTES = 16;

/** where a browser keeps its id (WorkerInfo.browser), for its worker tabs and its dashboard on one origin */
export const BROWSER_ID_KEY = 'ditswarm-browser';

/** A rank's place in its job's mesh (its group's mesh with CFG parallel): RankLayout.meshOf. */
export interface RankMesh {
  rank: number;
  world: number;
  /** peer ids of all ranks of the mesh in rank order (the swarm mesh dials them) */
  peers: string[];
  session: string;
  /** each rank's share of the model's heads, in rank order (core/parallel.ts); even without it */
  heads?: number[];
  /** what it signs its tensors with and checks its peers' by (core/net/signing.ts); a mesh of one has none */
  signing?: MeshSigning;
  /**
   * a pipeline stage's links to the ranks that compute its tokens in the stages before and after (core/parallel.ts
   * stageLinksOf): each a mesh of two, the sender rank 0, the receiver rank 1, which its hidden state crosses directly
   */
  stageLinks?: StageLinks;
}

/** A mesh of two ranks that a pipeline stage's hidden state crosses. */
export type HandOffMesh = Omit<RankMesh, 'stageLinks'>;

export interface StageLinks {
  /** from the stage before's rank: this rank is its receiver */
  before?: HandOffMesh;
  /** to the next stage's rank: this rank is its sender */
  after?: HandOffMesh;
}

/** What a rank is told at initWorker: its place in the mesh and the placement's settings (placement.ts initArgsOf). */
export type InitArgs = RankMesh & RankSettings;

export const WEIGHT_TYPES = ['float32', 'float16', 'int8'] as const;
/**
 * How weights fed to a graph as inputs are stored, the math float32 all the same: float16 halves their memory; int8
 * halves the linear layers' matrices again (an integer per weight, a float32 scale per output channel; the rest as
 * float32), weight-only quantization (on WASM: rank/onnx-stages.ts heldWeightType).
 */
export type WeightType = (typeof WEIGHT_TYPES)[number];

export interface LoadArgs {
  /** the model folder as the worker fetches it */
  modelUrl: string;
  ep: ExecutionProvider | 'auto';
  /** the pipeline stage's blocks this worker holds (core/model/blocks.ts): only their tensors load; all where absent */
  blocks?: BlockRange;
  /** LoRA adapters merged into the weights as they load, in order (core/model/lora.ts); none where absent */
  loras?: LoraRef[];
  /**
   * how the blocks' weights are held: float16 halves them (widened per call), int8 quarters the matrices (on WASM;
   * WebGPU holds what float16 asked would); where absent, float16 on a WebGPU adapter with shader-f16 and float32
   * elsewhere. An adapter without shader-f16 holds float32 whatever is asked (rank/onnx-stages.ts heldWeightType)
   */
  weightType?: WeightType;
}

export interface LoadedModel {
  ep: ExecutionProvider;
  adapter: string;
  /** the model was in memory already, from an earlier job or rehearsal: loadMs and weights are that load's */
  inMemory: boolean;
  loadMs: number;
  /** why this EP: asked for by the job, or the faster one measured ("WASM: 21.3 GFLOP/s vs WebGPU 0.2") */
  why: string;
  weights: WeightsSource;
  /** the largest tensor its stages make: a stage that would make a larger one runs in chunks (rank/chunks.ts) */
  maxBufferBytes: number;
  /** how its blocks' weights are stored (LoadArgs' weightType as its device can) */
  weightType: WeightType;
  /** GPU buffers it allocated for the weights (0 on WASM; the activations' are onnxruntime's and not counted) */
  gpuWeightBytes: number;
  /** bytes of the transformer's weights it holds (the blocks' as `weightType`): a pipeline stage's alone */
  heldWeightBytes: number;
}

/** Where a worker's weights came from when it loaded them: bytes over the network and from its browser's cache. */
export interface WeightsSource {
  networkBytes: number;
  cacheBytes: number;
  /** why some were not kept (no room, no cache in this browser), or '' */
  note: string;
}

/** How far a worker's model load is, as its pulse reports it while loading. */
export interface LoadStatus {
  /** bytes of weights read, of all, and how many of them came over the network */
  bytes: number;
  totalBytes: number;
  networkBytes: number;
  elapsedMs: number;
  /** why weights are not being kept (WeightsSource's note), or '' */
  note: string;
}

/** "1.20 of 5.68 GB from the network · 45 MB/s · 2 min left": one load's progress as pages show it. */
export function describeLoad({ bytes, totalBytes, networkBytes, elapsedMs, note }: LoadStatus): string {
  const why = note ? ` (${note})` : '';
  if (bytes === 0) return `0 of ${amount(totalBytes)}${why}`;
  const rate = (bytes / Math.max(elapsedMs, 1)) * 1000;
  const leftS = (totalBytes - bytes) / rate;
  const from =
    networkBytes === 0
      ? 'from the browser cache'
      : networkBytes === bytes
        ? 'from the network'
        : `(${amount(networkBytes)} from the network)`;
  const left =
    leftS <= 0 ? '' : leftS >= 90 ? ` · ${Math.round(leftS / 60)} min left` : ` · ${Math.ceil(leftS)} s left`;
  return `${amount(bytes)} of ${amount(totalBytes)} ${from} · ${amount(rate)}/s${left}${why}`;
}

/** "weights: 5.68 GB from the browser cache", or from the network and whether they were kept */
export function describeWeights({ networkBytes, cacheBytes, note }: WeightsSource): string {
  const parts = [
    cacheBytes > 0 ? `${amount(cacheBytes)} from the browser cache` : '',
    networkBytes > 0 ? `${amount(networkBytes)} from the network` : '',
  ].filter(Boolean);
  return `weights: ${parts.join(', ') || 'none read'}${note ? ` (${note})` : ''}`;
}

/** bytes as pages show them: MB below a GB, GB above */
export const formatBytes = (bytes: number): string =>
  bytes >= 1e9 ? `${(bytes / 1e9).toFixed(2)} GB` : `${(bytes / 1e6).toFixed(1)} MB`;
const amount = formatBytes;

export interface PrepareArgs {
  job: number;
  /** text embeddings [L, text_dim]: the conditional pass's, then with guidance the unconditional one's */
  texts: Float32Array[];
  latentShape: number[]; // [C, T, H, W]
  /** how long a rank waits for a peer's tensor before naming it silent (within the coordinator's patience) */
  exchangeTimeoutMs?: number;
}

export interface ExecuteArgs {
  job: number;
  step: number;
  pass: number;
  /** one for all tokens, or one per token of this rank's (core/model/timesteps.ts) */
  timestep: Timestep;
  latentShape: number[];
  /** this rank's [Sl, C·pt·ph·pw]; empty where a later pipeline stage starts from `hidden` */
  patches: Float32Array;
  /** a later pipeline stage's input: the stage before's output for this rank's tokens */
  hidden?: HiddenState;
  /**
   * displaced mode: attend to the other ranks' keys and values of the previous step (this pass's)
   * rather than wait for this step's; exact where unset, or where this rank did not run that step
   */
  stale?: boolean;
  /**
   * a job with a step cache (core/step-cache.ts): 'keep' computes the blocks and keeps their residual (output − input)
   * for this pass; 'reuse' skips them, adding the residual the rank kept to this forward's embedding
   */
  cache?: CacheMode;
  /**
   * PipeFusion (a pipeline stage of one rank): this forward is patch `index` of the tokens cut in `count` as a plan of
   * `count` ranks cuts them, attending to every token's keys and values the rank holds (rank/pipefusion.ts); one patch
   * of one is the whole sequence, exact
   */
  patch?: PatchOf;
}

/** Which patch of how many a forward computes: the tokens of rank `index` of a plan of `count` (planUlysses). */
export interface PatchOf {
  index: number;
  count: number;
}

/** The forward whose residual a step cache's reuse adds: its step and timestep, and all its patches [S, ·]. */
export interface KeptForward {
  step: number;
  timestep: Timestep;
  patches: Float32Array;
}

/**
 * A spot check's recomputation: a forward as `executeModel` takes it, every token; a reused one (`cache: 'reuse'`)
 * with the forward it reuses the residual of, which the checker computes first (it kept no residual of its own)
 */
export interface RecomputeArgs extends ExecuteArgs {
  kept?: KeptForward;
}

/**
 * A forward recomputed alone, every token: its rows, or where the rank holds a pipeline stage before the last, the
 * hidden state its stage hands on (`rows` then empty), as ExecuteResult has them.
 */
export interface Recomputed {
  rows: Float32Array;
  hidden?: HiddenState;
  computeMs: number;
}

/** One forward of a job: a pass of a step. */
export interface ForwardKey {
  job: number;
  step: number;
  pass: number;
}

/**
 * A tensor a rank received in a forward's exchanges, and what proves who sent it (core/net/signing.ts): its payload's
 * SHA-256 and its sender's Ed25519 signature over that and its place, hex ('' where nothing is signed).
 */
export interface ExchangeReceipt {
  block: number;
  phase: number;
  group: number;
  /** the sender's rank in the mesh */
  from: number;
  digest: string;
  signature: string;
}

/** One forward's hand-off to a later stage's rank (a PipeFusion patch's where `patch` is given). */
export interface HandOffKey extends ForwardKey {
  patch?: number;
}

/** What a later stage's rank was handed for one forward, and its sender's signed receipts of each tensor of it. */
export interface HandOffEvidence {
  hidden: HiddenState;
  receipts: ExchangeReceipt[];
}

/** A group's forward recomputed in-process as its ranks ran it (its plan's heads and head groups): what each sent. */
export interface RecomputeExchangesArgs extends ExecuteArgs {
  heads: number[];
  headGroups: number;
}

/** What each rank of a group receives in a forward, by mesh rank: the true receipts, unsigned. */
export interface ExchangesRecomputed {
  received: ExchangeReceipt[][];
}

/** What one forward pass of a rank cost: time computing and waiting, bytes between device and CPU. */
export interface RankStats {
  computeMs: number;
  commMs: number;
  /** time computing while an exchange of the rank's was on the wire: the exchange hidden behind compute */
  overlapMs: number;
  /** bytes of stage outputs that came to the CPU side (on WebGPU: read back from GPU buffers) */
  bytesDownloaded: number;
  /** bytes of stage outputs that stayed on the device for this rank's next stages */
  bytesKept: number;
  /** device tensors the runner still keeps after the pass released its own: 0 unless passes overlap */
  deviceTensorsLeft: number;
}

export interface ExecuteResult extends RankStats {
  /** this rank's [Sl, pt·ph·pw·C]; empty where its pipeline stage hands its hidden state on to the next (StageLinks) */
  rows: Float32Array;
  /** a later stage's: the hidden state the stage before handed it directly, its payload bytes and how long it took */
  handOff?: HandOffStats;
  /** payload bytes this rank sent to its peers in this pass */
  bytesSent: number;
  /**
   * the most memory its page was measured to hold so far: JS heaps with the weights' ArrayBuffers,
   * its engine's among them (measureUserAgentSpecificMemory); null where the browser cannot tell
   */
  peakMemoryBytes: number | null;
  /**
   * a kept residual against the one kept before it for the pass (MagCache's magnitude ratio): the sum over this rank's
   * tokens of |r_t| / |r_t−1|, and how many tokens; absent where nothing was kept before
   */
  residualRatio?: { sum: number; tokens: number };
}

/** A hand-off as its receiver saw it: payload bytes, and ms from the first of its tensors to the last. */
export interface HandOffStats {
  bytes: number;
  ms: number;
}

/** How fast a worker computes on one EP: the two rates the cost model plans with. */
export interface ComputeProbe {
  ep: ExecutionProvider;
  /** matrix-multiply FLOP/s */
  flops: number;
  /** attention scores (bias + softmax) per second: the memory-bound work FLOP counts miss */
  softmaxRate: number;
  /** ms one stage call costs whatever its size (a step at few tokens is mostly this) */
  stageMs: number;
}

/**
 * A job's forward passes timed before the job, on the model and the shapes it will run: a rank's
 * share under each Ulysses degree (its tokens, its heads over all tokens), computed through the
 * same stage calls as in the job, with the exchange left out (the mesh probe times that).
 */
/** (the model whole, with the job's adapters and weight type: the job then finds it loaded) */
export interface RehearseArgs extends Omit<LoadArgs, 'blocks'> {
  latentShape: number[]; // [C, T, H, W]
  /** rows of the text embedding the cross-attention reads */
  textTokens: number;
  degrees: number[];
  /** the forwards the job computes (steps × passes): a cold engine is warmed up for no more (rank/rehearsal.ts) */
  forwards: number;
}

/**
 * A run of the text encoder's layers (umT5, core/model/umt5.ts) on a prompt's hidden states: the
 * coordinator passes the [tokens, d_model] state from worker to worker, each running its layers
 * [from, to). A worker keeps the layers it ran while they fit its budget, else reads them again
 * (from its browser's cache) the next time.
 */
export interface EncodeTextArgs {
  modelUrl: string;
  ep: ExecutionProvider | 'auto';
  from: number;
  to: number;
  tokens: number;
  hidden: Float32Array;
}

export interface EncodedText {
  hidden: Float32Array;
  /** each layer's compute time */
  layerMs: number[];
  /** layers whose weights it read for this call (the rest it held) */
  layersRead: number;
}

/**
 * A run of latent frames of one VAE tile (coordinator/vae-decoding.ts): a tile is decoded a few
 * latent frames per call, so that no reply outgrows a message, the worker carrying the tile's
 * causal caches from one call to the next. `from` 0 starts a tile (a tile left open is dropped);
 * a later call continues the open tile of the same name from where it stopped.
 */
export interface DecodeTileArgs {
  modelUrl: string;
  ep: ExecutionProvider | 'auto';
  tile: string;
  /** latent frames of this tile decoded by earlier calls */
  from: number;
  /** these are the tile's last latent frames: the worker lets its caches go after them */
  last: boolean;
  /** the frames' latent [z_dim, n, h, w], as the transformer made it */
  shape: number[];
  latent: Float32Array;
}

export interface DecodedTile {
  /** [F, 3·p², 8h, 8w], before blending and clamping */
  frames: Float32Array;
  shape: number[];
  computeMs: number;
  /** bytes the tile's causal caches take on the worker, and the decoder's weights */
  cacheBytes: number;
  weightBytes: number;
}

/**
 * One image of an image-to-video job through the folder's VAE encoder (coordinator/image-encoding.ts):
 * the image as the pipeline hands it to the VAE (core/model/image-condition.ts), one call, untiled, as
 * diffusers' pipeline encodes it.
 */
export interface EncodeImageArgs {
  modelUrl: string;
  ep: ExecutionProvider | 'auto';
  /** [3, 1, H, W] */
  shape: number[];
  /** the image in [−1, 1], its channels' planes one after another */
  video: Float32Array;
}

export interface EncodedImage {
  /** the posterior's mean, normalised ((mean − latents_mean) / latents_std): [z_dim, 1, H/16, W/16] (Wan2.1's H/8) */
  latent: Float32Array;
  shape: number[];
  computeMs: number;
  /** bytes of the encoder's weights on the worker */
  weightBytes: number;
}

/** A timed all-to-all on the job's own mesh (rank/mesh-probe.ts). */
export interface MeshProbe {
  rank: number;
  /** bytes this rank sent to each peer in the large exchange */
  bytesPerPeer: number;
  /** bytes this rank sent in a small exchange / in the large one, all peers together */
  smallBytes: number;
  bytesSent: number;
  smallMs: number;
  largeMs: number;
}

/** A worker's running totals, over all forward passes (deviceTensorsLeft: after the last one). */
export interface WorkerTotals {
  steps: number;
  bytesSent: number;
  computeMs: number;
  bytesDownloaded: number;
  bytesKept: number;
  deviceTensorsLeft: number;
}

export interface PingReply {
  state: WorkerState;
  rank: number | null;
  totals: WorkerTotals;
}

/**
 * Why a rank is thought lost, as data. A worker reports the peers of its mesh it lost or caught
 * misbehaving (ranks of its own group); the coordinator decides from its own evidence whom to let go.
 */
export interface RankLost {
  /** a rank of the blaming rank's mesh; with `stage`, its place in the mesh of the stage before or after */
  rank: number;
  cause: 'disconnected' | 'silent' | 'misbehaved';
  evidence: string;
  /** the rank is the blaming rank's hand-off partner (StageLinks): of the stage before, or after */
  stage?: 'before' | 'after';
}

/** An error a worker raises about one of its peers: the blame travels with it as data, not in its text. */
export class PeerLost extends Error {
  override name = 'PeerLost';
  constructor(readonly detail: RankLost) {
    super(`rank ${detail.rank} ${detail.cause === 'misbehaved' ? 'misbehaved' : 'is gone'}: ${detail.evidence}`);
  }
}

/** What a worker does for its coordinator, and nothing else. */
export interface WorkerApi {
  describe(args: Record<string, never>): Promise<WorkerInfo>;
  /** times a matrix multiply and a softmax on an EP (both EPs are measured: the faster one may not be the default) */
  probeCompute(args: { ep: ExecutionProvider }): Promise<ComputeProbe>;
  /** echoes the payload's size: the coordinator times the round trip of the link */
  probeLink(args: { payload: Float32Array }): Promise<{ bytes: number }>;
  initWorker(args: InitArgs): Promise<{ rank: number; world: number }>;
  loadModel(args: LoadArgs): Promise<LoadedModel>;
  /** loads the model if it is not loaded and times one rank's forward under each degree: ms per degree */
  rehearse(args: RehearseArgs): Promise<{ forwardMs: number[] }>;
  /**
   * loads the dashboard's model on the EP this worker measured fastest, between jobs, so that the first job placed on
   * it finds it loaded: weights before the first job, not during it
   */
  preload(args: { modelUrl: string }): Promise<{ ep: ExecutionProvider; loadMs: number }>;
  /** runs the text encoder's layers [from, to) on a prompt's hidden states, between jobs */
  encodeText(args: EncodeTextArgs): Promise<EncodedText>;
  /** decodes a run of latent frames of one VAE tile, between jobs */
  decodeTile(args: DecodeTileArgs): Promise<DecodedTile>;
  /** encodes an image-to-video job's image with the VAE, between jobs */
  encodeImage(args: EncodeImageArgs): Promise<EncodedImage>;
  prepareJob(args: PrepareArgs): Promise<{ job: number }>;
  probeMesh(args: { job: number }): Promise<MeshProbe>;
  executeModel(args: ExecuteArgs): Promise<ExecuteResult>;
  /**
   * a whole forward of the prepared job on this worker alone, every token (patches [S, ·]): its group's spot check;
   * with `stale`, as its displaced group ran it, from the step before's keys and values this rank of it holds; a
   * step cache's reuse from the residual of the `kept` forward, computed first
   */
  recompute(args: RecomputeArgs): Promise<Recomputed>;
  /** what this rank received in one of its recent forwards' exchanges, with its senders' signatures */
  exchangeEvidence(args: ForwardKey): Promise<{ receipts: ExchangeReceipt[] }>;
  /**
   * a whole forward of the prepared job as a group of `heads.length` ranks runs it, all of them in this worker and
   * exchanging in memory: what each of them would receive (a spot check's evidence of who sent a wrong tensor)
   */
  recomputeExchanges(args: RecomputeExchangesArgs): Promise<ExchangesRecomputed>;
  /** what the stage before handed this rank directly in one of its last forwards, with its sender's receipts */
  handOffEvidence(args: HandOffKey): Promise<HandOffEvidence>;
  ping(args: Record<string, never>): Promise<PingReply>;
  /**
   * answers once its engine gets to it, after the calls queued before it: a health check that, unlike
   * ping, goes through the engine (a worker whose engine hangs answers pings but never this)
   */
  pingEngine(args: Record<string, never>): Promise<{ waitedMs: number }>;
  /** releases the job's ranks; the worker waits for the next initWorker */
  shutdown(args: Record<string, never>): Promise<'bye'>;
}

export type WorkerMethod = keyof WorkerApi;
export type ArgsOf<M extends WorkerMethod> = Parameters<WorkerApi[M]>[0];
export type ReplyOf<M extends WorkerMethod> = Awaited<ReturnType<WorkerApi[M]>>;

// Bounds: generous for any real model, small enough that a hostile value cannot make a side allocate much.
const MAX_RANKS = 256;
/** more heads than any DiT has (Wan2.1 14B: 40) */
const MAX_HEADS = 1024;
/** a prompt's tokens at most: WanPipeline's 512, with room */
const MAX_PROMPT_TOKENS = 4096;
/** a VAE tile's latent frames in one call: 16 channels of 64×64 pixels, 64 frames */
const MAX_TILE_LATENT_VALUES = 1 << 22;
/** what one reply may carry: the links' message cap (64 MiB) less room for the rest */
export const MAX_MESSAGE_FLOATS = 15 << 20;
/** more blocks than any DiT has (Wan2.1 14B: 40) */
const MAX_BLOCKS = 1024;
const ep = oneOf(...EXECUTION_PROVIDERS);
const ms = num(0);
const bytes = num(0);
const shape = list(int(1, 1 << 20), { min: 4, max: 4 });
/** A Float32Array of at most `maxLength` values, each finite (and within ±`bound` where given). */
const finiteFloats =
  (maxLength: number, bound = Number.MAX_VALUE): Check<Float32Array> =>
  (v, at) => {
    const values = floats(maxLength)(v, at);
    const expected = bound === Number.MAX_VALUE ? 'a finite number' : `a finite number within ±${bound}`;
    for (let i = 0; i < values.length; i++)
      if (!(Math.abs(values[i]) <= bound)) fail(`${at}[${i}]`, expected, values[i]);
    return values;
  };
const epOrAuto = oneOf(...EXECUTION_PROVIDERS, 'auto');
const checkLoraRefs: Check<LoraRef[]> = list(
  fields({ url: text(), strength: num(LORA_LIMITS.strength.min, LORA_LIMITS.strength.max) }),
  { max: LORA_LIMITS.adapters },
);
const stats: FieldChecks<RankStats> = {
  computeMs: ms,
  commMs: ms,
  overlapMs: ms,
  bytesDownloaded: bytes,
  bytesKept: bytes,
  deviceTensorsLeft: int(0),
};
/** A mesh's fields, a pair of hand-off links' among them (StageLinks). */
const rankMesh: FieldChecks<HandOffMesh> = {
  rank: int(0, MAX_RANKS - 1),
  world: int(1, MAX_RANKS),
  peers: list(text(256), { min: 1, max: MAX_RANKS }),
  session: text(256),
  heads: optional(list(int(1, MAX_HEADS), { min: 1, max: MAX_RANKS })),
  signing: optional(fields({ secretKey: hexOf(32), publicKeys: list(hexOf(32), { min: 1, max: MAX_RANKS }) })),
};
const checkWeightsSource: Check<WeightsSource> = fields({ networkBytes: bytes, cacheBytes: bytes, note: text() });
/**
 * How far a page's engine has got, counted in its Web Worker where the work happens: a page whose
 * engine moves is slow, not dead, however long its call takes.
 */
export interface EngineProgress {
  /** engine calls finished and load chunks read since the page started: it only grows while the engine works */
  done: number;
  /** the engine call under way and how far into the forward it is ("preAttention block 3"), or null when idle */
  running: string | null;
}

/** What a worker reports with each answer, for the swarm view and the coordinator's judgement of its liveness. */
export interface WorkerPulse {
  state: string;
  framesDropped: number;
  /** its open links to the other ranks of its job: which peer, and whether direct or relayed */
  mesh?: { peer: string; transport: Transport }[];
  /** the WASM threads it computes on from its next job: its share of its machine's cores */
  threads?: number;
  /** what its user lets the model's weights take now (WorkerInfo.modelMemoryGiB); null: not set */
  modelMemoryGiB?: number | null;
  /** how far the model load under way is */
  load?: LoadStatus;
  /** how far its engine has got */
  progress?: EngineProgress;
  /** the model folder its engine holds whole and without adapters (a job there loads nothing); null: none */
  holds?: string | null;
}

/** a loading worker's pulse, judged where the coordinator receives it */
export const checkLoadStatus: Check<LoadStatus> = fields({
  bytes,
  totalBytes: bytes,
  networkBytes: bytes,
  elapsedMs: ms,
  note: text(1000),
});
/** a worker's answer to a heartbeat, judged where the coordinator receives it (a bad one is dropped, not its sender) */
export const checkPulse: Check<WorkerPulse> = fields({
  state: text(64),
  framesDropped: int(0),
  mesh: optional(list(fields({ peer: text(256), transport: oneOf('direct', 'turn', 'relay') }), { max: MAX_RANKS })),
  threads: optional(int(1, 1024)),
  modelMemoryGiB: optional(nullable(num(MIN_MODEL_MEMORY_GIB, MAX_MODEL_MEMORY_GIB))),
  load: optional(checkLoadStatus),
  progress: optional(fields({ done: int(0), running: nullable(text(128)) })),
  holds: optional(nullable(text())),
});
/** a hidden state's fields as Float32Arrays; their sizes are the receiver's to judge (it knows the model) */
const checkHiddenState: Check<HiddenState> = fields({
  x: floats(),
  temb: floats(),
  tproj: floats(),
  context: floats(),
});
/** one timestep, or one per token: each within the schedulers' range (its count is the receiver's to judge) */
const checkTimestep: Check<Timestep> = (v, at) => {
  const inRange = num(TIMESTEP_RANGE.min, TIMESTEP_RANGE.max);
  if (!(v instanceof Float32Array)) return inRange(v, at);
  v.forEach((t, i) => inRange(t, `${at}[${i}]`));
  return floats()(v, at);
};
const executeArgs = {
  job: int(0),
  step: int(0, 9999),
  pass: int(0, 1),
  timestep: checkTimestep,
  latentShape: shape,
  patches: floats(),
  hidden: optional(checkHiddenState),
  stale: optional(oneOf(true, false)),
  cache: optional(oneOf('keep', 'reuse')),
  patch: optional(fields<PatchOf>({ index: int(0, MAX_HEADS - 1), count: int(1, MAX_HEADS) })),
} as const;
const checkExecuteArgs: Check<ExecuteArgs> = fields(executeArgs);
const checkRecomputeArgs: Check<RecomputeArgs> = fields({
  ...executeArgs,
  kept: optional(fields({ step: int(0, 9999), timestep: checkTimestep, patches: floats() })),
});
const forwardKey = { job: int(0), step: int(0, 9999), pass: int(0, 1) };
/** more receipts than a forward of the largest model has (40 blocks × 2 phases × head groups × peers) */
const MAX_RECEIPTS = 1 << 16;
const receiptFields = {
  block: int(0, MAX_BLOCKS),
  phase: int(0, 0xffff),
  group: int(0, MAX_HEADS),
  from: int(0, MAX_RANKS - 1),
  digest: hexOf(32),
};
/** a receipt as a rank kept it, its sender's signature checked */
const checkSignedReceipt: Check<ExchangeReceipt> = fields({ ...receiptFields, signature: hexOf(64) });
/** a receipt of an in-process recomputation: nothing signed */
const checkTrueReceipt: Check<ExchangeReceipt> = fields({ ...receiptFields, signature: oneOf('') });
const totals: Check<WorkerTotals> = fields({
  steps: int(0),
  bytesSent: bytes,
  computeMs: ms,
  bytesDownloaded: bytes,
  bytesKept: bytes,
  deviceTensorsLeft: int(0),
});

export const WORKER_CONTRACT: ApiContract<WorkerApi> = {
  describe: {
    args: none,
    reply: fields({
      kind: optional(oneOf('tab', 'node')),
      host: optional(text(256)),
      nativeDevice: optional(oneOf(...NATIVE_DEVICES)),
      ep,
      adapter: text(),
      softwareAdapter: oneOf(true, false),
      threads: int(1, 1024),
      memoryGiB: nullable(num(0)),
      modelMemoryGiB: optional(num(MIN_MODEL_MEMORY_GIB, MAX_MODEL_MEMORY_GIB)),
      userAgent: text(),
      browser: optional(text(64)),
      cores: int(1, 1024),
      machine: hexOf(MACHINE_HINT_BYTES),
    }),
  },
  probeCompute: {
    args: fields({ ep }),
    reply: fields({ ep, flops: num(Number.MIN_VALUE), softmaxRate: num(Number.MIN_VALUE), stageMs: num(0, 60_000) }),
  },
  probeLink: {
    args: fields({ payload: floats(1 << 20) }),
    reply: fields({ bytes: int(0) }),
  },
  initWorker: {
    args: fields({
      ...rankMesh,
      stageLinks: optional(fields({ before: optional(fields(rankMesh)), after: optional(fields(rankMesh)) })),
      ...RANK_SETTINGS_CHECKS,
    }),
    reply: fields({ rank: int(0), world: int(1) }),
  },
  loadModel: {
    args: fields({
      modelUrl: text(),
      ep: epOrAuto,
      blocks: optional(fields({ from: int(0, MAX_BLOCKS - 1), to: int(1, MAX_BLOCKS) })),
      loras: optional(checkLoraRefs),
      weightType: optional(oneOf(...WEIGHT_TYPES)),
    }),
    reply: fields({
      ep,
      adapter: text(),
      inMemory: oneOf(true, false),
      loadMs: ms,
      why: text(),
      weights: checkWeightsSource,
      maxBufferBytes: num(1),
      weightType: oneOf(...WEIGHT_TYPES),
      gpuWeightBytes: bytes,
      heldWeightBytes: bytes,
    }),
  },
  rehearse: {
    args: fields({
      modelUrl: text(),
      ep: epOrAuto,
      loras: optional(checkLoraRefs),
      weightType: optional(oneOf(...WEIGHT_TYPES)),
      latentShape: shape,
      textTokens: int(1, 1 << 16),
      degrees: list(int(1, MAX_RANKS), { min: 1, max: 16 }),
      forwards: int(1, 1 << 20),
    }),
    reply: fields({ forwardMs: list(ms, { min: 1, max: 16 }) }),
  },
  preload: {
    args: fields({ modelUrl: text() }),
    reply: fields({ ep, loadMs: ms }),
  },
  encodeText: {
    args: fields({
      modelUrl: text(),
      ep: epOrAuto,
      from: int(0, 1023),
      to: int(1, 1024),
      tokens: int(1, MAX_PROMPT_TOKENS),
      hidden: floats(MAX_PROMPT_TOKENS * 65_536),
    }),
    reply: fields({
      hidden: floats(MAX_PROMPT_TOKENS * 65_536),
      layerMs: list(ms, { max: 1024 }),
      layersRead: int(0, 1024),
    }),
  },
  decodeTile: {
    args: fields({
      modelUrl: text(),
      ep: epOrAuto,
      tile: text(256),
      from: int(0, 1 << 16),
      last: oneOf(true, false),
      shape,
      latent: floats(MAX_TILE_LATENT_VALUES),
    }),
    reply: fields({
      frames: floats(MAX_MESSAGE_FLOATS),
      shape: list(int(1, 1 << 16), { min: 4, max: 4 }),
      computeMs: ms,
      cacheBytes: bytes,
      weightBytes: bytes,
    }),
  },
  encodeImage: {
    // the image's values are bytes mapped to [−1, 1]; the latent's bound is the VAE's (encodedLatentBound), judged by
    // the coordinator, which has the folder
    args: fields({ modelUrl: text(), ep: epOrAuto, shape, video: finiteFloats(MAX_MESSAGE_FLOATS, 1) }),
    reply: fields({
      latent: finiteFloats(MAX_MESSAGE_FLOATS),
      shape,
      computeMs: ms,
      weightBytes: bytes,
    }),
  },
  prepareJob: {
    args: fields({
      job: int(0),
      texts: list(floats(), { min: 1, max: 2 }),
      latentShape: shape,
      exchangeTimeoutMs: optional(int(1_000, 86_400_000)),
    }),
    reply: fields({ job: int(0) }),
  },
  probeMesh: {
    args: fields({ job: int(0) }),
    reply: fields({ rank: int(0), bytesPerPeer: bytes, smallBytes: bytes, bytesSent: bytes, smallMs: ms, largeMs: ms }),
  },
  executeModel: {
    args: checkExecuteArgs,
    reply: fields({
      rows: floats(),
      bytesSent: bytes,
      peakMemoryBytes: nullable(bytes),
      residualRatio: optional(fields({ sum: num(0, Number.MAX_VALUE), tokens: int(0) })),
      handOff: optional(fields({ bytes, ms })),
      ...stats,
    }),
  },
  recompute: {
    args: checkRecomputeArgs,
    reply: fields({ rows: floats(), hidden: optional(checkHiddenState), computeMs: ms }),
  },
  exchangeEvidence: {
    args: fields(forwardKey),
    reply: fields({ receipts: list(checkSignedReceipt, { max: MAX_RECEIPTS }) }),
  },
  handOffEvidence: {
    args: fields({ ...forwardKey, patch: optional(int(0, MAX_HEADS - 1)) }),
    reply: fields({ hidden: checkHiddenState, receipts: list(checkSignedReceipt, { max: MAX_RECEIPTS }) }),
  },
  recomputeExchanges: {
    args: fields({
      ...executeArgs,
      heads: list(int(1, MAX_HEADS), { min: 1, max: MAX_RANKS }),
      headGroups: int(1, MAX_HEADS),
    }),
    reply: fields({
      received: list(list(checkTrueReceipt, { max: MAX_RECEIPTS }), { min: 1, max: MAX_RANKS }),
    }),
  },
  ping: {
    args: none,
    reply: fields({
      state: oneOf('idle', 'initialized', 'loading', 'ready', 'computing'),
      rank: nullable(int(0)),
      totals,
    }),
  },
  pingEngine: {
    args: none,
    reply: fields({ waitedMs: ms }),
  },
  shutdown: {
    args: none,
    reply: oneOf('bye'),
  },
};

export const WORKER_METHODS = Object.keys(WORKER_CONTRACT) as WorkerMethod[];

/** The blame a failed call may carry (PeerLost's detail), checked like any reply. */
export const checkRankLost: Check<RankLost> = fields({
  rank: int(0, MAX_RANKS - 1),
  cause: oneOf('disconnected', 'silent', 'misbehaved'),
  evidence: text(),
  stage: optional(oneOf('before', 'after')),
});

/** The coordinator's handle on a worker: its API over a link, and a way to fail what still waits when the link goes. */
export type WorkerRemote = Remote<WorkerApi> & { failAll?(reason: string): void };

/** Calls one method by name; the one place a method name chosen at run time meets its types. */
export function callWorker<M extends WorkerMethod>(
  worker: Remote<WorkerApi>,
  method: M,
  args: ArgsOf<M>,
  timeoutMs?: number,
): Promise<ReplyOf<M>> {
  return (worker[method] as unknown as (args: ArgsOf<M>, timeoutMs?: number) => Promise<ReplyOf<M>>)(args, timeoutMs);
}
