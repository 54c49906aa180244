// A worker as a Node process (`npm run worker -- LINK`): PeerJS on werift (webrtc.ts), the engine in a worker
// thread (engine-thread.ts) on the fastest of onnxruntime-node's devices where it is installed (native-devices.ts),
// on onnxruntime-web's WebAssembly in Node where it is not; the process takes the cores it is given.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { availableParallelism, cpus, hostname, release, totalmem, platform as system } from 'node:os';
import { Worker } from 'node:worker_threads';
import * as Comlink from 'comlink';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';
import { cpuName } from '../../core/cost-model.ts';
import { NATIVE_DEVICES, type NativeDevice } from '../../core/worker-api.ts';
import { EngineHost, type StartEngine } from '../../rank/engine-client.ts';
import type { EngineMove } from '../../rank/engine.ts';
import type { EngineFactory } from '../../rank/engine.worker.ts';
import type { WorkerPlatform } from '../platform.ts';
import type { EngineThreadData } from './engine-thread.ts';
import { chooseNativeDevice, nvidiaGpu, probeNativeDevices } from './native-devices.ts';
import { loadOnnxruntimeNode } from './onnxruntime-node.ts';
import { nodePeers } from './webrtc.ts';

/** What a worker process computes on: a device of onnxruntime-node's, or (without it) onnxruntime-web's WebAssembly. */
export interface NodeCompute {
  /** null: WebAssembly */
  device: NativeDevice | null;
  /** in a user's words, with why this device and not another */
  name: string;
  /** the memory the model's weights live in where it is not the machine's (a GPU's), in GiB */
  memoryGiB?: number;
}

/** What `--device` asks for: a device of onnxruntime-node's, the fastest of them, or onnxruntime-web's WebAssembly. */
export type DeviceRequest = NativeDevice | 'auto' | 'wasm';

/**
 * The device asked for, or with 'auto' the fastest of onnxruntime-node's where it loads (an optional dependency: an
 * install may have left it out), with why. Throws where a device asked for cannot compute here.
 */
export async function nodeCompute(threads: number, asked: DeviceRequest = 'auto'): Promise<NodeCompute> {
  const cpu = `${cpus()[0]?.model.trim() || 'CPU'}, ${threads} thread${threads === 1 ? '' : 's'}`;
  if (asked === 'wasm') return { device: null, name: `WebAssembly in Node (${cpu}), as asked` };
  let ort: Awaited<ReturnType<typeof loadOnnxruntimeNode>>;
  try {
    ort = await loadOnnxruntimeNode();
  } catch (e) {
    const why = `onnxruntime-node did not load (${(e as Error).message.split('\n')[0]}); npm install onnxruntime-node`;
    if (asked !== 'auto') throw new Error(why, { cause: e });
    return { device: null, name: `WebAssembly in Node (${cpu}): ${why}` };
  }
  const { device, why } = chooseNativeDevice(
    await probeNativeDevices(ort, threads, asked === 'auto' ? NATIVE_DEVICES : [asked]),
    asked,
  );
  const gpu = device === 'cuda' ? nvidiaGpu() : null;
  return {
    device,
    name: `onnxruntime-node on ${device === 'cpu' ? `the CPU (${cpu})` : (gpu?.name ?? cpuName(device))}: ${why}`,
    ...(gpu && { memoryGiB: gpu.memoryGiB }),
  };
}

export interface NodePlatformOptions {
  /** the threads the engine computes on: the machine's cores unless told */
  threads?: number;
  /** what to compute on (default 'auto': the fastest of onnxruntime-node's devices) */
  device?: DeviceRequest;
  /** the folder the weights it fetches are kept in (worker/node/disk-weights.ts); null: none */
  cacheDir?: string | null;
  /** a model folder this machine has, read where its files are the server's; null: none */
  modelDir?: string | null;
}

/** The platform of a worker process. */
export async function nodePlatform({
  threads = availableParallelism(),
  device = 'auto',
  cacheDir = null,
  modelDir = null,
}: NodePlatformOptions = {}): Promise<{
  platform: WorkerPlatform;
  compute: NodeCompute;
}> {
  const compute = await nodeCompute(threads, device);
  const id = machineId();
  const platform: WorkerPlatform = {
    newPeer: await nodePeers(),
    describe: () =>
      Promise.resolve({
        kind: 'node',
        host: hostname(),
        ...(compute.device && { nativeDevice: compute.device }),
        ep: 'wasm',
        adapter: compute.name,
        softwareAdapter: false,
        memoryGiB: compute.memoryGiB ?? totalmem() / 2 ** 30,
        userAgent: `Node ${process.version} (${system()} ${release()})`,
        cores: availableParallelism(),
        // the processes of one machine share it; a tab on it has a hint of its own (rank/machine-hint.ts)
        machine: id,
      }),
    shareCores: () =>
      Promise.resolve({
        cores: availableParallelism(),
        browser: id,
        threads: () => threads,
        tabs: () => 1,
        leave() {},
      }),
    startEngine: (engineThreads) =>
      new EngineHost(
        engineThreads,
        (probe) => probe(),
        engineThread({ cpu: compute.name, device: compute.device, cacheDir, modelDir }),
      ),
    keepAwake: () => () => {},
    onFreeze: () => () => {},
    peakMemoryBytes: () => process.memoryUsage.rss(),
  };
  return { platform, compute };
}

/**
 * This machine's id, as a tab has its browser's (WorkerInfo.browser): the processes of one machine share it, as the
 * tabs of one browser do. So the planner knows they compute on one CPU (their exchanges cost those cores), and a ban
 * or a trust mark covers the machine. A hash of the OS's machine id (or host name), not the id itself.
 */
export function machineId(): string {
  let machine = hostname();
  for (const file of ['/etc/machine-id', '/var/lib/dbus/machine-id'])
    try {
      machine = readFileSync(file, 'utf8').trim() || machine;
      break;
    } catch {
      // not this OS's place for it
    }
  return createHash('sha256').update(`ditswarm worker machine ${machine}`).digest('hex').slice(0, 32);
}

/**
 * The engine in a worker thread. The thread is started from a CommonJS snippet that puts two module hooks in
 * place before it loads the engine: TypeScript (tsx, which a worker thread does not inherit), and, with
 * onnxruntime-node, 'onnxruntime-web' resolved to native-ort.ts.
 */
function engineThread(workerData: EngineThreadData): StartEngine {
  const entry = new URL('./engine-thread.ts', import.meta.url).href;
  const nativeOrt = new URL('./native-ort.ts', import.meta.url).href;
  const redirect =
    'export async function resolve(specifier, context, next) {' +
    ` return specifier === 'onnxruntime-web' ? { url: ${JSON.stringify(nativeOrt)}, shortCircuit: true }` +
    ' : next(specifier, context); }';
  const boot = [
    workerData.device &&
      `require('node:module').register('data:text/javascript,' + encodeURIComponent(${JSON.stringify(redirect)}));`,
    `import('tsx/esm/api').then(({ register }) => { register(); return import(${JSON.stringify(entry)}); });`,
  ]
    .filter(Boolean)
    .join('\n');
  return (threads, onMove) => {
    const worker = new Worker(boot, { eval: true, workerData, name: `ditswarm-engine (${threads} threads)` });
    worker.on('message', (message: { engineMove?: EngineMove } | null) => {
      if (message?.engineMove) onMove(message.engineMove);
    });
    worker.on('error', (e) => console.error(`the engine's thread failed: ${e.message}`));
    return {
      engine: Comlink.wrap<EngineFactory>(nodeEndpoint(worker)).start(threads),
      terminate: () => void worker.terminate(),
    };
  };
}
