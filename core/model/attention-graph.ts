// Self-attention over the full sequence with the queries taken a chunk of rows at a time, so the
// score matrix never exceeds `scoreBudget` floats: a [h, S, S] matrix is 3.2 GB at 12 heads and
// S = 8192 — past what a 32-bit wasm heap (and onnxruntime's size arithmetic) allows — while a
// [h, c, S] chunk of it is not. The math of `attention` in ops.ts, rows independent of the chunking:
//   q [S, h·d], k, v [Sk, h·d] → o [S, h·d], h = width / d.
//
// In ONNX: an outer graph puts heads first and pads the queries to n·c rows, a Loop of n
// iterations attends one [h, c, d] chunk of queries to all keys, and the stacked chunk outputs
// [n, h, c, d] go back to rows [S, h·d]. Weightless: one graph serves every block and head count.

import onnxProto from 'onnx-proto';
import { OPSET } from './onnx-builder.ts';

const { onnx } = onnxProto;
const { FLOAT, INT64, BOOL } = onnx.TensorProto.DataType;
const { INT, INTS, GRAPH } = onnx.AttributeProto.AttributeType;

export const DEFAULT_SCORE_BUDGET = 1 << 22; // floats in one chunk's [h, c, S] scores: 16 MiB

export function buildChunkedAttentionGraph(headDim: number, scoreBudget = DEFAULT_SCORE_BUDGET): Uint8Array {
  const outer = new ProtoGraph('attention_chunked');
  const body = new ProtoGraph('attention_chunk');
  const d = headDim;

  // queries and keys may differ in number (a displaced rank's own tokens over every token)
  const q = outer.input('q', FLOAT, ['S', 'W']);
  const [k, v] = ['k', 'v'].map((name) => outer.input(name, FLOAT, ['Sk', 'W']));
  const heads = (x: string, perm: number[]) =>
    outer.op('Transpose', [outer.op('Reshape', [x, outer.ints([0, -1, d])])], { perm });
  const qh = outer.op('Mul', [heads(q, [1, 0, 2]), outer.float(1 / Math.sqrt(d))]); // [h, S, d], pre-scaled
  const kt = heads(k, [1, 2, 0]); // [h, d, Sk]
  const vh = heads(v, [1, 0, 2]); // [h, Sk, d]

  // chunk rows c = clamp(budget / (h·Sk), 1, S); n = ceil(S / c) chunks; queries padded to n·c rows
  const qShape = outer.op('Shape', [q]);
  const rows = outer.op('Gather', [qShape, outer.ints([0])], { axis: 0 }); // [1]: S
  const width = outer.op('Gather', [qShape, outer.ints([1])], { axis: 0 }); // [1]: h·d
  const headCount = outer.op('Div', [width, outer.ints([d])]);
  const keyRows = outer.op('Gather', [outer.op('Shape', [k]), outer.ints([0])], { axis: 0 }); // [1]: Sk
  const fit = outer.op('Div', [outer.ints([scoreBudget]), outer.op('Mul', [headCount, keyRows])]);
  const chunk = outer.op('Min', [outer.op('Max', [fit, outer.ints([1])]), rows]); // [1]: c
  const count = outer.op('Div', [outer.op('Sub', [outer.op('Add', [rows, chunk]), outer.ints([1])]), chunk]); // [1]: n
  const padRows = outer.op('Sub', [outer.op('Mul', [count, chunk]), rows]);
  const pads = outer.op('Concat', [outer.ints([0, 0, 0, 0]), padRows, outer.ints([0])], { axis: 0 });
  const qPadded = outer.op('Pad', [qh, pads]); // [h, n·c, d]

  // body: (i, cond) → (cond, o_i [h, c, d]); q, k, v and c come from the outer scope
  const i = body.input('i', INT64, []);
  const cond = body.input('cond_in', BOOL, []);
  const start = body.op('Mul', [body.op('Unsqueeze', [i, body.ints([0])]), chunk]);
  const qc = body.op('Slice', [qPadded, start, body.op('Add', [start, chunk]), body.ints([1])]); // [h, c, d]
  const scores = body.op('MatMul', [qc, kt]); // [h, c, Sk]
  const oc = body.op('MatMul', [body.op('Softmax', [scores], { axis: -1 }), vh]); // [h, c, d]
  body.output(cond, 'cond_out', BOOL, []);
  body.output(oc, 'o_chunk', FLOAT, ['h', 'c', d]);

  const trips = outer.op('Squeeze', [count, outer.ints([0])]);
  const stacked = outer.op('Loop', [trips, ''], { body: body.proto() }); // [n, h, c, d]
  const tokenRows = outer.op('Reshape', [
    outer.op('Transpose', [stacked], { perm: [0, 2, 1, 3] }),
    outer.op('Concat', [outer.ints([-1]), width], { axis: 0 }),
  ]);
  const o = outer.op('Slice', [tokenRows, outer.ints([0]), rows, outer.ints([0])]); // [S, h·d]
  outer.output(o, 'o', FLOAT, ['S', 'W']);
  return outer.toBytes();
}

type Attribute = number | number[] | onnxProto.onnx.IGraphProto;

/** The part of an ONNX graph builder a Loop needs and `OnnxGraph` has not: typed values and graph attributes. */
class ProtoGraph {
  private nodes: onnxProto.onnx.INodeProto[] = [];
  private initializers: onnxProto.onnx.ITensorProto[] = [];
  private inputs: onnxProto.onnx.IValueInfoProto[] = [];
  private outputs: onnxProto.onnx.IValueInfoProto[] = [];
  private static counter = 0; // names stay unique across a graph and its bodies

  constructor(readonly name: string) {}

  input(name: string, type: number, dims: (number | string)[]): string {
    this.inputs.push(valueInfo(name, type, dims));
    return name;
  }

  output(value: string, name: string, type: number, dims: (number | string)[]): void {
    this.nodes.push({ opType: 'Identity', input: [value], output: [name], name: `${this.name}_${name}` });
    this.outputs.push(valueInfo(name, type, dims));
  }

  ints(values: number[]): string {
    const name = `${this.name}_const_${ProtoGraph.counter++}`;
    this.initializers.push({ name, dims: [values.length], dataType: INT64, int64Data: values });
    return name;
  }

  float(value: number): string {
    const name = `${this.name}_const_${ProtoGraph.counter++}`;
    this.initializers.push({ name, dims: [], dataType: FLOAT, floatData: [value] });
    return name;
  }

  op(type: string, inputs: string[], attributes: Record<string, Attribute> = {}): string {
    const name = `${this.name}_${type.toLowerCase()}_${ProtoGraph.counter++}`;
    this.nodes.push({
      opType: type,
      input: inputs,
      output: [name],
      name,
      attribute: Object.entries(attributes).map(([key, v]) =>
        typeof v === 'number'
          ? { name: key, type: INT, i: v }
          : Array.isArray(v)
            ? { name: key, type: INTS, ints: v }
            : { name: key, type: GRAPH, g: v },
      ),
    });
    return name;
  }

  proto(): onnxProto.onnx.IGraphProto {
    return {
      name: this.name,
      node: this.nodes,
      initializer: this.initializers,
      input: this.inputs,
      output: this.outputs,
    };
  }

  toBytes(): Uint8Array {
    const model = onnx.ModelProto.create({
      irVersion: 8,
      producerName: 'ditswarm',
      opsetImport: [{ domain: '', version: OPSET }],
      graph: this.proto(),
    });
    return onnx.ModelProto.encode(model).finish();
  }
}

function valueInfo(name: string, elemType: number, dims: (number | string)[]): onnxProto.onnx.IValueInfoProto {
  return {
    name,
    type: {
      tensorType: {
        elemType,
        shape: { dim: dims.map((x) => (typeof x === 'string' ? { dimParam: x } : { dimValue: x })) },
      },
    },
  };
}
