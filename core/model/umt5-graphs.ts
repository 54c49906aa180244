// umT5's encoder layer as one ONNX graph for every layer, fed the layer's weights as inputs (as the
// transformer's block graphs are: a worker holds its layers' weights outside onnxruntime's 4 GB wasm
// heap, and one layer of umT5-XXL is 0.77 GB in fp32). It computes what umt5LayerReference computes:
//   hidden [T, d_model], buckets [T, T] (int64, relativePositionBuckets) → hidden [T, d_model]
// The layer's relative-attention bias [buckets, H] is gathered by the buckets into [H, T, T] in the
// graph. Float32 throughout: T5's activations overflow float16.

import { OnnxGraph } from './onnx-builder.ts';
import { umt5LayerWeightNames, type Umt5Config, type Umt5LayerWeight } from './umt5.ts';

const T = 'T';

export interface Umt5LayerGraph {
  bytes: Uint8Array;
  /** feed layer i's tensor umt5LayerWeightNames(i)[weight] as the input `weight`, shaped `dims` */
  weights: { weight: Umt5LayerWeight; dims: number[] }[];
}

export function buildUmt5LayerGraph(cfg: Umt5Config): Umt5LayerGraph {
  const g = new OnnxGraph('umt5_layer');
  const { dModel: d, numHeads: H, dKv, dFf, numBuckets, eps } = cfg;
  const inner = H * dKv;
  const dims: Record<Umt5LayerWeight, number[]> = {
    attnNorm: [d],
    q: [inner, d],
    k: [inner, d],
    v: [inner, d],
    o: [d, inner],
    positionBias: [numBuckets, H],
    ffnNorm: [d],
    wi0: [dFf, d],
    wi1: [dFf, d],
    wo: [d, dFf],
  };
  // the names are checked against the layout's: one list of a layer's weights
  const weights = (Object.keys(umt5LayerWeightNames(0)) as Umt5LayerWeight[]).map((weight) => ({
    weight,
    dims: dims[weight],
  }));
  for (const { weight, dims: shape } of weights) g.input(weight, shape);
  const hidden = g.input('hidden', [T, d]);
  const buckets = g.input('buckets', [T, T], 'int64');

  const project = (x: string, weight: string) => g.op('Gemm', [x, weight], { transB: 1 }); // no biases in T5
  const heads = (x: string, perm: number[]) => g.op('Transpose', [g.op('Reshape', [x, g.ints([0, H, dKv])])], { perm });

  const n = g.rmsNorm(hidden, 'attnNorm', eps);
  // [H, T, T]
  const bias = g.op('Transpose', [g.op('Gather', ['positionBias', buckets], { axis: 0 })], { perm: [2, 0, 1] });
  const scores = g.op('Add', [
    g.op('MatMul', [heads(project(n, 'q'), [1, 0, 2]), heads(project(n, 'k'), [1, 2, 0])]),
    bias,
  ]);
  // [H, T, d_kv]
  const context = g.op('MatMul', [g.op('Softmax', [scores], { axis: -1 }), heads(project(n, 'v'), [1, 0, 2])]);
  const attended = g.op('Add', [
    hidden,
    project(g.op('Reshape', [g.op('Transpose', [context], { perm: [1, 0, 2] }), g.ints([0, inner])]), 'o'),
  ]);

  const m = g.rmsNorm(attended, 'ffnNorm', eps);
  const gate = g.geluTanh(project(m, 'wi0')); // gelu_new
  const out = g.op('Add', [attended, project(g.op('Mul', [gate, project(m, 'wi1')]), 'wo')]);
  g.output(out, 'hidden_out', [T, d]);
  return { bytes: g.toBytes(), weights };
}
