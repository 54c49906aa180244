// A worker's reading of weights as the news of the call that waits for it: a text encoder run or a VAE tile reads
// its weights (GBs for umT5-XXL) inside the call, and only the worker's pulse says how far it is.
import { describeLoad, type WorkerPulse } from '../core/worker-api.ts';

/** how often a call's news says how far its worker's reading of weights is */
export const LOAD_NEWS_MS = 1000;

/** A worker whose last pulse says how far the reading of the weights it loads is. */
export interface LoadingHost {
  readonly pulse: Pick<WorkerPulse, 'load'> | null;
}

/**
 * While a call to `host` is out: every LOAD_NEWS_MS where its reading moved, `tell` hears how far it is
 * (describeLoad's words). Returns what stops it, for when the call ends.
 */
export function watchLoad(host: LoadingHost, tell: (load: string) => void): () => void {
  let shownBytes: number | undefined;
  const timer = setInterval(() => {
    const load = host.pulse?.load;
    if (!load || load.bytes === shownBytes) return;
    shownBytes = load.bytes;
    tell(describeLoad(load));
  }, LOAD_NEWS_MS);
  return () => clearInterval(timer);
}
