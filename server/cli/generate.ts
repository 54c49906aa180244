// The main job, headless: starts the server and Chromium, opens the dashboard and N worker pages,
// runs one prompt → video job through the dashboard, and writes the video, the latent and a report.
//
//   npm run generate -- --prompt "a red ball" [--backend local|swarm] [--workers N]
//     [--ep auto|webgpu|wasm] [--frames F --height H --width W --steps K --guidance G --seed S]
//     [--out out/video.webm] [--report out/report.json] [--latent-out out/latent.f32]
//     [--drop-worker RANK@STEP] [--crash-worker RANK@STEP] [--force-relay] [--cfg-parallel] [--stages S] [--model URL]
//     [--prompt-embeds FILE] [--negative-prompt-embeds FILE] [--output-type video|latent] [--image FILE.png]

import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { parseArgs } from 'node:util';
import type { AutomationProgress, JobOverrides } from '../../app/automation.ts';
import { describeEstimate, describeLeft, needsConfirmation } from '../../coordinator/estimate.ts';
import { checkJobParams, FEW_STEP_SAMPLING, type JobParams } from '../../core/job.ts';
import { readSafetensors } from '../../core/safetensors.ts';
import { parseCacheFlags } from '../../core/step-cache.ts';
import { WEIGHT_TYPES } from '../../core/worker-api.ts';
import { CACHE_ROOT } from '../model-folder.ts';
import { servedOr } from '../serve.ts';
import { pageError, startLocalSwarm } from './browser-swarm.ts';
import { degreeOfWorkers, jobFlagValues } from './job-flags.ts';
import { GENERATE_OPTIONS } from './flags.ts';
import { imageTypeOf } from '../api/video-form.ts';

const USAGE = [
  'usage: npm run generate -- --prompt "a red ball" ' + '[--backend local|swarm] [--workers N] [--ep auto|webgpu|wasm]',
  '  [--frames F] [--height H] [--width W] [--steps K] [--guidance G] [--seed S] [--negative-prompt TEXT]',
  '  [--out out/video.webm] [--report out/report.json] [--latent-out out/latent.f32] [--port P]',
  "  [--verbose]   the server's and the pages' log lines too",
  '  [--node-workers K]   K of the N workers are worker processes (npm run worker, one thread each), not tabs',
  '  [--yes]   run a job estimated to take over an hour on these workers (without it, generate stops and says so)',
  '  [--drop-worker RANK@STEP] [--crash-worker RANK@STEP]   ' +
    "close (or crash) that rank's tab when step STEP (from 1) starts",
  '  [--model PATH|URL]   model folder: a folder on this machine (served to the pages), or a URL as the pages fetch it',
  '                     (default: the bundled demo model, /models/tiny-wan-demo)',
  '  [--lora FILE[:STRENGTH]]...   LoRA adapters (.safetensors: Wan/ComfyUI, diffusers or kohya keys) merged into',
  "                     every rank's transformer weights as it loads (strength 1 unless given)",
  '  [--prompt-embeds FILE] [--negative-prompt-embeds FILE]   ' +
    'safetensors holding prompt_embeds [L, text_dim] (or [1, L, text_dim]), as',
  "                     WanPipeline's prompt_embeds=: the text encoder is not run (--prompt is then optional, a label)",
  '  [--output-type video|latent]   ' +
    'latent: stop before the VAE and write the latent and the report only (output_type="latent")',
  '  [--image FILE.png]   image to video on a Wan2.2 TI2V folder: the image, stretched to the job size, is the ' +
    "video's first frame",
  '  [--fp16]   send activations between ranks as float16 (half the bytes, not bit-exact)',
  '  [--int8]   send them as int8 with a float32 scale per 64 values (about a quarter of the bytes, less exact still)',
  "  [--int4]   with --displaced: keys' and values' change since the last step " +
    'as int4 with a scale per 64 values (an eighth)',
  '  [--displaced] [--warmup-steps N]   ' +
    'displaced patch parallelism: past N exact steps (default 2), each rank attends to the',
  "                     others' keys and values of the step before while this step's travel " +
    '(the exchange off the critical path, not exact)',
  '  [--cfg-parallel]   conditional and unconditional passes at once ' +
    'on two groups of N/2 workers (N even; guidance ≠ 1)',
  "  [--force-relay]   send every link through the server's relay instead of WebRTC data channels " +
    '(networks that block UDP; tests)',
  "  [--stages S]   pooled memory: the transformer's blocks cut into S pipeline stages, each on N/S worker tabs " +
    "holding only its stage's weights",
  '                     (Ulysses among them; N is S unless --workers says; with --cfg-parallel each group runs the S)',
  '  [--pipefusion M]   with --stages (one worker a stage): each step after the warm-up cut into M patches that flow ' +
    'through the stages at once, attending to the later patches as of the step before (PipeFusion; not exact)',
  "  [--weights float16|float32]   how every worker holds the blocks' weights: float16 halves them (a stage holds " +
    'twice the blocks;',
  '                     ~2e-4 of the output from float32); unset: float16 on WebGPU with shader-f16, else float32',
  "  [--scheduler folder|step-distill]   the model folder's scheduler, or lightx2v's few-step schedule",
  "  [--fast]   a step-distilled LoRA's sampling: 4 steps, guidance 1, shift 5, step-distill (give the LoRA too)",
  '  [--cache magcache|auto|off] [--cache-threshold X]   the step cache: forwards whose residual barely changes skip',
  "                     the transformer's blocks (MagCache; auto: at its defaults where the model has a curve)",
].join('\n');

function fail(message: string): never {
  console.error(`generate: ${message}`);
  process.exit(1);
}

let parsed;
try {
  parsed = parseArgs({
    options: GENERATE_OPTIONS,
  });
} catch (e) {
  fail(`${(e as Error).message}\n${USAGE}`);
}
const { values } = parsed;
if (values.help) {
  console.log(USAGE);
  process.exit(0);
}
// as diffusers takes prompt=None beside prompt_embeds: the prompt is then only the report's label
if (!values.prompt && values['prompt-embeds'] === undefined)
  fail(`--prompt is required (or --prompt-embeds)\n${USAGE}`);
const prompt = values.prompt || `the prompt embeddings of ${basename(values['prompt-embeds'] ?? '')}`;
if (values.backend !== 'local' && values.backend !== 'swarm')
  fail(`--backend must be local or swarm, got ${values.backend}`);
const EPS = ['auto', 'webgpu', 'wasm'] as const;
const isEp = (ep: string): ep is (typeof EPS)[number] => (EPS as readonly string[]).includes(ep);
if (!isEp(values.ep)) fail(`--ep must be auto, webgpu or wasm, got ${values.ep}`);
if ([values.fp16, values.int8, values.int4].filter(Boolean).length > 1)
  fail('--fp16, --int8 and --int4 are ways to send activations between ranks: give one of them');
if (values.int4 && !values.displaced)
  fail("--int4 sends displaced mode's deltas of keys and values: give --displaced too");
let cache;
try {
  cache = parseCacheFlags(values.cache, values['cache-threshold']);
} catch (e) {
  fail((e as Error).message);
}
const weightType =
  values.weights === undefined
    ? undefined
    : (WEIGHT_TYPES.find((type) => type === values.weights) ??
      fail(`--weights is ${WEIGHT_TYPES.join(' or ')}, got ${JSON.stringify(values.weights)}`));
const stages = Number(values.stages);
if (!Number.isInteger(stages) || stages < 1) fail(`--stages must be a whole number ≥ 1, got ${values.stages}`);
const cfgParallel = values['cfg-parallel'];
// with CFG parallel each of the two groups runs every stage
const stageTabs = stages * (cfgParallel ? 2 : 1);
const workers = Number(values.workers ?? stageTabs);
if (!Number.isInteger(workers) || workers < 1) fail(`--workers must be a whole number ≥ 1, got ${values.workers}`);
const nodeWorkers = Number(values['node-workers']);
if (
  !Number.isInteger(nodeWorkers) ||
  nodeWorkers < 0 ||
  nodeWorkers > workers ||
  (nodeWorkers && values.backend !== 'swarm')
)
  fail(`--node-workers must be a whole number from 0 to --workers with --backend swarm, got ${values['node-workers']}`);
if (stages > 1 && (values.backend !== 'swarm' || workers % stageTabs))
  fail(
    `--stages ${stages} runs each stage on the same number of worker tabs: it needs --backend swarm and ` +
      `--workers a multiple of ${stageTabs}${cfgParallel ? ' (the stages × the two CFG groups)' : ''} ` +
      `(${stageTabs} without --workers), got ${values.backend} with ${workers}`,
  );
const warmupSteps = values['warmup-steps'] === undefined ? undefined : Number(values['warmup-steps']);
const stale = values.displaced || values.pipefusion !== undefined;
if (warmupSteps !== undefined && !(Number.isInteger(warmupSteps) && warmupSteps >= 0 && stale))
  fail(
    `--warmup-steps is a whole number ≥ 0 of exact steps for --displaced or --pipefusion, ` +
      `got ${values['warmup-steps']}${stale ? '' : ' without either'}`,
  );
if (cfgParallel && (values.backend !== 'swarm' || workers % 2))
  fail(
    '--cfg-parallel runs two equal groups of worker tabs: it needs --backend swarm and an even --workers, ' +
      `got ${values.backend} with ${workers}`,
  );

/** --drop-worker / --crash-worker: which rank's tab to close or crash, when its step starts. */
const harm = (['drop-worker', 'crash-worker'] as const).flatMap((flag) => {
  const value = values[flag];
  if (value === undefined) return [];
  const match = /^(\d+)@(\d+)$/.exec(value);
  if (!match) fail(`--${flag} takes RANK@STEP, e.g. 1@2, got ${value}`);
  const [rank, step] = [Number(match[1]), Number(match[2])];
  if (values.backend !== 'swarm' || rank >= workers)
    fail(`--${flag} ${value}: rank ${rank} does not exist with --backend ${values.backend} --workers ${workers}`);
  if (step < 1) fail(`--${flag} ${value}: steps count from 1`);
  return [{ kind: flag === 'drop-worker' ? ('drop' as const) : ('crash' as const), rank, step, at: 0, worker: '' }];
});

const outputType = values['output-type'];
if (outputType !== 'video' && outputType !== 'latent') fail(`--output-type must be video or latent, got ${outputType}`);

/** --prompt-embeds FILE: its prompt_embeds tensor, as the page takes it. */
function embedsFrom(flag: 'prompt-embeds' | 'negative-prompt-embeds'): { shape: number[]; base64: string } | undefined {
  const file = values[flag];
  if (file === undefined) return undefined;
  let tensors;
  try {
    tensors = readSafetensors(new Uint8Array(readFileSync(file)), file);
  } catch (e) {
    return fail(`--${flag} ${file}: ${(e as Error).message}`);
  }
  const embeds = tensors.get('prompt_embeds') ?? (tensors.size === 1 ? [...tensors.values()][0] : undefined);
  if (!embeds)
    return fail(`--${flag} ${file} has no tensor "prompt_embeds" (it has ${[...tensors.keys()].join(', ')})`);
  return {
    shape: embeds.shape,
    base64: Buffer.from(embeds.data.buffer, embeds.data.byteOffset, embeds.data.byteLength).toString('base64'),
  };
}
/** --image FILE: the file as the page takes it (the page decodes it); not an image stops here, before Chromium. */
function imageFrom(file: string | undefined): JobOverrides['image'] {
  if (file === undefined) return undefined;
  let bytes: Uint8Array;
  try {
    bytes = new Uint8Array(readFileSync(file));
  } catch (e) {
    return fail(`--image ${file}: ${(e as Error).message}`);
  }
  const type = imageTypeOf(bytes) ?? fail(`--image ${file} is not a PNG, JPEG or WebP image by its bytes`);
  return { type, base64: Buffer.from(bytes).toString('base64') };
}
const inputs: JobOverrides = {
  promptEmbeds: embedsFrom('prompt-embeds'),
  negativePromptEmbeds: embedsFrom('negative-prompt-embeds'),
  outputType,
  image: imageFrom(values.image),
};

// --fast: a step-distilled LoRA's sampling beneath what the other flags give
const params: Partial<JobParams> = { ...(values.fast && FEW_STEP_SAMPLING), prompt };
if (values['negative-prompt'] !== undefined) params.negativePrompt = values['negative-prompt'];
if (values.scheduler !== undefined) params.scheduler = values.scheduler as JobParams['scheduler'];
Object.assign(params, jobFlagValues(values));
const errors = checkJobParams(params);
if (Object.keys(errors).length)
  fail(
    `bad job parameters:\n${Object.entries(errors)
      .map(([k, v]) => `  --${k}: ${v}`)
      .join('\n')}`,
  );

const tty = process.stderr.isTTY;
const progress = (line: string) => (tty ? process.stderr.write(`\r\x1b[K${line}`) : console.error(line));
const swarmWorkers = values.backend === 'swarm' ? workers : 0;
// the sizes the flags leave out are the model folder's defaults (WanPipeline's for a published folder):
// the report says which
const tabs = swarmWorkers - nodeWorkers;
const withWorkers = [tabs && `${tabs} worker tab(s)`, nodeWorkers && `${nodeWorkers} worker process(es)`]
  .filter(Boolean)
  .join(' and ');
console.error(`generate: "${prompt}" on ${values.backend}${swarmWorkers ? ` with ${withWorkers}` : ''}`);

const {
  modelFolders,
  defaultModel: modelUrl,
  loraFiles,
  defaultLoras,
} = servedOr({ model: values.model, loras: values.lora }, fail);
const swarm = await startLocalSwarm({
  workers: tabs,
  nodeWorkers,
  // the next run's worker tabs load the weights this one fetched from the browser's cache
  profileDir: join(CACHE_ROOT, 'browser'),
  modelFolders,
  loraFiles,
  port: Number(values.port),
  relay: values['force-relay'] ? 'force' : 'fallback',
  log: values.verbose ? console.error : () => {},
}).catch((e: unknown) => fail(`could not start the server and Chromium: ${(e as Error).message}`));
try {
  await swarm.dashboard.exposeFunction('ditswarmProgress', async (p: AutomationProgress) => {
    const started = 'phase' in p ? (p.phase === 'denoising' ? 1 : 0) : p.step + 1;
    for (const h of harm) if (!h.at && h.step === started) await inflict(h);
    // before the first step (encoding, loading GBs of weights) and after the last, what is under way
    if ('phase' in p)
      return progress(`${p.phase}${p.detail ? `: ${p.detail}` : ''}…${'left' in p ? ` ${describeLeft(p.left)}` : ''}`);
    const bar = '#'.repeat(Math.round((20 * p.step) / p.steps)).padEnd(20, '.');
    progress(
      `[${bar}] step ${p.step}/${p.steps}  ${p.stepMs.toFixed(0)} ms/step  eta ${(p.etaMs / 1000).toFixed(1)} s`,
    );
  });
  /** Closes or crashes the tab of a rank, as a user or a failing machine would. */
  async function inflict(h: (typeof harm)[number]) {
    const ranks = await swarm.dashboard.evaluate(() => window.ditswarm.ranks());
    for (const page of swarm.workers) {
      if (page.isClosed() || (await page.evaluate(() => window.ditswarmWorker?.peerId)) !== ranks[h.rank]) continue;
      h.at = Date.now();
      h.worker = ranks[h.rank];
      if (tty) process.stderr.write('\n');
      console.error(
        `generate: ${h.kind === 'drop' ? 'closing' : 'crashing'} rank ${h.rank}'s tab as step ${h.step} starts`,
      );
      if (h.kind === 'drop') await page.close();
      else await page.goto('chrome://crash').catch(() => {});
    }
  }
  const overrides: JobOverrides = {
    ...params,
    ...inputs,
    backend: values.backend,
    // with CFG parallel the degree is that of each of the two groups, with stages that of each stage
    workers:
      values.backend === 'swarm'
        ? (degreeOfWorkers(workers, stages, cfgParallel) ?? fail(`--workers ${workers} cannot be shared evenly`))
        : 1,
    ...(stages > 1 && { stages }),
    ...(values.pipefusion !== undefined && { pipeFusionPatches: Number(values.pipefusion) }),
    ...(weightType && { weightType }),
    ep: values.ep,
    dtype: values.int4 ? 'i4' : values.int8 ? 'i8' : values.fp16 ? 'f16' : 'f32',
    parallel: values.displaced ? 'displaced' : 'ulysses',
    warmupSteps,
    cfgParallel,
    model: modelUrl,
    ...(defaultLoras && { loras: defaultLoras }),
    ...(cache && { cache }),
  };
  // a job of hours (a published folder's WanPipeline defaults on WASM take days) runs only when asked for
  const estimate = await swarm.dashboard.evaluate((o) => window.ditswarm.estimate(o), overrides).catch(() => null);
  if (estimate) {
    console.error(`generate: estimated ${describeEstimate(estimate)}`);
    if (needsConfirmation(estimate) && !values.yes)
      throw new Error(
        `this job would take ${describeEstimate(estimate)} on ${swarmWorkers || 'no'} worker tab(s) of this machine; ` +
          'ask for fewer --frames, a smaller --height/--width or fewer --steps, or pass --yes to run it anyway',
      );
  }
  const result = await swarm.dashboard.evaluate((o) => window.ditswarm.generate(o), overrides);
  if (tty) process.stderr.write('\n');
  const injected = harm.map((h) => {
    const failure = result.report.failures.find((f: { lost: { worker: string }[] }) =>
      f.lost.some((l) => l.worker === h.worker),
    );
    return {
      ...h,
      detectionMs: failure ? failure.detectedAt - h.at : null,
      replanMs: failure?.replanMs ?? null,
      degreeAfter: failure?.degreeAfter ?? null,
    };
  });
  const report = {
    ...result.report,
    ...(injected.length ? { injected } : {}),
    machine: {
      cpus: cpus().length,
      cpuModel: cpus()[0]?.model,
      memoryGiB: Math.round(totalmem() / 2 ** 30),
      node: process.version,
      browser: swarm.browserVersion,
    },
  };
  const write = (path: string, data: Buffer | string) => {
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, data);
  };
  if (result.video) write(values.out, Buffer.from(result.video, 'base64'));
  write(values['latent-out'], Buffer.from(result.latent, 'base64'));
  write(values.report, JSON.stringify(report, null, 2) + '\n');
  const perStep = report.steps.map((s: { ms: number }) => s.ms.toFixed(0)).join(', ');
  const wrote = [...(result.video ? [values.out] : []), values['latent-out'], values.report].join(', ');
  const { frames, width, height } = report.config;
  console.error(
    `generate: wrote ${wrote}: ${frames} frames ${width}×${height}; ` +
      `${report.steps.length} steps (${perStep} ms), total ${(report.totalMs / 1000).toFixed(1)} s`,
  );
  const { links } = report;
  if (links.length) {
    const name = (l: (typeof links)[number]) =>
      `${l.from === 'coordinator' ? 'coordinator' : `rank ${l.from}`}→rank ${l.to}`;
    const by = (path: string) => links.filter((l) => l.transport === path);
    const [turned, relayed] = [by('turn'), by('relay')];
    console.error(
      `generate: links ${by('direct').length} direct, ${turned.length} through TURN, ${relayed.length} relayed` +
        [turned, relayed].map((l) => (l.length ? ` (${l.map(name).join(', ')})` : '')).join(''),
    );
  }
  for (const i of injected) {
    console.error(
      `generate: rank ${i.rank} ${i.kind === 'drop' ? 'closed' : 'crashed'} at step ${i.step}: ` +
        `detected after ${i.detectionMs ?? '?'} ms, re-planned to ${i.degreeAfter ?? '?'} rank(s) ` +
        `in ${i.replanMs?.toFixed(0) ?? '?'} ms`,
    );
  }
} catch (e) {
  if (tty) process.stderr.write('\n');
  await swarm.close();
  fail(pageError(e));
}
await swarm.close();
