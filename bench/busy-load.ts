// A machine doing other work too: processes that spin on the CPU beside a job, at the scheduler's
// ordinary priority, as a build or a video call would. Used by bench/chaos.ts and
// bench/oversubscribed.ts to oversubscribe the cores.
import { spawn, type ChildProcess } from 'node:child_process';
import { cpus } from 'node:os';

export interface BusyLoad {
  /** spinning processes beside the job */
  processes: number;
  stop(): void;
}

/** `perCore` spinning processes for each core, stopped by `stop()` or when this process exits. */
export function startBusyLoad(perCore: number): BusyLoad {
  const count = Math.round(perCore * cpus().length);
  const children: ChildProcess[] = Array.from({ length: count }, () =>
    spawn('/bin/sh', ['-c', 'while :; do :; done'], { stdio: 'ignore' }),
  );
  const stop = () => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    process.off('exit', stop);
  };
  // spinners left behind would load the machine after the bench is gone
  process.on('exit', stop);
  for (const signal of ['SIGINT', 'SIGTERM'] as const)
    process.once(signal, () => {
      stop();
      process.exit(130);
    });
  return { processes: count, stop };
}
