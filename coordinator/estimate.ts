// How long a job will take before it starts, phase by phase (issue 36): the steps as the cost model predicts them on
// the live workers, the other phases at the rates this pipeline's earlier jobs measured. A phase nothing has measured
// yet is left out and named, never guessed: a figure a person acts on (a job of days asks to be confirmed) must rest
// on something.
import { sizeOf } from '../core/tensor.ts';
import type { PromptEncoding } from './text-encoding.ts';

/**
 * What a job does, in order: encoding embeds the prompts; placing takes the workers, loads the model and prepares the
 * ranks; denoising runs the steps; decoding makes frames of the latent; muxing a video file of the frames.
 */
export type JobPhase = 'encoding' | 'placing' | 'denoising' | 'decoding' | 'muxing';

/** What a finished job measured, as its report says (pipeline.ts GenerateReport). */
export interface MeasuredJob {
  encoding: { prompt: PromptEncoding; negativePrompt: PromptEncoding | null };
  phasesMs: Record<JobPhase, number>;
  latentShape: number[];
  /** null where the job stopped at the latent */
  decoding: object | null;
  /** what it was estimated at as it started */
  estimate: JobEstimate;
}

/** Past this, a job asks to be confirmed (the dashboard) or for --yes (generate) before it is queued. */
export const CONFIRM_FROM_MS = 60 * 60_000;

/** What a job's phases are predicted to take, in ms; null where nothing measured it yet. */
export interface PhaseEstimates {
  encoding: number | null;
  /** taking the workers: rehearsing, preparing, and loading the transformer where a worker does not hold it */
  placing: number | null;
  denoising: number | null;
  decoding: number | null;
}

export interface JobEstimate {
  phasesMs: PhaseEstimates;
  /** the phases predicted, summed: the whole job where `unmeasured` is empty, else at least this */
  knownMs: number;
  /** the phases left out, each with why ("decoding: no job of this model has decoded yet") */
  unmeasured: string[];
  /** the weight bytes a rank was to load as the job was estimated (0: its workers held the model) */
  loadBytes: number;
}

/**
 * What past jobs of a model measured of the phases the cost model does not predict. `saved` is what `save` was given
 * last (a page keeps it, so that the next run of `generate` or a reloaded dashboard starts from it); anything in it
 * that is not a rate is ignored.
 */
export class PhaseRates {
  /** ms a layer run of the text encoder took per prompt token, as the last encoded prompt measured */
  encodingMsPerToken: number | null = null;
  /** ms of the placing phase (rehearsals, loads, preparing the ranks) per weight byte loaded, as the last job that
   * loaded the model measured: a real model's load is most of it */
  placingMsPerLoadedByte: number | null = null;
  /** ms of the placing phase of the last job whose workers held the model */
  placingHeldMs: number | null = null;
  /** ms of the decoding phase per latent value, as the last decoded job measured */
  decodingMsPerValue: number | null = null;

  constructor(
    saved?: string | null,
    private readonly save?: (json: string) => void,
  ) {
    let kept: Record<string, unknown> = {};
    try {
      kept = Object(JSON.parse(saved ?? '{}')) as Record<string, unknown>;
    } catch {
      // not JSON: measured again
    }
    const rate = (value: unknown) => (typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : null);
    this.encodingMsPerToken = rate(kept.encodingMsPerToken);
    this.placingMsPerLoadedByte = rate(kept.placingMsPerLoadedByte);
    this.placingHeldMs = rate(kept.placingHeldMs);
    this.decodingMsPerValue = rate(kept.decodingMsPerValue);
  }

  /** Takes what a finished job measured. */
  record(report: MeasuredJob): void {
    for (const prompt of [report.encoding.prompt, report.encoding.negativePrompt])
      if (prompt?.source === 'encoded' && prompt.tokens) this.encodingMsPerToken = prompt.ms / prompt.tokens;
    const { loadBytes } = report.estimate;
    if (loadBytes > 0) this.placingMsPerLoadedByte = report.phasesMs.placing / loadBytes;
    else this.placingHeldMs = report.phasesMs.placing;
    if (report.decoding) this.decodingMsPerValue = report.phasesMs.decoding / sizeOf(report.latentShape);
    const { encodingMsPerToken, placingMsPerLoadedByte, placingHeldMs, decodingMsPerValue } = this;
    this.save?.(JSON.stringify({ encodingMsPerToken, placingMsPerLoadedByte, placingHeldMs, decodingMsPerValue }));
  }
}

/** What a job asks of each phase, as the pipeline knows it before the job starts. */
export interface JobDemand {
  steps: number;
  /** the cost model's step on the live workers; a string says why there is none */
  stepMs: number | string;
  /** tokens of each prompt the text encoder must run (a cached or given one is not run) */
  promptTokens: number[];
  /** bytes of transformer weights (as float32) each worker the job runs on must load, where some does not hold them */
  loadBytes: number;
  /** latent values the VAE decodes (0: the job asks for the latent only) */
  decodedValues: number;
}

export function estimateJob(demand: JobDemand, rates: PhaseRates): JobEstimate {
  const unmeasured: string[] = [];
  const phase = (name: keyof PhaseEstimates, needed: boolean, rate: number | null, amount: number, why: string) => {
    if (!needed) return 0;
    if (rate === null) unmeasured.push(`${name}: ${why}`);
    return rate === null ? null : rate * amount;
  };
  const tokens = demand.promptTokens.reduce((a, b) => a + b, 0);
  const phasesMs: PhaseEstimates = {
    encoding: phase('encoding', tokens > 0, rates.encodingMsPerToken, tokens, 'no prompt was encoded here yet'),
    placing:
      demand.loadBytes > 0
        ? phase(
            'placing',
            true,
            rates.placingMsPerLoadedByte,
            demand.loadBytes,
            'no job here has loaded this model yet',
          )
        : phase('placing', true, rates.placingHeldMs, 1, 'no job here was placed on workers holding this model yet'),
    denoising: phase(
      'denoising',
      true,
      typeof demand.stepMs === 'number' ? demand.stepMs : null,
      demand.steps,
      typeof demand.stepMs === 'string' ? demand.stepMs : '',
    ),
    decoding: phase(
      'decoding',
      demand.decodedValues > 0,
      rates.decodingMsPerValue,
      demand.decodedValues,
      'no job of this model has decoded here yet',
    ),
  };
  const { encoding, placing: placed, denoising, decoding } = phasesMs;
  const knownMs = [encoding, placed, denoising, decoding].reduce<number>((sum, ms) => sum + (ms ?? 0), 0);
  return { phasesMs, knownMs, unmeasured, loadBytes: demand.loadBytes };
}

/** What is left of a job by its estimate; `atLeast`: a phase still to come is not measured and not counted. */
export interface TimeLeft {
  ms: number;
  atLeast: boolean;
}

/** A job's phases in order: muxing, the last, too short to estimate. */
const PHASES: JobPhase[] = ['encoding', 'placing', 'denoising', 'decoding', 'muxing'];

/** What is left of a job in `phase`, `inPhaseMs` into it, by its estimate. */
export function timeLeft(estimate: JobEstimate, phase: JobPhase, inPhaseMs: number): TimeLeft {
  const parts = PHASES.slice(PHASES.indexOf(phase)).map((p) => (p === 'muxing' ? 0 : estimate.phasesMs[p]));
  const [current = 0, ...later] = parts.map((ms) => ms ?? 0);
  return {
    ms: Math.max(0, current - inPhaseMs) + later.reduce((a, b) => a + b, 0),
    atLeast: parts.some((ms) => ms === null),
  };
}

/** "3 min 20 s", "2 h 5 min", "3.1 days": a duration as a person reads it. */
export function formatDuration(ms: number): string {
  if (ms < 59_500) return `${ms < 9_950 ? (ms / 1000).toFixed(1) : Math.round(ms / 1000)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 48 * 3600) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${(s / 86400).toFixed(1)} days`;
}

/** "about 3 min 20 s", or "at least 3 min 20 s (decoding: …)" where a phase is not measured yet. */
export function describeEstimate(estimate: JobEstimate): string {
  const total = formatDuration(estimate.knownMs);
  return estimate.unmeasured.length
    ? `at least ${total} (not counted: ${estimate.unmeasured.join('; ')})`
    : `about ${total}`;
}

/** "about 2 min left", "at least 2 min left", or "time left not measured yet" where nothing known is left */
export function describeLeft(left: TimeLeft): string {
  if (left.ms < 50) return left.atLeast ? 'time left not measured yet' : 'nearly done';
  return `${left.atLeast ? 'at least' : 'about'} ${formatDuration(left.ms)} left`;
}

/** Whether the job should be confirmed before it is queued: its predicted part alone passes CONFIRM_FROM_MS. */
export const needsConfirmation = (estimate: JobEstimate): boolean => estimate.knownMs > CONFIRM_FROM_MS;
