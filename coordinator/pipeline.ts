// prompt → text encoder → denoising loop (denoising.ts; each step one or two DiT forward passes on
// the placement's executor) → VAE decoder → WebM. The pipeline reads like the algorithm: where and
// how the transformer runs is the planner's (planner.ts), carried out by the placer (placer.ts), and
// a worker lost in any phase (its text encoder layers, placing, a step, its VAE tiles) costs a
// re-placement on the live workers, not the job (Placer: one rule for all of them).
import { defined } from '../core/defined.ts';
import { DEFAULT_MODEL_URL, jobParams, passesPerStep, usesGuidance, type JobParams } from '../core/job.ts';
import { checkFamilyParams, latentShape, type ModelFamily } from '../core/model/family.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { parseWanConfig, type WanConfig } from '../core/model/config.ts';
import { fetchModelFiles, readJson } from '../core/model/files.ts';
import { openTransformer, TRANSFORMER_CONFIG } from '../core/model/transformer.ts';
import type { DecodedVideo } from '../core/model/vae-decoder.ts';
import { loadWanPipelineParts, MISSING_PARTS, MissingPart } from '../core/model/wan-pipeline.ts';
import { jobSolver, scheduleOf, type SamplerCheckpoint, type Schedule, type Solver } from '../core/sampler.ts';
import type { StepCacheSettings } from '../core/step-cache.ts';
import { sizeOf, type Tensor } from '../core/tensor.ts';
import type { LoadedModel, NativeDevice, WorkerKind } from '../core/worker-api.ts';
import type { Backend } from './backends.ts';
import { denoise, type StepProgress, type StepReport } from './denoising.ts';
import { estimateJob, PhaseRates, timeLeft, type JobEstimate, type JobPhase, type TimeLeft } from './estimate.ts';
import { maxOrNull, type CacheForward, type Executor, type LinkReport, type RankReport } from './executor.ts';
import type { PlacedStepCache, PlacementRequest, ResolvedPlacement } from './placement.ts';
import { Placer, type FailureRecord, type MeshProbeReport, type RebalanceRecord } from './placer.ts';
import { timeoutsOf } from './planner.ts';
import { spotCheckOdds, type SpotCheck, type SpotCheckOdds } from './spot-check.ts';
import type { Swarm, SwarmWorker } from './swarm.ts';
import { standInEncoding, umt5Encoding, type PromptCache, type PromptEncoding } from './text-encoding.ts';
import {
  describeDecodeProgress,
  standInDecoding,
  tiledDecoding,
  type DecodeOptions,
  type DecodeReport,
  type DecodeResult,
} from './vae-decoding.ts';
import { encodeWebM } from './video.ts';
import { encodeImageCondition, ImageEncodingBreach } from './image-encoding.ts';
import { imageProblem, type RgbaImage } from '../core/model/image-condition.ts';

export interface PipelineOptions {
  /** URL of a diffusers-layout model folder (relative: the swarm's server's); the bundled demo model by default */
  model?: string;
  backend?: Backend;
  /** the swarm the `swarm` backend draws workers from */
  swarm?: Swarm;
  /**
   * what every job asks of placement unless it asks otherwise (GenerateRequest.placement); the planner decides the rest
   */
  placement?: PlacementRequest;
  placementTimeoutMs?: number;
  rpcTimeoutMs?: number;
  /** the last stage, frames → video file: WebM through WebCodecs unless replaced (Node has no WebCodecs) */
  encodeVideo?: (frames: DecodedVideo, options: { fps: number }) => Promise<Blob>;
  /** encoded prompts kept between jobs (the dashboard's IndexedDB); none: every prompt is encoded */
  promptCache?: PromptCache;
  /** what earlier jobs of the model measured of their phases, for estimates (none: this pipeline's jobs alone) */
  phaseRates?: PhaseRates;
}

/** A text embedding as WanPipeline's prompt_embeds: [L, text_dim], or [1, L, text_dim]. */
export interface PromptEmbeds {
  shape: number[];
  data: Float32Array;
}

/** A job as asked: its parameters, inputs and placement, without the hooks that follow it. */
export type JobRequest = Omit<
  GenerateRequest,
  'resume' | 'onCheckpoint' | 'onFailure' | 'onProgress' | 'onPhase' | 'signal'
>;

export interface GenerateRequest extends Partial<JobParams> {
  /** the prompt's embedding instead of encoding `prompt` (WanPipeline's prompt_embeds=) */
  promptEmbeds?: PromptEmbeds;
  /** the negative prompt's, with guidance (negative_prompt_embeds=) */
  negativePromptEmbeds?: PromptEmbeds;
  /** 'latent' stops before the VAE: no video, the latent only (output_type="latent") */
  outputType?: 'video' | 'latent';
  /**
   * an image to start the video from (Wan2.2 TI2V: image to video with the same model), stretched to the job's size
   * and encoded on a worker as the first latent frame, held there at every step
   */
  image?: RgbaImage;
  /** where this job runs, where it differs from the pipeline's options */
  placement?: PlacementRequest;
  /** continue a job from a checkpoint: `step` steps done, `latent` after them */
  resume?: SamplerCheckpoint;
  onCheckpoint?: (c: SamplerCheckpoint) => void;
  onFailure?: (f: FailureRecord) => void;
  onProgress?: (p: StepProgress) => void;
  /** a phase begins, or moves on (detail: how far it is, e.g. "tile 3 of 15"), and what is left of the job */
  onPhase?: (phase: JobPhase, detail: string | undefined, left: TimeLeft) => void;
  signal?: AbortSignal;
}

export interface GenerateReport {
  config: JobParams & {
    backend: Backend;
    model: string;
    outputType: 'video' | 'latent';
    promptEmbeds: 'encoded' | 'given';
    /** the model's family (core/model/family.ts), the latent's [C, T, H, W] in it and its video's frame rate */
    family: string;
    latentShape: number[];
    fps: number;
  };
  /** where and how the job ran, as the planner decided it (after a lost rank: the last placement) */
  placement: ResolvedPlacement;
  /**
   * each rank's EP, and why it runs there ("WASM: 21.3 GFLOP/s vs WebGPU 0.2"); how long its model
   * took to load and where the weights came from (the network or its browser's cache); the most
   * memory its page held during the job (JS heaps, the wasm heap among them) and the GPU bytes its weights
   * took; the largest tensor its stages make (larger ones run in chunks); whether it is a tab or a process (and
   * then on which host)
   */
  workers: (LoadedModel & {
    id: string;
    kind: WorkerKind;
    host?: string;
    /** what a process's 'wasm' EP computed on natively (absent: WebAssembly) */
    nativeDevice?: NativeDevice;
    threads: number;
    peakMemoryBytes: number | null;
  })[];
  /** which links of the last placement were direct data channels and which went through the relay */
  links: LinkReport[];
  /** the folder's scheduler and what it stepped through: the timesteps the model was given and the sigmas */
  schedule: Schedule & { scheduler: Solver['kind'] };
  /** how the latent became frames: where, in which tiles, each worker's share (null with outputType 'latent') */
  decoding: DecodeReport | null;
  /** how each prompt became its embedding: given, encoded (where each text encoder layer ran) or from the cache */
  encoding: { prompt: PromptEncoding; negativePrompt: PromptEncoding | null };
  /** the all-to-all timed on this placement's mesh before its first job (null for one rank or a local backend) */
  meshProbe: MeshProbeReport;
  steps: StepReport[];
  /**
   * inter-stage activation bytes that crossed this page: none can. A pipeline stage's rank hands its hidden state to
   * the next stage's over their own link (rank/hand-off.ts), and the worker contract carries no hidden state in a
   * forward either way (core/worker-api.ts executeModel); a spot check's evidence of a hand-off is its own traffic.
   */
  coordinatorActivationBytes: 0;
  /**
   * the median step's ms: what the plan's predictedStepMs is held to (a slow step, a GC or a busy neighbour, moves a
   * mean, not a median)
   */
  medianStepMs: number;
  resumedFromStep: number;
  /** the workers lost in every phase, and what placing the job again after each cost */
  failures: FailureRecord[];
  /** the steps a rank slower than its share had its share shrunk at (the same workers, the same latent) */
  rebalances: RebalanceRecord[];
  /** time spent re-placing after lost ranks */
  recoveryMs: number;
  /** forwards another rank recomputed to check its group's rows, and what came of it (coordinator/spot-check.ts) */
  spotChecks: SpotCheck[];
  /** the chance a forward was checked and a liar was caught, at the rate the job ran with on its last placement */
  spotCheckOdds: SpotCheckOdds;
  /** which forwards the step cache reused, and the magnitude ratios the computed ones measured (null: no cache) */
  cache: CacheReport | null;
  setupMs: number;
  /** where the job's time went, phase by phase */
  phasesMs: Record<JobPhase, number>;
  totalMs: number;
  /** what the job was predicted to take as it started (estimate.ts), to hold phasesMs to */
  estimate: JobEstimate;
  latentShape: number[];
  latentSha256: string;
}

/** What a job's step cache did (core/step-cache.ts). */
export interface CacheReport extends StepCacheSettings {
  /** the curve its schedule was read from; null for a calibration run, which computes every forward */
  curve: string | null;
  forwardsComputed: number;
  forwardsReused: number;
  /** [step, pass] of each forward that skipped the blocks */
  reused: [number, number][];
  /** [step, pass] of each reused forward whose residual was rebuilt first on ranks placed since it was kept */
  replayed: [number, number][];
  /** [step, pass] of each forward scheduled to reuse but computed: no kept forward to rebuild from (a resumed job) */
  recomputed: [number, number][];
  /** per pass, per step: the magnitude ratio its residual measured against the one kept before (null: not measured) */
  measuredRatios: (number | null)[][];
}

function cacheReport(
  placed: PlacedStepCache | null,
  forwards: CacheForward[],
  steps: number,
  passes: number,
): CacheReport | null {
  if (!placed) return null;
  const where = (f: CacheForward): [number, number] => [f.step, f.pass];
  const measuredRatios = Array.from({ length: passes }, () =>
    Array.from({ length: steps }, () => null as number | null),
  );
  for (const f of forwards) measuredRatios[f.pass][f.step] = f.magnitudeRatio;
  return {
    ...placed.settings,
    curve: placed.curve?.source ?? null,
    // a residual rebuilt ran the blocks too
    forwardsComputed: forwards.filter((f) => !f.reused).length + forwards.filter((f) => f.replayedFrom !== null).length,
    forwardsReused: forwards.filter((f) => f.reused).length,
    reused: forwards.filter((f) => f.reused).map(where),
    replayed: forwards.filter((f) => f.replayedFrom !== null).map(where),
    recomputed: forwards.filter((f) => f.recomputed).map(where),
    measuredRatios,
  };
}

export interface GenerateResult {
  /** null with outputType 'latent' */
  video: Blob | null;
  latent: Float32Array;
  frames: DecodedVideo | null;
  report: GenerateReport;
}

export interface Pipeline {
  /** the folder's transformer config; null where it has none (it only decodes: `decode`) */
  readonly config: WanConfig | null;
  /** the folder's model family: its latent, timesteps, frame rate (core/model/family.ts) */
  readonly family: ModelFamily;
  /** the current placement's executor, once a job has been placed */
  readonly executor: Executor | null;
  generate(request: GenerateRequest): Promise<GenerateResult>;
  /** what a job would take on the workers as they are now, phase by phase (estimate.ts) */
  estimate(request: JobRequest): Promise<JobEstimate>;
  /** times, while no job runs, the forwards a job like this would be placed by (Placer.rehearseAhead) */
  rehearseAhead(request: JobRequest): Promise<void>;
  /** a latent [z_dim, T, h, w] through the folder's VAE alone (on the swarm's workers for AutoencoderKLWan) */
  decode(latent: Tensor, options?: DecodeOptions): Promise<DecodeResult>;
  shutdown(options?: { graceMs?: number }): Promise<void>;
}

/**
 * rows a given text embedding may have at most: WanPipeline pads to 512; a bound on what a caller can make the workers
 * hold
 */
const MAX_TEXT_TOKENS = 4096;

/** The page's address, which relative model URLs are resolved against (none in Node). */
const pageUrl = (): string | undefined => (globalThis as { location?: Location }).location?.href;

/**
 * Reads a model folder's transformer config: what a page needs to know of a model before running it (its heads, say).
 */
export async function loadModelConfig(model: string = DEFAULT_MODEL_URL): Promise<WanConfig> {
  return parseWanConfig(
    await readJson(fetchModelFiles(new URL(model, pageUrl()).href), TRANSFORMER_CONFIG),
    TRANSFORMER_CONFIG,
  );
}

/**
 * What a job on a model folder is where it says nothing more: WanPipeline's defaults for a published folder,
 * DEFAULT_JOB for the tiny ones (a form fills itself with it).
 */
export async function loadJobDefaults(model: string = DEFAULT_MODEL_URL): Promise<JobParams> {
  return (await loadFormModel(model)).defaults;
}

/**
 * What a form shows of a model folder: its transformer's config, or why it runs no job (a folder holding only vae/
 * decodes), and its job defaults.
 */
export async function loadFormModel(
  model: string = DEFAULT_MODEL_URL,
): Promise<{ config: WanConfig | null; family: ModelFamily; noJobs: string | null; defaults: JobParams }> {
  const { config, family, defaults } = await loadWanPipelineParts(fetchModelFiles(new URL(model, pageUrl()).href));
  return { config, family, noJobs: config ? null : MISSING_PARTS.transformer, defaults };
}

export type { StepProgress } from './denoising.ts';

export async function createPipeline(options: PipelineOptions = {}): Promise<Pipeline> {
  const backend = options.backend ?? 'local';
  const { swarm, rpcTimeoutMs } = options;
  // a page embedding the library on an origin of its own runs its swarm server's models: the bundled demo unless told
  const modelUrl = new URL(options.model ?? DEFAULT_MODEL_URL, swarm?.origin ?? pageUrl()).href;
  const files = fetchModelFiles(modelUrl);
  const parts = await loadWanPipelineParts(files);
  const { config, family, textTokens, umt5, wanVae, solver, defaults: folderDefaults, stepCacheCurve } = parts;
  const placer = new Placer({
    config,
    latent: family.latent,
    modelUrl,
    backend,
    swarm,
    textTokens,
    stepCacheCurve,
    placementTimeoutMs: options.placementTimeoutMs,
    rpcTimeoutMs,
  });
  /** The workers of the swarm, where a part of this folder runs on them; else an error saying what to do. */
  const onSwarm = (what: string, instead: string): Placer => {
    if (!swarm || backend !== 'swarm') throw new Error(`${what}: use the swarm backend, or ${instead}`);
    return placer;
  };
  const { promptCache } = options;
  // a worker let go for wrong results anywhere (a spot check, a text encoder run, a tile) takes its cached prompts
  const offBans = swarm?.on((e) => {
    if (e.type === 'leave' && e.banned) void promptCache?.purge(e.worker.id).catch(() => {});
  });
  const textEncoding = umt5
    ? umt5Encoding<SwarmWorker>({
        modelUrl,
        files,
        maxLength: textTokens,
        ep: 'auto',
        timeoutMs: timeoutsOf(rpcTimeoutMs).loadMs,
        cache: promptCache,
        convict: (worker, why) => placer.convict(worker, why),
        lost: (worker, among, error) => placer.lostOutsideSteps('encoding', worker, among, error),
        runs: (numLayers, from) =>
          onSwarm(
            "this folder's text encoder (umT5) runs on the swarm's workers",
            'give the prompt embeddings (promptEmbeds)',
          ).textLayers(numLayers, from),
      })
    : standInEncoding(() => parts.textEncoder());
  const videoDecoding = wanVae
    ? tiledDecoding<SwarmWorker>({
        modelUrl,
        files,
        config: wanVae,
        ep: 'auto',
        timeoutMs: timeoutsOf(rpcTimeoutMs).loadMs,
        convict: (worker, why) => placer.convict(worker, why),
        lost: (worker, among, error) => placer.lostOutsideSteps('decoding', worker, among, error),
        tileHosts: () =>
          onSwarm(
            "this folder's VAE (AutoencoderKLWan) decodes on the swarm's workers",
            "ask for the latent (outputType 'latent')",
          ).vaeTiles(),
      })
    : standInDecoding(() => parts.decoder());

  /**
   * A job's image as its first latent frame, encoded on a worker of the swarm; a worker whose latent no honest encoder
   * makes is let go and another asked.
   */
  const imageCondition = async (
    image: RgbaImage,
    { height, width }: JobParams,
    onProgress: (detail: string) => void,
  ): Promise<Float32Array> => {
    if (!family.expandTimesteps)
      throw new Error(
        `image: ${family.name} makes video from text alone; an image to start from needs a Wan2.2 TI2V folder ` +
          '(its model_index.json sets expand_timesteps)',
      );
    const problem = imageProblem(image);
    if (problem) throw new Error(`image: ${problem}`);
    const why = "an image-to-video job's image encodes on the swarm's workers";
    for (;;) {
      const { hosts } = await onSwarm(why, 'give no image').vaeTiles();
      const host = defined(hosts[0], 'a worker to encode the image');
      onProgress(`the image on ${host.id}`);
      try {
        const { latent } = await encodeImageCondition({
          host,
          modelUrl,
          files,
          image,
          height,
          width,
          ep: 'auto',
          timeoutMs: timeoutsOf(rpcTimeoutMs).loadMs,
          onLoading: (news) => onProgress(`the image on ${host.id}: ${news}`),
        });
        return latent.data;
      } catch (e) {
        if (!(e instanceof ImageEncodingBreach)) throw e;
        placer.convict(host, e.why);
      }
    }
  };

  /** The transformer's config, which every job denoises with: a folder without transformer/ only decodes. */
  const transformer = (): WanConfig => {
    if (!config) throw new MissingPart(MISSING_PARTS.transformer);
    return config;
  };

  /** A given embedding's rows, checked against the model; else the prompt encoded. */
  const embed = async (
    given: PromptEmbeds | undefined,
    prompt: string,
    what: string,
    onProgress?: (detail: string) => void,
  ): Promise<{ embeds: Float32Array; report: PromptEncoding }> => {
    if (!given) return textEncoding.encode(prompt, onProgress);
    const started = performance.now();
    const { textDim } = transformer();
    const [L, width] = given.shape.length === 3 && given.shape[0] === 1 ? given.shape.slice(1) : given.shape;
    const fits = given.shape.length >= 2 && given.shape.length <= 3 && width === textDim;
    if (!fits || !(L >= 1 && L <= MAX_TEXT_TOKENS) || given.data.length !== L * width) {
      throw new Error(
        `${what} must be [L, ${textDim}] or [1, L, ${textDim}] with 1 ≤ L ≤ ${MAX_TEXT_TOKENS} ` +
          `and as many values, got [${given.shape.join(',')}] with ${given.data.length} values`,
      );
    }
    if (!given.data.every(Number.isFinite)) throw new Error(`${what} holds NaN or infinite values`);
    return {
      embeds: given.data,
      report: {
        source: 'given',
        tokens: null,
        truncated: false,
        ms: performance.now() - started,
        layers: [],
        checks: [],
      },
    };
  };
  let jobs = 0;
  /** what this model's jobs measured of the phases the cost model does not predict */
  const rates = options.phaseRates ?? new PhaseRates();
  /** A job's parameters: the folder's defaults beneath the input's, every field checked, on this family too. */
  const paramsOf = (input: Parameters<typeof jobParams>[0]): JobParams => {
    const params = jobParams(input, folderDefaults);
    checkFamilyParams(family, params);
    return params;
  };
  /** The job's placement as asked: the pipeline's beneath the job's. */
  const placementOf = (asked: PlacementRequest | undefined): PlacementRequest => {
    const merged = { ...options.placement, ...asked };
    // an adapter's file is fetched by workers on other pages: its URL whole, as the model's is
    const loras = merged.loras?.map((l) => ({ ...l, url: new URL(l.url, pageUrl()).href }));
    return { ...merged, ...(loras && { loras }) };
  };
  /** What a job of these parameters would take from `fromStep` on the workers as they are now. */
  const estimateOf = async (
    params: JobParams,
    placement: PlacementRequest,
    { promptEmbeds, negativePromptEmbeds, outputType = 'video' }: JobRequest,
    fromStep = 0,
  ): Promise<JobEstimate> => {
    transformer(); // a folder without one runs no job: it says so before anything is forecast
    const { stepMs, loadBytes } = placer.forecast(params, placement);
    const prompts = [promptEmbeds ? null : params.prompt];
    if (usesGuidance(params)) prompts.push(negativePromptEmbeds ? null : params.negativePrompt);
    const promptTokens = await Promise.all(
      prompts.map((p) => (p === null ? Promise.resolve(0) : textEncoding.tokensToRun(p))),
    );
    const latentValues = sizeOf(latentShape(params, family.latent));
    return estimateJob(
      {
        steps: params.steps - fromStep,
        stepMs,
        promptTokens,
        loadBytes,
        decodedValues: outputType === 'video' ? latentValues : 0,
      },
      rates,
    );
  };

  return {
    config,
    family,
    get executor() {
      return placer.current;
    },
    async estimate(request) {
      const { placement: asked, ...given } = request;
      const { promptEmbeds: _p, negativePromptEmbeds: _n, outputType: _o, image: _i, ...input } = given;
      return estimateOf(paramsOf(input), placementOf(asked), given);
    },
    rehearseAhead({
      placement: asked,
      promptEmbeds: _p,
      negativePromptEmbeds: _n,
      outputType: _o,
      image: _i,
      ...input
    }) {
      return placer.rehearseAhead(paramsOf(input), placementOf(asked));
    },
    async generate(request) {
      const { placement: asked, resume, onCheckpoint, onFailure, onProgress, onPhase, signal, ...given } = request;
      // what is left is the job's parameters: the report and the store keep them, so nothing else may stay
      const { promptEmbeds, negativePromptEmbeds, outputType = 'video', image, ...input } = given;
      const params = paramsOf(input);
      const placementRequest = placementOf(asked);
      const estimate = await estimateOf(params, placementRequest, given, resume?.step);
      const clock = phaseClock((phase) => tell(phase));
      /** a phase's news, with what is left of the job by the estimate */
      const tell = (phase: JobPhase, detail?: string) =>
        onPhase?.(phase, detail, timeLeft(estimate, phase, clock.inPhaseMs()));
      placer.startJob({ step: resume?.step ?? 0, onFailure });
      // the weights, the prompts and the decoder first: what a job cannot do is refused before any worker is asked (a
      // truncated shard fails the job here, naming the file, not a worker that loads it)
      await openTransformer(files);
      clock.enter('encoding');
      const encoded = [
        await embed(promptEmbeds, params.prompt, 'promptEmbeds', (detail) => tell('encoding', `the prompt: ${detail}`)),
      ];
      if (usesGuidance(params))
        encoded.push(
          await embed(negativePromptEmbeds, params.negativePrompt, 'negativePromptEmbeds', (detail) =>
            tell('encoding', `the negative prompt: ${detail}`),
          ),
        );
      if (outputType === 'video') await videoDecoding.ready();
      const firstFrame = image && (await imageCondition(image, params, (detail) => tell('encoding', detail)));

      clock.enter('placing');
      await placer.place(params, placementRequest);
      const setupMs = clock.elapsedMs();
      const job = ++jobs;
      const shape = latentShape(params, family.latent);
      const texts = encoded.map((e) => e.embeds);
      const meshProbe = await placer.prepare(job, texts, shape, params, placementRequest);

      clock.enter('denoising');
      const sampling = jobSolver(solver, params);
      const denoised = await denoise({
        placer,
        job,
        params,
        shape,
        grid: tokenGrid(transformer(), shape),
        firstFrame,
        solver: sampling,
        resume,
        signal,
        onCheckpoint,
        // the steps' own estimate, and the decoding after them
        onProgress: onProgress && ((p) => onProgress({ ...p, etaMs: p.etaMs + (estimate.phasesMs.decoding ?? 0) })),
      });
      // a job that ran on one placement throughout is what the next of its shape there is predicted from
      if (!denoised.failures.length && !denoised.rebalances.length) placer.measuredStep(params, denoised.medianStepMs);

      const executor = defined(placer.current, 'the placement the job ran on');
      // a job that asks for the latent has neither phase, and says none
      let decoded: DecodeResult | null = null;
      let video: Blob | null = null;
      if (outputType === 'video') {
        clock.enter('decoding');
        decoded = await videoDecoding.decode(denoised.latent, {
          ep: executor.placement.ep,
          onProgress: (p) => tell('decoding', describeDecodeProgress(p)),
        });
        clock.enter('muxing');
        video = await (options.encodeVideo ?? encodeWebM)(decoded.frames, { fps: family.fps });
      }
      clock.enter(null);
      const frames = decoded?.frames ?? null;
      const { latent, steps, spotChecks, medianStepMs, rebalances } = denoised;
      const { failures } = placer;
      const report: GenerateReport = {
        config: {
          ...params,
          backend,
          model: modelUrl,
          family: family.name,
          latentShape: shape,
          fps: family.fps,
          outputType,
          promptEmbeds: promptEmbeds ? 'given' : 'encoded',
        },
        placement: executor.placement,
        meshProbe,
        decoding: decoded?.report ?? null,
        encoding: { prompt: encoded[0].report, negativePrompt: encoded.at(1)?.report ?? null },
        schedule: { scheduler: sampling.kind, ...scheduleOf(sampling, params.steps, params.flowShift) },
        workers: workersReport(executor, steps),
        links: executor.linkReport(),
        steps,
        medianStepMs,
        resumedFromStep: resume?.step ?? 0,
        failures,
        recoveryMs: failures.reduce((t, f) => t + f.replanMs, 0),
        rebalances,
        spotChecks,
        coordinatorActivationBytes: 0,
        cache: cacheReport(executor.placement.cache, denoised.cacheForwards, params.steps, passesPerStep(params)),
        spotCheckOdds: spotCheckOdds(
          executor.placement.spotChecks.rate,
          params.steps,
          passesPerStep(params),
          // who may recompute a forward: every rank, or with pipeline stages a stage's holders
          executor.layout.stageHolders(0).length,
        ),
        setupMs,
        phasesMs: clock.phasesMs,
        totalMs: clock.elapsedMs(),
        latentShape: shape,
        latentSha256: await sha256(latent.data),
        estimate,
      };
      rates.record(report);
      return { video, latent: latent.data, frames, report };
    },
    async decode(latent, options) {
      placer.startJob();
      await videoDecoding.ready();
      return videoDecoding.decode(latent, options);
    },
    async shutdown(opts) {
      offBans?.();
      await placer.shutdown({ ...opts, close: true });
    },
  };
}

/** Where a job's time goes, phase by phase, each phase announced as it begins. */
function phaseClock(onPhase?: (phase: JobPhase) => void) {
  const started = performance.now();
  const phasesMs: Record<JobPhase, number> = { encoding: 0, placing: 0, denoising: 0, decoding: 0, muxing: 0 };
  let phase: { name: JobPhase; since: number } | null = null;
  return {
    phasesMs,
    elapsedMs: () => performance.now() - started,
    inPhaseMs: () => (phase ? performance.now() - phase.since : 0),
    enter(name: JobPhase | null) {
      const now = performance.now();
      if (phase) phasesMs[phase.name] += now - phase.since;
      phase = name && { name, since: now };
      if (name) onPhase?.(name);
    },
  };
}

/** Each rank's worker as it loaded the model, with the most memory its page held during the job's steps. */
function workersReport(executor: Executor, steps: { ranks: RankReport[] }[]): GenerateReport['workers'] {
  return executor.workers.map((w) => ({
    id: w.id,
    kind: w.kind ?? 'tab',
    ...(w.host !== undefined && { host: w.host }),
    ...(w.nativeDevice !== undefined && { nativeDevice: w.nativeDevice }),
    ep: w.ep,
    adapter: w.adapter,
    why: w.why,
    threads: w.threads,
    inMemory: w.inMemory,
    loadMs: w.loadMs,
    weights: w.weights,
    maxBufferBytes: w.maxBufferBytes,
    weightType: w.weightType,
    gpuWeightBytes: w.gpuWeightBytes,
    heldWeightBytes: w.heldWeightBytes,
    peakMemoryBytes: steps
      .flatMap((s) => s.ranks)
      .filter((r) => r.worker === w.id)
      .reduce<number | null>((peak, r) => maxOrNull(peak, r.peakMemoryBytes), null),
  }));
}

async function sha256(data: Float32Array): Promise<string> {
  const digest = await crypto.subtle.digest('SHA-256', data.slice());
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}
