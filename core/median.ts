/** The middle of `values` (the mean of the middle two for an even count); 0 for none. */
export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length === 0 ? 0 : sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

/** a probe's time budget: well under a second on a CPU, a few seconds on a software WebGPU adapter */
const PROBE_BUDGET_MS = 300;

/**
 * The median of up to `runs` samples (ms) after a warm-up, stopping early once they took
 * `budgetMs`; a warm-up that took the whole budget by itself is the one sample (a rehearsed forward
 * of a real model is seconds: paying it twice is worth less than the first run's allocations).
 */
export async function medianSample(
  sample: () => Promise<number>,
  runs = 7,
  budgetMs = PROBE_BUDGET_MS,
): Promise<number> {
  const warmup = await sample();
  if (warmup >= budgetMs) return warmup;
  const times: number[] = [];
  for (let spent = 0; times.length < runs && (times.length === 0 || spent < budgetMs);) {
    times.push(await sample());
    spent += times[times.length - 1];
  }
  return times.sort((x, y) => x - y)[Math.floor(times.length / 2)];
}

/** medianSample of the wall time of `run`. */
export const medianMs = (run: () => Promise<unknown>, runs = 7): Promise<number> =>
  medianSample(async () => {
    const start = performance.now();
    await run();
    return performance.now() - start;
  }, runs);
