import { latentShape, usesGuidance, type JobParams } from '../core/job.ts';
import { readJson, type ModelFiles } from '../core/model/files.ts';
import type { WanModel } from '../core/model/reference.ts';
import { loadTextEncoder, type TextEncoder } from '../core/model/text-encoder.ts';
import { loadTransformer } from '../core/model/transformer.ts';
import { loadVaeDecoder, type DecodedVideo } from '../core/model/vae-decoder.ts';
import { eulerStep, flowMatchSchedule, guide, initialNoise } from '../core/scheduler.ts';
import type { Tensor } from '../core/tensor.ts';
import { memoryExchanges } from '../rank/exchange/memory.ts';
import { onnxStages } from '../rank/onnx-stages.ts';
import type { StageRunner } from '../rank/stages.ts';
import { forwardInProcess } from '../rank/ulysses.ts';

/**
 * The coordinator pipeline's sampler run in Node: text encoder → seeded noise → flow-matching
 * Euler steps with classifier-free guidance, each forward pass through the same ONNX stage graphs
 * and Ulysses split the workers run (all ranks in this process) → VAE decoder. For evaluating a
 * model fast, without browsers.
 */
export interface LoadedModel {
  transformer: WanModel;
  textEncoder: TextEncoder;
  decode(latent: Tensor): DecodedVideo;
  flowShift: number;
  stages: StageRunner;
}

export async function loadModel(files: ModelFiles): Promise<LoadedModel> {
  const transformer = await loadTransformer(files);
  const [textEncoder, decode, index] = await Promise.all([loadTextEncoder(files), loadVaeDecoder(files), readJson(files, 'model_index.json')]);
  return { transformer, textEncoder, decode, flowShift: (index as { flow_shift?: number }).flow_shift ?? 3, stages: await onnxStages(transformer, 'wasm') };
}

export type SampleParams = Pick<JobParams, 'prompt' | 'negativePrompt' | 'frames' | 'height' | 'width' | 'steps' | 'guidance' | 'seed'> & { ranks?: number };

export async function sampleVideo(m: LoadedModel, p: SampleParams): Promise<{ latent: Tensor; video: DecodedVideo }> {
  const cfg = m.transformer.config;
  const shape = latentShape(p, cfg.inChannels);
  const texts = [m.textEncoder.encode(p.prompt), m.textEncoder.encode(p.negativePrompt)];
  const schedule = flowMatchSchedule(p.steps, m.flowShift);
  const ranks = p.ranks ?? 1;
  let latent = initialNoise(shape, p.seed);
  for (let step = 0; step < p.steps; step++) {
    const t = schedule.timesteps[step];
    const forward = (pass: number) => forwardInProcess(cfg, m.stages, memoryExchanges(ranks), latent, t, texts[pass], { job: 0, step, pass });
    const cond = (await forward(0)).data;
    const velocity = usesGuidance(p) ? guide(cond, (await forward(1)).data, p.guidance) : cond;
    latent = { shape, data: eulerStep(latent.data, velocity, schedule.sigmas[step], schedule.sigmas[step + 1]) };
  }
  return { latent, video: m.decode(latent) };
}
