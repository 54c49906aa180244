import * as ort from 'onnxruntime-web';
import type { WanModel } from '../core/model/reference.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';
import { buildAttentionGraph, buildEmbedGraph, buildHeadGraph, buildPostAttentionGraph, buildPreAttentionGraph, type BlockGraph } from '../core/model/stage-graphs.ts';
import type { Activation, DeviceStageRunner, DeviceTensor } from './stages.ts';


/**
 * The stage graphs of one model as onnxruntime-web sessions: one session per graph, built once
 * at load, all on one execution provider. On WebGPU the outputs that only feed this rank's next
 * sessions (embed's x, temb, tproj, context; post-attention's x) stay in GPU buffers and go back
 * in as inputs; only q/k/v, o and the head's rows, which cross ranks or leave the rank, are read
 * back. On WASM every output is CPU data, as before.
 */
export async function onnxStages(m: WanModel, ep: ExecutionProvider): Promise<Required<DeviceStageRunner>> {
  const { dim: D, headDim, textDim } = m.config;
  const options: ort.InferenceSession.SessionOptions = { executionProviders: [ep], graphOptimizationLevel: 'all' };
  const onDevice = (...outputs: string[]): ort.InferenceSession.SessionOptions =>
    ep === 'webgpu' ? { ...options, preferredOutputLocation: Object.fromEntries(outputs.map((name) => [name, 'gpu-buffer' as const])) } : options;
  const session = (graph: Uint8Array, sessionOptions = options) => ort.InferenceSession.create(graph, sessionOptions);
  const embed = await session(buildEmbedGraph(m), onDevice('x', 'temb', 'tproj', 'context'));
  const attention = await session(buildAttentionGraph(m));
  const head = await session(buildHeadGraph(m));
  // one session for every block's pre-attention and one for its post-attention, fed the block's
  // weights: only the running block's weights are in onnxruntime's memory (the wasm heap holds 4 GB)
  const preGraph = buildPreAttentionGraph(m);
  const postGraph = buildPostAttentionGraph(m);
  const pre = await session(preGraph.bytes);
  const post = await session(postGraph.bytes, onDevice('x_out'));
  const blockWeights = (graph: BlockGraph) =>
    Array.from({ length: m.config.numLayers }, (_, b) =>
      Object.fromEntries(graph.weights.map(({ name, dims }) => [name, new ort.Tensor('float32', m.weights.get(`blocks.${b}.${name}`)!.data, dims)])),
    );
  const preWeights = blockWeights(preGraph);
  const postWeights = blockWeights(postGraph);

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
    if (!tensor) throw new Error(`device tensor ${a.deviceTensor} is not kept by this runner (released already, or made by another engine): a stage input must be a tensor of this pass`);
    return tensor;
  };
  const out = (r: ort.InferenceSession.OnnxValueMapType, name: string) => r[name].data as Float32Array;
  const patchWidth = m.weights.get('patch_embedding.weight')!.data.length / D;

  return {
    async embed(patches, timestep, text) {
      const r = await embed.run({ patches: t(patches, patchWidth), timestep: new ort.Tensor('float32', Float32Array.of(timestep), [1]), text: t(text, textDim) });
      return { x: keep(r.x), temb: keep(r.temb), tproj: keep(r.tproj), context: keep(r.context) };
    },
    async preAttention(block, x, tproj, cos, sin) {
      const r = await pre.run({ ...preWeights[block], x: feed(x, D), tproj: feed(tproj, D), cos: t(cos, headDim / 2), sin: t(sin, headDim / 2) });
      return { q: out(r, 'q'), k: out(r, 'k'), v: out(r, 'v') };
    },
    async attention({ q, k, v }, keyBias) {
      const width = q.length / keyBias.length;
      const r = await attention.run({ q: t(q, width), k: t(k, width), v: t(v, width), key_bias: new ort.Tensor('float32', keyBias, [keyBias.length]) });
      return out(r, 'o');
    },
    async postAttention(block, x, o, tproj, context) {
      const r = await post.run({ ...postWeights[block], x: feed(x, D), o: t(o, D), tproj: feed(tproj, D), context: feed(context, D) });
      return keep(r.x_out);
    },
    async head(x, temb) {
      return out(await head.run({ x: feed(x, D), temb: feed(temb, D) }), 'rows');
    },
    async release(tensors: DeviceTensor[]) {
      for (const { deviceTensor } of tensors) {
        kept.get(deviceTensor)?.dispose();
        kept.delete(deviceTensor);
      }
      return kept.size;
    },
  };
}
