import type { RpcClient } from '../core/net/rpc.ts';
import type { ExecutionProvider } from '../rank/onnx-stages.ts';

/**
 * What a worker can do, measured rather than declared: its matrix-multiply and softmax throughput
 * on its EP (the worker runs a short probe) and the link to the coordinator (the round trip of a small and
 * of a 512 KiB message: the difference is the time the bytes took).
 */
export interface WorkerMeasurement {
  /** FLOP/s on each EP the worker has (WebAssembly always; WebGPU where there is an adapter) */
  flops: Partial<Record<ExecutionProvider, number>>;
  /** attention scores (bias + softmax) per second on each EP: the memory-bound work FLOPs miss */
  softmaxRate: Partial<Record<ExecutionProvider, number>>;
  rttMs: number;
  /** coordinator → worker, bytes per second */
  bandwidth: number;
}

const PROBE_BYTES = 512 * 1024;

export async function measureWorker(worker: { rpc: Pick<RpcClient, 'call'>; info: { ep: ExecutionProvider } }, timeoutMs = 30_000): Promise<WorkerMeasurement> {
  const flops: WorkerMeasurement['flops'] = {};
  const softmaxRate: WorkerMeasurement['softmaxRate'] = {};
  for (const ep of worker.info.ep === 'webgpu' ? (['wasm', 'webgpu'] as const) : (['wasm'] as const)) {
    ({ flops: flops[ep], softmaxRate: softmaxRate[ep] } = await worker.rpc.call<{ flops: number; softmaxRate: number }>('probe', { ep }, timeoutMs));
  }
  const roundTrip = async (payload: Float32Array) => {
    const start = performance.now();
    await worker.rpc.call('probe', { payload }, timeoutMs);
    return performance.now() - start;
  };
  const rttMs = Math.min(await roundTrip(new Float32Array(1)), await roundTrip(new Float32Array(1)));
  const largeMs = await roundTrip(new Float32Array(PROBE_BYTES / 4));
  return { flops, softmaxRate, rttMs, bandwidth: PROBE_BYTES / (Math.max(largeMs - rttMs, 0.5) / 1000) };
}
