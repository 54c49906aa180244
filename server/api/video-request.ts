// `POST /v1/videos`'s body, as OpenAI's video API and vLLM-Omni's Wan serving shape it (prompt, size "832x480",
// seconds) with the job fields ditswarm has beyond them (frames, steps, guidance, seed, LoRA, placement), checked
// field by field into what the dashboard's automation API takes. A bad field is refused with its name and what
// it may be: nothing is queued.

import type { JobOverrides } from '../../app/automation.ts';
import { checkJobParams, DEFAULT_MODEL_URL, JOB_SCHEDULERS, LIMITS, type JobParams } from '../../core/job.ts';
import { latentShape, wan21Latent } from '../../core/model/family.ts';
import { checkLoras, LoraError } from '../../core/model/lora.ts';
import { DTYPES } from '../../core/net/protocol.ts';
import { WEIGHT_TYPES } from '../../core/worker-api.ts';
import { DEFAULT_FPS } from '../../coordinator/video.ts';
import { degreeOfWorkers } from '../cli/job-flags.ts';
import { MAX_SWARM_WORKERS } from '../signaling-capacity.ts';
import { modelUrlRefusal } from './model-hosts.ts';

/** the image types OpenAI's video API takes as `input_reference` (video-form.ts tells them by their first bytes) */
export type ReferenceType = 'image/png' | 'image/jpeg' | 'image/webp';

/** The image a job was given to start from: kept with it, the first frame of a Wan2.2 TI2V model's video. */
export interface InputReference {
  type: ReferenceType;
  bytes: number;
  /** the file's name as the client gave it */
  name: string | null;
}

/** A job as the API keeps it: what the dashboard's automation API is given, the form's values beneath. */
export interface VideoRequest {
  overrides: JobOverrides;
  /** the image a multipart POST gave (kept as the job's file 'reference'), for image-to-video on a TI2V model */
  inputReference?: InputReference;
}

/** A field the API refuses: `param` names it, as OpenAI's errors do. */
export class RequestError extends Error {
  override name = 'RequestError';
  constructor(
    message: string,
    readonly param: string | null,
  ) {
    super(message);
  }
}

/** Sizes worth naming when one is refused: Wan's published 480p and 720p, either way up. */
export const NAMED_SIZES = ['832x480', '480x832', '1280x720', '720x1280'];

export function sizeRule(defaultModelSize: string | null): string {
  const { min, max } = LIMITS.size;
  return (
    `WIDTHxHEIGHT with each side a multiple of 16 from ${min} to ${max}, such as ` +
    [...(defaultModelSize ? [`${defaultModelSize} (this server's default model's)`] : []), ...NAMED_SIZES].join(', ')
  );
}

const EPS = ['auto', 'webgpu', 'wasm'] as const;
const PARALLEL = ['ulysses', 'displaced'] as const;
const CACHES = ['off', 'auto', 'magcache'] as const;
const OUTPUTS = ['video', 'latent'] as const;

/** Every field the body may have: anything else is refused by name (a misspelt field would be silently dropped). */
const FIELDS = [
  'prompt',
  'negative_prompt',
  'model',
  'size',
  'width',
  'height',
  'frames',
  'seconds',
  'steps',
  'guidance',
  'seed',
  'flow_shift',
  'scheduler',
  'lora',
  'workers',
  'stages',
  'parallel',
  'warmup_steps',
  'pipefusion',
  'cfg_parallel',
  'dtype',
  'weights',
  'ep',
  'cache',
  'cache_threshold',
  'output',
] as const;

/** JobParams' fields by the API's names, where they differ. */
const PARAM_NAMES: Partial<Record<keyof JobParams, string>> = {
  negativePrompt: 'negative_prompt',
  flowShift: 'flow_shift',
};

/**
 * The body of a POST, checked: throws a RequestError naming the first field it refuses. `model` is the served
 * model the job runs on unless the body names one; `defaultModelSize` is named among the allowed sizes; `modelHosts`
 * are the hosts besides this server a job's model and LoRA files may be read from (model-hosts.ts).
 */
export function parseVideoRequest(
  body: unknown,
  {
    model,
    defaultModelSize = null,
    modelHosts = [],
  }: { model?: string; defaultModelSize?: string | null; modelHosts?: readonly string[] } = {},
): VideoRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body))
    throw new RequestError('the body is a JSON object: { "prompt": "…", … }', null);
  const b = body as Record<string, unknown>;
  for (const key of Object.keys(b))
    if (!(FIELDS as readonly string[]).includes(key))
      throw new RequestError(`unknown field ${JSON.stringify(key)}; the fields are ${FIELDS.join(', ')}`, key);

  const oneOf = <T extends string>(key: string, allowed: readonly T[]): T | undefined => {
    const v = b[key];
    if (v === undefined) return undefined;
    if (typeof v !== 'string' || !(allowed as readonly string[]).includes(v))
      throw new RequestError(`${key} is ${allowed.map((a) => JSON.stringify(a)).join(', ')}; got ${show(v)}`, key);
    return v as T;
  };
  /** a whole number from `min` to `max`; `why` says where the most comes from */
  const whole = (key: string, min: number, max: number, why: string): number | undefined => {
    const v = b[key];
    if (v === undefined) return undefined;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max)
      throw new RequestError(`${key} is a whole number from ${min} to ${max} (${why}); got ${show(v)}`, key);
    return v;
  };

  if (typeof b.prompt !== 'string')
    throw new RequestError('prompt is required: the text of the video you want', 'prompt');
  const params: Partial<Record<keyof JobParams, unknown>> = { prompt: b.prompt };
  if (b.negative_prompt !== undefined) params.negativePrompt = b.negative_prompt;
  for (const key of ['steps', 'guidance', 'seed', 'scheduler'] as const) if (b[key] !== undefined) params[key] = b[key];
  if (b.flow_shift !== undefined) params.flowShift = b.flow_shift;
  if (b.scheduler !== undefined) oneOf('scheduler', JOB_SCHEDULERS);

  // size "WxH", or width and height
  const rule = sizeRule(defaultModelSize);
  if (b.size !== undefined) {
    if (b.width !== undefined || b.height !== undefined)
      throw new RequestError('give size or width and height, not both', 'size');
    const match = typeof b.size === 'string' ? /^(\d+)x(\d+)$/.exec(b.size) : null;
    if (!match) throw new RequestError(`size is ${rule}; got ${show(b.size)}`, 'size');
    params.width = Number(match[1]);
    params.height = Number(match[2]);
  } else {
    if (b.width !== undefined) params.width = b.width;
    if (b.height !== undefined) params.height = b.height;
  }
  // frames, or seconds at the model's frame rate (Wan's 4k+1 frames: 5 s at 16 fps is 81)
  if (b.seconds !== undefined) {
    if (b.frames !== undefined) throw new RequestError('give frames or seconds, not both', 'seconds');
    const seconds = typeof b.seconds === 'string' && b.seconds.trim() !== '' ? Number(b.seconds) : b.seconds;
    if (typeof seconds !== 'number' || !(seconds > 0))
      throw new RequestError(
        `seconds is a number above 0 (at ${DEFAULT_FPS} frames a second); got ${show(b.seconds)}`,
        'seconds',
      );
    params.frames = 4 * Math.round((seconds * DEFAULT_FPS) / 4) + 1;
  } else if (b.frames !== undefined) params.frames = b.frames;

  const errors = checkJobParams(params);
  const bad = Object.entries(errors)[0] as [keyof JobParams, string] | undefined;
  if (bad) {
    const [field, problem] = bad;
    if ((field === 'width' || field === 'height') && b.size !== undefined)
      throw new RequestError(`size ${show(b.size)}: its ${field} ${problem}; size is ${rule}`, 'size');
    if (field === 'frames' && b.seconds !== undefined)
      throw new RequestError(
        `seconds ${show(b.seconds)} makes ${params.frames as number} frames, which ${problem}`,
        'seconds',
      );
    throw new RequestError(`${PARAM_NAMES[field] ?? field} ${problem}`, PARAM_NAMES[field] ?? field);
  }

  // placement
  const cfgParallel = b.cfg_parallel;
  if (cfgParallel !== undefined && typeof cfgParallel !== 'boolean')
    throw new RequestError(`cfg_parallel is true or false; got ${show(cfgParallel)}`, 'cfg_parallel');
  const groups = cfgParallel === true ? 2 : 1;
  const stages =
    whole(
      'stages',
      1,
      Math.floor(MAX_SWARM_WORKERS / groups),
      `a stage is at least one worker${groups === 2 ? ' of each CFG group' : ''}, and ${SWARM_BOUND}`,
    ) ?? 1;
  let workers: number | 'auto' = 'auto';
  if (b.workers !== undefined && b.workers !== 'auto') {
    const total = whole('workers', 1, MAX_SWARM_WORKERS, SWARM_BOUND) as number;
    const degree = degreeOfWorkers(total, stages, cfgParallel === true);
    if (degree === null)
      throw new RequestError(
        `workers ${total} cannot run ${stages} stage(s)${cfgParallel ? ' for each of the two CFG groups' : ''} ` +
          `on equal numbers of workers: give a multiple of ${stages * (cfgParallel ? 2 : 1)}`,
        'workers',
      );
    workers = degree;
  }
  const overrides: JobOverrides = { ...(params as Partial<JobParams>), backend: 'swarm', workers };
  if (stages > 1) overrides.stages = stages;
  if (cfgParallel !== undefined) overrides.cfgParallel = cfgParallel;
  const parallel = oneOf('parallel', PARALLEL);
  if (parallel) overrides.parallel = parallel;
  const warmupSteps = whole('warmup_steps', 0, LIMITS.steps.max, `a job has at most ${LIMITS.steps.max} steps`);
  if (warmupSteps !== undefined) overrides.warmupSteps = warmupSteps;
  const patches = whole(
    'pipefusion',
    2,
    MAX_LATENT_POSITIONS,
    "a forward is cut into at most its tokens, and the largest job's latent has that many positions",
  );
  if (patches !== undefined) overrides.pipeFusionPatches = patches;
  const dtype = oneOf('dtype', DTYPES);
  if (dtype) overrides.dtype = dtype;
  const weights = oneOf('weights', WEIGHT_TYPES);
  if (weights) overrides.weightType = weights;
  const ep = oneOf('ep', EPS);
  if (ep) overrides.ep = ep;
  const cache = oneOf('cache', CACHES);
  const threshold = b.cache_threshold;
  if (
    threshold !== undefined &&
    (cache !== 'magcache' || typeof threshold !== 'number' || !(threshold >= 0 && threshold <= 1))
  )
    throw new RequestError(
      `cache_threshold is a number from 0 to 1, with cache "magcache"; ` +
        `got ${show(threshold)} with cache ${show(cache)}`,
      'cache_threshold',
    );
  if (cache === 'magcache') overrides.cache = { method: 'magcache', ...(threshold !== undefined && { threshold }) };
  else if (cache) overrides.cache = cache;
  const output = oneOf('output', OUTPUTS);
  if (output) overrides.outputType = output;

  if (b.model !== undefined) {
    if (typeof b.model !== 'string')
      throw new RequestError(`model is a path this server serves (/models/…) or a URL; got ${show(b.model)}`, 'model');
    const refusal = modelUrlRefusal(b.model, { modelHosts, model });
    if (refusal) throw new RequestError(`model: ${refusal}`, 'model');
  }
  // set from the start, so that a queued job says what it will run on
  overrides.model = b.model ?? model ?? DEFAULT_MODEL_URL;
  if (b.lora !== undefined) {
    const list = Array.isArray(b.lora) ? b.lora : [b.lora];
    try {
      overrides.loras = checkLoras(
        list.map((l: unknown) => (typeof l === 'string' ? { url: l, strength: 1 } : { strength: 1, ...(l as object) })),
      );
    } catch (e) {
      if (e instanceof LoraError) throw new RequestError(`lora: ${e.message}`, 'lora');
      throw e;
    }
    for (const { url } of overrides.loras) {
      const refusal = modelUrlRefusal(url, { modelHosts });
      if (refusal) throw new RequestError(`lora: ${refusal}`, 'lora');
    }
  }
  return { overrides };
}

/** why a swarm's workers are bounded, as a refusal says it */
const SWARM_BOUND = `a swarm has at most ${MAX_SWARM_WORKERS} workers: one signaling place each, less the dashboard's`;

/** the positions of the largest latent a job may ask for, as many as its tokens can ever be (a patch of 1×1×1) */
export const MAX_LATENT_POSITIONS = latentShape(
  {
    frames: LIMITS.frames.max,
    height: LIMITS.size.max,
    width: LIMITS.size.max,
  },
  wan21Latent(16), // the finest: 8 pixels a latent pixel
)
  .slice(1)
  .reduce((a, b) => a * b);

const show = (v: unknown): string => (v === undefined ? 'nothing' : JSON.stringify(v));
