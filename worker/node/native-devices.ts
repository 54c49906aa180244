// What a worker process computes on with onnxruntime-node: its CPU, an NVIDIA GPU through CUDA (where
// onnxruntime-node's CUDA providers are installed), or a GPU through WebGPU (Dawn, which onnxruntime-node bundles:
// Vulkan, Metal or D3D12 underneath). Each device that starts here is timed on the matrix multiply a tab times its
// EPs on, and 'auto' takes the fastest, as a tab does between WebGPU and WASM. The engine then computes on it for
// what it calls its 'wasm' EP (native-ort.ts).
import { execFileSync } from 'node:child_process';
import type * as OnnxRuntime from 'onnxruntime-common';
import { medianMs } from '../../core/median.ts';
import { matmulProbe } from '../../core/model/matmul-probe.ts';
import { cpuName } from '../../core/cost-model.ts';
import { NATIVE_DEVICES, type NativeDevice } from '../../core/worker-api.ts';
import { CUDA_PROVIDERS_INSTALL } from './onnxruntime-node.ts';

/**
 * A GPU has to beat the CPU on a multiply large enough to pay for its copies: at 512² a CPU takes milliseconds and a
 * GPU's launch and transfer costs are small beside its compute.
 */
const PROBE_SIZE = 512;

/** A device timed, or why it did not start. */
export type DeviceProbe = { device: NativeDevice; flops: number } | { device: NativeDevice; refused: string };

/** The device the engine computes on, and why in a user's words: its rate and the others' (or why they failed) */
export interface DeviceChoice {
  device: NativeDevice;
  why: string;
}

/** Times `devices` (each alone, no CPU fallback) on `threads` CPU threads; a device that does not start says why. */
export async function probeNativeDevices(
  ort: typeof OnnxRuntime,
  threads: number,
  devices: readonly NativeDevice[] = NATIVE_DEVICES,
): Promise<DeviceProbe[]> {
  const probe = matmulProbe(PROBE_SIZE);
  const feeds = {
    a: new ort.Tensor('float32', probe.a, [PROBE_SIZE, PROBE_SIZE]),
    b: new ort.Tensor('float32', probe.b, [PROBE_SIZE, PROBE_SIZE]),
  };
  // a missing CUDA library or GPU is an answer here, not an error for onnxruntime's log (set before its first session)
  ort.env.logLevel = 'fatal';
  const probes: DeviceProbe[] = [];
  for (const device of devices) {
    let session: OnnxRuntime.InferenceSession;
    try {
      session = await ort.InferenceSession.create(probe.graph, {
        executionProviders: [device],
        intraOpNumThreads: threads,
      });
    } catch (e) {
      probes.push({ device, refused: refusal(device, (e as Error).message) });
      continue;
    }
    try {
      const ms = await medianMs(() => session.run(feeds), 5);
      probes.push({ device, flops: probe.operations / (ms / 1000) });
    } catch (e) {
      probes.push({ device, refused: `it started but failed to compute (${firstLine((e as Error).message)})` });
    } finally {
      await session.release();
    }
  }
  return probes;
}

/** why a device did not start, with what to do where something can be done */
function refusal(device: NativeDevice, message: string): string {
  if (device === 'cuda' && /shared librar/i.test(message))
    return (
      "onnxruntime-node's CUDA providers are not installed " + `(${CUDA_PROVIDERS_INSTALL}, with CUDA 12 and cuDNN 9)`
    );
  if (device === 'webgpu' && /adapter/i.test(message))
    return 'no GPU adapter (Dawn found no Vulkan, Metal or D3D12 GPU)';
  return firstLine(message);
}

const firstLine = (message: string): string => message.split('\n')[0].slice(0, 300);
const gflops = (flops: number): string => `${+(flops / 1e9).toPrecision(3)}`;

/**
 * The device `asked` for ('auto': the fastest that started), and why: its rate and the others'
 * ("2100 GFLOP/s vs CPU 41.2; WebGPU (Dawn): no GPU adapter"). Throws where the device asked for did not start.
 */
export function chooseNativeDevice(probes: readonly DeviceProbe[], asked: NativeDevice | 'auto'): DeviceChoice {
  const started = probes.flatMap((p) => ('flops' in p ? [p] : [])).sort((a, b) => b.flops - a.flops);
  const refused = probes.flatMap((p) => ('refused' in p ? [p] : []));
  const chosen = asked === 'auto' ? started[0] : started.find((p) => p.device === asked);
  if (!chosen) {
    const why = refused.find((p) => asked === 'auto' || p.device === asked);
    throw new Error(
      `onnxruntime-node cannot compute on ${asked === 'auto' ? 'any device' : cpuName(asked)} here` +
        (why ? `: ${why.refused}` : ''),
    );
  }
  const others = started.filter((p) => p !== chosen).map((p) => `${cpuName(p.device)} ${gflops(p.flops)}`);
  const notes = refused.map((p) => `${cpuName(p.device)}: ${p.refused}`);
  return {
    device: chosen.device,
    why:
      `${gflops(chosen.flops)} GFLOP/s` +
      (others.length ? ` vs ${others.join(', ')}` : '') +
      (asked === 'auto' ? '' : ', as asked') +
      (notes.length ? `; ${notes.join('; ')}` : ''),
  };
}

/** An NVIDIA GPU's name and memory (GiB) as nvidia-smi tells them; null where there is none or no nvidia-smi. */
export function nvidiaGpu(): { name: string; memoryGiB: number } | null {
  try {
    const [name, mib] = execFileSync('nvidia-smi', ['--query-gpu=name,memory.total', '--format=csv,noheader,nounits'], {
      encoding: 'utf8',
      timeout: 5_000,
      stdio: ['ignore', 'pipe', 'ignore'],
    })
      .split('\n')[0]
      .split(',')
      .map((s) => s.trim());
    const memoryGiB = Number(mib) / 1024;
    return name && Number.isFinite(memoryGiB) && memoryGiB > 0 ? { name, memoryGiB } : null;
  } catch {
    return null;
  }
}
