import * as ort from 'onnxruntime-web';
import { allBlocks, holdsEmbedders, holdsHead, type BlockRange } from '../core/model/blocks.ts';
import type { WanModel } from '../core/model/reference.ts';
import type { ExecutionProvider, WeightType } from '../core/worker-api.ts';
import {
  buildAttentionGraph,
  buildEmbedGraph,
  buildHeadGraph,
  buildPostAttentionGraph,
  buildPreAttentionGraph,
  fedWeightKey,
  type FedGraph,
} from '../core/model/stage-graphs.ts';
import { defined } from '../core/defined.ts';
import { concat, setCols, sliceCols } from '../core/tensor.ts';
import { rowChunks, rowsPerBuffer } from './chunks.ts';
import { weightTensors, type GpuDevice } from './gpu-weights.ts';
import type { HeldAs, HeldWeight } from '../core/model/held-weights.ts';
import type { Activation, DeviceStageRunner, DeviceTensor } from './stages.ts';

/**
 * The largest tensor a stage may make on WASM: FFN intermediates and their GELU temporaries live at
 * once in the 4 GB wasm heap beside the running block's weights, so a quarter GB each.
 */
export const WASM_MAX_BUFFER_BYTES = 256 << 20;

/** The largest buffer onnxruntime's WebGPU device may bind (it asks the adapter for its maxima). */
async function webGpuMaxBufferBytes(): Promise<number> {
  const { limits } = (await ort.env.webgpu.device) as {
    limits: { maxStorageBufferBindingSize: number; maxBufferSize: number };
  };
  return Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
}

/**
 * The weights the runner's graphs are fed: the embed and head graphs' (where the range holds them) and every held
 * block's, per block graph and block. On WebGPU they go to GPU buffers once. A function of its own so that the stage
 * methods' closures do not hold the model: on WebGPU its 5.7 GB of CPU copies are free to go once uploaded.
 */
function fedWeightTensors(
  m: WanModel,
  range: BlockRange,
  graphs: { embed: FedGraph | null; head: FedGraph | null; blocks: FedGraph[] },
  weightType: WeightType,
  device: GpuDevice | null,
  takesWeights: boolean,
  held: Map<string, HeldWeight> | null,
) {
  const weights = weightTensors(device);
  // a copy (float16 or int8, or a GPU buffer) makes the model's float32 array garbage once taken from it: block by
  // block, a load holds one block's weights twice for a moment, not the whole model twice
  const copies = takesWeights && (weightType !== 'float32' || device !== null);
  /** the graphs' inputs of block `block`'s weights (null: the embed's or head's), the keys taken dropped after */
  const feed = (fed: FedGraph[], block: number | null) => {
    // a weight two graphs take (a block's modulation table) is held once
    const taken = new Map<string, [string, ort.Tensor][]>();
    const inputs = fed.map((graph) =>
      Object.fromEntries(
        graph.weights.flatMap(({ name, dims, type }) => {
          const key = fedWeightKey(name, block);
          const made =
            taken.get(key) ??
            (held
              ? weights.heldInputs(name, defined(held.get(key), `weight ${key}`), dims)
              : weights.inputs(name, defined(m.weights.get(key), `weight ${key}`).data, dims, type));
          taken.set(key, made);
          return made;
        }),
      ),
    );
    // read as held, a weight's arrays are its tensors' on WASM; on WebGPU uploaded, they go with the map's entry
    for (const key of taken.keys()) held?.delete(key);
    if (copies) for (const key of taken.keys()) m.weights.delete(key);
    return inputs;
  };
  const [embed, head] = [graphs.embed, graphs.head].map((graph) => (graph ? feed([graph], null)[0] : null));
  // indexed by block: a pipeline stage's runner has its blocks' weights only
  const perBlock = Array.from({ length: m.config.numLayers }, (_, b) =>
    b >= range.from && b < range.to ? feed(graphs.blocks, b) : null,
  );
  const perGraph = graphs.blocks.map((_, g) => perBlock.map((inputs) => inputs?.[g] ?? null));
  return {
    embed,
    head,
    perGraph,
    gpuBytes: weights.gpuBytes,
    heldBytes: weights.heldBytes,
    destroy: () => weights.destroy(),
  };
}

/** How each weight the graphs take is held, by the model's name for it: the plan a load in the held type reads by. */
function heldPlan(
  range: BlockRange,
  graphs: { embed: FedGraph | null; head: FedGraph | null; blocks: FedGraph[] },
): Map<string, HeldAs> {
  const plan = new Map<string, HeldAs>();
  const add = (graph: FedGraph, block: number | null) => {
    for (const { name, dims, type } of graph.weights) plan.set(fedWeightKey(name, block), { type, dims });
  };
  for (const graph of [graphs.embed, graphs.head]) if (graph) add(graph, null);
  for (let b = range.from; b < range.to; b++) for (const graph of graphs.blocks) add(graph, b);
  return plan;
}

/**
 * How a runner holds the model's weights: as asked, float16 halving them where the device can (WASM's CPU always; a
 * WebGPU adapter with shader-f16), int8 on WASM (the graphs widen them per call); unasked, float16 where WebGPU can,
 * else float32. onnxruntime-web 1.30's WebGPU EP reads uint8 tensors wrong (DequantizeLinear gave NaN, a Cast from
 * uint8 wrong values, on SwiftShader), so int8 asked of WebGPU holds what float16 asked would.
 */
export function heldWeightType(asked: WeightType | undefined, device: GpuDevice | null): WeightType {
  const halves = !device || device.features.has('shader-f16');
  if (asked === 'int8' && device) return halves ? 'float16' : 'float32';
  if (asked) return halves ? asked : 'float32';
  return device && halves ? 'float16' : 'float32';
}

/**
 * A runner that says how large a buffer it cuts its stages to (chunks.ts) and how it stores the
 * weights; disposed when its model is replaced.
 */
export type OnnxStages = Required<DeviceStageRunner> & {
  maxBufferBytes: number;
  weightType: WeightType;
  gpuWeightBytes: number;
  /** the bytes its weights are held in, as stored */
  heldWeightBytes: number;
  dispose(): Promise<void>;
};

/**
 * The stage graphs of one model as onnxruntime-web sessions: one session per graph, built once
 * at load, all on one execution provider. On WebGPU the outputs that only feed this rank's next
 * sessions (embed's x, temb, tproj, context; post-attention's x) stay in GPU buffers and go back
 * in as inputs; only q/k/v, o and the head's rows, which cross ranks or leave the rank, are read
 * back. On WASM every output is CPU data, as before.
 * A stage whose tensors would exceed `maxBufferBytes` (by default what the EP allows) runs in
 * chunks of rows, or of heads for attention (chunks.ts); its inputs and outputs are then CPU data.
 * With `takesWeights` (a model loaded for the runner alone), weights held as a copy leave `m.weights`. With `readHeld`,
 * the weights are read in the type they are held in (core/model/held-weights.ts), not taken from `m.weights`.
 */
export async function onnxStages(
  m: WanModel,
  ep: ExecutionProvider,
  limits: {
    maxBufferBytes?: number;
    weightType?: WeightType;
    takesWeights?: boolean;
    /** reads the weights as held, by the plan of each one's type (then `m` needs only their shapes) */
    readHeld?: (plan: Map<string, HeldAs>) => Promise<Map<string, HeldWeight>>;
  } = {},
): Promise<OnnxStages> {
  const { dim: D, headDim, textDim, numHeads, ffnDim, inChannels, outChannels, patchSize } = m.config;
  const range = m.blocks ?? allBlocks(m.config);
  const options: ort.InferenceSession.SessionOptions = { executionProviders: [ep], graphOptimizationLevel: 'all' };
  const onDevice = (...outputs: string[]): ort.InferenceSession.SessionOptions =>
    ep === 'webgpu'
      ? {
          ...options,
          preferredOutputLocation: Object.fromEntries(outputs.map((name) => [name, 'gpu-buffer' as const])),
        }
      : options;
  const session = (graph: Uint8Array, sessionOptions = options) => ort.InferenceSession.create(graph, sessionOptions);
  // one session for every block's pre-attention and one for its post-attention, fed the block's
  // weights: only the running block's weights are in onnxruntime's memory (the wasm heap holds 4 GB).
  // On WebGPU the weights live in GPU buffers, uploaded once, not from the CPU at every call.
  const device = ep === 'webgpu' ? ((await ort.env.webgpu.device) as GpuDevice) : null;
  const weightType = heldWeightType(limits.weightType, device);
  const embedGraph = holdsEmbedders(range) ? buildEmbedGraph(m, weightType) : null;
  const headGraph = holdsHead(m.config, range) ? buildHeadGraph(m, weightType) : null;
  const preGraph = buildPreAttentionGraph(m, weightType);
  const postGraph = buildPostAttentionGraph(m, weightType);
  const embedSession = embedGraph && (await session(embedGraph.bytes, onDevice('x', 'temb', 'tproj', 'context')));
  const attention = await session(buildAttentionGraph(m));
  const headSession = headGraph && (await session(headGraph.bytes));
  const pre = await session(preGraph.bytes);
  const post = await session(postGraph.bytes, onDevice('x_out'));
  const graphs = { embed: embedGraph, head: headGraph, blocks: [preGraph, postGraph] };
  const held = limits.readHeld ? await limits.readHeld(heldPlan(range, graphs)) : null;
  const fed = fedWeightTensors(m, range, graphs, weightType, device, !!limits.takesWeights, held);
  const notHeld = (what: string): never => {
    throw new Error(`this rank holds blocks ${range.from}–${range.to - 1} of the transformer: ${what}`);
  };
  const embedder = () =>
    (embedSession && fed.embed && { session: embedSession, weights: fed.embed }) ??
    notHeld("the embedders are the first pipeline stage's");
  const outputHead = () =>
    (headSession && fed.head && { session: headSession, weights: fed.head }) ??
    notHeld("the output head is the last pipeline stage's");
  const [preWeights, postWeights] = fed.perGraph.map(
    (perBlock) => (block: number) => perBlock[block] ?? notHeld(`block ${block} is another stage's`),
  );

  // GPU tensors this runner handed out by id; the caller releases each once it is done with it
  const kept = new Map<number, ort.Tensor>();
  let nextId = 1;
  const keep = (tensor: ort.Tensor): Activation => {
    if (tensor.location !== 'gpu-buffer') return tensor.data as Float32Array;
    const id = nextId++;
    kept.set(id, tensor);
    return { deviceTensor: id, floats: tensor.size };
  };
  const t = (data: Float32Array, width: number) => new ort.Tensor('float32', data, [data.length / width, width]);
  const feed = (a: Activation, width: number): ort.Tensor => {
    if (a instanceof Float32Array) return t(a, width);
    const tensor = kept.get(a.deviceTensor);
    if (!tensor)
      throw new Error(
        `device tensor ${a.deviceTensor} is not kept by this runner (released already, or made by another ` +
          'engine): a stage input must be a tensor of this pass',
      );
    return tensor;
  };
  const out = (r: ort.InferenceSession.OnnxValueMapType, name: string) => r[name].data as Float32Array;
  const patch = patchSize.reduce((a, b) => a * b, 1);
  const [patchWidth, rowsWidth] = [inChannels * patch, outChannels * patch];

  // chunked stages take and give CPU data: a device tensor is read back, a device output downloaded and freed
  const maxBufferBytes =
    limits.maxBufferBytes ?? (ep === 'webgpu' ? await webGpuMaxBufferBytes() : WASM_MAX_BUFFER_BYTES);
  const rowsOf = (a: Activation, width: number) => (a instanceof Float32Array ? a.length : a.floats) / width;
  const host = async (a: Activation): Promise<Float32Array> =>
    a instanceof Float32Array ? a : ((await feed(a, 1).getData()) as Float32Array);
  const hostOutput = async (tensor: ort.Tensor): Promise<Float32Array> =>
    tensor.location === 'gpu-buffer' ? ((await tensor.getData(true)) as Float32Array) : (tensor.data as Float32Array);
  /** the same stage on each block of rows, outputs stacked back */
  const byRows = async (rows: number, maxRows: number, run: (begin: number, end: number) => Promise<Float32Array>) => {
    const parts: Float32Array[] = [];
    for (const [begin, end] of rowChunks(rows, maxRows)) parts.push(await run(begin, end));
    return concat(parts);
  };
  const rowsIn = (a: Float32Array, width: number, begin: number, end: number) =>
    t(a.subarray(begin * width, end * width), width);
  /** each token's timestep level, of rows [begin, end) */
  const levelsOf = (levels: Int32Array, begin = 0, end = levels.length) =>
    new ort.Tensor('int32', levels.subarray(begin, end), [end - begin]);

  return {
    maxBufferBytes,
    weightType,
    gpuWeightBytes: fed.gpuBytes,
    heldWeightBytes: fed.heldBytes,
    async dispose() {
      fed.destroy();
      await Promise.all([embedSession, attention, headSession, pre, post].flatMap((s) => (s ? [s.release()] : [])));
    },
    async embed(patches, timesteps, text) {
      const { session: embed, weights } = embedder();
      const fixed = {
        ...weights,
        timesteps: new ort.Tensor('float32', timesteps, [timesteps.length]),
        text: t(text, textDim),
      };
      const rows = patches.length / patchWidth;
      const maxRows = rowsPerBuffer(maxBufferBytes, Math.max(D, patchWidth));
      if (rows <= maxRows) {
        const r = await embed.run({ patches: t(patches, patchWidth), ...fixed });
        return { x: keep(r.x), temb: keep(r.temb), tproj: keep(r.tproj), context: keep(r.context) };
      }
      // temb, tproj and the context do not depend on the patches: the first chunk's are kept
      let first: ort.InferenceSession.OnnxValueMapType | null = null;
      const x = await byRows(rows, maxRows, async (begin, end) => {
        const r = await embed.run({ patches: rowsIn(patches, patchWidth, begin, end), ...fixed });
        if (first) for (const name of ['temb', 'tproj', 'context']) r[name].dispose();
        first ??= r;
        return hostOutput(r.x);
      });
      const conditions = defined<ort.InferenceSession.OnnxValueMapType>(first, "the first chunk's outputs");
      return { x, temb: keep(conditions.temb), tproj: keep(conditions.tproj), context: keep(conditions.context) };
    },
    async preAttention(block, x, tproj, levels, cos, sin) {
      const rows = rowsOf(x, D);
      const run = async (xIn: ort.Tensor, levelsIn: ort.Tensor, cosIn: ort.Tensor, sinIn: ort.Tensor) =>
        pre.run({ ...preWeights(block), x: xIn, tproj: feed(tproj, D), levels: levelsIn, cos: cosIn, sin: sinIn });
      const maxRows = rowsPerBuffer(maxBufferBytes, D);
      if (rows <= maxRows) {
        const r = await run(feed(x, D), levelsOf(levels), t(cos, headDim / 2), t(sin, headDim / 2));
        return { q: out(r, 'q'), k: out(r, 'k'), v: out(r, 'v') };
      }
      const xs = await host(x);
      const parts = { q: [] as Float32Array[], k: [] as Float32Array[], v: [] as Float32Array[] };
      for (const [begin, end] of rowChunks(rows, maxRows)) {
        const r = await run(
          rowsIn(xs, D, begin, end),
          levelsOf(levels, begin, end),
          rowsIn(cos, headDim / 2, begin, end),
          rowsIn(sin, headDim / 2, begin, end),
        );
        for (const name of ['q', 'k', 'v'] as const) parts[name].push(out(r, name));
      }
      return { q: concat(parts.q), k: concat(parts.k), v: concat(parts.v) };
    },
    async attention({ q, k, v }, width) {
      const tokens = Math.max(q.length, k.length) / width;
      const run = async (qs: Float32Array, ks: Float32Array, vs: Float32Array, w: number) =>
        out(await attention.run({ q: t(qs, w), k: t(ks, w), v: t(vs, w) }), 'o');
      // heads are independent: as many at a time as one buffer holds [tokens, heads·d]
      const headsAtOnce = Math.floor(maxBufferBytes / (4 * tokens * headDim));
      if (headsAtOnce < 1)
        throw new Error(
          `attention over ${tokens} tokens needs ${4 * tokens * headDim} bytes per head, ` +
            `more than one buffer of this worker holds (${maxBufferBytes}): use more workers`,
        );
      if (headsAtOnce * headDim >= width) return run(q, k, v, width);
      const o = new Float32Array(q.length);
      for (const [from, to] of rowChunks(width / headDim, headsAtOnce)) {
        const [start, count] = [from * headDim, (to - from) * headDim];
        const [qs, ks, vs] = [q, k, v].map((a) => sliceCols(a, width, start, count));
        setCols(o, width, start, await run(qs, ks, vs, count), count);
      }
      return o;
    },
    async postAttention(block, x, o, tproj, levels, context) {
      const rows = rowsOf(x, D);
      const run = (xIn: ort.Tensor, oIn: ort.Tensor, levelsIn: ort.Tensor) =>
        post.run({
          ...postWeights(block),
          x: xIn,
          o: oIn,
          tproj: feed(tproj, D),
          levels: levelsIn,
          context: feed(context, D),
        });
      // per row: the FFN's hidden layer, and the cross-attention's scores over the text
      const maxRows = rowsPerBuffer(maxBufferBytes, Math.max(ffnDim, numHeads * rowsOf(context, D)));
      if (rows <= maxRows) return keep((await run(feed(x, D), t(o, D), levelsOf(levels))).x_out);
      const xs = await host(x);
      return byRows(rows, maxRows, async (begin, end) =>
        hostOutput(
          (await run(rowsIn(xs, D, begin, end), rowsIn(o, D, begin, end), levelsOf(levels, begin, end))).x_out,
        ),
      );
    },
    async head(x, temb, levels) {
      const { session: head, weights } = outputHead();
      const rows = rowsOf(x, D);
      const maxRows = rowsPerBuffer(maxBufferBytes, Math.max(D, rowsWidth));
      const run = async (xIn: ort.Tensor, levelsIn: ort.Tensor) =>
        out(await head.run({ ...weights, x: xIn, temb: feed(temb, D), levels: levelsIn }), 'rows');
      if (rows <= maxRows) return run(feed(x, D), levelsOf(levels));
      const xs = await host(x);
      return byRows(rows, maxRows, (begin, end) => run(rowsIn(xs, D, begin, end), levelsOf(levels, begin, end)));
    },
    read: ({ deviceTensor }) => host({ deviceTensor, floats: 0 }),
    release(tensors: DeviceTensor[]) {
      for (const { deviceTensor } of tensors) {
        kept.get(deviceTensor)?.dispose();
        kept.delete(deviceTensor);
      }
      return Promise.resolve(kept.size);
    },
  };
}
