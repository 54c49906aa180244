// The API's OpenAPI 3.1 document, served at /v1/openapi.json. The tests validate what the server answers against
// its schemas (JSON Schema 2020-12), so the document and the server cannot drift apart unnoticed.

import { LIMITS, JOB_SCHEDULERS } from '../../core/job.ts';
import { DTYPES } from '../../core/net/protocol.ts';
import { WEIGHT_TYPES } from '../../core/worker-api.ts';
import { MAX_SWARM_WORKERS } from '../signaling-capacity.ts';
import { VIDEO_STATUSES } from './job-db.ts';
import { MAX_REFERENCE_BYTES, REFERENCE_TYPES } from './video-form.ts';
import { MAX_LATENT_POSITIONS } from './video-request.ts';

const nullable = (schema: object) => ({ oneOf: [schema, { type: 'null' }] });
const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: object) => ({ 'application/json': { schema } });
const errorResponse = (description: string) => ({ description, content: json(ref('Error')) });

const schemas = {
  Error: {
    type: 'object',
    required: ['error'],
    properties: {
      error: {
        type: 'object',
        required: ['message', 'type', 'param'],
        properties: {
          message: { type: 'string' },
          type: { type: 'string' },
          param: nullable({ type: 'string' }),
          code: nullable({ type: 'string' }),
        },
      },
    },
  },
  CreateVideoRequest: {
    type: 'object',
    required: ['prompt'],
    additionalProperties: false,
    properties: {
      prompt: { type: 'string', maxLength: LIMITS.promptChars },
      negative_prompt: { type: 'string', maxLength: LIMITS.promptChars },
      model: {
        type: 'string',
        description: 'a path this server serves (/models/…), or an http(s) URL of a host --allow-model-host named',
      },
      size: { type: 'string', pattern: '^\\d+x\\d+$', description: 'WIDTHxHEIGHT, each a multiple of 16' },
      width: { type: 'integer', multipleOf: 16, minimum: LIMITS.size.min, maximum: LIMITS.size.max },
      height: { type: 'integer', multipleOf: 16, minimum: LIMITS.size.min, maximum: LIMITS.size.max },
      frames: { type: 'integer', minimum: LIMITS.frames.min, maximum: LIMITS.frames.max, description: '4k+1' },
      seconds: { oneOf: [{ type: 'number' }, { type: 'string' }], description: 'at 16 frames a second' },
      steps: { type: 'integer', minimum: LIMITS.steps.min, maximum: LIMITS.steps.max },
      guidance: { type: 'number', minimum: LIMITS.guidance.min, maximum: LIMITS.guidance.max },
      seed: { type: 'integer', minimum: 0, maximum: 2 ** 32 - 1 },
      flow_shift: { type: 'number', minimum: LIMITS.flowShift.min, maximum: LIMITS.flowShift.max },
      scheduler: { enum: [...JOB_SCHEDULERS] },
      lora: {
        description: 'LoRA files: paths this server serves (/loras/…), or URLs of hosts --allow-model-host named',
        oneOf: [
          { type: 'string' },
          {
            type: 'array',
            items: {
              oneOf: [
                { type: 'string' },
                {
                  type: 'object',
                  required: ['url'],
                  properties: { url: { type: 'string' }, strength: { type: 'number' } },
                },
              ],
            },
          },
        ],
      },
      workers: {
        oneOf: [{ type: 'integer', minimum: 1, maximum: MAX_SWARM_WORKERS }, { const: 'auto' }],
        description: 'worker tabs in all',
      },
      stages: { type: 'integer', minimum: 1, maximum: MAX_SWARM_WORKERS, description: 'half that with cfg_parallel' },
      parallel: { enum: ['ulysses', 'displaced'] },
      warmup_steps: { type: 'integer', minimum: 0, maximum: LIMITS.steps.max },
      pipefusion: { type: 'integer', minimum: 2, maximum: MAX_LATENT_POSITIONS },
      cfg_parallel: { type: 'boolean' },
      dtype: { enum: [...DTYPES] },
      weights: { enum: [...WEIGHT_TYPES] },
      ep: { enum: ['auto', 'webgpu', 'wasm'] },
      cache: { enum: ['off', 'auto', 'magcache'] },
      cache_threshold: { type: 'number', minimum: 0, maximum: 1 },
      output: { enum: ['video', 'latent'] },
    },
  },
  Video: {
    type: 'object',
    required: [
      'id',
      'object',
      'status',
      'progress',
      'created_at',
      'started_at',
      'completed_at',
      'model',
      'prompt',
      'size',
      'frames',
      'seconds',
      'phase',
      'eta_seconds',
      'error',
      'report',
      'attempts',
      'input_reference',
    ],
    additionalProperties: false,
    properties: {
      id: { type: 'string', pattern: '^video_[0-9a-f]{24}$' },
      object: { const: 'video' },
      status: { enum: [...VIDEO_STATUSES] },
      progress: { type: 'integer', minimum: 0, maximum: 100 },
      created_at: { type: 'integer' },
      started_at: nullable({ type: 'integer' }),
      completed_at: nullable({ type: 'integer' }),
      model: nullable({ type: 'string' }),
      prompt: { type: 'string' },
      size: nullable({ type: 'string', pattern: '^\\d+x\\d+$' }),
      frames: nullable({ type: 'integer' }),
      seconds: nullable({ type: 'string' }),
      phase: nullable({ type: 'string' }),
      eta_seconds: nullable({ type: 'integer', minimum: 0 }),
      error: nullable({
        type: 'object',
        required: ['code', 'message'],
        properties: { code: { type: 'string' }, message: { type: 'string' } },
      }),
      report: nullable({
        type: 'object',
        required: ['config', 'steps', 'totalMs'],
        description: "the coordinator's report (GenerateReport): config, placement, steps, workers, links, …",
      }),
      attempts: { type: 'integer', minimum: 0 },
      input_reference: nullable({
        type: 'object',
        required: ['type', 'bytes', 'name', 'note'],
        additionalProperties: false,
        description: 'the image a multipart POST gave, kept with the job for image-to-video',
        properties: {
          type: { enum: [...REFERENCE_TYPES] },
          bytes: { type: 'integer', minimum: 0 },
          name: nullable({ type: 'string' }),
          note: { type: 'string' },
        },
      }),
    },
  },
  VideoList: {
    type: 'object',
    required: ['object', 'data', 'first_id', 'last_id', 'has_more'],
    additionalProperties: false,
    properties: {
      object: { const: 'list' },
      data: { type: 'array', items: ref('Video') },
      first_id: nullable({ type: 'string' }),
      last_id: nullable({ type: 'string' }),
      has_more: { type: 'boolean' },
    },
  },
  DeletedVideo: {
    type: 'object',
    required: ['id', 'object', 'deleted'],
    additionalProperties: false,
    properties: { id: { type: 'string' }, object: { const: 'video.deleted' }, deleted: { const: true } },
  },
  Swarm: {
    type: 'object',
    required: ['joinUrl', 'lanJoinUrl', 'coordinator', 'restarts', 'workers'],
    additionalProperties: false,
    properties: {
      joinUrl: { type: 'string' },
      lanJoinUrl: { type: 'string' },
      coordinator: { enum: ['starting', 'ready', 'restarting'] },
      restarts: { type: 'integer', minimum: 0 },
      workers: {
        type: 'array',
        items: {
          type: 'object',
          required: ['id', 'ep', 'threads', 'adapter', 'transport', 'state', 'thisMachine'],
          additionalProperties: false,
          properties: {
            id: { type: 'string' },
            ep: nullable({ enum: ['webgpu', 'wasm'] }),
            threads: { type: 'integer' },
            adapter: { type: 'string' },
            transport: { enum: ['direct', 'turn', 'relay'] },
            state: { type: 'string' },
            thisMachine: { type: 'boolean' },
          },
        },
      },
    },
  },
};

/**
 * The POST as OpenAI documents it (`curl -F prompt=… -F seconds=4 -F size=832x480`): the JSON body's fields as text
 * parts, `lora` repeatable, and the image to start from as a file part.
 */
const createVideoForm = {
  type: 'object',
  required: ['prompt'],
  additionalProperties: false,
  properties: {
    ...Object.fromEntries(
      Object.keys(schemas.CreateVideoRequest.properties).map((name) => [
        name,
        name === 'lora'
          ? { type: 'array', items: { type: 'string' }, description: 'a LoRA URL; one part each' }
          : { type: 'string', description: `the JSON body's ${name}, as text` },
      ]),
    ),
    input_reference: {
      type: 'string',
      contentMediaType: 'application/octet-stream',
      description:
        `a PNG, JPEG or WebP image of at most ${MAX_REFERENCE_BYTES / 1024 / 1024} MiB, kept with the job for ` +
        "image-to-video: the video's first frame, stretched to its size, on a Wan2.2 TI2V model (a model that makes " +
        'video from text alone fails the job, saying so)',
    },
  },
};

const idParam = { name: 'id', in: 'path', required: true, schema: { type: 'string' } };
const unauthorized = errorResponse('no key, or a wrong one (Authorization: Bearer <key>)');
const limited = errorResponse('too many requests with this key: wait a moment');

export const OPENAPI = {
  openapi: '3.1.0',
  info: {
    title: 'ditswarm video API',
    version: '1',
    description:
      'OpenAI-style video jobs on a ditswarm swarm. Every call needs `Authorization: Bearer <key>` ' +
      '(`npm start -- --api` prints where it keeps the key).',
  },
  security: [{ bearer: [] }],
  components: {
    securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
    schemas,
  },
  paths: {
    '/v1/videos': {
      post: {
        summary: 'Queue a video job',
        requestBody: {
          required: true,
          content: {
            ...json(ref('CreateVideoRequest')),
            'multipart/form-data': {
              schema: createVideoForm,
              encoding: { input_reference: { contentType: REFERENCE_TYPES.join(', ') } },
            },
          },
        },
        responses: {
          202: { description: 'accepted: on the disk, queued', content: json(ref('Video')) },
          400: errorResponse('a field refused: `param` names it'),
          401: unauthorized,
          413: errorResponse('the body is larger than the API takes (a JSON body 64 KB, a form its image and 64 KB)'),
          429: errorResponse('the queue is full, or too many requests with this key'),
          503: errorResponse('no worker has joined the swarm'),
          507: errorResponse('the disk is full: nothing was queued'),
        },
      },
      get: {
        summary: 'List jobs, newest first',
        parameters: [
          { name: 'limit', in: 'query', schema: { type: 'integer', minimum: 1, maximum: 100, default: 20 } },
          { name: 'after', in: 'query', schema: { type: 'string' }, description: 'the last id of the page before' },
        ],
        responses: {
          200: { description: 'a page of jobs', content: json(ref('VideoList')) },
          401: unauthorized,
          429: limited,
        },
      },
    },
    '/v1/videos/{id}': {
      get: {
        summary: 'A job',
        parameters: [
          idParam,
          {
            name: 'wait',
            in: 'query',
            schema: { type: 'number', minimum: 0, maximum: 60 },
            description: 'long poll: answer once the job changes, or after this many seconds',
          },
        ],
        responses: {
          200: { description: 'the job', content: json(ref('Video')) },
          401: unauthorized,
          404: errorResponse('no such job'),
          429: limited,
        },
      },
      delete: {
        summary: 'Cancel a queued or running job; delete a finished one and its files',
        parameters: [idParam],
        responses: {
          200: {
            description: 'the cancelled job, or that it was deleted',
            content: json({ oneOf: [ref('Video'), ref('DeletedVideo')] }),
          },
          401: unauthorized,
          404: errorResponse('no such job'),
          429: limited,
        },
      },
    },
    '/v1/videos/{id}/content': {
      get: {
        summary: "The job's video (WebM), or its latent as safetensors",
        parameters: [
          idParam,
          { name: 'variant', in: 'query', schema: { enum: ['video', 'latent'], default: 'video' } },
        ],
        responses: {
          200: {
            description: 'the file (Accept-Ranges: bytes)',
            content: { 'video/webm': {}, 'application/octet-stream': {} },
          },
          206: {
            description: 'the bytes a Range header asked for, with Content-Range',
            content: { 'video/webm': {}, 'application/octet-stream': {} },
          },
          401: unauthorized,
          404: errorResponse('no such job, or it made no such file (output "latent" makes no video)'),
          409: errorResponse('the job has not completed'),
          416: errorResponse("a Range not within the file's bytes (Content-Range: bytes */SIZE says how many)"),
          429: limited,
        },
      },
    },
    '/v1/videos/{id}/events': {
      get: {
        summary: 'Server-sent events: the job at each change, until it ends',
        parameters: [idParam],
        responses: {
          200: { description: '`event: video` with the job as its data', content: { 'text/event-stream': {} } },
          401: unauthorized,
          404: errorResponse('no such job'),
        },
      },
    },
    '/v1/swarm': {
      get: {
        summary: 'The worker link, and the workers that joined',
        responses: { 200: { description: 'the swarm', content: json(ref('Swarm')) }, 401: unauthorized, 429: limited },
      },
    },
    '/v1/swarm/revoke': {
      post: {
        summary: 'Revokes the worker link: its workers leave, none joins with it again; the swarm with the new link',
        responses: {
          200: { description: 'the swarm, with its new worker link', content: json(ref('Swarm')) },
          401: unauthorized,
          429: limited,
          503: errorResponse('the coordinator page could not revoke it (it says why): try again'),
        },
      },
    },
    '/v1/openapi.json': {
      get: { summary: 'This document', responses: { 200: { description: 'OpenAPI 3.1' }, 401: unauthorized } },
    },
  },
} as const;
