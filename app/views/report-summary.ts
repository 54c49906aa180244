// A finished job's report in a few sentences, for the dashboard's status line: where it ran (from the
// placement as the planner decided it), what the cost model predicted and what was measured, how
// activations travelled (in the planner's own words for each transport) and what the spot checks found.
import type { GenerateReport, PromptEncoding, RankReport } from '../../coordinator/index.ts';
import { smallestShare, transportWire } from '../../coordinator/planner.ts';
import { cpuName } from '../../core/cost-model.ts';

/** T with the keys K possibly missing. */
type Optional<T, K extends keyof T> = Omit<T, K> & Partial<Pick<T, K>>;

/**
 * A report as the queue's store gives it back: a job an older version kept lacks what reports
 * gained since (spot checks, the prompts' encoding, the placement, head-group overlap).
 */
export type KeptReport = Optional<
  Omit<GenerateReport, 'steps'>,
  'spotChecks' | 'spotCheckOdds' | 'encoding' | 'placement'
> & {
  steps: (Omit<GenerateReport['steps'][number], 'ranks'> & { ranks: Optional<RankReport, 'overlapMs'>[] })[];
};

const sentence = (text: string | null): string => (text ? ` ${text[0].toUpperCase()}${text.slice(1)}.` : '');
const plural = (n: number, what: string): string => `${n} ${what}${n === 1 ? '' : 's'}`;

/** Where the prompt's embedding came from, when it was not given. */
function encodingNote(prompt: PromptEncoding): string {
  if (prompt.source === 'given') return '';
  if (prompt.source === 'cache') return ' The prompt came from the cache.';
  if (!prompt.layers.length) return '';
  const workers = new Set(prompt.layers.map((l) => l.worker)).size;
  return ` The prompt was encoded on ${workers} worker(s) in ${(prompt.ms / 1000).toFixed(1)} s.`;
}

/** How the job ran, in words: the placement's decisions, its prediction against the measured step, what was caught. */
function placementNote(r: KeptReport): { ranks: string; notes: string[] } {
  const p = r.placement;
  // a job an older version kept says only how many ranks it had
  if (!p) return { ranks: `${r.config.backend} ranks`, notes: [] };
  const { layout, settings, prediction } = p;
  const cfgParallel = layout.cfgGroups === 2; // a kept layout is plain data, without RankLayout's getters
  const heads = layout.heads?.[0];
  const shares = heads
    ? ` sharing the heads ${heads.join('/')} (and the tokens alike) by each one's rehearsed speed`
    : '';
  const chose = cfgParallel
    ? `CFG parallel on two groups of ${plural(layout.ulyssesDegree, 'rank')}`
    : `${plural(layout.ulyssesDegree, 'rank')}${shares}`;
  const planned = prediction
    ? ` ${prediction.asked ? 'The job asked for' : 'The cost model chose'} ${chose}, ` +
      `predicting ${(prediction.predictedStepMs / 1000).toFixed(2)} s per step; ` +
      `measured ${(r.medianStepMs / 1000).toFixed(2)} s (the median step).${sentence(prediction.leftOut)}` +
      // a placement an older version kept has no shared cores
      sentence(prediction.sharedCores?.note ?? null)
    : '';
  const several = layout.world > 1;
  const transport =
    settings.dtype !== 'f32' && several
      ? ` Activations went between ranks as ${transportWire(settings.dtype)}, not exact float32.`
      : '';
  const displaced =
    settings.parallel === 'displaced' && several
      ? ` Displaced: past ${plural(p.warmupSteps, 'exact step')}, each rank attended to the others' keys and ` +
        `values of the step before (the exchange off the critical path), not exact.`
      : '';
  // jobs kept before the report had it exchanged all heads at once
  const hidden = Math.max(0, ...r.steps.flatMap((s) => s.ranks.map((rank) => rank.overlapMs ?? 0)));
  const overlapped =
    settings.headGroups > 1 && settings.parallel === 'ulysses' && several
      ? ` Ulysses in ${settings.headGroups} head groups: attention over one group ran while the next was on the ` +
        `wire (up to ${(hidden / 1000).toFixed(2)} s of exchange hidden behind compute in a step).`
      : '';
  const link = settings.emulateLink;
  const emulated = link
    ? ` Rank links were paced as a ${(link.bandwidth / 1e6).toFixed(2)} MB/s, ${link.latencyMs} ms link ` +
      `(an emulated LAN).`
    : '';
  const groups = cfgParallel ? ` (CFG parallel: two groups of ${layout.ulyssesDegree})` : '';
  // a placement an older version kept has no stages
  const stages = p.stages ?? null;
  const pooled = stages
    ? ` Pooled memory: the blocks in ${plural(stages.length, 'pipeline stage')} ` +
      `(${stages.map((s) => `${s.blocks[0]}–${s.blocks[1] - 1} on ${s.workers.join(', ')}`).join('; ')}), ` +
      "each worker holding its stage's weights alone." +
      (p.pipeFusion
        ? ` PipeFusion: after ${plural(p.warmupSteps, 'exact step')}, each forward in ${p.pipeFusion.patches} ` +
          'patches flowing through the stages at once, each attending to the later patches as of the step before.'
        : '')
    : '';
  return {
    ranks: `${plural(layout.world, `${p.backend} rank`)}${groups}`,
    notes: [
      planned,
      heads ? sentence(smallestShare(p.workers, heads)) : '',
      sentence(p.cfgFallback),
      pooled,
      transport,
      displaced,
      overlapped,
      emulated,
    ],
  };
}

/** The status line of a finished job. */
export function summarizeReport(id: number, r: KeptReport, storageNote?: string): string {
  const recovered = r.failures.length ? `, recovered from ${r.failures.length} lost worker(s)` : '';
  // jobs kept before spot checks have none
  const checks = r.spotChecks ?? [];
  const caught = checks.flatMap((c) =>
    c.verdict === 'agreed' ? [] : [`rank ${c.verdict.convicted.join(' and ')}: ${c.verdict.why}`],
  );
  const verdicts = caught.length ? `; caught ${caught.join('; ')}` : ', all agreed';
  // with pipeline stages each check recomputes one stage of a forward
  const what = checks.some((c) => c.stage !== undefined) ? "forwards' pipeline stage(s)" : 'forward(s)';
  const checked = checks.length ? ` ${checks.length} ${what} recomputed to spot-check the workers${verdicts}.` : '';
  const computedOn = [
    ...new Set(
      r.workers.map(
        (w) => `${w.ep === 'webgpu' ? 'WebGPU' : cpuName(w.nativeDevice)} on ${plural(w.threads, 'thread')}`,
      ),
    ),
  ].join(', ');
  const { ranks, notes } = placementNote(r);
  const prompt = r.encoding?.prompt; // jobs kept before the report had it have none
  const encoded = prompt ? encodingNote(prompt) : '';
  const notKept = storageNote ? ` Not kept: ${storageNote}.` : '';
  // jobs kept before the step cache have no cache report
  const c = r.cache;
  const cached = c?.curve
    ? ` Step cache (MagCache at ${c.threshold}): ${c.forwardsReused} of ${c.forwardsReused + c.forwardsComputed} ` +
      "forwards skipped the blocks, reusing the last computed one's residual" +
      (c.replayed.length ? `; ${c.replayed.length} rebuilt their residual on workers placed since.` : '.')
    : c
      ? ' Every forward computed to calibrate the step cache.'
      : '';
  return (
    `#${id} done: ${r.config.frames} frames in ${(r.totalMs / 1000).toFixed(1)} s ` +
    `on ${ranks}${recovered}, each on ${computedOn}.` +
    [...notes, cached, checked, encoded, notKept].join('')
  );
}
