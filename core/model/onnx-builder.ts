import onnxProto from 'onnx-proto';

const { onnx } = onnxProto;
const FLOAT = onnx.TensorProto.DataType.FLOAT;
const FLOAT16 = onnx.TensorProto.DataType.FLOAT16;
const INT32 = onnx.TensorProto.DataType.INT32;
const INT64 = onnx.TensorProto.DataType.INT64;
const UINT8 = onnx.TensorProto.DataType.UINT8;

const ELEMENT_TYPES = { float32: FLOAT, float16: FLOAT16, int32: INT32, int64: INT64, uint8: UINT8 };
export const OPSET = 17;

export type Dim = number | string; // a string is a symbolic dimension, e.g. the sequence length

/**
 * A small builder for ONNX graphs: named values in, ops in order, named values out. Weights go in
 * as float32 initializers; constants (shapes, axes) as int64 initializers.
 */
export class OnnxGraph {
  private nodes: onnxProto.onnx.INodeProto[] = [];
  private initializers: onnxProto.onnx.ITensorProto[] = [];
  private inputs: onnxProto.onnx.IValueInfoProto[] = [];
  private outputs: onnxProto.onnx.IValueInfoProto[] = [];
  private counter = 0;
  private weightNames = new Set<string>();

  constructor(readonly name: string) {}

  input(name: string, dims: Dim[], type: keyof typeof ELEMENT_TYPES = 'float32'): string {
    this.inputs.push(valueInfo(name, dims, ELEMENT_TYPES[type]));
    return name;
  }

  /** A float16 value as float32. */
  widen(value: string): string {
    return this.op('Cast', [value], { to: FLOAT });
  }

  /**
   * A [rows, …] matrix of bytes offset by 128 (an int8 as GPU buffers take it: they hold no int8) as float32, each row
   * times its scale of `scales` [rows]: DequantizeLinear per axis 0, the zero points a constant.
   */
  dequantizeRows(value: string, scales: string, rows: number): string {
    const zeroPoints = `zero_points_${rows}`;
    if (!this.weightNames.has(zeroPoints)) {
      this.weightNames.add(zeroPoints);
      const rawData = new Uint8Array(rows).fill(128);
      this.initializers.push({ name: zeroPoints, dims: [rows], dataType: UINT8, rawData });
    }
    return this.op('DequantizeLinear', [value, scales, zeroPoints], { axis: 0 });
  }

  output(value: string, name: string, dims: Dim[]): void {
    this.op('Identity', [value], {}, name);
    this.outputs.push(valueInfo(name, dims));
  }

  /** Adds a float32 initializer once; later calls with the same name reuse it. */
  weight(name: string, dims: number[], data: Float32Array): string {
    if (this.weightNames.has(name)) return name;
    this.weightNames.add(name);
    this.initializers.push({
      name,
      dims,
      dataType: FLOAT,
      rawData: new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
    });
    return name;
  }

  ints(values: number[]): string {
    const name = `const_${this.counter++}`;
    this.initializers.push({ name, dims: [values.length], dataType: INT64, int64Data: values });
    return name;
  }

  scalar(value: number): string {
    const name = `const_${this.counter++}`;
    this.initializers.push({ name, dims: [], dataType: FLOAT, floatData: [value] });
    return name;
  }

  /** RMSNorm over the last axis with a learned scale (no mean, no bias: Wan's q/k norms, T5's layer norms). */
  rmsNorm(x: string, weight: string, eps: number): string {
    const meanSquare = this.op('ReduceMean', [this.op('Mul', [x, x])], { axes: [-1], keepdims: 1 });
    const inv = this.op('Reciprocal', [this.op('Sqrt', [this.op('Add', [meanSquare, this.scalar(eps)])])]);
    return this.op('Mul', [this.op('Mul', [x, inv]), weight]);
  }

  /** GELU's tanh approximation (diffusers' "gelu-approximate", transformers' gelu_new). */
  geluTanh(x: string): string {
    const cube = this.op('Mul', [this.op('Mul', [x, x]), x]);
    const inner = this.op('Mul', [
      this.op('Add', [x, this.op('Mul', [cube, this.scalar(0.044715)])]),
      this.scalar(Math.sqrt(2 / Math.PI)),
    ]);
    const half = this.op('Mul', [x, this.scalar(0.5)]);
    return this.op('Mul', [half, this.op('Add', [this.op('Tanh', [inner]), this.scalar(1)])]);
  }

  /** Appends one node and returns its output. Whole-number attributes are INT, others FLOAT. */
  op(
    type: string,
    inputs: string[],
    attributes: Record<string, number | number[]> = {},
    outputName?: string,
    outputs = 1,
  ): string {
    return this.opMulti(type, inputs, attributes, outputs, outputName)[0];
  }

  /** Appends one node with several outputs (e.g. Split). */
  opMulti(
    type: string,
    inputs: string[],
    attributes: Record<string, number | number[]>,
    outputs: number,
    outputName?: string,
  ): string[] {
    const id = this.counter++;
    const names = Array.from({ length: outputs }, (_, i) =>
      outputName && outputs === 1 ? outputName : `${type.toLowerCase()}_${id}_${i}`,
    );
    this.nodes.push({
      opType: type,
      input: inputs,
      output: names,
      name: `${type}_${id}`,
      attribute: Object.entries(attributes).map(([name, v]) =>
        Array.isArray(v)
          ? { name, type: onnx.AttributeProto.AttributeType.INTS, ints: v }
          : Number.isInteger(v)
            ? { name, type: onnx.AttributeProto.AttributeType.INT, i: v }
            : { name, type: onnx.AttributeProto.AttributeType.FLOAT, f: v },
      ),
    });
    return names;
  }

  toBytes(): Uint8Array {
    const model = onnx.ModelProto.create({
      irVersion: 8,
      producerName: 'ditswarm',
      opsetImport: [{ domain: '', version: OPSET }],
      graph: {
        name: this.name,
        node: this.nodes,
        initializer: this.initializers,
        input: this.inputs,
        output: this.outputs,
      },
    });
    return onnx.ModelProto.encode(model).finish();
  }
}

function valueInfo(name: string, dims: Dim[], elemType = FLOAT): onnxProto.onnx.IValueInfoProto {
  return {
    name,
    type: {
      tensorType: {
        elemType,
        shape: { dim: dims.map((d) => (typeof d === 'string' ? { dimParam: d } : { dimValue: d })) },
      },
    },
  };
}
