// onnxruntime-node, an optional dependency (its install script would fetch CUDA providers from NuGet, which fails
// offline and drops the package: package.json's allowScripts denies it, the CPU binaries ship in the package; an
// install may still leave it out): loaded by name at run time, so that nothing else needs it installed, and typed
// by the API it shares with onnxruntime-web (onnxruntime-common).
import type * as OnnxRuntime from 'onnxruntime-common';

const PACKAGE: string = 'onnxruntime-node';

/** What installs its CUDA providers (CUDA 12 and cuDNN 9): its own install script, which npm install does not run. */
export const CUDA_PROVIDERS_INSTALL =
  'cd node_modules/onnxruntime-node && ONNXRUNTIME_NODE_INSTALL=cuda12 node script/install.js';

/** onnxruntime-node, or the reason it did not load (not installed, no binary for this platform) */
export const loadOnnxruntimeNode = (): Promise<typeof OnnxRuntime> => import(PACKAGE) as Promise<typeof OnnxRuntime>;
