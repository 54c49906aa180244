// The executor backends by name: the factory the placer uses, with an error that names the valid ones.
import type { ExecutorOptions } from './executor.ts';
import { LocalExecutor } from './local-executor.ts';
import type { Swarm, SwarmWorker } from './swarm.ts';
import { SwarmExecutor } from './swarm-executor.ts';

import { BACKENDS, type Backend } from './placement.ts';

export { BACKENDS, type Backend };

export function getExecutorClass(backend: string): typeof LocalExecutor | typeof SwarmExecutor {
  switch (backend) {
    case 'local':
      return LocalExecutor;
    case 'swarm':
      return SwarmExecutor;
    default:
      throw new Error(`unknown executor backend ${JSON.stringify(backend)}; valid backends: ${BACKENDS.join(', ')}`);
  }
}

/** An executor of `backend` for `options.placement`; the swarm backend's ranks are `workers` of `swarm`, in order. */
export function createExecutor(
  backend: Backend,
  options: ExecutorOptions,
  swarm?: Swarm,
  workers: SwarmWorker[] = [],
): LocalExecutor | SwarmExecutor {
  const Class = getExecutorClass(backend);
  if (Class === SwarmExecutor) {
    if (!swarm) throw new Error('the swarm backend needs a Swarm: pass one from openSwarm()');
    return new SwarmExecutor(options, swarm, workers);
  }
  return new LocalExecutor(options);
}
