// How a call to the ranks fails, as data: the ranks that made no progress, or the rank whose method failed and whom
// it blames. The executor throws them; the strategies and the verifier that run its forwards throw them too.
import type { RankLost } from '../core/worker-api.ts';

/** Some ranks' engines made no progress on a call within its limit (call-watch.ts). */
export class TimeoutError extends Error {
  override name = 'TimeoutError';
  constructor(
    readonly method: string,
    readonly silentRanks: number[],
    /** the limit they were judged by, stretched where every rank was late together */
    readonly timeoutMs: number,
  ) {
    super(
      `${method} timed out after ${timeoutMs} ms waiting for ` +
        `rank${silentRanks.length > 1 ? 's' : ''} ${silentRanks.join(', ')}`,
    );
  }
}

/**
 * A rank's method failed. `remoteMessage` is the rank's own error text (or, with `breach`, what was
 * wrong with its reply); `blame` is whom the rank holds responsible, in global ranks: its word, not
 * a verdict.
 */
export class WorkerError extends Error {
  override name = 'WorkerError';
  constructor(
    readonly rank: number,
    readonly method: string,
    readonly remoteMessage: string,
    readonly blame: RankLost | null = null,
    /** the rank broke the contract: the coordinator saw it itself */
    readonly breach = false,
  ) {
    super(`rank ${rank} failed in ${method}: ${remoteMessage}`);
  }
}
