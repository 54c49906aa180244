// What a worker can do, measured rather than declared: its matrix-multiply and softmax throughput on
// each EP it has (the worker runs a short probe) and its link to the coordinator (the round trip of
// a small and of a 512 KiB message: the difference is the time the bytes took).
import { fastestEp } from '../core/cost-model.ts';
import type { ComputeProbe, ExecutionProvider, WorkerApi, WorkerInfo } from '../core/worker-api.ts';
import type { Remote } from '../core/net/rpc.ts';

export interface WorkerMeasurement {
  /** the WASM threads the worker had (its share of its machine's cores): what `compute` was measured on */
  threads: number;
  /** what it computes at on each EP it has (WebAssembly always; WebGPU where there is an adapter) */
  compute: Partial<Record<ExecutionProvider, ComputeProbe>>;
  /** the EP it computes on when a job leaves the EP to 'auto' (as the worker itself chooses), and why */
  auto: { ep: ExecutionProvider; why: string };
  rttMs: number;
  /** coordinator → worker, bytes per second */
  bandwidth: number;
}

const PROBE_BYTES = 512 * 1024;
/**
 * The worker tabs of one machine take turns at their compute probes (so that each measures its
 * share of the cores, not a crowd of probes): a tab that joins beside three others may wait for
 * theirs before its own starts.
 */
const PROBE_TIMEOUT_MS = 120_000;

type MeasuredWorker = {
  api: Pick<Remote<WorkerApi>, 'probeCompute' | 'probeLink'>;
  info: Pick<WorkerInfo, 'ep' | 'softwareAdapter' | 'threads' | 'nativeDevice'>;
};

/**
 * The EPs a worker is probed on as it joins: WebAssembly, and WebGPU on a GPU. A software adapter (SwiftShader,
 * llvmpipe) is never what 'auto' takes, and its probe costs seconds of compiling shaders on the CPU, so its WebGPU is
 * probed only for a job that asks for WebGPU (withEpMeasured).
 */
const probedAtJoin = (info: MeasuredWorker['info']): ExecutionProvider[] =>
  info.ep === 'webgpu' && !info.softwareAdapter ? ['wasm', 'webgpu'] : ['wasm'];

/**
 * The worker's compute (its probes at join) and its link to the coordinator. `kept`: the compute of a worker of the
 * same browser on the same share of its cores (Swarm keeps them): the same compute on the same machine, taken instead
 * of probing again where it is had; the link is measured all the same, as each worker's is its own.
 */
export async function measureWorker(
  worker: MeasuredWorker,
  timeoutMs = PROBE_TIMEOUT_MS,
  kept?: Promise<WorkerMeasurement['compute']>,
): Promise<WorkerMeasurement> {
  const compute: WorkerMeasurement['compute'] = { ...(await kept?.catch(() => undefined)) };
  for (const ep of probedAtJoin(worker.info)) compute[ep] ??= await worker.api.probeCompute({ ep }, timeoutMs);
  const roundTrip = async (payload: Float32Array) => {
    const start = performance.now();
    await worker.api.probeLink({ payload }, timeoutMs);
    return performance.now() - start;
  };
  const rttMs = Math.min(await roundTrip(new Float32Array(1)), await roundTrip(new Float32Array(1)));
  const largeMs = await roundTrip(new Float32Array(PROBE_BYTES / 4));
  return {
    threads: worker.info.threads,
    compute,
    auto: fastestEp(compute, worker.info.softwareAdapter, worker.info.nativeDevice),
    rttMs,
    bandwidth: PROBE_BYTES / (Math.max(largeMs - rttMs, 0.5) / 1000),
  };
}

/** Whether the worker has `ep` and `measurement` has no probe of it (a software WebGPU adapter before a job asks). */
export const lacksProbe = (info: MeasuredWorker['info'], m: WorkerMeasurement, ep: ExecutionProvider): boolean =>
  !m.compute[ep] && (ep === 'wasm' || info.ep === 'webgpu');

/** `measurement` with the worker probed on `ep` too where it lacks that probe (lacksProbe), else `measurement`. */
export async function withEpMeasured(
  worker: MeasuredWorker,
  measurement: WorkerMeasurement,
  ep: ExecutionProvider,
  timeoutMs = PROBE_TIMEOUT_MS,
): Promise<WorkerMeasurement> {
  if (!lacksProbe(worker.info, measurement, ep)) return measurement;
  return {
    ...measurement,
    compute: { ...measurement.compute, [ep]: await worker.api.probeCompute({ ep }, timeoutMs) },
  };
}
