// Kept apart from the engine so that pages can ask about WebGPU without loading onnxruntime-web.
import type { WorkerInfo } from '../core/worker-api.ts';

export interface WebGpuAdapter {
  /** in words a user recognises: "google swiftshader", "nvidia ampere" */
  name: string;
  /** WebGPU's own flag for an adapter that computes on the CPU (SwiftShader, llvmpipe) */
  software: boolean;
}

/** What WebGPU adapter this context has, if any. */
export async function probeWebGpu(): Promise<WebGpuAdapter | null> {
  // Node before 21 has no navigator at all
  const gpu = (
    globalThis.navigator as
      | (Navigator & {
          gpu?: {
            requestAdapter(): Promise<{ info?: Record<string, string | boolean>; isFallbackAdapter?: boolean } | null>;
          };
        })
      | undefined
  )?.gpu;
  if (!gpu) return null;
  try {
    const adapter = await gpu.requestAdapter();
    if (!adapter) return null;
    const info = adapter.info ?? {};
    const name =
      [info.vendor, info.architecture, info.device, info.description]
        .filter((s) => typeof s === 'string' && s)
        .join(' ') || 'WebGPU adapter';
    // older browsers flag it on the adapter, newer ones in its info
    return { name, software: info.isFallbackAdapter === true || adapter.isFallbackAdapter === true };
  } catch {
    return null;
  }
}

/** The compute a page has, as its worker says when it joins. */
export async function describeCompute(): Promise<Pick<WorkerInfo, 'ep' | 'adapter' | 'softwareAdapter'>> {
  const adapter = await probeWebGpu();
  return adapter
    ? { ep: 'webgpu', adapter: adapter.name, softwareAdapter: adapter.software }
    : { ep: 'wasm', adapter: 'WebAssembly (no WebGPU adapter)', softwareAdapter: false };
}
