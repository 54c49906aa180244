import type { SwarmWorker } from './swarm.ts';

/**
 * What a worker can do, measured rather than declared: its matrix-multiply throughput on its EP
 * (the worker runs a short probe) and the link to the coordinator (the round trip of a small and
 * of a 512 KiB message: the difference is the time the bytes took).
 */
export interface WorkerMeasurement {
  flops: number;
  rttMs: number;
  /** coordinator → worker, bytes per second */
  bandwidth: number;
}

const PROBE_BYTES = 512 * 1024;

export async function measureWorker(worker: SwarmWorker, timeoutMs = 30_000): Promise<WorkerMeasurement> {
  const { flops } = await worker.rpc.call<{ flops: number }>('probe', {}, timeoutMs);
  const roundTrip = async (payload: Float32Array) => {
    const start = performance.now();
    await worker.rpc.call('probe', { payload }, timeoutMs);
    return performance.now() - start;
  };
  const rttMs = Math.min(await roundTrip(new Float32Array(1)), await roundTrip(new Float32Array(1)));
  const largeMs = await roundTrip(new Float32Array(PROBE_BYTES / 4));
  return { flops, rttMs, bandwidth: PROBE_BYTES / (Math.max(largeMs - rttMs, 0.5) / 1000) };
}
