import type { ExecutorOptions } from './executor.ts';
import { LocalExecutor } from './local-executor.ts';
import type { Swarm } from './swarm.ts';
import { SwarmExecutor } from './swarm-executor.ts';

/** The executor backends by name, as the seed's factory chooses them. */
export const BACKENDS = ['local', 'swarm'] as const;
export type Backend = (typeof BACKENDS)[number];

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

export function createExecutor(backend: Backend, options: ExecutorOptions, swarm?: Swarm): LocalExecutor | SwarmExecutor {
  const Class = getExecutorClass(backend);
  if (Class === SwarmExecutor) {
    if (!swarm) throw new Error('the swarm backend needs a Swarm: pass one from openSwarm()');
    return new SwarmExecutor(options, swarm);
  }
  return new LocalExecutor(options);
}
