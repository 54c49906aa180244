// The engine of a worker process, in a worker thread: onnxruntime-node's runs block the thread they are called
// from, and the process's main thread keeps its WebRTC links and heartbeats going meanwhile. The main thread
// (platform.ts) talks to it through comlink, as a page talks to its engine's Web Worker (rank/engine.worker.ts).
import { parentPort, workerData } from 'node:worker_threads';
import * as Comlink from 'comlink';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';
import { createEngine, type EngineApi, type EngineMove } from '../../rank/engine.ts';
import type { EngineFactory } from '../../rank/engine.worker.ts';
import { keepWeightsIn } from '../../rank/weight-cache.ts';
import type { NativeDevice } from '../../core/worker-api.ts';
import { diskWeights } from './disk-weights.ts';

const port = parentPort;
if (!port) throw new Error('engine-thread.ts runs as a worker thread of a worker process (platform.ts)');
const { cpu, cacheDir, modelDir } = workerData as EngineThreadData;
keepWeightsIn(diskWeights({ cacheDir, modelDir }));

/** what the main thread tells the engine's thread when it starts it */
export interface EngineThreadData {
  /** the CPU as the engine reports it, on the EP it calls 'wasm' */
  cpu: string;
  /** what onnxruntime-node computes on for that EP (native-ort.ts); null: onnxruntime-web's WebAssembly */
  device: NativeDevice | null;
  /** the folder the weights it fetches are kept in; null: none, every load fetches them */
  cacheDir: string | null;
  /** a model folder this machine has, read where its files are the server's; null: none */
  modelDir: string | null;
}

const factory: EngineFactory = {
  start: (threads: number): EngineApi =>
    Comlink.proxy(createEngine(threads, (move: EngineMove) => port.postMessage({ engineMove: move }), cpu)),
};
Comlink.expose(factory, nodeEndpoint(port));
