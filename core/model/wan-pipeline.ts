// The parts of a WanPipeline folder that run beside the transformer (it runs on the ranks): the
// transformer's config, the text encoder, the VAE decoder and the sampler's flow shift, read from the
// folder as diffusers lays it out, and what a job on it is by default (WanPipeline's __call__ defaults
// for a published folder). The coordinator's pipeline and the demo's Node sampler load them here.
// The text encoder and the decoder load when first used: a job given prompt embeddings needs no text
// encoder, one asking for the latent no decoder (as WanPipeline's prompt_embeds= and output_type="latent"),
// and a folder may lack what its jobs do not use: only transformer/ for jobs given embeddings that ask for the
// latent, only vae/ for decoding a given latent. A part a job needs and the folder lacks fails it, saying
// what to give instead (MissingPart).
import { DEFAULT_JOB, INSTEAD_OF, type JobParams } from '../job.ts';
import type { Tensor } from '../tensor.ts';
import { EULER, type Solver } from '../sampler.ts';
import { ModelConfigError, parseWanConfig, type WanConfig } from './config.ts';
import { familyOf, WAN21, type ModelFamily } from './family.ts';
import { MissingFile, readJson, type ModelFiles } from './files.ts';
import { parseMagnitudeCurve, publishedCurve, STEP_CACHE_FILE, type MagnitudeCurve } from '../step-cache.ts';
import { loadTextEncoder, TEXT_ENCODER_CLASS, type TextEncoder } from './text-encoder.ts';
import { TRANSFORMER_CONFIG } from './transformer.ts';
import { isUmt5Config, TEXT_ENCODER_CONFIG } from './umt5.ts';
import { loadVaeDecoder, type DecodedVideo } from './vae-decoder.ts';
import { isWanVaeConfig, parseWanVaeConfig, VAE_CONFIG, type WanVaeConfig } from './wan-vae.ts';

export const SCHEDULER_CONFIG = 'scheduler/scheduler_config.json';

/** WanPipeline's max_sequence_length: an encoded prompt is padded to this many rows */
export const WAN_TEXT_TOKENS = 512;

/** Wan2.1's two resolutions, each with the flow shift diffusers' Wan example gives it */
export const WAN_SIZES = WAN21.sizes;

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
  height: WAN21.published.height,
  width: WAN21.published.width,
  frames: 81,
  steps: 50,
  guidance: 5,
  negativePrompt: WAN_NEGATIVE_PROMPT,
} satisfies Partial<JobParams>;

export interface WanPipelineParts {
  /** the transformer's config; null where the folder has no transformer/ (it can decode a given latent, no more) */
  config: WanConfig | null;
  /** Wan2.1 or Wan2.2 TI2V: its latent, its timesteps, its frame rate (family.ts) */
  family: ModelFamily;
  /** rows of every text embedding the text encoder makes: the cross-attention length */
  textTokens: number;
  /** text_encoder/ is umT5's encoder (the published folders'): too large for one tab, it runs on the workers */
  umt5: boolean;
  /** the tiny models' stand-in encoder (MissingPart where the folder has no text_encoder/) */
  textEncoder(): Promise<TextEncoder>;
  /** vae/ is AutoencoderKLWan (the published folders'): it decodes in tiles on the workers */
  wanVae: WanVaeConfig | null;
  /** the tiny models' stand-in decoder (MissingPart where the folder has no vae/) */
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
  family,
}: Pick<WanPipelineParts, 'umt5' | 'wanVae' | 'solver' | 'flowShift' | 'family'>): JobParams {
  const published = umt5 && wanVae !== null && solver.kind === 'UniPCMultistepScheduler';
  return { ...DEFAULT_JOB, ...(published ? { ...WAN_PIPELINE_DEFAULTS, ...family.published } : {}), flowShift };
}

/** A part of the model folder that a job needs and the folder does not have; the message says what to give instead. */
export class MissingPart extends Error {
  override name = 'MissingPart';
}

/** What a job that needs a part the folder lacks is told: the part, and what the job could be given instead. */
export const MISSING_PARTS = {
  transformer: 'the model folder has no transformer/: it can decode a given latent (npm run decode), not run a job',
  textEncoder: `the model folder has no text_encoder/: ${INSTEAD_OF.textEncoder}`,
  vae: `the model folder has no vae/: ${INSTEAD_OF.vae}`,
} as const;

/** A config file of an optional part: null where the folder has no such file. */
function readOptionalJson<T>(files: ModelFiles, path: string, parse: (json: unknown) => T): Promise<T | null> {
  return readJson(files, path).then(parse, (e: unknown) => {
    if (e instanceof MissingFile) return null;
    throw e;
  });
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
    readOptionalJson(files, TRANSFORMER_CONFIG, (json) => parseWanConfig(json, TRANSFORMER_CONFIG)),
    readOptionalJson(files, TEXT_ENCODER_CONFIG, (json) => json as { _class_name?: string; max_length?: number }),
    readOptionalJson(files, VAE_CONFIG, (json) => json),
    readOptionalJson(files, 'model_index.json', (json) => json as { flow_shift?: unknown; expand_timesteps?: unknown }),
    readOptionalJson(files, SCHEDULER_CONFIG, (json) => parseSchedulerConfig(json, SCHEDULER_CONFIG)),
    readOptionalJson(files, STEP_CACHE_FILE, (json) => parseMagnitudeCurve(json, STEP_CACHE_FILE)),
  ]);
  const flowShift = index?.flow_shift ?? scheduler?.flowShift;
  const lacking = (part: keyof typeof MISSING_PARTS) => () => Promise.reject(new MissingPart(MISSING_PARTS[part]));
  const wanVae = isWanVaeConfig(vaeConfig) ? parseWanVaeConfig(vaeConfig, VAE_CONFIG) : null;
  const parts: Omit<WanPipelineParts, 'defaults'> = {
    config,
    family: familyOf({
      expandTimesteps: index?.expand_timesteps === true,
      vae: wanVae,
      inChannels: config?.inChannels ?? null,
    }),
    stepCacheCurve: calibrated ?? (config && publishedCurve(config)),
    textTokens:
      textConfig?._class_name === TEXT_ENCODER_CLASS && typeof textConfig.max_length === 'number'
        ? textConfig.max_length
        : WAN_TEXT_TOKENS,
    umt5: textConfig !== null && isUmt5Config(textConfig),
    textEncoder: textConfig ? once(() => loadTextEncoder(files)) : lacking('textEncoder'),
    wanVae,
    decoder: vaeConfig ? once(() => loadVaeDecoder(files)) : lacking('vae'),
    flowShift: typeof flowShift === 'number' ? flowShift : DEFAULT_JOB.flowShift,
    solver: scheduler?.solver ?? EULER,
  };
  return { ...parts, defaults: jobDefaults(parts) };
}
