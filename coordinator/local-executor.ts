// The `local` backend: one rank in this tab, its runtime called in-process through the same contract
// checks a remote worker's calls pass, its engine in a Web Worker.
import { inProcess, type Remote } from '../core/net/rpc.ts';
import { WORKER_CONTRACT, type WorkerApi } from '../core/worker-api.ts';
import { EngineHost, usableCores } from '../rank/engine-client.ts';
import { memoryExchanges } from '../rank/exchange/memory.ts';
import { WorkerRuntime } from '../rank/runtime.ts';
import { sampleMemoryPeak } from '../rank/memory.ts';
import { describeMachine } from '../rank/machine-hint.ts';
import { describeCompute } from '../rank/webgpu.ts';
import { Executor } from './executor.ts';

export class LocalExecutor extends Executor {
  private rank0: Remote<WorkerApi> | null = null;
  private terminate: (() => void) | null = null;

  protected place(): Promise<string[]> {
    if (this.layout.world !== 1)
      return Promise.reject(
        new Error(
          `the local backend runs one rank in this tab, but the layout asks for ${this.layout.world}: ` +
            'use the swarm backend',
        ),
      );
    // the one rank computes in this tab, on all of its machine's cores
    const threads = usableCores();
    const engine = new EngineHost(threads);
    this.terminate = () => engine.terminate();
    const runtime = new WorkerRuntime(engine, {
      connectMesh: (init) => Promise.resolve(memoryExchanges(1, init.dtype)[0]),
      describe: async () => {
        const compute = await describeCompute();
        return { ...compute, threads, memoryGiB: null, userAgent: navigator.userAgent, ...describeMachine(compute) };
      },
      peakMemoryBytes: sampleMemoryPeak(),
    });
    this.rank0 = inProcess<WorkerApi>(runtime, WORKER_CONTRACT, 'the local rank');
    return Promise.resolve(['local']);
  }

  protected remoteOf(rank: number): Remote<WorkerApi> | undefined {
    return rank === 0 ? (this.rank0 ?? undefined) : undefined;
  }

  protected closeTransport(): void {
    this.terminate?.();
    this.rank0 = null;
  }
}
