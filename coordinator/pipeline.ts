import { jobParams, latentShape, usesGuidance, type JobParams } from '../core/job.ts';
import { parseWanConfig, type WanConfig } from '../core/model/config.ts';
import { candidatePlans, planSwarm, type Hardware, type LinkSpeed, type Workload } from '../core/cost-model.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { defaultDegree } from '../core/parallel.ts';
import { fetchModelFiles, readJson } from '../core/model/files.ts';
import { loadTextEncoder } from '../core/model/text-encoder.ts';
import { TRANSFORMER_CONFIG } from '../core/model/transformer.ts';
import { loadVaeDecoder, type DecodedVideo } from '../core/model/vae-decoder.ts';
import { eulerStep, flowMatchSchedule, guide, initialNoise } from '../core/scheduler.ts';
import type { DType } from '../core/net/protocol.ts';
import type { Tensor } from '../core/tensor.ts';
import type { ExecutionProvider } from '../rank/onnx-stages.ts';
import { createExecutor, type Backend } from './backends.ts';
import type { Executor, LinkReport, LostRank, RankReport } from './executor.ts';
import type { WorkerMeasurement } from './measure.ts';
import type { Swarm } from './swarm.ts';
import { encodeWebM } from './video.ts';
import { fitMeshProbe, type MeshProbe } from '../rank/mesh-probe.ts';

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
}

export interface StepProgress {
  step: number; // 1-based, completed
  steps: number;
  stepMs: number;
  elapsedMs: number;
  etaMs: number;
  ranks: RankReport[];
}

/** How the degree of an 'auto' job was chosen, and what the cost model expected of it. */
export interface PlannedDegree {
  /** Ulysses degree (of each group with CFG parallel) */
  degree: number;
  cfgParallel: boolean;
  by: string;
  /** the rank-to-rank link planned with: a mesh probe of an earlier placement, or the coordinator's links as a stand-in */
  link: LinkSpeed & { from: 'mesh probe' | 'coordinator links' };
  predictedStepMs: number | null;
  oneWorkerStepMs: number | null;
}

/** How a lost rank was noticed and what the re-plan cost. */
export interface FailureRecord {
  step: number;
  error: string;
  lost: LostRank[];
  /** when the pipeline saw the failure (ms since the epoch) */
  detectedAt: number;
  degreeBefore: number;
  degreeAfter: number;
  replanMs: number;
}

export interface GenerateRequest extends Partial<JobParams> {
  /** continue a job from a checkpoint: `step` steps done, `latent` after them */
  resume?: { step: number; latent: Float32Array };
  onCheckpoint?(c: { step: number; latent: Float32Array }): void;
  onFailure?(f: FailureRecord): void;
  onProgress?(p: StepProgress): void;
  onPhase?(phase: 'placing' | 'encoding' | 'denoising' | 'decoding' | 'muxing'): void;
  signal?: AbortSignal;
}

export interface GenerateReport {
  /** workers = ulyssesDegree, ×2 with cfgParallel */
  config: JobParams & { backend: Backend; workers: number; ulyssesDegree: number; cfgParallel: boolean; model: string };
  workers: { id: string; ep: string; adapter: string }[];
  /** which links of the last placement were direct data channels and which went through the relay */
  links: LinkReport[];
  /** the cost model's choice of degree when it was 'auto' (null when asked for, or unmeasured) */
  plan: PlannedDegree | null;
  /** why the job did not run CFG parallel although it was asked for (null when it did, or was not asked) */
  cfgFallback: string | null;
  /** the all-to-all timed on this placement's mesh before its first job (null for one rank or a local backend) */
  meshProbe: { ranks: MeshProbe[]; link: LinkSpeed } | { error: string } | null;
  steps: { step: number; ms: number; ranks: RankReport[] }[];
  resumedFromStep: number;
  failures: FailureRecord[];
  /** time spent re-planning after lost ranks */
  recoveryMs: number;
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

/** The trained demo model: its videos show what a prompt of its small grammar asks (demo/world.ts). */
export const DEFAULT_MODEL_URL = '/models/tiny-wan-demo';

export async function createPipeline(options: PipelineOptions = {}): Promise<Pipeline> {
  const backend = options.backend ?? 'local';
  const modelUrl = new URL(options.model ?? DEFAULT_MODEL_URL, globalThis.location?.href).href;
  const files = fetchModelFiles(modelUrl);
  const config = parseWanConfig(await readJson(files, TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
  const [textEncoder, decode] = await Promise.all([loadTextEncoder(files), loadVaeDecoder(files)]);
  const flowShift = ((await readJson(files, 'model_index.json')) as { flow_shift?: number }).flow_shift;
  /** executors that lost a rank while placed: the next job places afresh instead of failing on the gone rank */
  const lostARank = new WeakSet<Executor>();
  const cfgAsked = options.parallel?.cfgParallel;
  if (cfgAsked && backend !== 'swarm') throw new Error(`cfgParallel needs two groups of worker pages: use the swarm backend, not ${backend}`);
  const newExecutor = (ulyssesDegree: number | 'auto', cfgParallel = false) => {
    const created = createExecutor(
      backend,
      { config, modelUrl, ulyssesDegree, cfgParallel, ep: options.ep, dtype: options.dtype, placementTimeoutMs: options.placementTimeoutMs, rpcTimeoutMs: options.rpcTimeoutMs },
      options.swarm,
    );
    created.onFailure(() => lostARank.add(created));
    return created;
  };
  const asked = options.parallel?.ulyssesDegree ?? options.workers ?? 'auto';
  let executor = newExecutor(asked, cfgAsked === true);
  let ready: Promise<void> | null = null;
  let jobs = 0;
  /** executors whose mesh was probed (once each) */
  const probed = new WeakSet<Executor>();

  /**
   * On a new swarm placement of several ranks, time an all-to-all on its mesh before the first
   * step: the swarm keeps it as the cost model's rank-to-rank link for the next plans. A failed
   * probe costs nothing: a lost rank shows again in the first step, which re-plans.
   */
  async function probeNewMesh(job: number): Promise<GenerateReport['meshProbe']> {
    if (!options.swarm || backend !== 'swarm' || executor.groupSize < 2 || probed.has(executor)) return null;
    probed.add(executor);
    try {
      const ranks = await executor.probeMesh(job);
      const fits = ranks.map(fitMeshProbe);
      const link = { bandwidth: Math.min(...fits.map((f) => f.bandwidth)), latency: Math.max(...fits.map((f) => f.latency)) };
      options.swarm.meshLink = { ...link, ranks: ranks.length, at: Date.now() };
      return { ranks, link };
    } catch (e) {
      return { error: (e as Error).message };
    }
  }

  /**
   * 'auto' on a swarm: the degree the cost model predicts fastest for this job, from the workers'
   * measured throughput and links (never a plan predicted slower than one worker). Until every
   * live worker has been measured, the largest valid degree.
   */
  function planFor(params: JobParams, cfgParallel: boolean | undefined): PlannedDegree | null {
    const workers = options.swarm?.workers() ?? [];
    // CFG parallel asked for but not two workers yet: the executor waits for them when it places
    if (workers.length < (cfgParallel ? 2 : 1)) return null;
    const measured = workers.map((w) => w.measurement);
    const coordinatorLinks = { bandwidth: Math.min(...measured.map((m) => m?.bandwidth ?? Infinity)), latency: Math.max(...measured.map((m) => m?.rttMs ?? 0)) / 2000 };
    const probe = options.swarm?.meshLink;
    const link = probe ? { bandwidth: probe.bandwidth, latency: probe.latency, from: 'mesh probe' as const } : { ...coordinatorLinks, from: 'coordinator links' as const };
    if (measured.some((m) => !m)) return { degree: defaultDegree(config.numHeads, cfgParallel ? Math.floor(workers.length / 2) : workers.length), cfgParallel: !!cfgParallel, by: 'largest valid degree (workers not measured yet)', link, predictedStepMs: null, oneWorkerStepMs: null };
    const work: Workload = { model: config, tokens: tokenGrid(config, latentShape(params, config.inChannels)).count, textTokens: textEncoder.maxLength, passes: usesGuidance(params) ? 2 : 1 };
    // the EP each worker will run on: WebGPU where it has one, unless the job asks for WebAssembly
    const epOf = (m: WorkerMeasurement) => (options.ep !== 'wasm' && m.flops.webgpu ? 'webgpu' : 'wasm');
    const hw: Hardware = {
      workerFlops: measured.map((m) => m!.flops[epOf(m!)] ?? 0),
      workerSoftmaxRates: measured.map((m) => m!.softmaxRate?.[epOf(m!)] ?? Infinity),
      link,
      bytesPerElement: options.dtype === 'f16' ? 2 : 4,
    };
    const choice = planSwarm(work, hw, candidatePlans(work, workers.length).filter((p) => cfgParallel === undefined || p.cfgParallel === cfgParallel));
    // one worker is always ranked; asked for CFG parallel, the fastest CFG-parallel plan
    const best = cfgParallel ? choice.ranked.find((p) => p.plan.cfgParallel)! : choice.best;
    return { degree: best.plan.ulyssesDegree, cfgParallel: best.plan.cfgParallel, by: `cost model (rank links from ${link.from})`, link, predictedStepMs: best.stepS * 1000, oneWorkerStepMs: choice.baseline.stepS * 1000 };
  }

  /** Places the executor once; a failed placement must not poison the next job, so it starts afresh. */
  function place(): Promise<void> {
    ready ??= executor.initialize().catch(async (e: Error) => {
      ready = null;
      await executor.shutdown({ graceMs: 500 }).catch(() => {});
      executor = newExecutor(executor.options.ulyssesDegree ?? asked, executor.options.cfgParallel);
      throw e;
    });
    return ready;
  }

  /**
   * A lost rank costs one step, not the job: let the survivors go, place again on the workers that
   * are live (largest valid degree, down to one, without CFG parallel), and run the step again
   * from the kept latent.
   */
  async function replan(job: number, texts: Float32Array[], shape: number[], error: Error, step: number): Promise<FailureRecord | null> {
    const detectedAt = Date.now();
    const lost = await executor.lostRanks(error);
    if (!lost.length) return null;
    const before = executor;
    const record: FailureRecord = {
      step,
      error: error.message,
      lost,
      detectedAt,
      degreeBefore: before.world,
      degreeAfter: 0,
      replanMs: 0,
    };
    const replanStart = performance.now();
    await before.shutdown({ graceMs: 1_000 });
    executor = newExecutor('auto');
    ready = null;
    await place();
    await executor.prepareJob(job, texts, shape);
    record.degreeAfter = executor.world;
    record.replanMs = performance.now() - replanStart;
    return record;
  }

  return {
    config,
    get executor() {
      return executor;
    },
    async generate(request) {
      const params = jobParams({ flowShift, ...stripCallbacks(request) });
      const started = performance.now();
      request.onPhase?.('placing');
      // workers that joined since the last placement, or came back after a re-plan shrank it, count from the next job
      const guided = usesGuidance(params);
      const plan = asked !== 'auto' || backend !== 'swarm' ? null : planFor(params, cfgAsked === undefined ? undefined : cfgAsked && guided);
      const layout = jobLayout({ ulyssesDegree: asked, cfgParallel: cfgAsked }, guided, plan);
      if (plan && layout.cfgFallback) plan.by += `; ${layout.cfgFallback}`;
      const placed = { ulyssesDegree: executor.options.ulyssesDegree, cfgParallel: !!executor.options.cfgParallel };
      const wanted = layout.ulyssesDegree !== 'auto' ? layout.ulyssesDegree : executor.groupSize;
      const relayout = !ready
        ? layout.ulyssesDegree !== placed.ulyssesDegree || layout.cfgParallel !== placed.cfgParallel
        : wanted !== executor.groupSize || layout.cfgParallel !== placed.cfgParallel || lostARank.has(executor);
      if (backend === 'swarm' && relayout) {
        await executor.shutdown({ graceMs: 1_000 });
        executor = newExecutor(layout.ulyssesDegree, layout.cfgParallel);
        ready = null;
      }
      await place();
      const setupMs = performance.now() - started;
      const job = ++jobs;
      request.onPhase?.('encoding');
      const texts = [textEncoder.encode(params.prompt)];
      if (guided) texts.push(textEncoder.encode(params.negativePrompt));
      const shape = latentShape(params, config.inChannels);
      await executor.prepareJob(job, texts, shape);
      const meshProbe = await probeNewMesh(job);

      request.onPhase?.('denoising');
      const first = request.resume?.step ?? 0;
      let latent: Tensor = request.resume ? { shape, data: request.resume.latent } : initialNoise(shape, params.seed);
      const schedule = flowMatchSchedule(params.steps, params.flowShift);
      const steps: GenerateReport['steps'] = [];
      const failures: FailureRecord[] = [];
      const loopStart = performance.now();
      for (let step = first; step < params.steps; step++) {
        request.signal?.throwIfAborted();
        const stepStart = performance.now();
        let velocity: Float32Array;
        let ranks: RankReport[];
        for (;;) {
          try {
            ({ velocity, ranks } = await denoiserVelocity(executor, { job, step, timestep: schedule.timesteps[step], latent }, params.guidance, guided));
            break;
          } catch (e) {
            const failure = failures.length < MAX_REPLANS ? await replan(job, texts, shape, e as Error, step) : null;
            if (!failure) throw e;
            failures.push(failure);
            request.onFailure?.(failure);
          }
        }
        latent = { shape, data: eulerStep(latent.data, velocity, schedule.sigmas[step], schedule.sigmas[step + 1]) };
        const stepMs = performance.now() - stepStart;
        steps.push({ step, ms: stepMs, ranks });
        request.onCheckpoint?.({ step: step + 1, latent: latent.data });
        const elapsedMs = performance.now() - loopStart;
        const done = step + 1 - first;
        request.onProgress?.({ step: step + 1, steps: params.steps, stepMs, elapsedMs, etaMs: (elapsedMs / done) * (params.steps - step - 1), ranks });
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
          config: { ...params, backend, workers: executor.world, ulyssesDegree: executor.groupSize, cfgParallel: !!executor.options.cfgParallel, model: modelUrl },
          plan,
          cfgFallback: layout.cfgFallback,
          meshProbe,
          workers: executor.workers.map((w) => ({ id: w.id, ep: w.ep, adapter: w.adapter })),
          links: executor.linkReport(),
          steps,
          resumedFromStep: first,
          failures,
          recoveryMs: failures.reduce((t, f) => t + f.replanMs, 0),
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

const MAX_REPLANS = 8;

/** Where a job's passes run: the planner's choice for 'auto', else what was asked; CFG parallel only with two passes. */
export function jobLayout(
  asked: { ulyssesDegree: number | 'auto'; cfgParallel?: boolean },
  guided: boolean,
  plan: PlannedDegree | null,
): { ulyssesDegree: number | 'auto'; cfgParallel: boolean; cfgFallback: string | null } {
  const cfgFallback = asked.cfgParallel && !guided ? 'no CFG parallel: guidance 1 means one forward pass per step, so there is no second pass for a second group' : null;
  if (plan) return { ulyssesDegree: plan.degree, cfgParallel: plan.cfgParallel && guided, cfgFallback };
  return { ulyssesDegree: asked.ulyssesDegree, cfgParallel: !!asked.cfgParallel && guided, cfgFallback };
}

/**
 * One denoising step's velocity: the conditional pass, and with guidance the unconditional one —
 * at the same time on their two groups with CFG parallel, where `guide` is the step's one exchange.
 */
export async function denoiserVelocity(
  executor: Executor,
  at: { job: number; step: number; timestep: number; latent: Tensor },
  guidance: number,
  guided: boolean,
): Promise<{ velocity: Float32Array; ranks: RankReport[] }> {
  if (guided && executor.options.cfgParallel) {
    const [cond, uncond] = await Promise.all([executor.executeModel({ ...at, pass: 0 }), executor.executeModel({ ...at, pass: 1 })]);
    return { velocity: guide(cond.output.data, uncond.output.data, guidance), ranks: [...cond.ranks, ...uncond.ranks] };
  }
  const cond = await executor.executeModel({ ...at, pass: 0 });
  if (!guided) return { velocity: cond.output.data, ranks: cond.ranks };
  const uncond = await executor.executeModel({ ...at, pass: 1 });
  const ranks = cond.ranks.map((r, i) => ({
    ...r,
    computeMs: r.computeMs + uncond.ranks[i].computeMs,
    commMs: r.commMs + uncond.ranks[i].commMs,
    bytesSent: r.bytesSent + uncond.ranks[i].bytesSent,
  }));
  return { velocity: guide(cond.output.data, uncond.output.data, guidance), ranks };
}

function stripCallbacks(request: GenerateRequest): Partial<JobParams> {
  const { onProgress: _p, onPhase: _f, signal: _s, resume: _r, onCheckpoint: _c, onFailure: _x, ...params } = request;
  return params;
}

async function sha256(data: Float32Array): Promise<string> {
  const digest = await crypto.subtle.digest('SHA-256', data.slice());
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}
