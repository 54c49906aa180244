// Weights before the first job (issue 36): a worker that joins loads the dashboard's model as soon as its EPs are
// measured (so that it loads on the one it measured fastest, as a placement would ask) and no job is running, where
// the whole model fits the memory it has; the first job placed on it finds the model in its engine, warmed up, instead
// of reading every weight and warming up then. A model no worker holds whole is not preloaded: its pipeline stages
// load at placement. A small one is preloaded too (issue 66): its load is quick, but the engine's warm-up is not, and
// that was most of a first job's wait.
import type { WanConfig } from '../core/model/config.ts';
import { memoryBudget, stagedModel, wholeModelBytes } from './stage-plan.ts';
import type { Swarm, SwarmWorker } from './swarm.ts';

/** A preload reads GBs on a slow link: as long as a placement's load may take. */
const PRELOAD_TIMEOUT_MS = 30 * 60_000;
/** Models whose weights (as ranks hold them, float32) are smaller load at placement: none, unless a driver says. */
export const PRELOAD_FROM_BYTES = 0;
/**
 * What a harness whose jobs are its own, not the dashboard form's (the e2e tests, the benchmarks, generate), has
 * preloaded: only models a placement would take long to load. Preloading the form's model and rehearsing the form's
 * job there would only take the cores from the job the harness is about to submit.
 */
export const PRELOAD_LARGE_ONLY = 256 * 2 ** 20;

export interface PreloadOptions {
  /** the model folder the dashboard's next job would run, as the workers fetch it */
  modelUrl(): string;
  config(modelUrl: string): Promise<WanConfig>;
  /** whether a job is running: a preload would compete with it for the worker's engine */
  busy(): boolean;
  /** the smallest model preloaded, PRELOAD_FROM_BYTES unless given (a bench of cold loads preloads none) */
  fromBytes?(): number;
  /** what came of a preload that did not happen or failed: it costs nothing but the first job's time */
  log?(line: string): void;
  /** a worker holds the model now, warmed up: what a first job would be placed by may be timed (rehearseAhead) */
  onPreloaded?(worker: SwarmWorker, modelUrl: string): void;
}

/**
 * The bytes of weights a worker may be sent ahead of a job: what its user set on its page, else all its browser reports
 * (an unstaged job would place the whole model on it too; the stage planner's share of it is for cutting stages), else
 * no bound (a browser that reports nothing).
 */
function preloadBudget(info: SwarmWorker['info']): number {
  return memoryBudget({ memoryGiB: null, modelMemoryGiB: info.modelMemoryGiB ?? info.memoryGiB ?? undefined });
}

/** Starts preloading on the swarm's workers as they join and are measured; returns what stops it. */
export function preloadOnJoin(swarm: Pick<Swarm, 'on'>, options: PreloadOptions): () => void {
  /** per worker, the model it was asked to preload (once: a failed preload is not tried again for it) */
  const asked = new Map<string, string>();
  const consider = async (worker: SwarmWorker) => {
    const modelUrl = options.modelUrl();
    if (!worker.measurement || asked.get(worker.id) === modelUrl || options.busy()) return;
    asked.set(worker.id, modelUrl);
    const bytes = wholeModelBytes(stagedModel(await options.config(modelUrl)));
    if (bytes < (options.fromBytes?.() ?? PRELOAD_FROM_BYTES)) return;
    if (bytes > preloadBudget(worker.info)) {
      options.log?.(`not preloading ${modelUrl} on ${worker.id}: its weights pass what it may give the model`);
      return;
    }
    await worker.api.preload({ modelUrl }, PRELOAD_TIMEOUT_MS);
    options.onPreloaded?.(worker, modelUrl);
  };
  return swarm.on((e) => {
    if (e.type === 'leave') asked.delete(e.worker.id);
    else if (e.type === 'join' || e.type === 'update')
      void consider(e.worker).catch((error: unknown) =>
        options.log?.(`preloading on ${e.worker.id} failed: ${(error as Error).message}`),
      );
  });
}
