// One transformer forward on a diffusers-style input file, for parity checks against diffusers:
// reads hidden_states [1, C, T, H, W], timestep [1], encoder_hidden_states [1, L, text_dim] and
// writes sample [1, C, T, H, W], all float32 safetensors.
//
//   npm run forward -- --input in.safetensors --output out.safetensors
//     [--model public/models/tiny-wan] [--backend onnx|reference] [--ulysses P] [--lora FILE[:STRENGTH]]...
//   npm run forward -- --make-input in.safetensors [--frames T --height H --width W --text-length L --seed S]
//     [--per-token]   (timestep [1, S]: the first latent frame's tokens at 0, as Wan2.2 TI2V gives an image's)

import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { forwardOutput, randomForwardInputs, readForwardInputs } from '../../core/model/forward-io.ts';
import type { Timestep } from '../../core/model/timesteps.ts';
import { referenceForward, type WanModel } from '../../core/model/reference.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { applyLoras, parseLoraFlag, splitFileUrl } from '../../core/model/lora.ts';
import { checkDegree } from '../../core/parallel.ts';
import { readSafetensors, writeSafetensors } from '../../core/safetensors.ts';
import type { Tensor } from '../../core/tensor.ts';
import type { StageRunner } from '../../rank/stages.ts';
import { folderFiles } from '../model-folder.ts';
import { byteProgress } from './progress.ts';
import { defined } from '../../core/defined.ts';
import { FORWARD_OPTIONS } from './flags.ts';

const USAGE = [
  'usage: npm run forward -- --input in.safetensors --output out.safetensors',
  '         [--model public/models/tiny-wan] [--backend onnx|reference] [--ulysses P]',
  '         [--lora FILE[:STRENGTH]]...   LoRA adapters merged into the weights (strength 1 unless given)',
  '       npm run forward -- --make-input in.safetensors ' +
    '[--frames T] [--height H] [--width W] [--text-length L] [--seed S]',
].join('\n');
const BACKENDS = ['onnx', 'reference'];
/** Errors whose message is the whole story; anything else is a bug and keeps its stack. */
const USER_ERRORS = new Set([
  'ForwardInputError',
  'SafetensorsError',
  'ModelConfigError',
  'ParallelConfigError',
  'UsageError',
  'MissingFile',
  'LoraError',
]);

class UsageError extends Error {
  override name = 'UsageError';
}

function usage(message: string): never {
  throw new UsageError(`${message}\n${USAGE}`);
}

function wholeNumber(flag: string, value: string, min: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) usage(`--${flag} must be a whole number ≥ ${min}, got ${JSON.stringify(value)}`);
  return n;
}

async function readInput(path: string): Promise<Uint8Array> {
  try {
    return new Uint8Array(await readFile(path));
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    throw new UsageError(`--input ${path} does not exist; make an example with --make-input ${path}`);
  }
}

async function writeOutput(path: string, bytes: Uint8Array): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  await writeFile(path, bytes);
}

type Forward = (latent: Tensor, timestep: Timestep, text: Float32Array) => Promise<Tensor>;

/** Builds the backend once, so the timed part is the forward pass alone. */
async function forwardOn(backend: string, degree: number, model: WanModel): Promise<Forward> {
  if (backend === 'reference' && degree === 1)
    return (latent, timestep, text) => Promise.resolve(referenceForward(model, latent, timestep, text));
  // Loaded on demand: the plain reference needs neither onnxruntime nor the Ulysses machinery.
  const [{ forwardInProcess }, { memoryExchanges }] = await Promise.all([
    import('../../rank/ulysses.ts'),
    import('../../rank/exchange/memory.ts'),
  ]);
  let stages: StageRunner;
  if (backend === 'onnx') {
    const ort = await import('onnxruntime-web');
    ort.env.wasm.numThreads = 1; // one thread, as each worker engine runs; results stay comparable with the tests
    stages = await (await import('../../rank/onnx-stages.ts')).onnxStages(model, 'wasm');
  } else {
    stages = (await import('../../rank/stages.ts')).referenceStages(model);
  }
  return (latent, timestep, text) =>
    forwardInProcess(model.config, stages, memoryExchanges(degree), latent, timestep, text);
}

async function run(): Promise<void> {
  let parsed;
  try {
    parsed = parseArgs({
      options: FORWARD_OPTIONS,
    });
  } catch (e) {
    usage((e as Error).message);
  }
  const { values } = parsed;
  if (values.help) {
    console.log(USAGE);
    return;
  }

  const loadStarted = performance.now();
  // a large model's load takes a while: say how far it is
  const progress = byteProgress(`forward: loading ${values.model}`);
  const model = await loadTransformer(
    folderFiles(values.model),
    (loaded, total) => total >= 1e9 && progress(loaded, total),
  );
  await applyLoras(model, values.lora.map(parseLoraFlag), (file) => {
    const { folder, name } = splitFileUrl(file);
    return { files: folderFiles(folder), path: name };
  });
  const loadMs = performance.now() - loadStarted;
  const cfg = model.config;

  if (values['make-input'] !== undefined) {
    if (values.input !== undefined) usage('--make-input writes an example input and exits; give it without --input');
    const size = {
      frames: wholeNumber('frames', values.frames, 1),
      height: wholeNumber('height', values.height, 1),
      width: wholeNumber('width', values.width, 1),
      textLength: wholeNumber('text-length', values['text-length'], 1),
      seed: wholeNumber('seed', values.seed, 0),
      perToken: values['per-token'],
    };
    const inputs = randomForwardInputs(cfg, size);
    readForwardInputs(cfg, inputs, '--frames/--height/--width'); // refuses sizes the patch size does not divide
    await writeOutput(values['make-input'], writeSafetensors(inputs));
    const shapes = [...inputs].map(([name, t]) => `${name} [${t.shape.join(',')}]`).join(', ');
    const inputTimestep = defined(inputs.get('timestep'), 'the example input timestep').data;
    console.log(
      `forward: wrote ${values['make-input']}: ${shapes}, timesteps ${[...new Set(inputTimestep)].join(', ')} ` +
        `(seed ${size.seed})`,
    );
    return;
  }

  if (values.input === undefined) usage('--input is required (or --make-input FILE to write an example)');
  if (values.output === undefined) usage('--output is required');
  if (!BACKENDS.includes(values.backend))
    usage(`--backend must be one of ${BACKENDS.join(', ')}, got ${JSON.stringify(values.backend)}`);
  const degree = wholeNumber('ulysses', values.ulysses, 1);
  checkDegree(cfg.numHeads, degree);

  const { latent, timestep, text } = readForwardInputs(
    cfg,
    readSafetensors(await readInput(values.input), values.input),
    values.input,
  );
  const forward = await forwardOn(values.backend, degree, model);
  const started = performance.now();
  const sample = await forward(latent, timestep, text);
  const ms = performance.now() - started;
  const output = forwardOutput(sample);
  await writeOutput(values.output, writeSafetensors(output));
  const backend = values.backend === 'onnx' ? 'onnx (wasm)' : 'reference';
  // the most memory this process held at once: every weight in float32, and the backend's copies
  const peakGiB = (process.resourceUsage().maxRSS * 1024) / 2 ** 30;
  const t = typeof timestep === 'number' ? timestep : `${new Set(timestep).size} values over ${timestep.length} tokens`;
  console.log(
    `forward: sample [${defined(output.get('sample'), 'the output sample').shape.join(',')}] t=${t} ` +
      `in ${ms.toFixed(0)} ms on ${backend}, ulysses ${degree} → ${values.output}; ` +
      `model loaded in ${(loadMs / 1000).toFixed(1)} s, peak resident memory ${peakGiB.toFixed(2)} GiB`,
  );
}

try {
  await run();
} catch (e) {
  const error = e instanceof Error ? e : undefined;
  console.error(`forward: ${error && USER_ERRORS.has(error.name) ? error.message : (error?.stack ?? String(e))}`);
  process.exit(1);
}
