// What the engine (rank/) uses of onnxruntime-web, on onnxruntime-node in a worker process: the engine's thread
// resolves 'onnxruntime-web' to this module (engine-thread.ts). The engine's 'wasm' EP is the device the process
// chose (native-devices.ts: the CPU, CUDA or Dawn's WebGPU), on the threads the engine was started with
// (onnxruntime-web's numThreads).
import type { InferenceSession as NativeSession } from 'onnxruntime-common';
import type { InferenceSession as Session } from 'onnxruntime-web';
import { workerData } from 'node:worker_threads';
import type { EngineThreadData } from './engine-thread.ts';
import { loadOnnxruntimeNode } from './onnxruntime-node.ts';

const native = await loadOnnxruntimeNode();
const { device } = workerData as EngineThreadData;
if (!device) throw new Error('native-ort.ts serves an engine thread started on a native device');
export const { Tensor, env } = native;

export const InferenceSession = {
  create(model: Uint8Array, options: Session.SessionOptions = {}): Promise<NativeSession> {
    const executionProviders = (options.executionProviders ?? ['wasm']).flatMap((ep) => {
      if (ep !== 'wasm') throw new Error(`a worker process computes on its native device, not ${JSON.stringify(ep)}`);
      // ops a GPU's EP lacks run on the CPU's kernels
      return device === 'cpu' ? ['cpu'] : [device, 'cpu'];
    });
    return native.InferenceSession.create(model, {
      ...options,
      executionProviders,
      intraOpNumThreads: env.wasm.numThreads ?? 1,
    } as NativeSession.SessionOptions);
  },
};
