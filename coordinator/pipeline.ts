import { jobParams, latentShape, usesGuidance, type JobParams } from '../core/job.ts';
import { parseWanConfig, type WanConfig } from '../core/model/config.ts';
import { fetchModelFiles, readJson } from '../core/model/files.ts';
import { loadTextEncoder } from '../core/model/text-encoder.ts';
import { TRANSFORMER_CONFIG } from '../core/model/transformer.ts';
import { loadVaeDecoder, type DecodedVideo } from '../core/model/vae-decoder.ts';
import { eulerStep, flowMatchSchedule, guide, initialNoise } from '../core/scheduler.ts';
import type { Tensor } from '../core/tensor.ts';
import type { ExecutionProvider } from '../worker/onnx-stages.ts';
import { createExecutor, type Backend } from './backends.ts';
import type { Executor, RankReport } from './executor.ts';
import type { Swarm } from './swarm.ts';
import { encodeWebM } from './video.ts';

/**
 * prompt → text encoder → denoising loop (each step one or two DiT forward passes on the
 * executor) → VAE decoder → WebM. The pipeline reads like the sampler; the executor hides where
 * the transformer runs.
 */
export interface PipelineOptions {
  /** URL of a diffusers-layout model folder; the bundled tiny model by default */
  model?: string;
  backend?: Backend;
  /** the swarm the `swarm` backend draws workers from */
  swarm?: Swarm;
  /** number of workers (= Ulysses degree); 'auto' uses as many as the live workers allow */
  workers?: number | 'auto';
  parallel?: { ulyssesDegree?: number | 'auto' };
  ep?: ExecutionProvider | 'auto';
  placementTimeoutMs?: number;
  rpcTimeoutMs?: number;
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
  onProgress?(p: StepProgress): void;
  onPhase?(phase: 'placing' | 'encoding' | 'denoising' | 'decoding' | 'muxing'): void;
  signal?: AbortSignal;
}

export interface GenerateReport {
  config: JobParams & { backend: Backend; workers: number; ulyssesDegree: number; model: string };
  workers: { id: string; ep: string; adapter: string }[];
  steps: { ms: number; ranks: RankReport[] }[];
  setupMs: number;
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
  readonly executor: Executor;
  generate(request: GenerateRequest): Promise<GenerateResult>;
  shutdown(options?: { graceMs?: number }): Promise<void>;
}

export const DEFAULT_MODEL_URL = '/models/tiny-wan';

export async function createPipeline(options: PipelineOptions = {}): Promise<Pipeline> {
  const backend = options.backend ?? 'local';
  const modelUrl = new URL(options.model ?? DEFAULT_MODEL_URL, globalThis.location?.href).href;
  const files = fetchModelFiles(modelUrl);
  const config = parseWanConfig(await readJson(files, TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
  const [textEncoder, decode] = await Promise.all([loadTextEncoder(files), loadVaeDecoder(files)]);
  const flowShift = ((await readJson(files, 'model_index.json')) as { flow_shift?: number }).flow_shift;
  const executor = createExecutor(
    backend,
    {
      config,
      modelUrl,
      ulyssesDegree: options.parallel?.ulyssesDegree ?? options.workers ?? 'auto',
      ep: options.ep,
      placementTimeoutMs: options.placementTimeoutMs,
      rpcTimeoutMs: options.rpcTimeoutMs,
    },
    options.swarm,
  );
  let ready: Promise<void> | null = null;
  let jobs = 0;

  return {
    config,
    executor,
    async generate(request) {
      const params = jobParams({ flowShift, ...stripCallbacks(request) });
      const started = performance.now();
      request.onPhase?.('placing');
      ready ??= executor.initialize();
      await ready;
      const setupMs = performance.now() - started;
      const job = ++jobs;
      request.onPhase?.('encoding');
      const texts = [textEncoder.encode(params.prompt)];
      if (usesGuidance(params)) texts.push(textEncoder.encode(params.negativePrompt));
      await executor.prepareJob(job, texts);

      request.onPhase?.('denoising');
      const shape = latentShape(params, config.inChannels);
      let latent: Tensor = initialNoise(shape, params.seed);
      const schedule = flowMatchSchedule(params.steps, params.flowShift);
      const steps: GenerateReport['steps'] = [];
      const loopStart = performance.now();
      for (let step = 0; step < params.steps; step++) {
        request.signal?.throwIfAborted();
        const stepStart = performance.now();
        const timestep = schedule.timesteps[step];
        const cond = await executor.executeModel({ job, step, pass: 0, timestep, latent });
        let velocity = cond.output.data;
        const ranks = cond.ranks;
        if (usesGuidance(params)) {
          const uncond = await executor.executeModel({ job, step, pass: 1, timestep, latent });
          velocity = guide(cond.output.data, uncond.output.data, params.guidance);
          uncond.ranks.forEach((r, i) => {
            ranks[i] = { ...ranks[i], computeMs: ranks[i].computeMs + r.computeMs, commMs: ranks[i].commMs + r.commMs, bytesSent: ranks[i].bytesSent + r.bytesSent };
          });
        }
        latent = { shape, data: eulerStep(latent.data, velocity, schedule.sigmas[step], schedule.sigmas[step + 1]) };
        const stepMs = performance.now() - stepStart;
        steps.push({ ms: stepMs, ranks });
        const elapsedMs = performance.now() - loopStart;
        request.onProgress?.({ step: step + 1, steps: params.steps, stepMs, elapsedMs, etaMs: (elapsedMs / (step + 1)) * (params.steps - step - 1), ranks });
      }

      request.onPhase?.('decoding');
      const frames = decode(latent);
      request.onPhase?.('muxing');
      const video = await encodeWebM(frames);
      return {
        video,
        latent: latent.data,
        frames,
        report: {
          config: { ...params, backend, workers: executor.world, ulyssesDegree: executor.world, model: modelUrl },
          workers: executor.workers.map((w) => ({ id: w.id, ep: w.ep, adapter: w.adapter })),
          steps,
          setupMs,
          totalMs: performance.now() - started,
          latentShape: shape,
          latentSha256: await sha256(latent.data),
        },
      };
    },
    async shutdown(opts) {
      await executor.shutdown(opts);
    },
  };
}

function stripCallbacks(request: GenerateRequest): Partial<JobParams> {
  const { onProgress: _p, onPhase: _f, signal: _s, ...params } = request;
  return params;
}

async function sha256(data: Float32Array): Promise<string> {
  const digest = await crypto.subtle.digest('SHA-256', data.slice());
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}
