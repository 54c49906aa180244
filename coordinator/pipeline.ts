// prompt → text encoder → denoising loop (core/sampler.ts; each step one or two DiT forward passes
// on the placement's executor) → VAE decoder → WebM. The pipeline reads like the algorithm: where the
// transformer runs is the placer's business (placement.ts), and a lost rank costs a re-placement
// and one step, not the job.
import { jobParams, latentShape, usesGuidance, type JobParams } from '../core/job.ts';
import { parseWanConfig, type WanConfig } from '../core/model/config.ts';
import { fetchModelFiles, readJson } from '../core/model/files.ts';
import { TRANSFORMER_CONFIG } from '../core/model/transformer.ts';
import type { DecodedVideo } from '../core/model/vae-decoder.ts';
import { loadWanPipelineParts } from '../core/model/wan-pipeline.ts';
import type { DType } from '../core/net/protocol.ts';
import type { LinkEmulation } from '../core/net/paced-channel.ts';
import { sample, scheduleOf, type SamplerCheckpoint, type Solver } from '../core/sampler.ts';
import type { Schedule } from '../core/scheduler.ts';
import type { Tensor } from '../core/tensor.ts';
import type { ExecutionProvider, LoadedModel } from '../core/worker-api.ts';
import { standInEncoding, umt5Encoding, type PromptCache, type PromptEncoding } from './text-encoding.ts';
import {
  standInDecoding,
  tiledDecoding,
  type DecodeOptions,
  type DecodeReport,
  type DecodeResult,
} from './vae-decoding.ts';
import type { Backend } from './backends.ts';
import {
  DEFAULT_WARMUP_STEPS,
  loadTimeoutMs,
  maxOrNull,
  WorkerError,
  type Executor,
  type LinkReport,
  type RankReport,
} from './executor.ts';
import type { ParallelMode } from '../core/parallel.ts';
import {
  Placer,
  type FailureRecord,
  type MeshProbeReport,
  type PlacementRequest,
  type PlannedDegree,
} from './placement.ts';
import type { SpotCheck } from './spot-check.ts';
import type { Swarm } from './swarm.ts';
import { encodeWebM } from './video.ts';

/** A rank was caught returning wrong rows: the steps since it was placed run again (the sampler is left by it). */
class RerunSteps extends Error {
  override name = 'RerunSteps';
}

export interface PipelineOptions {
  /** URL of a diffusers-layout model folder; the bundled demo model by default */
  model?: string;
  backend?: Backend;
  /** the swarm the `swarm` backend draws workers from */
  swarm?: Swarm;
  /** number of workers (= Ulysses degree); 'auto' lets the cost model choose */
  workers?: number | 'auto';
  parallel?: {
    ulyssesDegree?: number | 'auto';
    /**
     * CFG parallel: the conditional and unconditional passes on two groups of workers at once
     * (swarm backend, jobs with guidance ≠ 1). true: always; false: never; unset: the 'auto'
     * planner chooses.
     */
    cfgParallel?: boolean;
  };
  ep?: ExecutionProvider | 'auto';
  /** activations between ranks: 'f32' (default, exact), 'f16' (half the bytes, ~3e-4 on the tiny model) or 'i8' (about a quarter, with a scale per 64 values) */
  dtype?: DType;
  placementTimeoutMs?: number;
  rpcTimeoutMs?: number;
  /** the last stage, frames → video file: WebM through WebCodecs unless replaced (Node has no WebCodecs) */
  encodeVideo?(frames: DecodedVideo): Promise<Blob>;
  /** encoded prompts kept between jobs (the dashboard's IndexedDB); none: every prompt is encoded */
  promptCache?: PromptCache;
}

export interface StepProgress {
  step: number; // 1-based, completed
  steps: number;
  stepMs: number;
  elapsedMs: number;
  etaMs: number;
  ranks: RankReport[];
}

/** A text embedding as WanPipeline's prompt_embeds: [L, text_dim], or [1, L, text_dim]. */
export interface PromptEmbeds {
  shape: number[];
  data: Float32Array;
}

export interface GenerateRequest extends Partial<JobParams> {
  /** the prompt's embedding instead of encoding `prompt` (WanPipeline's prompt_embeds=) */
  promptEmbeds?: PromptEmbeds;
  /** the negative prompt's, with guidance (negative_prompt_embeds=) */
  negativePromptEmbeds?: PromptEmbeds;
  /** 'latent' stops before the VAE: no video, the latent only (output_type="latent") */
  outputType?: 'video' | 'latent';
  /** where this job runs, where it differs from the pipeline's options */
  placement?: Partial<PlacementRequest>;
  /** continue a job from a checkpoint: `step` steps done, `latent` after them */
  resume?: SamplerCheckpoint;
  onCheckpoint?(c: SamplerCheckpoint): void;
  onFailure?(f: FailureRecord): void;
  onProgress?(p: StepProgress): void;
  /** a phase begins, or moves on (detail: how far it is, e.g. "tile 3 of 15") */
  onPhase?(phase: JobPhase, detail?: string): void;
  signal?: AbortSignal;
}

/** What a job does, in order: encoding embeds the prompts; placing takes the workers, loads the model and prepares the ranks. */
export type JobPhase = 'encoding' | 'placing' | 'denoising' | 'decoding' | 'muxing';

export interface GenerateReport {
  /** workers = ulyssesDegree, ×2 with cfgParallel */
  config: JobParams & {
    backend: Backend;
    workers: number;
    ulyssesDegree: number;
    cfgParallel: boolean;
    model: string;
    outputType: 'video' | 'latent';
    promptEmbeds: 'encoded' | 'given';
    /** how activations went between ranks, and over what emulated link if any (benchmarks) */
    dtype: DType;
    /** how the ranks shared self-attention, and (displaced) how many exact steps came first */
    parallel: ParallelMode;
    warmupSteps: number;
    /** Ulysses: the head groups a block's exchange went in (1: all heads at once, no overlap) */
    headGroups: number;
    emulateLink: LinkEmulation | null;
  };
  /**
   * each rank's EP, and why it runs there ("WASM: 21.3 GFLOP/s vs WebGPU 0.2"); how long its model
   * took to load and where the weights came from (the network or its browser's cache); the most
   * memory its page held during the job (JS heaps, the wasm heap among them) and the GPU bytes its weights
   * took; the largest tensor its stages make (larger ones run in chunks)
   */
  workers: (LoadedModel & { id: string; threads: number; peakMemoryBytes: number | null })[];
  /** which links of the last placement were direct data channels and which went through the relay */
  links: LinkReport[];
  /** the folder's scheduler and what it stepped through: the timesteps the model was given and the sigmas */
  schedule: Schedule & { scheduler: Solver['kind'] };
  /** how the latent became frames: where, in which tiles, each worker's share (null with outputType 'latent') */
  decoding: DecodeReport | null;
  /** how each prompt became its embedding: given, encoded (where each text encoder layer ran) or from the cache */
  encoding: { prompt: PromptEncoding; negativePrompt: PromptEncoding | null };
  /** the cost model's choice of degree when it was 'auto' (null when asked for, or unmeasured) */
  plan: PlannedDegree | null;
  /** why the job did not run CFG parallel although it was asked for (null when it did, or was not asked) */
  cfgFallback: string | null;
  /** the all-to-all timed on this placement's mesh before its first job (null for one rank or a local backend) */
  meshProbe: MeshProbeReport;
  steps: { step: number; ms: number; ranks: RankReport[] }[];
  /** the median step's ms: what the plan's predictedStepMs is held to (a slow step, a GC or a busy neighbour, moves a mean, not a median) */
  medianStepMs: number;
  resumedFromStep: number;
  failures: FailureRecord[];
  /** time spent re-placing after lost ranks */
  recoveryMs: number;
  /** forwards another rank recomputed to check its group's rows, and what came of it (coordinator/spot-check.ts) */
  spotChecks: SpotCheck[];
  setupMs: number;
  /** where the job's time went, phase by phase */
  phasesMs: Record<JobPhase, number>;
  totalMs: number;
  latentShape: number[];
  latentSha256: string;
}

export interface GenerateResult {
  /** null with outputType 'latent' */
  video: Blob | null;
  latent: Float32Array;
  frames: DecodedVideo | null;
  report: GenerateReport;
}

export interface Pipeline {
  readonly config: WanConfig;
  /** the current placement's executor, once a job has been placed */
  readonly executor: Executor | null;
  generate(request: GenerateRequest): Promise<GenerateResult>;
  /** a latent [z_dim, T, h, w] through the folder's VAE alone (on the swarm's workers for AutoencoderKLWan) */
  decode(latent: Tensor, options?: DecodeOptions): Promise<DecodeResult>;
  shutdown(options?: { graceMs?: number }): Promise<void>;
}

/** rows a given text embedding may have at most: WanPipeline pads to 512; a bound on what a caller can make the workers hold */
const MAX_TEXT_TOKENS = 4096;

/** The trained demo model: its videos show what a prompt of its small grammar asks (demo/world.ts). */
export const DEFAULT_MODEL_URL = '/models/tiny-wan-demo';

/** Reads a model folder's transformer config: what a page needs to know of a model before running it (its heads, say). */
export async function loadModelConfig(model: string = DEFAULT_MODEL_URL): Promise<WanConfig> {
  return parseWanConfig(
    await readJson(fetchModelFiles(new URL(model, globalThis.location?.href).href), TRANSFORMER_CONFIG),
    TRANSFORMER_CONFIG,
  );
}

/** What a job on a model folder is where it says nothing more: WanPipeline's defaults for a published folder, DEFAULT_JOB for the tiny ones (a form fills itself with it). */
export async function loadJobDefaults(model: string = DEFAULT_MODEL_URL): Promise<JobParams> {
  return (await loadWanPipelineParts(fetchModelFiles(new URL(model, globalThis.location?.href).href))).defaults;
}

export async function createPipeline(options: PipelineOptions = {}): Promise<Pipeline> {
  const backend = options.backend ?? 'local';
  const modelUrl = new URL(options.model ?? DEFAULT_MODEL_URL, globalThis.location?.href).href;
  const files = fetchModelFiles(modelUrl);
  const {
    config,
    textTokens,
    umt5,
    textEncoder,
    wanVae,
    decoder,
    solver,
    defaults: folderDefaults,
  } = await loadWanPipelineParts(files);
  const placer = new Placer({
    config,
    modelUrl,
    backend,
    swarm: options.swarm,
    textTokens,
    placementTimeoutMs: options.placementTimeoutMs,
    rpcTimeoutMs: options.rpcTimeoutMs,
  });
  const textEncoding = umt5
    ? umt5Encoding({
        modelUrl,
        files,
        maxLength: textTokens,
        ep: 'auto',
        timeoutMs: loadTimeoutMs(options.rpcTimeoutMs),
        cache: options.promptCache,
        async hosts() {
          if (!options.swarm || backend !== 'swarm')
            throw new Error(
              "this folder's text encoder (umT5) runs on the swarm's workers: use the swarm backend, or give the prompt embeddings (promptEmbeds)",
            );
          return placer.liveWorkers(1);
        },
      })
    : standInEncoding(textEncoder);
  const videoDecoding = wanVae
    ? tiledDecoding({
        modelUrl,
        files,
        config: wanVae,
        ep: 'auto',
        timeoutMs: loadTimeoutMs(options.rpcTimeoutMs),
        async hosts() {
          if (!options.swarm || backend !== 'swarm')
            throw new Error(
              "this folder's VAE (AutoencoderKLWan) decodes on the swarm's workers: use the swarm backend, or ask for the latent (outputType 'latent')",
            );
          return placer.liveWorkers(1);
        },
        // the workers of the job's placement say what buffers they allow
        maxBufferBytes: () => Math.min(...(placer.current?.workers.map((w) => w.maxBufferBytes) ?? []), Infinity),
      })
    : standInDecoding(decoder);
  /** A given embedding's rows, checked against the model; else the prompt encoded. */
  const embed = async (
    given: PromptEmbeds | undefined,
    prompt: string,
    what: string,
    onProgress?: (detail: string) => void,
  ): Promise<{ embeds: Float32Array; report: PromptEncoding }> => {
    if (!given) return textEncoding.encode(prompt, onProgress);
    const started = performance.now();
    const [L, width] = given.shape.length === 3 && given.shape[0] === 1 ? given.shape.slice(1) : given.shape;
    if (
      given.shape.length < 2 ||
      given.shape.length > 3 ||
      width !== config.textDim ||
      !(L >= 1 && L <= MAX_TEXT_TOKENS) ||
      given.data.length !== L * width
    ) {
      throw new Error(
        `${what} must be [L, ${config.textDim}] or [1, L, ${config.textDim}] with 1 ≤ L ≤ ${MAX_TEXT_TOKENS} and as many values, got [${given.shape}] with ${given.data.length} values`,
      );
    }
    if (!given.data.every(Number.isFinite)) throw new Error(`${what} holds NaN or infinite values`);
    return {
      embeds: given.data,
      report: { source: 'given', tokens: null, truncated: false, ms: performance.now() - started, layers: [] },
    };
  };
  const defaults: PlacementRequest = {
    ulyssesDegree: options.parallel?.ulyssesDegree ?? options.workers ?? 'auto',
    cfgParallel: options.parallel?.cfgParallel,
    ep: options.ep ?? 'auto',
    dtype: options.dtype ?? 'f32',
  };
  let jobs = 0;

  return {
    config,
    get executor() {
      return placer.current;
    },
    async generate(request) {
      const {
        placement: asked,
        resume,
        onCheckpoint,
        onFailure,
        onProgress,
        onPhase,
        signal,
        promptEmbeds,
        negativePromptEmbeds,
        outputType = 'video',
        ...input
      } = request;
      const params = jobParams(input, folderDefaults);
      const started = performance.now();
      const phasesMs: Record<JobPhase, number> = { encoding: 0, placing: 0, denoising: 0, decoding: 0, muxing: 0 };
      let phase: { name: JobPhase; since: number } | null = null;
      const enter = (name: JobPhase | null) => {
        const now = performance.now();
        if (phase) phasesMs[phase.name] += now - phase.since;
        phase = name && { name, since: now };
        if (name) onPhase?.(name);
      };
      // the prompts and the decoder first: what a job cannot do is refused before any worker is asked
      enter('encoding');
      const encoded = [
        await embed(promptEmbeds, params.prompt, 'promptEmbeds', (detail) =>
          onPhase?.('encoding', `the prompt: ${detail}`),
        ),
      ];
      if (usesGuidance(params))
        encoded.push(
          await embed(negativePromptEmbeds, params.negativePrompt, 'negativePromptEmbeds', (detail) =>
            onPhase?.('encoding', `the negative prompt: ${detail}`),
          ),
        );
      const texts = encoded.map((e) => e.embeds);
      if (outputType === 'video') await videoDecoding.ready();
      enter('placing');
      const placement = { ...defaults, ...asked };
      const { plan, cfgFallback } = await placer.place(params, placement);
      const setupMs = performance.now() - started;
      const job = ++jobs;
      const shape = latentShape(params, config.inChannels);
      const meshProbe = await placer.prepare(job, texts, shape);

      enter('denoising');
      const first = resume?.step ?? 0;
      const steps: GenerateReport['steps'] = [];
      const failures: FailureRecord[] = [];
      const spotChecks: SpotCheck[] = [];
      const loopStart = performance.now();
      let ranks: RankReport[] = [];
      // where the current placement started, and the last step done: a rank caught returning wrong
      // rows by a spot check may have returned them unchecked since it was placed, so the steps
      // since then run again from the checkpoint it was placed at (kept alone: a real model's
      // latent is megabytes, one per step)
      type Point = { step: number; checkpoint: SamplerCheckpoint | undefined };
      let placedAt: Point = { step: first, checkpoint: resume };
      let latent: Tensor | undefined;
      while (!latent) {
        const from = placedAt;
        let lastDone = from;
        steps.splice(0, steps.length, ...steps.filter((s) => s.step < from.step));
        latent = await sample({
          shape,
          steps: params.steps,
          flowShift: params.flowShift,
          seed: params.seed,
          solver,
          resume: from.checkpoint,
          signal,
          async velocity(at) {
            for (;;) {
              try {
                const result = await placer.current!.velocity({ job, ...at }, params.guidance);
                ranks = result.ranks;
                return result.velocity;
              } catch (e) {
                spotChecks.push(...placer.current!.takeSpotChecks());
                const failure = await placer.replace(e as Error, at.step);
                if (!failure) throw e;
                const caught = e instanceof WorkerError && e.method === 'spot check';
                const record = { ...failure, rerunFromStep: caught ? placedAt.step : null };
                failures.push(record);
                onFailure?.(record);
                if (caught) throw new RerunSteps(); // from placedAt, on the new placement
                placedAt = lastDone; // the new placement starts at this step
              }
            }
          },
          onStep({ stepMs, ...checkpoint }) {
            spotChecks.push(...placer.current!.takeSpotChecks());
            const { step } = checkpoint;
            lastDone = { step, checkpoint };
            steps.push({ step: step - 1, ms: stepMs, ranks });
            onCheckpoint?.(checkpoint);
            const elapsedMs = performance.now() - loopStart;
            onProgress?.({
              step,
              steps: params.steps,
              stepMs,
              elapsedMs,
              etaMs: (elapsedMs / (step - first)) * (params.steps - step),
              ranks,
            });
          },
        }).catch((e: unknown) => {
          if (e instanceof RerunSteps) return undefined;
          throw e;
        });
      }

      const medianStepMs = median(steps.map((s) => s.ms));
      // a job that ran on one placement throughout is what the next of its shape there is predicted from
      if (!failures.length) placer.measuredStep(params, medianStepMs);

      enter('decoding');
      const decoded =
        outputType === 'video'
          ? await videoDecoding.decode(latent, {
              ep: placement.ep,
              onProgress: ({ tilesDone, tiles }) => onPhase?.('decoding', `tile ${tilesDone} of ${tiles}`),
            })
          : null;
      const frames = decoded?.frames ?? null;
      enter('muxing');
      const video = frames && (await (options.encodeVideo ?? encodeWebM)(frames));
      enter(null);
      const executor = placer.current!;
      return {
        video,
        latent: latent.data,
        frames,
        report: {
          config: {
            ...params,
            backend,
            workers: executor.world,
            ulyssesDegree: executor.layout.ulyssesDegree,
            cfgParallel: executor.layout.cfgParallel,
            model: modelUrl,
            outputType,
            promptEmbeds: promptEmbeds ? 'given' : 'encoded',
            dtype: executor.options.dtype ?? 'f32',
            parallel: executor.options.parallel ?? 'ulysses',
            headGroups: executor.options.headGroups ?? 1,
            warmupSteps: executor.options.warmupSteps ?? DEFAULT_WARMUP_STEPS,
            emulateLink: placement.emulateLink ?? null,
          },
          plan,
          cfgFallback,
          meshProbe,
          decoding: decoded?.report ?? null,
          encoding: { prompt: encoded[0].report, negativePrompt: encoded[1]?.report ?? null },
          schedule: { scheduler: solver.kind, ...scheduleOf(solver, params.steps, params.flowShift) },
          workers: executor.workers.map(
            ({
              id,
              ep,
              adapter,
              why,
              threads,
              inMemory,
              loadMs,
              weights,
              maxBufferBytes,
              weightType,
              gpuWeightBytes,
            }) => ({
              id,
              ep,
              adapter,
              why,
              threads,
              inMemory,
              loadMs,
              weights,
              maxBufferBytes,
              weightType,
              gpuWeightBytes,
              peakMemoryBytes: steps
                .flatMap((s) => s.ranks)
                .filter((r) => r.worker === id)
                .reduce<number | null>((peak, r) => maxOrNull(peak, r.peakMemoryBytes), null),
            }),
          ),
          links: executor.linkReport(),
          steps,
          medianStepMs,
          resumedFromStep: first,
          failures,
          recoveryMs: failures.reduce((t, f) => t + f.replanMs, 0),
          spotChecks,
          setupMs,
          phasesMs,
          totalMs: performance.now() - started,
          latentShape: shape,
          latentSha256: await sha256(latent.data),
        },
      };
    },
    async decode(latent, options) {
      await videoDecoding.ready();
      return videoDecoding.decode(latent, options);
    },
    shutdown: (opts) => placer.shutdown(opts),
  };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length === 0 ? 0 : sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

async function sha256(data: Float32Array): Promise<string> {
  const digest = await crypto.subtle.digest('SHA-256', data.slice());
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}
