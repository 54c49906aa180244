// The coordinator pipeline's sampler run in Node: text encoder → seeded noise → flow-matching
// Euler steps with classifier-free guidance, each forward pass through the same ONNX stage graphs
// and Ulysses split the workers run (all ranks in this process) → VAE decoder. For evaluating a
// model fast, without browsers.
import { usesGuidance, type JobParams } from '../core/job.ts';
import { latentShape, wan21Latent } from '../core/model/family.ts';
import type { ModelFiles } from '../core/model/files.ts';
import type { WanConfig } from '../core/model/config.ts';
import type { WanModel } from '../core/model/reference.ts';
import { loadTransformer } from '../core/model/transformer.ts';
import type { DecodedVideo } from '../core/model/vae-decoder.ts';
import { loadWanPipelineParts, type WanPipelineParts } from '../core/model/wan-pipeline.ts';
import { guide, sample } from '../core/sampler.ts';
import type { Tensor } from '../core/tensor.ts';
import { memoryExchanges } from '../rank/exchange/memory.ts';
import { onnxStages } from '../rank/onnx-stages.ts';
import { serialStages, type StageRunner } from '../rank/stages.ts';
import { forwardInProcess, type Exchange } from '../rank/ulysses.ts';
import { displacedAttention, KeysValuesHistory } from '../rank/displaced.ts';
import { forwardInPatches, PatchKeysValues } from '../rank/pipefusion.ts';
import { attendsStale, type UlyssesPlan } from '../core/parallel.ts';
import type { DType } from '../core/net/protocol.ts';
import { cacheSchedule } from '../core/step-cache.ts';
import { defined } from '../core/defined.ts';
import type { PlacedStepCache } from '../coordinator/placement.ts';

export interface LoadedModel extends WanPipelineParts {
  /** the transformer's config: a model this process samples with has one */
  config: WanConfig;
  transformer: WanModel;
  stages: StageRunner;
}

export async function loadModel(files: ModelFiles): Promise<LoadedModel> {
  const [transformer, parts] = await Promise.all([loadTransformer(files), loadWanPipelineParts(files)]);
  // its ranks in this process share one engine's sessions, a stage at a time, as a worker's engine runs them
  return {
    ...parts,
    config: transformer.config,
    transformer,
    stages: serialStages(await onnxStages(transformer, 'wasm')),
  };
}

export type SampleParams = Pick<
  JobParams,
  'prompt' | 'negativePrompt' | 'frames' | 'height' | 'width' | 'steps' | 'guidance' | 'seed'
> & {
  ranks?: number;
  /** displaced mode (rank/displaced.ts) past this many exact steps, as the executor runs it; Ulysses without it */
  displaced?: { warmupSteps: number };
  /** PipeFusion's patches (rank/pipefusion.ts) past this many exact steps, as pipeline stages run them; one rank */
  pipeFusion?: { patches: number; warmupSteps: number };
  /** how activations go between the ranks */
  dtype?: DType;
  /** a step cache, as the coordinator schedules it (core/step-cache.ts); every forward computed without it */
  cache?: PlacedStepCache;
};

export async function sampleVideo(m: LoadedModel, p: SampleParams): Promise<{ latent: Tensor; video: DecodedVideo }> {
  const cfg = m.transformer.config;
  const textEncoder = await m.textEncoder();
  const texts = [textEncoder.encode(p.prompt), textEncoder.encode(p.negativePrompt)];
  const ranks = p.ranks ?? 1;
  const histories = Array.from({ length: ranks }, () => new KeysValuesHistory());
  if (p.pipeFusion && (ranks !== 1 || p.displaced || p.cache))
    throw new Error('PipeFusion samples on one rank, without displaced mode or a step cache, as its stages run');
  const patchKeysValues = new PatchKeysValues();
  const passes = usesGuidance(p) ? 2 : 1;
  const schedule = p.cache && cacheSchedule(p.cache.curve, p.cache.settings, p.steps, passes);
  const kept = [new Map<number, Float32Array>(), new Map<number, Float32Array>()]; // per pass, per rank
  /** per pass, the last step whose blocks ran: displaced ranks hold its keys and values */
  const lastRan = new Map<number, number>();
  const residualOf = (step: number, pass: number) => (rank: number) => {
    const mode = schedule?.[step][pass];
    if (!mode) return undefined;
    return mode === 'reuse'
      ? { reuse: defined(kept[pass].get(rank), 'a residual kept before it is reused') }
      : { keep: (r: Float32Array) => kept[pass].set(rank, r) };
  };
  const latent = await sample({
    shape: latentShape(p, wan21Latent(cfg.inChannels)),
    steps: p.steps,
    flowShift: m.flowShift,
    seed: p.seed,
    async velocity({ step, timestep, latent }) {
      // as the executor decides it: stale where the pass's step before ran its blocks on these ranks
      const stale = (pass: number) =>
        !!p.displaced && attendsStale('displaced', p.displaced.warmupSteps, step, lastRan.get(pass));
      const attendOf = (pass: number, isStale: boolean) => (exchange: Exchange, plan: UlyssesPlan) =>
        displacedAttention(cfg, plan, m.stages, exchange, histories[exchange.rank], { step, pass, stale: isStale });
      const forward = (pass: number) => {
        if (p.pipeFusion) {
          const { patches, warmupSteps } = p.pipeFusion;
          const count = attendsStale('pipefusion', warmupSteps, step, lastRan.get(pass)) ? patches : 1;
          lastRan.set(pass, step);
          const tag = { job: 0, step, pass };
          return forwardInPatches(cfg, m.stages, { latent, timestep, text: texts[pass], tag }, count, patchKeysValues);
        }
        const isStale = stale(pass);
        if (schedule?.[step][pass] !== 'reuse') lastRan.set(pass, step);
        return forwardInProcess(
          cfg,
          m.stages,
          memoryExchanges(ranks, p.dtype),
          latent,
          timestep,
          texts[pass],
          { job: 0, step, pass },
          ranks,
          p.displaced ? attendOf(pass, isStale) : undefined,
          residualOf(step, pass),
        );
      };
      const cond = (await forward(0)).data;
      return usesGuidance(p) ? guide(cond, (await forward(1)).data, p.guidance) : cond;
    },
  });
  return { latent, video: (await m.decoder())(latent) };
}
