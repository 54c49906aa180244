// onnxruntime-node, an optional dependency (its install script fetches CUDA providers, which .npmrc skips; an
// install may still leave it out): loaded by name at run time, so that nothing else needs it installed, and typed
// by the API it shares with onnxruntime-web (onnxruntime-common).
import type * as OnnxRuntime from 'onnxruntime-common';

const PACKAGE: string = 'onnxruntime-node';

/** onnxruntime-node, or the reason it did not load (not installed, no binary for this platform) */
export const loadOnnxruntimeNode = (): Promise<typeof OnnxRuntime> => import(PACKAGE) as Promise<typeof OnnxRuntime>;
