// How much memory a page holds, measured rather than guessed: measureUserAgentSpecificMemory counts
// its JS heaps with their ArrayBuffers, its Web Workers' among them (a rank's weights live there),
// and is only offered to cross-origin-isolated pages. Sampled every few seconds; the peak is kept.

type MeasurablePerformance = Performance & { measureUserAgentSpecificMemory?(): Promise<{ bytes: number }> };

const SAMPLE_EVERY_MS = 5_000;

/** A function giving the most memory measured so far, or null where the browser cannot measure it. */
export function sampleMemoryPeak(): () => number | null {
  const perf = globalThis.performance as MeasurablePerformance | undefined;
  const measure = perf?.measureUserAgentSpecificMemory?.bind(perf);
  if (!globalThis.crossOriginIsolated || !measure) return () => null;
  let peak: number | null = null;
  const sample = async () => {
    try {
      const { bytes } = await measure();
      peak = Math.max(peak ?? 0, bytes);
    } catch {
      // a measurement refused now (the page is being torn down, say) leaves the peak as it was
    }
    setTimeout(() => void sample(), SAMPLE_EVERY_MS);
  };
  void sample();
  return () => peak;
}
