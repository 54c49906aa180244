// The flags of server/cli's commands, one object each, which each command parses its arguments by:
// test/unit/docs.test.ts holds every flag the docs name to these.
import type { ParseArgsConfig } from 'node:util';
import { JOB_FLAG_OPTIONS } from './job-flags.ts';

/**
 * where generate serves unless told (not the dashboard's, so both can run at once): a fixed port,
 * as the browser keeps weights and encoded prompts per origin
 */
const GENERATE_PORT = 5190;

export const GENERATE_OPTIONS = {
  prompt: { type: 'string' },
  'negative-prompt': { type: 'string' },
  backend: { type: 'string', default: 'swarm' },
  workers: { type: 'string' },
  'node-workers': { type: 'string', default: '0' },
  stages: { type: 'string', default: '1' },
  pipefusion: { type: 'string' },
  weights: { type: 'string' },
  ep: { type: 'string', default: 'auto' },
  fp16: { type: 'boolean', default: false },
  int8: { type: 'boolean', default: false },
  int4: { type: 'boolean', default: false },
  model: { type: 'string' },
  lora: { type: 'string', multiple: true, default: [] },
  'cfg-parallel': { type: 'boolean', default: false },
  displaced: { type: 'boolean', default: false },
  'warmup-steps': { type: 'string' },
  'drop-worker': { type: 'string' },
  'crash-worker': { type: 'string' },
  'force-relay': { type: 'boolean', default: false },
  cache: { type: 'string' },
  scheduler: { type: 'string' },
  fast: { type: 'boolean', default: false },
  'cache-threshold': { type: 'string' },
  ...JOB_FLAG_OPTIONS,
  out: { type: 'string', default: 'out/video.webm' },
  report: { type: 'string', default: 'out/report.json' },
  'latent-out': { type: 'string', default: 'out/latent.f32' },
  port: { type: 'string', default: String(GENERATE_PORT) },
  verbose: { type: 'boolean', default: false },
  yes: { type: 'boolean', default: false },
  'prompt-embeds': { type: 'string' },
  'negative-prompt-embeds': { type: 'string' },
  'output-type': { type: 'string', default: 'video' },
  image: { type: 'string' },
  help: { type: 'boolean', default: false },
} satisfies ParseArgsConfig['options'];

export const FORWARD_OPTIONS = {
  model: { type: 'string', default: 'public/models/tiny-wan' },
  input: { type: 'string' },
  output: { type: 'string' },
  backend: { type: 'string', default: 'onnx' },
  ulysses: { type: 'string', default: '1' },
  'make-input': { type: 'string' },
  frames: { type: 'string', default: '3' },
  height: { type: 'string', default: '8' },
  width: { type: 'string', default: '8' },
  'text-length': { type: 'string', default: '32' },
  seed: { type: 'string', default: '0' },
  'per-token': { type: 'boolean', default: false },
  lora: { type: 'string', multiple: true, default: [] },
  help: { type: 'boolean', default: false },
} satisfies ParseArgsConfig['options'];

export const DECODE_OPTIONS = {
  model: { type: 'string' },
  latent: { type: 'string' },
  output: { type: 'string' },
  out: { type: 'string' },
  workers: { type: 'string', default: '1' },
  verbose: { type: 'boolean', default: false },
} satisfies ParseArgsConfig['options'];

export const ENCODE_IMAGE_OPTIONS = {
  model: { type: 'string' },
  image: { type: 'string' },
  height: { type: 'string' },
  width: { type: 'string' },
  output: { type: 'string' },
} satisfies ParseArgsConfig['options'];

export const ENCODE_PROMPT_OPTIONS = {
  model: { type: 'string' },
  prompt: { type: 'string' },
  'input-ids': { type: 'string' },
  output: { type: 'string' },
  backend: { type: 'string', default: 'onnx' },
  'max-length': { type: 'string', default: '512' },
} satisfies ParseArgsConfig['options'];

export const MAKE_LORA_OPTIONS = {
  model: { type: 'string' },
  out: { type: 'string' },
  rank: { type: 'string', default: '16' },
  alpha: { type: 'string', default: '8' },
  strength: { type: 'string', default: '1' },
  seed: { type: 'string', default: 'lora' },
} satisfies ParseArgsConfig['options'];

export const MAKE_MODEL_OPTIONS = {
  preset: { type: 'string', default: 'tiny' },
  out: { type: 'string' },
  seed: { type: 'string' },
  layers: { type: 'string' },
  'head-dim': { type: 'string' },
  ffn: { type: 'string' },
  'text-dim': { type: 'string' },
  'text-length': { type: 'string' },
  'shard-bytes': { type: 'string' },
  'text-layers': { type: 'string' },
  dtype: { type: 'string', default: 'fp32' },
} satisfies ParseArgsConfig['options'];
