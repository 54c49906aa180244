// What the engine (rank/) uses of onnxruntime-web, on onnxruntime-node in a worker process: the engine's thread
// resolves 'onnxruntime-web' to this module (engine-thread.ts). The engine's CPU EP, 'wasm', is onnxruntime-node's
// native 'cpu' here, on the threads the engine was started with (onnxruntime-web's numThreads).
import type { InferenceSession as NativeSession } from 'onnxruntime-common';
import type { InferenceSession as Session } from 'onnxruntime-web';
import { loadOnnxruntimeNode } from './onnxruntime-node.ts';

const native = await loadOnnxruntimeNode();
export const { Tensor, env } = native;

export const InferenceSession = {
  create(model: Uint8Array, options: Session.SessionOptions = {}): Promise<NativeSession> {
    const executionProviders = (options.executionProviders ?? ['wasm']).map((ep) => {
      if (ep !== 'wasm') throw new Error(`a worker process computes on its CPU, not ${JSON.stringify(ep)}`);
      return 'cpu';
    });
    return native.InferenceSession.create(model, {
      ...options,
      executionProviders,
      intraOpNumThreads: env.wasm.numThreads ?? 1,
    } as NativeSession.SessionOptions);
  },
};
