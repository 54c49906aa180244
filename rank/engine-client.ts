import * as Comlink from 'comlink';
import type { EngineApi } from './engine.ts';

/** Starts the engine in a Web Worker of this page; `terminate` ends it. */
export function startEngineWorker(): { engine: EngineApi; terminate(): void } {
  const worker = new Worker(new URL('./engine.worker.ts', import.meta.url), { type: 'module', name: 'ditswarm-engine' });
  const remote = Comlink.wrap<EngineApi>(worker);
  return { engine: remote as unknown as EngineApi, terminate: () => worker.terminate() };
}
