// The flags of the demo's commands (npm run eval-demo): test/unit/docs.test.ts holds every flag the docs name to them.
import type { ParseArgsConfig } from 'node:util';
import { DEFAULT_WARMUP_STEPS } from '../../coordinator/planner.ts';
import { DEMO_SAMPLING } from '../world.ts';

export const EVAL_DEMO_OPTIONS = {
  model: { type: 'string', default: 'public/models/tiny-wan-demo' },
  out: { type: 'string', default: 'bench/out/demo-eval.json' },
  steps: { type: 'string', default: String(DEMO_SAMPLING.steps) },
  guidance: { type: 'string', default: String(DEMO_SAMPLING.guidance) },
  seeds: { type: 'string', default: '2' },
  'first-seed': { type: 'string', default: '1000' },
  ranks: { type: 'string', default: '1' },
  set: { type: 'string', default: 'held-out' },
  displaced: { type: 'boolean', default: false },
  'warmup-steps': { type: 'string', default: String(DEFAULT_WARMUP_STEPS) },
  dtype: { type: 'string', default: 'f32' },
  cache: { type: 'string' },
  'cache-threshold': { type: 'string' },
  pipefusion: { type: 'string' },
} satisfies ParseArgsConfig['options'];
