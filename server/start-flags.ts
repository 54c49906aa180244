// `npm start`'s flags (server/main.ts reads them; docs/command-line.md names them, and test/unit/docs.test.ts holds the
// docs to this object).
import type { ParseArgsConfig } from 'node:util';

export const START_OPTIONS = {
  port: { type: 'string' },
  model: { type: 'string' },
  lora: { type: 'string', multiple: true, default: [] },
  rebuild: { type: 'boolean', default: false },
  'peer-key': { type: 'string' },
  host: { type: 'string', multiple: true, default: [] },
  cert: { type: 'string' },
  key: { type: 'string' },
  'ice-servers': { type: 'string' },
  relay: { type: 'string' },
  'force-relay': { type: 'boolean', default: false },
  'turn-secret': { type: 'string' },
  'turn-url': { type: 'string', multiple: true, default: [] },
  'ice-policy': { type: 'string' },
  'allow-origin': { type: 'string', multiple: true, default: [] },
  api: { type: 'boolean', default: false },
  'local-workers': { type: 'string' },
  data: { type: 'string' },
  'max-queue': { type: 'string' },
  'api-rate': { type: 'string' },
  'allow-model-host': { type: 'string', multiple: true, default: [] },
} satisfies ParseArgsConfig['options'];
