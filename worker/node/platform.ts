// A worker as a Node process (`npm run worker -- LINK`): PeerJS on werift (webrtc.ts), the engine in a worker
// thread (engine-thread.ts) on onnxruntime-node's native CPU EP where it is installed, on onnxruntime-web's
// WebAssembly in Node where it is not; the process takes the cores it is given, shared with no tab.
import { availableParallelism, cpus, hostname, release, totalmem, platform as system } from 'node:os';
import { Worker } from 'node:worker_threads';
import * as Comlink from 'comlink';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';
import { nonce } from '../../core/net/hmac.ts';
import { EngineHost, type StartEngine } from '../../rank/engine-client.ts';
import type { EngineMove } from '../../rank/engine.ts';
import type { EngineFactory } from '../../rank/engine.worker.ts';
import type { WorkerPlatform } from '../platform.ts';
import type { EngineThreadData } from './engine-thread.ts';
import { nodePeers } from './webrtc.ts';
import { loadOnnxruntimeNode } from './onnxruntime-node.ts';

/** What a worker process computes on: onnxruntime-node natively, or (without it) onnxruntime-web's WebAssembly. */
export interface NodeCompute {
  native: boolean;
  /** in a user's words, with why where it is not native */
  name: string;
}

/**
 * onnxruntime-node where it loads (an optional dependency: an install may have left it out) unless `wasm` is asked,
 * with why not.
 */
export async function nodeCompute(threads: number, wasm = false): Promise<NodeCompute> {
  const cpu = `${cpus()[0]?.model.trim() || 'CPU'}, ${threads} thread${threads === 1 ? '' : 's'}`;
  if (wasm) return { native: false, name: `WebAssembly in Node (${cpu}), as asked` };
  try {
    await loadOnnxruntimeNode();
    return { native: true, name: `onnxruntime-node on the CPU (${cpu})` };
  } catch (e) {
    const why = (e as Error).message.split('\n')[0];
    return {
      native: false,
      name: `WebAssembly in Node (${cpu}): onnxruntime-node did not load (${why}); npm install onnxruntime-node`,
    };
  }
}

export interface NodePlatformOptions {
  /** the threads the engine computes on: the machine's cores unless told */
  threads?: number;
  /** onnxruntime-web's WebAssembly, as a tab computes, even where onnxruntime-node is installed */
  wasm?: boolean;
  /** the folder the weights it fetches are kept in (worker/node/disk-weights.ts); null: none */
  cacheDir?: string | null;
  /** a model folder this machine has, read where its files are the server's; null: none */
  modelDir?: string | null;
}

/** The platform of a worker process. */
export async function nodePlatform({
  threads = availableParallelism(),
  wasm,
  cacheDir = null,
  modelDir = null,
}: NodePlatformOptions = {}): Promise<{
  platform: WorkerPlatform;
  compute: NodeCompute;
}> {
  const compute = await nodeCompute(threads, wasm);
  // an id for this process as a tab has its browser's: what bans and accusations name it by
  const id = nonce();
  const platform: WorkerPlatform = {
    newPeer: await nodePeers(),
    describe: () =>
      Promise.resolve({
        kind: 'node',
        host: hostname(),
        ep: 'wasm',
        adapter: compute.name,
        softwareAdapter: false,
        memoryGiB: totalmem() / 2 ** 30,
        userAgent: `Node ${process.version} (${system()} ${release()})`,
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
        engineThread({ cpu: compute.name, cacheDir, modelDir }, compute.native),
      ),
    keepAwake: () => () => {},
    onFreeze: () => () => {},
    peakMemoryBytes: () => process.memoryUsage.rss(),
  };
  return { platform, compute };
}

/**
 * The engine in a worker thread. The thread is started from a CommonJS snippet that puts two module hooks in
 * place before it loads the engine: TypeScript (tsx, which a worker thread does not inherit), and, with
 * onnxruntime-node, 'onnxruntime-web' resolved to native-ort.ts.
 */
function engineThread(workerData: EngineThreadData, native: boolean): StartEngine {
  const entry = new URL('./engine-thread.ts', import.meta.url).href;
  const nativeOrt = new URL('./native-ort.ts', import.meta.url).href;
  const redirect =
    'export async function resolve(specifier, context, next) {' +
    ` return specifier === 'onnxruntime-web' ? { url: ${JSON.stringify(nativeOrt)}, shortCircuit: true }` +
    ' : next(specifier, context); }';
  const boot = [
    native &&
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
