// The parts of a WanPipeline folder that run beside the transformer (it runs on the ranks): the
// transformer's config, the text encoder, the VAE decoder and the sampler's flow shift, read from the
// folder as diffusers lays it out, and what a job on it is by default (WanPipeline's __call__ defaults
// for a published folder). The coordinator's pipeline and the demo's Node sampler load them here.
// The text encoder and the decoder load when first used: a job given prompt embeddings needs no text
// encoder, one asking for the latent no decoder (as WanPipeline's prompt_embeds= and output_type="latent").
import { DEFAULT_JOB, type JobParams } from '../job.ts';
import type { Tensor } from '../tensor.ts';
import { EULER, type Solver } from '../sampler.ts';
import { ModelConfigError, parseWanConfig, type WanConfig } from './config.ts';
import { MissingFile, readJson, type ModelFiles } from './files.ts';
import { parseMagnitudeCurve, publishedCurve, STEP_CACHE_FILE, type MagnitudeCurve } from '../step-cache.ts';
import { loadTextEncoder, TEXT_ENCODER_CLASS, type TextEncoder } from './text-encoder.ts';
import { TRANSFORMER_CONFIG } from './transformer.ts';
import { isUmt5Config } from './umt5.ts';
import { loadVaeDecoder, type DecodedVideo } from './vae-decoder.ts';
import { isWanVaeConfig, parseWanVaeConfig, VAE_CONFIG, type WanVaeConfig } from './wan-vae.ts';

export const SCHEDULER_CONFIG = 'scheduler/scheduler_config.json';

/** WanPipeline's max_sequence_length: an encoded prompt is padded to this many rows */
export const WAN_TEXT_TOKENS = 512;

/** Wan2.1's two resolutions, each with the flow shift diffusers' Wan example gives it ("5.0 for 720P, 3.0 for 480P") */
export const WAN_SIZES = {
  '480p': { height: 480, width: 832, flowShift: 3 },
  '720p': { height: 720, width: 1280, flowShift: 5 },
} as const satisfies Record<string, Pick<JobParams, 'height' | 'width' | 'flowShift'>>;

/** The negative prompt of diffusers' Wan example (pipeline_wan.py, EXAMPLE_DOC_STRING), word for word */
export const WAN_NEGATIVE_PROMPT =
  'Bright tones, overexposed, static, blurred details, subtitles, style, works, paintings, images, static, ' +
  'overall gray, worst quality, low quality, JPEG compression residue, ugly, incomplete, extra fingers, ' +
  'poorly drawn hands, poorly drawn faces, deformed, disfigured, misshapen limbs, fused fingers, still picture, ' +
  'messy background, three legs, many people in the background, walking backwards';

/**
 * WanPipeline.__call__'s defaults (height, width, num_frames, num_inference_steps, guidance_scale), with
 * that negative prompt
 */
export const WAN_PIPELINE_DEFAULTS = {
  height: WAN_SIZES['480p'].height,
  width: WAN_SIZES['480p'].width,
  frames: 81,
  steps: 50,
  guidance: 5,
  negativePrompt: WAN_NEGATIVE_PROMPT,
} satisfies Partial<JobParams>;

export interface WanPipelineParts {
  config: WanConfig;
  /** rows of every text embedding the text encoder makes: the cross-attention length */
  textTokens: number;
  /** text_encoder/ is umT5's encoder (the published folders'): too large for one tab, it runs on the workers */
  umt5: boolean;
  /** the tiny models' stand-in encoder */
  textEncoder(): Promise<TextEncoder>;
  /** vae/ is AutoencoderKLWan (the published folders'): it decodes in tiles on the workers */
  wanVae: WanVaeConfig | null;
  /** the tiny models' stand-in decoder */
  decoder(): Promise<(latent: Tensor) => DecodedVideo>;
  /** the folder's flow shift (model_index.json, else its scheduler's config), the default job's where it has neither */
  flowShift: number;
  /** the folder's scheduler (scheduler/scheduler_config.json); flow-matching Euler where it has none (tiny models) */
  solver: Solver;
  /** what a job's missing fields are on this folder (jobDefaults) */
  defaults: JobParams;
  /** the step cache's magnitude curve: the folder's calibration, else the published one of its shape, else null */
  stepCacheCurve: MagnitudeCurve | null;
}

/**
 * The scheduler a folder names, as far as ditswarm runs it: UniPC as Wan2.1 configures it, or
 * flow-matching Euler. Anything else is refused by name rather than run differently.
 */
export function parseSchedulerConfig(json: unknown, source: string): { solver: Solver; flowShift?: number } {
  const c = (json ?? {}) as Record<string, unknown>;
  const fail = (what: string) => new ModelConfigError(`${source}: ${what}`);
  const flowShift = typeof c.flow_shift === 'number' ? c.flow_shift : typeof c.shift === 'number' ? c.shift : undefined;
  const trained = c.num_train_timesteps ?? undefined;
  if (trained !== undefined && !(Number.isInteger(trained) && (trained as number) > 0))
    throw fail(`num_train_timesteps must be a whole number ≥ 1, got ${JSON.stringify(trained)}`);
  const numTrainTimesteps = trained === undefined ? {} : { numTrainTimesteps: trained as number };
  if (c._class_name === 'FlowMatchEulerDiscreteScheduler')
    return { solver: { kind: 'FlowMatchEulerDiscreteScheduler', config: numTrainTimesteps }, flowShift };
  if (c._class_name !== 'UniPCMultistepScheduler')
    throw fail(
      `_class_name ${JSON.stringify(c._class_name)} is not a scheduler ditswarm runs; ` +
        'expected UniPCMultistepScheduler or FlowMatchEulerDiscreteScheduler',
    );
  const expect = (key: string, wanted: unknown, fallback: unknown) => {
    const value = c[key] ?? fallback;
    if (value !== wanted)
      throw fail(
        `${key} is ${JSON.stringify(value)}; ` +
          `ditswarm runs UniPC with ${key} ${JSON.stringify(wanted)}, as Wan2.1 publishes it`,
      );
  };
  expect('prediction_type', 'flow_prediction', 'epsilon');
  expect('use_flow_sigmas', true, false);
  expect('predict_x0', true, true);
  expect('solver_type', 'bh2', 'bh2');
  expect('final_sigmas_type', 'zero', 'zero');
  expect('thresholding', false, false);
  const solverOrder = c.solver_order ?? 2;
  if (solverOrder !== 1 && solverOrder !== 2)
    throw fail(`solver_order ${JSON.stringify(solverOrder)} is not supported; ditswarm runs UniPC of order 1 or 2`);
  return {
    solver: {
      kind: 'UniPCMultistepScheduler',
      config: { ...numTrainTimesteps, solverOrder, lowerOrderFinal: c.lower_order_final !== false },
    },
    flowShift,
  };
}

/**
 * What a job's missing fields are on a folder: WanPipeline's defaults where it holds what WanPipeline
 * runs as published (umT5, AutoencoderKLWan, UniPC), DEFAULT_JOB for the tiny models (an 81-frame
 * 480×832 clip means nothing to them); the folder's flow shift in both.
 */
export function jobDefaults({
  umt5,
  wanVae,
  solver,
  flowShift,
}: Pick<WanPipelineParts, 'umt5' | 'wanVae' | 'solver' | 'flowShift'>): JobParams {
  const published = umt5 && wanVae !== null && solver.kind === 'UniPCMultistepScheduler';
  return { ...DEFAULT_JOB, ...(published ? WAN_PIPELINE_DEFAULTS : {}), flowShift };
}

/** `load` once, when first asked; a failed load is tried again next time. */
export function once<T>(load: () => Promise<T>): () => Promise<T> {
  let loading: Promise<T> | null = null;
  return () =>
    (loading ??= load().catch((e: unknown) => {
      loading = null;
      throw e;
    }));
}

export async function loadWanPipelineParts(files: ModelFiles): Promise<WanPipelineParts> {
  const [config, textConfig, vaeConfig, index, scheduler, calibrated] = await Promise.all([
    readJson(files, TRANSFORMER_CONFIG).then((json) => parseWanConfig(json, TRANSFORMER_CONFIG)),
    readJson(files, 'text_encoder/config.json') as Promise<{ _class_name?: string; max_length?: number }>,
    readJson(files, VAE_CONFIG),
    readJson(files, 'model_index.json'),
    readJson(files, SCHEDULER_CONFIG).then(
      (json) => parseSchedulerConfig(json, SCHEDULER_CONFIG),
      (e: unknown) => {
        if (e instanceof MissingFile) return { solver: EULER, flowShift: undefined };
        throw e;
      },
    ),
    readJson(files, STEP_CACHE_FILE).then(
      (json) => parseMagnitudeCurve(json, STEP_CACHE_FILE),
      (e: unknown) => {
        if (e instanceof MissingFile) return null;
        throw e;
      },
    ),
  ]);
  const flowShift = (index as { flow_shift?: unknown }).flow_shift ?? scheduler.flowShift;
  const parts: Omit<WanPipelineParts, 'defaults'> = {
    config,
    stepCacheCurve: calibrated ?? publishedCurve(config),
    textTokens:
      textConfig._class_name === TEXT_ENCODER_CLASS && typeof textConfig.max_length === 'number'
        ? textConfig.max_length
        : WAN_TEXT_TOKENS,
    umt5: isUmt5Config(textConfig),
    textEncoder: once(() => loadTextEncoder(files)),
    wanVae: isWanVaeConfig(vaeConfig) ? parseWanVaeConfig(vaeConfig, VAE_CONFIG) : null,
    decoder: once(() => loadVaeDecoder(files)),
    flowShift: typeof flowShift === 'number' ? flowShift : DEFAULT_JOB.flowShift,
    solver: scheduler.solver,
  };
  return { ...parts, defaults: jobDefaults(parts) };
}
