// A step cache: some of a job's forwards skip the transformer's blocks and reuse the residual
// (blocks' output − input) of the pass's last computed forward. MagCache (Ma et al., 2025; its
// Wan2.1 code, MagCache4Wan2.1/magcache_generate.py) decides which: the ratio of successive
// residuals' magnitudes, calibrated once per model, is a curve over the steps that barely depends
// on the prompt, so the skip error of a run of reused steps is known before the job starts. That is
// why MagCache and not TeaCache here: TeaCache's estimate depends on each step's modulated input, so
// ranks would have to agree on it as they go; MagCache's schedule is a pure function of the curve,
// the steps and the settings, which the coordinator computes once and every rank follows, on any
// placement, across losses and re-runs alike.

/** What a folder's calibration of the magnitude ratios holds (`step_cache.json` at its root). */
export interface MagnitudeCurve {
  method: 'magcache';
  /** the steps the curve was calibrated at; a job of other steps reads it by nearest interpolation */
  steps: number;
  /** per pass (0: conditional, 1: unconditional), per step: mean over tokens of |r_t| / |r_t−1|, 1 at step 0 */
  ratios: [number[], number[]];
  /** where it came from: a calibration run's job, or the published values it copies */
  source: string;
}

/** The folder file a calibration writes and a coordinator reads, beside the model's own files. */
export const STEP_CACHE_FILE = 'step_cache.json';

/** How a job's forwards are cached: the settings MagCache's Wan2.1 script runs with unless a job asks otherwise. */
export interface StepCacheSettings {
  method: 'magcache';
  /** the largest accumulated skip error a run of reused forwards may have (magcache_thresh) */
  threshold: number;
  /** at most this many forwards of a pass reused in a row (magcache_K) */
  maxSkips: number;
  /** the first share of the forwards always computed (retention_ratio): the early steps shape the video */
  retention: number;
  /** the last steps always computed: they settle the details */
  finalSteps: number;
}

export const STEP_CACHE_DEFAULTS: StepCacheSettings = {
  method: 'magcache',
  threshold: 0.12,
  maxSkips: 2,
  retention: 0.2,
  finalSteps: 1,
};

export const STEP_CACHE_LIMITS = { threshold: { min: 0, max: 1 }, maxSkips: { min: 1, max: 10 } };

/**
 * What a job asks of the step cache: 'off' (the default), 'auto' (MagCache at its defaults where the
 * model has a curve, off where not), or MagCache at a threshold.
 */
export type StepCacheRequest = 'off' | 'auto' | { method: 'magcache'; threshold?: number; maxSkips?: number };

/** Each forward of a job with a step cache: computed (keeping its residual for the ones after) or reused. */
export type CacheMode = 'keep' | 'reuse';

/** The published Wan2.1 T2V calibrations (MagCache4Wan2.1, 50 steps, sdpa attention), interleaved cond/uncond. */
const PUBLISHED: Record<string, number[]> = {
  'Wan2.1-T2V-1.3B': [
    1.0124, 1.02213, 1.00166, 1.0041, 0.99791, 1.00061, 0.99682, 0.99762, 0.99634, 0.99685, 0.99567, 0.99586, 0.99416,
    0.99422, 0.99578, 0.99575, 0.9957, 0.99563, 0.99511, 0.99506, 0.99535, 0.99531, 0.99552, 0.99549, 0.99541, 0.99539,
    0.9954, 0.99536, 0.99489, 0.99485, 0.99518, 0.99514, 0.99484, 0.99478, 0.99481, 0.99479, 0.99415, 0.99413, 0.99419,
    0.99416, 0.99396, 0.99393, 0.99388, 0.99386, 0.99349, 0.99349, 0.99309, 0.99304, 0.9927, 0.9927, 0.99228, 0.99226,
    0.99171, 0.9917, 0.99137, 0.99135, 0.99068, 0.99063, 0.99005, 0.99003, 0.98944, 0.98942, 0.98849, 0.98849, 0.98758,
    0.98757, 0.98644, 0.98643, 0.98504, 0.98503, 0.9836, 0.98359, 0.98202, 0.98201, 0.97977, 0.97978, 0.97717, 0.97718,
    0.9741, 0.97411, 0.97003, 0.97002, 0.96538, 0.96541, 0.9593, 0.95933, 0.95086, 0.95089, 0.94013, 0.94019, 0.92402,
    0.92414, 0.90241, 0.9026, 0.86821, 0.86868, 0.81838, 0.81939,
  ],
  'Wan2.1-T2V-14B': [
    1.02504, 1.03017, 1.00025, 1.00251, 0.9985, 0.99962, 0.99779, 0.99771, 0.9966, 0.99658, 0.99482, 0.99476, 0.99467,
    0.99451, 0.99664, 0.99656, 0.99434, 0.99431, 0.99533, 0.99545, 0.99468, 0.99465, 0.99438, 0.99434, 0.99516, 0.99517,
    0.99384, 0.9938, 0.99404, 0.99401, 0.99517, 0.99516, 0.99409, 0.99408, 0.99428, 0.99426, 0.99347, 0.99343, 0.99418,
    0.99416, 0.99271, 0.99269, 0.99313, 0.99311, 0.99215, 0.99215, 0.99218, 0.99215, 0.99216, 0.99217, 0.99163, 0.99161,
    0.99138, 0.99135, 0.98982, 0.9898, 0.98996, 0.98995, 0.9887, 0.98866, 0.98772, 0.9877, 0.98767, 0.98765, 0.98573,
    0.9857, 0.98501, 0.98498, 0.9838, 0.98376, 0.98177, 0.98173, 0.98037, 0.98035, 0.97678, 0.97677, 0.97546, 0.97543,
    0.97184, 0.97183, 0.96711, 0.96708, 0.96349, 0.96345, 0.95629, 0.95625, 0.94926, 0.94929, 0.93964, 0.93961, 0.92511,
    0.92504, 0.90693, 0.90678, 0.8796, 0.87945, 0.86111, 0.86189,
  ],
};

/** The published curve of a Wan2.1 T2V transformer of this shape (dim, layers), null for any other. */
export function publishedCurve({ dim, numLayers }: { dim: number; numLayers: number }): MagnitudeCurve | null {
  const name =
    dim === 1536 && numLayers === 30 ? 'Wan2.1-T2V-1.3B' : dim === 5120 && numLayers === 40 ? 'Wan2.1-T2V-14B' : null;
  if (!name) return null;
  const values = PUBLISHED[name];
  // step 0 has no residual before it: 1, as the script pads it
  const pass = (p: number) => [1, ...values.filter((_, i) => i % 2 === p)];
  return {
    method: 'magcache',
    steps: 50,
    ratios: [pass(0), pass(1)],
    source: `MagCache's published ${name} calibration`,
  };
}

/** A curve read from a folder's file, checked: anyone may serve a folder. */
export function parseMagnitudeCurve(json: unknown, source: string): MagnitudeCurve {
  const fail = (why: string) =>
    new Error(`${source}: ${why}; run npm run calibrate-cache -- --model DIR to write it again`);
  if (typeof json !== 'object' || json === null) throw fail('not a JSON object');
  const { method, steps, ratios, source: calibrated } = json as Record<string, unknown>;
  if (method !== 'magcache') throw fail(`method ${JSON.stringify(method)}, expected "magcache"`);
  if (!(Number.isInteger(steps) && (steps as number) >= 2 && (steps as number) <= 1000))
    throw fail(`steps ${JSON.stringify(steps)}, expected a whole number from 2 to 1000`);
  if (!Array.isArray(ratios) || ratios.length !== 2)
    throw fail('ratios is not a pair of lists (conditional, unconditional)');
  for (const list of ratios as unknown[])
    if (
      !Array.isArray(list) ||
      list.length !== steps ||
      !list.every((r) => typeof r === 'number' && Number.isFinite(r) && r > 0 && r < 10)
    )
      throw fail(`each list of ratios holds ${String(steps)} positive finite numbers below 10`);
  // what the calibration says it was run on, as far as it is a line of text
  const from = typeof calibrated === 'string' ? `${source} (${calibrated.slice(0, 200)})` : source;
  return { method, steps: steps as number, ratios: ratios as [number[], number[]], source: from };
}

/** MagCache's nearest_interp: the curve read at `length` evenly spaced points, ends kept. */
export function nearestInterp(values: readonly number[], length: number): number[] {
  if (length === 1) return [values[values.length - 1]];
  const scale = (values.length - 1) / (length - 1);
  return Array.from({ length }, (_, i) => values[roundHalfEven(i * scale)]);
}

/** numpy's round: halves to even, so the indices are the script's. */
function roundHalfEven(x: number): number {
  const floor = Math.floor(x);
  const diff = x - floor;
  if (diff > 0.5 || (diff === 0.5 && floor % 2 === 1)) return floor + 1;
  return floor;
}

/**
 * Which of a job's forwards reuse their pass's residual: [step][pass]. MagCache's rule, forward by
 * forward in the order the script runs them (each step's conditional, then unconditional pass): past
 * the retained first forwards, each step multiplies its pass's accumulated ratio by the curve's; while
 * the summed |1 − ratio| stays under the threshold and at most maxSkips in a row, the forward is
 * reused; else it is computed and the accumulation starts again. The final steps are computed.
 */
export function cacheSchedule(
  curve: MagnitudeCurve | null,
  settings: StepCacheSettings,
  steps: number,
  passes: 1 | 2,
): CacheMode[][] {
  // no curve: a calibration's run, every forward computed and its residual kept to measure the next by
  if (!curve) return Array.from({ length: steps }, () => Array.from({ length: passes }, (): CacheMode => 'keep'));
  // Stryker disable next-line ConditionalExpression: nearestInterp to the curve's own length is the identity
  const ratios = curve.ratios.slice(0, passes).map((r) => (r.length === steps ? r : nearestInterp(r, steps)));
  const retained = Math.floor(steps * passes * settings.retention);
  const state = ratios.map(() => ({ ratio: 1, err: 0, skipped: 0 }));
  return Array.from({ length: steps }, (_, step) =>
    state.map((s, pass): CacheMode => {
      // the first forward has no residual before it to reuse, however little is retained
      if (step === 0 || step * passes + pass < retained || step >= steps - settings.finalSteps) return 'keep';
      s.ratio *= ratios[pass][step];
      s.skipped++;
      s.err += Math.abs(1 - s.ratio);
      if (s.err < settings.threshold && s.skipped <= settings.maxSkips) return 'reuse';
      Object.assign(s, { ratio: 1, err: 0, skipped: 0 });
      return 'keep';
    }),
  );
}

/** The settings a request resolves to, or null for none; refused where they are out of bounds. */
export function resolveStepCache(
  request: StepCacheRequest | undefined,
  curve: MagnitudeCurve | null,
): StepCacheSettings | null {
  if (request === undefined || request === 'off') return null;
  if (request === 'auto') return curve ? STEP_CACHE_DEFAULTS : null;
  // a stored job or a page's request is anyone's JSON: checked as what it may be, not what its type says
  const asked: unknown = request;
  if (typeof asked !== 'object' || asked === null || (asked as { method?: unknown }).method !== 'magcache')
    throw new Error(`cache is 'off', 'auto' or { method: 'magcache', threshold }, got ${JSON.stringify(request)}`);
  const { threshold = STEP_CACHE_DEFAULTS.threshold, maxSkips = STEP_CACHE_DEFAULTS.maxSkips } = request;
  const { threshold: t, maxSkips: k } = STEP_CACHE_LIMITS;
  if (!(typeof threshold === 'number' && threshold >= t.min && threshold <= t.max))
    throw new Error(`the cache's threshold is a number from ${t.min} to ${t.max}, got ${JSON.stringify(threshold)}`);
  if (!(Number.isInteger(maxSkips) && maxSkips >= k.min && maxSkips <= k.max))
    throw new Error(
      `the cache's maxSkips is a whole number from ${k.min} to ${k.max}, got ${JSON.stringify(maxSkips)}`,
    );
  if (!curve)
    throw new Error(
      `the model has no magnitude curve for MagCache (${STEP_CACHE_FILE} in its folder): ` +
        'run npm run calibrate-cache -- --model DIR once, or ask cache off',
    );
  return { ...STEP_CACHE_DEFAULTS, threshold, maxSkips };
}

/**
 * The command lines' --cache METHOD|auto|off|calibrate and --cache-threshold X as a placement's request; a threshold
 * alone asks MagCache at it. Undefined where neither is given.
 */
export function parseCacheFlags(
  cache: string | undefined,
  threshold: string | undefined,
): StepCacheRequest | 'calibrate' | undefined {
  const t = threshold === undefined ? undefined : Number(threshold);
  if (t !== undefined && !(Number.isFinite(t) && t >= STEP_CACHE_LIMITS.threshold.min))
    throw new Error(`--cache-threshold is a number from 0 to 1, got ${threshold}`);
  if (cache === undefined) return t === undefined ? undefined : { method: 'magcache', threshold: t };
  if (cache === 'magcache') return { method: 'magcache', ...(t !== undefined && { threshold: t }) };
  if (cache !== 'off' && cache !== 'auto' && cache !== 'calibrate')
    throw new Error(`--cache is magcache, auto, off or calibrate, got ${cache}`);
  if (t !== undefined) throw new Error(`--cache-threshold is MagCache's: give it with --cache magcache, not ${cache}`);
  return cache;
}
