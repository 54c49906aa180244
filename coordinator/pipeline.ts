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
import { sample } from '../core/sampler.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';
import type { Backend } from './backends.ts';
import type { Executor, LinkReport, RankReport } from './executor.ts';
import { Placer, type FailureRecord, type MeshProbeReport, type PlacementRequest, type PlannedDegree } from './placement.ts';
import type { Swarm } from './swarm.ts';
import { encodeWebM } from './video.ts';

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
  /** activations between ranks: 'f32' (default, exact) or 'f16' (half the bytes, ~3e-4 on the tiny model) */
  dtype?: DType;
  placementTimeoutMs?: number;
  rpcTimeoutMs?: number;
  /** the last stage, frames → video file: WebM through WebCodecs unless replaced (Node has no WebCodecs) */
  encodeVideo?(frames: DecodedVideo): Promise<Blob>;
}

export interface StepProgress {
  step: number; // 1-based, completed
  steps: number;
  stepMs: number;
  elapsedMs: number;
  etaMs: number;
  ranks: RankReport[];
}

export interface GenerateRequest extends Partial<JobParams> {
  /** where this job runs, where it differs from the pipeline's options */
  placement?: Partial<PlacementRequest>;
  /** continue a job from a checkpoint: `step` steps done, `latent` after them */
  resume?: { step: number; latent: Float32Array };
  onCheckpoint?(c: { step: number; latent: Float32Array }): void;
  onFailure?(f: FailureRecord): void;
  onProgress?(p: StepProgress): void;
  onPhase?(phase: JobPhase): void;
  signal?: AbortSignal;
}

/** What a job does, in order: placing takes the workers and loads the model; encoding embeds the prompts and prepares the ranks. */
export type JobPhase = 'placing' | 'encoding' | 'denoising' | 'decoding' | 'muxing';

export interface GenerateReport {
  /** workers = ulyssesDegree, ×2 with cfgParallel */
  config: JobParams & { backend: Backend; workers: number; ulyssesDegree: number; cfgParallel: boolean; model: string };
  /** each rank's EP, and why it runs there ("WASM: 21.3 GFLOP/s vs WebGPU 0.2") */
  workers: { id: string; ep: string; adapter: string; why: string; threads: number }[];
  /** which links of the last placement were direct data channels and which went through the relay */
  links: LinkReport[];
  /** the cost model's choice of degree when it was 'auto' (null when asked for, or unmeasured) */
  plan: PlannedDegree | null;
  /** why the job did not run CFG parallel although it was asked for (null when it did, or was not asked) */
  cfgFallback: string | null;
  /** the all-to-all timed on this placement's mesh before its first job (null for one rank or a local backend) */
  meshProbe: MeshProbeReport;
  steps: { step: number; ms: number; ranks: RankReport[] }[];
  resumedFromStep: number;
  failures: FailureRecord[];
  /** time spent re-placing after lost ranks */
  recoveryMs: number;
  setupMs: number;
  /** where the job's time went, phase by phase */
  phasesMs: Record<JobPhase, number>;
  totalMs: number;
  latentShape: number[];
  latentSha256: string;
}

export interface GenerateResult {
  video: Blob;
  latent: Float32Array;
  frames: DecodedVideo;
  report: GenerateReport;
}

export interface Pipeline {
  readonly config: WanConfig;
  /** the current placement's executor, once a job has been placed */
  readonly executor: Executor | null;
  generate(request: GenerateRequest): Promise<GenerateResult>;
  shutdown(options?: { graceMs?: number }): Promise<void>;
}

/** The trained demo model: its videos show what a prompt of its small grammar asks (demo/world.ts). */
export const DEFAULT_MODEL_URL = '/models/tiny-wan-demo';

/** Reads a model folder's transformer config: what a page needs to know of a model before running it (its heads, say). */
export async function loadModelConfig(model: string = DEFAULT_MODEL_URL): Promise<WanConfig> {
  return parseWanConfig(await readJson(fetchModelFiles(new URL(model, globalThis.location?.href).href), TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
}

export async function createPipeline(options: PipelineOptions = {}): Promise<Pipeline> {
  const backend = options.backend ?? 'local';
  const modelUrl = new URL(options.model ?? DEFAULT_MODEL_URL, globalThis.location?.href).href;
  const { config, textEncoder, decode, flowShift } = await loadWanPipelineParts(fetchModelFiles(modelUrl));
  const placer = new Placer({ config, modelUrl, backend, swarm: options.swarm, textTokens: textEncoder.maxLength, placementTimeoutMs: options.placementTimeoutMs, rpcTimeoutMs: options.rpcTimeoutMs });
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
      const { placement: asked, resume, onCheckpoint, onFailure, onProgress, onPhase, signal, ...input } = request;
      const params = jobParams({ flowShift, ...input });
      const started = performance.now();
      const phasesMs: Record<JobPhase, number> = { placing: 0, encoding: 0, denoising: 0, decoding: 0, muxing: 0 };
      let phase: { name: JobPhase; since: number } | null = null;
      const enter = (name: JobPhase | null) => {
        const now = performance.now();
        if (phase) phasesMs[phase.name] += now - phase.since;
        phase = name && { name, since: now };
        if (name) onPhase?.(name);
      };
      enter('placing');
      const { plan, cfgFallback } = await placer.place(params, { ...defaults, ...asked });
      const setupMs = performance.now() - started;
      const job = ++jobs;

      enter('encoding');
      const texts = [textEncoder.encode(params.prompt)];
      if (usesGuidance(params)) texts.push(textEncoder.encode(params.negativePrompt));
      const shape = latentShape(params, config.inChannels);
      const meshProbe = await placer.prepare(job, texts, shape);

      enter('denoising');
      const first = resume?.step ?? 0;
      const steps: GenerateReport['steps'] = [];
      const failures: FailureRecord[] = [];
      const loopStart = performance.now();
      let ranks: RankReport[] = [];
      const latent = await sample({
        shape,
        steps: params.steps,
        flowShift: params.flowShift,
        seed: params.seed,
        resume,
        signal,
        async velocity(at) {
          for (;;) {
            try {
              const result = await placer.current!.velocity({ job, ...at }, params.guidance);
              ranks = result.ranks;
              return result.velocity;
            } catch (e) {
              const failure = await placer.replace(e as Error, at.step);
              if (!failure) throw e;
              failures.push(failure);
              onFailure?.(failure);
            }
          }
        },
        onStep({ step, latent, stepMs }) {
          steps.push({ step: step - 1, ms: stepMs, ranks });
          onCheckpoint?.({ step, latent });
          const elapsedMs = performance.now() - loopStart;
          onProgress?.({ step, steps: params.steps, stepMs, elapsedMs, etaMs: (elapsedMs / (step - first)) * (params.steps - step), ranks });
        },
      });

      enter('decoding');
      const frames = decode(latent);
      enter('muxing');
      const video = await (options.encodeVideo ?? encodeWebM)(frames);
      enter(null);
      const executor = placer.current!;
      return {
        video,
        latent: latent.data,
        frames,
        report: {
          config: { ...params, backend, workers: executor.world, ulyssesDegree: executor.layout.ulyssesDegree, cfgParallel: executor.layout.cfgParallel, model: modelUrl },
          plan,
          cfgFallback,
          meshProbe,
          workers: executor.workers.map((w) => ({ id: w.id, ep: w.ep, adapter: w.adapter, why: w.why, threads: w.threads })),
          links: executor.linkReport(),
          steps,
          resumedFromStep: first,
          failures,
          recoveryMs: failures.reduce((t, f) => t + f.replanMs, 0),
          setupMs,
          phasesMs,
          totalMs: performance.now() - started,
          latentShape: shape,
          latentSha256: await sha256(latent.data),
        },
      };
    },
    shutdown: (opts) => placer.shutdown(opts),
  };
}

async function sha256(data: Float32Array): Promise<string> {
  const digest = await crypto.subtle.digest('SHA-256', data.slice());
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}
