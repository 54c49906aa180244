// What a user asks for, with the bounds that keep a job valid on any model: frames of the form 4k+1 (Wan's VAEs
// turn 4 frames into one latent frame), sizes multiple of 16 (Wan2.1's VAE ×8, then 2×2 patches; a family may ask
// more: core/model/family.ts).

export interface JobParams {
  prompt: string;
  negativePrompt: string;
  frames: number;
  height: number;
  width: number;
  steps: number;
  guidance: number;
  seed: number;
  flowShift: number;
  /**
   * how the steps are spaced: as the model folder's scheduler spaces them, or as a step-distilled LoRA's publisher
   * samples it (lightx2v's WanStepDistillScheduler: a few fixed points, Euler between them)
   */
  scheduler: JobScheduler;
}

/**
 * What a job is told to give instead where a part of its model folder cannot run (WanPipeline's escape hatches:
 * prompt_embeds=, output_type="latent").
 */
export const INSTEAD_OF = {
  textEncoder:
    "give the prompt's embeddings instead (promptEmbeds [L, text_dim]; --prompt-embeds FILE with npm run generate)",
  vae: "ask for the latent instead (outputType 'latent'; --output-type latent with npm run generate)",
} as const;

export const JOB_SCHEDULERS = ['folder', 'step-distill'] as const;
export type JobScheduler = (typeof JOB_SCHEDULERS)[number];

/** The trained demo model, bundled: its videos show what a prompt of its small grammar asks (demo/world.ts). */
export const DEFAULT_MODEL_URL = '/models/tiny-wan-demo';

/**
 * A job the default model (the trained demo model, demo/world.ts) answers: the clip size it was
 * trained on, with the steps and guidance its evaluation chose.
 */
export const DEFAULT_JOB: JobParams = {
  prompt: 'a red square moving right',
  negativePrompt: '',
  frames: 9,
  height: 64,
  width: 64,
  steps: 20,
  guidance: 4,
  seed: 42,
  flowShift: 3,
  scheduler: 'folder',
};

/**
 * The dashboard's "fast" preset: what a step- and CFG-distilled Wan LoRA (lightx2v's, CausVid's) is sampled with, 4
 * steps without guidance on lightx2v's schedule at its configs' shift; it needs such a LoRA in the job.
 */
export const FEW_STEP_SAMPLING = { steps: 4, guidance: 1, flowShift: 5, scheduler: 'step-distill' } as const;

export const LIMITS = {
  promptChars: 2000,
  // Wan2.2 TI2V's published 121 (5 s at 24 fps)
  frames: { min: 1, max: 121 },
  size: { min: 16, max: 1280 },
  steps: { min: 1, max: 100 },
  guidance: { min: 0, max: 20 },
  flowShift: { min: 0.1, max: 20 },
};

/** One problem per field, in words a user can act on. */
export type FieldErrors = Partial<Record<keyof JobParams, string>>;

export class JobParamsError extends Error {
  override name = 'JobParamsError';
  constructor(readonly fields: FieldErrors) {
    super(
      Object.entries(fields)
        .map(([k, v]) => `${k}: ${v}`)
        .join('; '),
    );
  }
}

/** `defaults`: what a field the input leaves out is (a model folder's, core/model/wan-pipeline.ts) */
export function checkJobParams(
  input: Partial<Record<keyof JobParams, unknown>>,
  defaults: JobParams = DEFAULT_JOB,
): FieldErrors {
  const p = { ...defaults, ...input };
  const errors: FieldErrors = {};
  const show = (v: unknown) => (typeof v === 'number' ? String(v) : JSON.stringify(v));
  const intIn = (key: keyof JobParams, min: number, max: number, extra?: (v: number) => string | null) => {
    const v = p[key] as number;
    if (typeof v !== 'number' || !Number.isInteger(v)) errors[key] = `must be a whole number, got ${show(p[key])}`;
    else if (v < min || v > max) errors[key] = `must be between ${min} and ${max}, got ${v}`;
    else {
      const problem = extra?.(v);
      if (problem) errors[key] = problem;
    }
  };
  const numIn = (key: keyof JobParams, min: number, max: number) => {
    const v = p[key] as number;
    if (typeof v !== 'number' || !Number.isFinite(v)) errors[key] = `must be a number, got ${show(p[key])}`;
    else if (v < min || v > max) errors[key] = `must be between ${min} and ${max}, got ${v}`;
  };
  for (const key of ['prompt', 'negativePrompt'] as const) {
    if (typeof p[key] !== 'string') errors[key] = 'must be text';
    else if (p[key].length > LIMITS.promptChars)
      errors[key] = `is ${p[key].length} characters; at most ${LIMITS.promptChars}`;
  }
  if (typeof p.prompt === 'string' && !p.prompt.trim()) errors.prompt = 'is empty; describe the video you want';
  intIn('frames', LIMITS.frames.min, LIMITS.frames.max, (v) =>
    (v - 1) % 4 ? `must be 4k+1 (1, 5, 9, 13, …), got ${v}; try ${4 * Math.round((v - 1) / 4) + 1}` : null,
  );
  for (const key of ['height', 'width'] as const) {
    intIn(key, LIMITS.size.min, LIMITS.size.max, (v) =>
      v % 16 ? `must be a multiple of 16, got ${v}; try ${Math.max(16, 16 * Math.round(v / 16))}` : null,
    );
  }
  intIn('steps', LIMITS.steps.min, LIMITS.steps.max);
  numIn('guidance', LIMITS.guidance.min, LIMITS.guidance.max);
  numIn('flowShift', LIMITS.flowShift.min, LIMITS.flowShift.max);
  intIn('seed', 0, 2 ** 32 - 1);
  if (!(JOB_SCHEDULERS as readonly unknown[]).includes(p.scheduler))
    errors.scheduler = `is ${JOB_SCHEDULERS.join(' or ')}, got ${JSON.stringify(p.scheduler)}`;
  return errors;
}

/** `defaults` beneath the input's fields, every field checked; throws a JobParamsError naming each bad field. */
export function jobParams(
  input: Partial<Record<keyof JobParams, unknown>>,
  defaults: JobParams = DEFAULT_JOB,
): JobParams {
  const errors = checkJobParams(input, defaults);
  if (Object.keys(errors).length) throw new JobParamsError(errors);
  return { ...defaults, ...input } as JobParams;
}

/** Classifier-free guidance needs an unconditional pass only when it changes the result. */
export const usesGuidance = (p: Pick<JobParams, 'guidance'>): boolean => p.guidance !== 1;
/** the forward passes of a step: two (conditional and unconditional) under guidance */
export const passesPerStep = (p: Pick<JobParams, 'guidance'>): 1 | 2 => (usesGuidance(p) ? 2 : 1);
