// A worker's engine in a thread of its own (a page's Web Worker, a worker process's worker thread), on a
// number of threads that can change: a restart ends the thread, starts one on the new threads and loads the
// model it had loaded again, so the runtime above keeps calling the same EngineApi. Calls and restarts
// take turns (the engine runs one call at a time anyway): a restart waits for the calls before it,
// and the calls after it wait for the new engine, since a call to a terminated one would never return.
import * as Comlink from 'comlink';
import type {
  DecodeTileArgs,
  EncodeImageArgs,
  EncodeTextArgs,
  EngineProgress,
  ExecutionProvider,
  LoadStatus,
} from '../core/worker-api.ts';
import { ENGINE_METHODS, type EngineApi, type EngineMove, type HeldWeights } from './engine.ts';
import type { EngineFactory } from './engine.worker.ts';
import { Forwarding } from './forwarding.ts';

/**
 * The WASM threads this page can run at most: its machine's cores. WASM threads share memory, so
 * without cross-origin isolation (a plain-http LAN page) there is no SharedArrayBuffer and
 * onnxruntime-web runs one thread whatever it is told.
 */
export function usableCores(): number {
  return globalThis.crossOriginIsolated ? Math.max(1, navigator.hardwareConcurrency || 1) : 1;
}

/** Runs `probe` while no other probe of this browser on this machine runs, where Web Locks exist. */
export type ProbeGate = <T>(probe: () => Promise<T>) => Promise<T>;

/** An engine started in a thread of its own on `threads` threads, saying its moves to `onMove`, and its end. */
export interface EngineThread {
  engine: Promise<EngineApi>;
  terminate(): void;
}
export type StartEngine = (threads: number, onMove: (move: EngineMove) => void) => EngineThread;

/** The engine in a Web Worker of this page (engine.worker.ts). */
export const webWorkerEngine: StartEngine = (threads, onMove) => {
  const worker = new Worker(new URL('./engine.worker.ts', import.meta.url), {
    type: 'module',
    name: `ditswarm-engine (${threads} threads)`,
  });
  worker.addEventListener('message', (event: MessageEvent<{ engineMove?: EngineMove } | null>) => {
    const move = event.data?.engineMove;
    if (move) onMove(move);
  });
  return { engine: Comlink.wrap<EngineFactory>(worker).start(threads), terminate: () => worker.terminate() };
};

/** What a worker holds its engine by: the engine's calls, in their turns, and its threads. */
export interface EngineHandle extends EngineApi {
  readonly threads: number;
  readonly progress: EngineProgress;
  readonly holds: string | null;
  restart(threads: number): Promise<void>;
  terminate(): void;
}

/** The engine's calls, each in its turn (every EngineApi method but those it defines is forwarded). */
export class EngineHost extends Forwarding(ENGINE_METHODS) implements EngineHandle {
  private thread: EngineThread | null = null;
  private engine: Promise<EngineApi>;
  private loaded: { modelUrl: string; ep: ExecutionProvider; held?: HeldWeights } | null = null;
  private turn: Promise<unknown> = Promise.resolve();
  /** how far the engine has got, across restarts: what the page's pulse says */
  private readonly moves: EngineProgress = { done: 0, running: null };

  constructor(
    private current: number,
    private readonly gate: ProbeGate = (probe) => probe(),
    private readonly startEngine: StartEngine = webWorkerEngine,
  ) {
    super();
    this.engine = this.start();
  }

  /** the WASM threads the engine computes on */
  get threads(): number {
    return this.current;
  }

  /** how far the engine has got, as its thread last said */
  get progress(): EngineProgress {
    return { ...this.moves };
  }

  /** the model folder the engine holds whole, without adapters, as its EP holds weights, as its last load was asked */
  get holds(): string | null {
    const held = this.loaded?.held;
    return this.loaded && !held?.blocks && !held?.loras?.length && !held?.weightType ? this.loaded.modelUrl : null;
  }

  private start(): Promise<EngineApi> {
    this.thread = this.startEngine(this.current, (move) => {
      if (move.moved) this.moves.done++;
      this.moves.running = move.running;
    });
    return this.thread.engine;
  }

  protected through<T>(work: (engine: EngineApi) => Promise<T>): Promise<T> {
    const next = this.turn.then(async () => work(await this.engine));
    this.turn = next.catch(() => {});
    return next;
  }

  /** A new engine on `threads`, with the model loaded again; a no-op when they are the threads it has. */
  restart(threads: number): Promise<void> {
    return this.through(async () => {
      if (threads === this.current) return;
      this.terminate();
      this.current = threads;
      this.engine = this.start();
      if (this.loaded)
        await (await this.engine).load(this.loaded.modelUrl, this.loaded.ep, undefined, this.loaded.held);
    });
  }

  terminate(): void {
    this.thread?.terminate();
    this.thread = null;
  }

  override load(
    modelUrl: string,
    ep: ExecutionProvider,
    onProgress?: (status: LoadStatus) => void,
    held?: HeldWeights,
  ) {
    return this.through(async (engine) => {
      // a function crosses to the engine's thread as a proxy the thread calls back
      const info = await engine.load(modelUrl, ep, onProgress && Comlink.proxy(onProgress), held);
      this.loaded = { modelUrl, ep, ...(held && { held }) };
      return info;
    });
  }

  override encodeText(
    args: Omit<EncodeTextArgs, 'ep'> & { ep: ExecutionProvider },
    onLoad?: (status: LoadStatus) => void,
  ) {
    return this.through((engine) => engine.encodeText(args, onLoad && Comlink.proxy(onLoad)));
  }

  override decodeTile(
    args: Omit<DecodeTileArgs, 'ep'> & { ep: ExecutionProvider },
    onLoad?: (status: LoadStatus) => void,
  ) {
    return this.through((engine) => engine.decodeTile(args, onLoad && Comlink.proxy(onLoad)));
  }

  override encodeImage(
    args: Omit<EncodeImageArgs, 'ep'> & { ep: ExecutionProvider },
    onLoad?: (status: LoadStatus) => void,
  ) {
    return this.through((engine) => engine.encodeImage(args, onLoad && Comlink.proxy(onLoad)));
  }

  override probe(ep: ExecutionProvider) {
    return this.through((engine) => this.gate(() => engine.probe(ep)));
  }
}
