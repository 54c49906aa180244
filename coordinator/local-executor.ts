import { probeWebGpu } from '../rank/webgpu.ts';
import { startEngineWorker } from '../rank/engine-client.ts';
import { memoryExchanges } from '../rank/exchange/memory.ts';
import { WorkerRuntime } from '../rank/runtime.ts';
import { Executor, withTimeout } from './executor.ts';

/** One rank in this tab: the worker runtime called directly, its engine in a Web Worker. */
export class LocalExecutor extends Executor {
  private runtime: WorkerRuntime | null = null;
  private terminate: (() => void) | null = null;

  protected async place(): Promise<string[]> {
    if (this.options.cfgParallel) throw new Error('cfgParallel needs two groups of ranks, but the local backend has one rank: use the swarm backend with at least 2 workers');
    const { engine, terminate } = startEngineWorker();
    this.terminate = terminate;
    this.runtime = new WorkerRuntime(engine, {
      connectMesh: async () => memoryExchanges(1)[0],
      describe: async () => {
        const adapter = await probeWebGpu();
        return { ep: adapter ? 'webgpu' : 'wasm', adapter: adapter ?? 'WebAssembly (no WebGPU adapter)', threads: 1, memoryGiB: null, userAgent: navigator.userAgent };
      },
    });
    return ['local'];
  }

  protected callRank(rank: number, method: string, args: unknown, timeoutMs: number): Promise<unknown> {
    if (rank !== 0 || !this.runtime) return Promise.reject(new Error(`the local executor has only rank 0, and only after initialize()`));
    return withTimeout(this.runtime.dispatch(method, args), method, timeoutMs);
  }

  protected closeTransport(): void {
    this.terminate?.();
    this.runtime = null;
  }
}
