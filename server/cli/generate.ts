/**
 * The main job, headless: starts the server and Chromium, opens the dashboard and N worker pages,
 * runs one prompt → video job through the dashboard, and writes the video, the latent and a report.
 *
 *   npm run generate -- --prompt "a red ball" [--backend local|swarm] [--workers N] [--ep auto|webgpu|wasm]
 *     [--frames F --height H --width W --steps K --guidance G --seed S]
 *     [--out out/video.webm] [--report out/report.json] [--latent-out out/latent.f32]
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { checkJobParams, DEFAULT_JOB, type JobParams } from '../../core/job.ts';
import { startLocalSwarm } from './browser-swarm.ts';

const USAGE = `usage: npm run generate -- --prompt "a red ball" [--backend local|swarm] [--workers N] [--ep auto|webgpu|wasm]
  [--frames F] [--height H] [--width W] [--steps K] [--guidance G] [--seed S] [--negative-prompt TEXT]
  [--out out/video.webm] [--report out/report.json] [--latent-out out/latent.f32] [--port P] [--verbose]`;

function fail(message: string): never {
  console.error(`generate: ${message}`);
  process.exit(1);
}

let parsed;
try {
  parsed = parseArgs({
    options: {
      prompt: { type: 'string' },
      'negative-prompt': { type: 'string' },
      backend: { type: 'string', default: 'swarm' },
      workers: { type: 'string', default: '1' },
      ep: { type: 'string', default: 'auto' },
      frames: { type: 'string' },
      height: { type: 'string' },
      width: { type: 'string' },
      steps: { type: 'string' },
      guidance: { type: 'string' },
      seed: { type: 'string' },
      out: { type: 'string', default: 'out/video.webm' },
      report: { type: 'string', default: 'out/report.json' },
      'latent-out': { type: 'string', default: 'out/latent.f32' },
      port: { type: 'string', default: '0' },
      verbose: { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  });
} catch (e) {
  fail(`${(e as Error).message}\n${USAGE}`);
}
const { values } = parsed;
if (values.help) {
  console.log(USAGE);
  process.exit(0);
}
if (!values.prompt) fail(`--prompt is required\n${USAGE}`);
if (values.backend !== 'local' && values.backend !== 'swarm') fail(`--backend must be local or swarm, got ${values.backend}`);
if (!['auto', 'webgpu', 'wasm'].includes(values.ep!)) fail(`--ep must be auto, webgpu or wasm, got ${values.ep}`);
const workers = Number(values.workers);
if (!Number.isInteger(workers) || workers < 1) fail(`--workers must be a whole number ≥ 1, got ${values.workers}`);

const params: Partial<Record<keyof JobParams, unknown>> = { prompt: values.prompt };
if (values['negative-prompt'] !== undefined) params.negativePrompt = values['negative-prompt'];
for (const key of ['frames', 'height', 'width', 'steps', 'guidance', 'seed'] as const) {
  if (values[key] !== undefined) params[key] = Number(values[key]);
}
const errors = checkJobParams(params);
if (Object.keys(errors).length) fail(`bad job parameters:\n${Object.entries(errors).map(([k, v]) => `  --${k}: ${v}`).join('\n')}`);

const job = { ...DEFAULT_JOB, ...params };
const tty = process.stderr.isTTY;
const progress = (line: string) => (tty ? process.stderr.write(`\r\x1b[K${line}`) : console.error(line));
const swarmWorkers = values.backend === 'swarm' ? workers : 0;
console.error(`generate: "${job.prompt}" ${job.frames} frames ${job.width}×${job.height}, ${job.steps} steps on ${values.backend}${swarmWorkers ? ` with ${workers} worker tab(s)` : ''}`);

const swarm = await startLocalSwarm({ workers: swarmWorkers, port: Number(values.port), log: values.verbose ? console.error : () => {} }).catch((e) =>
  fail(`could not start the server and Chromium: ${(e as Error).message}`),
);
try {
  await swarm.dashboard.exposeFunction('ditswarmProgress', (p: { step: number; steps: number; stepMs: number; etaMs: number }) => {
    const bar = '#'.repeat(Math.round((20 * p.step) / p.steps)).padEnd(20, '.');
    progress(`[${bar}] step ${p.step}/${p.steps}  ${p.stepMs.toFixed(0)} ms/step  eta ${(p.etaMs / 1000).toFixed(1)} s`);
  });
  const result = await swarm.dashboard.evaluate(
    async ({ overrides }) => {
      return (window as any).ditswarm.generate(overrides);
    },
    { overrides: { ...params, backend: values.backend, workers: values.backend === 'swarm' ? workers : 1, ep: values.ep } },
  );
  if (tty) process.stderr.write('\n');
  const report = {
    ...result.report,
    machine: { cpus: cpus().length, cpuModel: cpus()[0]?.model, memoryGiB: Math.round(totalmem() / 2 ** 30), node: process.version, browser: swarm.browser.version() },
  };
  const write = (path: string, data: Buffer | string) => {
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, data);
  };
  write(values.out!, Buffer.from(result.video, 'base64'));
  write(values['latent-out']!, Buffer.from(result.latent, 'base64'));
  write(values.report!, JSON.stringify(report, null, 2) + '\n');
  const perStep = report.steps.map((s: { ms: number }) => s.ms.toFixed(0)).join(', ');
  console.error(`generate: wrote ${values.out}, ${values['latent-out']}, ${values.report}; ${report.steps.length} steps (${perStep} ms), total ${(report.totalMs / 1000).toFixed(1)} s`);
} catch (e) {
  if (tty) process.stderr.write('\n');
  const message = (e as Error).message.replace(/^page\.evaluate: (Error: )?/, '').split('\n')[0];
  await swarm.close();
  fail(message);
}
await swarm.close();
