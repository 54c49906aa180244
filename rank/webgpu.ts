// Kept apart from the engine so that pages can ask about WebGPU without loading onnxruntime-web.

/** What WebGPU adapter this context has, if any, in words a user recognises. */
export async function probeWebGpu(): Promise<string | null> {
  const gpu = (globalThis.navigator as Navigator & { gpu?: { requestAdapter(): Promise<{ info?: Record<string, string> } | null> } })?.gpu;
  if (!gpu) return null;
  try {
    const adapter = await gpu.requestAdapter();
    if (!adapter) return null;
    const info = adapter.info ?? {};
    return [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(' ') || 'WebGPU adapter';
  } catch {
    return null;
  }
}
