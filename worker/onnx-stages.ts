import * as ort from 'onnxruntime-web';
import type { WanModel } from '../core/model/reference.ts';
import { buildAttentionGraph, buildEmbedGraph, buildHeadGraph, buildPostAttentionGraph, buildPreAttentionGraph } from '../core/model/stage-graphs.ts';
import type { StageRunner } from './stages.ts';

/** An onnxruntime-web execution provider a worker can run on. */
export type ExecutionProvider = 'webgpu' | 'wasm';

/**
 * The stage graphs of one model as onnxruntime-web sessions: one session per graph, built once
 * at load, all on one execution provider.
 */
export async function onnxStages(m: WanModel, ep: ExecutionProvider): Promise<StageRunner> {
  const { dim: D, headDim, textDim } = m.config;
  const options: ort.InferenceSession.SessionOptions = { executionProviders: [ep], graphOptimizationLevel: 'all' };
  const session = (graph: Uint8Array) => ort.InferenceSession.create(graph, options);
  const embed = await session(buildEmbedGraph(m));
  const attention = await session(buildAttentionGraph(m));
  const head = await session(buildHeadGraph(m));
  const pre: ort.InferenceSession[] = [];
  const post: ort.InferenceSession[] = [];
  for (let b = 0; b < m.config.numLayers; b++) {
    pre.push(await session(buildPreAttentionGraph(m, b)));
    post.push(await session(buildPostAttentionGraph(m, b)));
  }

  const t = (data: Float32Array, width: number) => new ort.Tensor('float32', data, [data.length / width, width]);
  const out = (r: ort.InferenceSession.OnnxValueMapType, name: string) => r[name].data as Float32Array;
  const patchWidth = m.weights.get('patch_embedding.weight')!.data.length / D;

  return {
    async embed(patches, timestep, text) {
      const r = await embed.run({ patches: t(patches, patchWidth), timestep: new ort.Tensor('float32', Float32Array.of(timestep), [1]), text: t(text, textDim) });
      return { x: out(r, 'x'), temb: out(r, 'temb'), tproj: out(r, 'tproj'), context: out(r, 'context') };
    },
    async preAttention(block, x, tproj, cos, sin) {
      const r = await pre[block].run({ x: t(x, D), tproj: t(tproj, D), cos: t(cos, headDim / 2), sin: t(sin, headDim / 2) });
      return { q: out(r, 'q'), k: out(r, 'k'), v: out(r, 'v') };
    },
    async attention({ q, k, v }, keyBias) {
      const width = q.length / keyBias.length;
      const r = await attention.run({ q: t(q, width), k: t(k, width), v: t(v, width), key_bias: new ort.Tensor('float32', keyBias, [keyBias.length]) });
      return out(r, 'o');
    },
    async postAttention(block, x, o, tproj, context) {
      const r = await post[block].run({ x: t(x, D), o: t(o, D), tproj: t(tproj, D), context: t(context, D) });
      return out(r, 'x_out');
    },
    async head(x, temb) {
      return out(await head.run({ x: t(x, D), temb: t(temb, D) }), 'rows');
    },
  };
}
