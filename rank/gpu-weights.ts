// Weights as onnxruntime-web tensors fed to a session at every run: on WebGPU uploaded once into
// GPU buffers (as float16 or int8 where asked: less memory, widened in the graph), on WASM CPU data.
// The transformer's blocks (onnx-stages.ts) and the VAE decoder (vae-decoder.ts) hold theirs here.
import type { WeightType } from '../core/worker-api.ts';
import * as ort from 'onnxruntime-web';
import { scaleInput } from '../core/model/stage-graphs.ts';
import { narrowWeight, type HeldWeight } from '../core/model/held-weights.ts';

/** The parts of a WebGPU device the runners use (the DOM's WebGPU types are not in this build's lib). */
export interface GpuDevice {
  features: { has(feature: string): boolean };
  createBuffer(descriptor: { size: number; usage: number }): { destroy(): void };
  queue: {
    writeBuffer(buffer: unknown, offset: number, data: ArrayBufferLike, dataOffset: number, size: number): void;
  };
}
/** WebGPU's GPUBufferUsage flags (a browser global) */
const GPU_BUFFER_USAGE = { COPY_SRC: 0x0004, COPY_DST: 0x0008, STORAGE: 0x0080 };

export interface WeightTensors {
  /** `data` as a float32 tensor shaped `dims` (the VAE decoder's weights) */
  tensor(data: Float32Array, dims: number[]): ort.Tensor;
  /** the inputs a fed graph (FedGraph) takes weight `name` by, `data` stored as `type`: an int8 weight's scales too */
  inputs(name: string, data: Float32Array, dims: number[], type: WeightType): [string, ort.Tensor][];
  /** the same of a weight already held as its graph takes it (core/model/held-weights.ts): its arrays, not a copy */
  heldInputs(name: string, weight: HeldWeight, dims: number[]): [string, ort.Tensor][];
  /** bytes of GPU buffers made so far (0 on WASM) */
  readonly gpuBytes: number;
  /** bytes of every tensor made so far, as stored */
  readonly heldBytes: number;
  /** frees the GPU buffers */
  destroy(): void;
}

/** `device` null: WASM, CPU tensors. */
export function weightTensors(device: GpuDevice | null): WeightTensors {
  const buffers: { destroy(): void }[] = [];
  let gpuBytes = 0;
  let heldBytes = 0;
  const held = (
    type: 'float32' | 'float16' | 'uint8',
    values: Float32Array | Uint16Array | Uint8Array,
    dims: number[],
  ) => {
    heldBytes += values.byteLength;
    if (!device) return new ort.Tensor(type, values, dims);
    // writeBuffer copies whole 4-byte words: an odd count of float16 values or of bytes goes padded
    const size = Math.ceil(values.byteLength / 4) * 4;
    const words =
      size === values.byteLength ? new Uint8Array(values.buffer, values.byteOffset, size) : new Uint8Array(size);
    if (words.buffer !== values.buffer) words.set(new Uint8Array(values.buffer, values.byteOffset, values.byteLength));
    const buffer = device.createBuffer({
      size,
      usage: GPU_BUFFER_USAGE.STORAGE | GPU_BUFFER_USAGE.COPY_SRC | GPU_BUFFER_USAGE.COPY_DST,
    });
    device.queue.writeBuffer(buffer, 0, words.buffer, words.byteOffset, size);
    buffers.push(buffer);
    gpuBytes += size;
    return ort.Tensor.fromGpuBuffer(buffer as never, { dataType: type, dims });
  };
  const heldInputs = (name: string, weight: HeldWeight, dims: number[]): [string, ort.Tensor][] =>
    weight.type === 'int8'
      ? [
          [name, held('uint8', weight.bytes, dims)],
          [scaleInput(name), held('float32', weight.scales, [dims[0]])],
        ]
      : [[name, held(weight.type, weight.data, dims)]];
  return {
    tensor: (data, dims) => held('float32', data, dims),
    inputs: (name, data, dims, type) => heldInputs(name, narrowWeight(data, dims[0], type), dims),
    heldInputs,
    get gpuBytes() {
      return gpuBytes;
    },
    get heldBytes() {
      return heldBytes;
    },
    destroy: () => buffers.forEach((buffer) => buffer.destroy()),
  };
}
