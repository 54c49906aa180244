// `npm run worker -- LINK`: this machine joins a swarm as a worker process, by the worker link its dashboard
// shows, computing natively on its cores (platform.ts). It says what it does on stdout, a line a change, and
// leaves the swarm cleanly on Ctrl-C or SIGTERM.
import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { readWorkerLink } from '../../app/worker-link.ts';
import { MAX_MODEL_MEMORY_GIB, MIN_MODEL_MEMORY_GIB, NATIVE_DEVICES } from '../../core/worker-api.ts';
import { startWorkerEndpoint, type WorkerStatus } from '../endpoint.ts';
import { CUDA_PROVIDERS_INSTALL } from './onnxruntime-node.ts';
import { nodePlatform, type DeviceRequest } from './platform.ts';
import { caToTrust, runTrusting, untrustedServer } from './server-ca.ts';
import { DEFAULT_CACHE, WORKER_OPTIONS } from './flags.ts';

const USAGE = `usage: npm run worker -- <worker link> [--threads N] [--model-memory GiB] [--cache DIR]
         [--model-dir DIR] [--device auto|cpu|cuda|webgpu|wasm] [--ca FILE]
       (npx ditswarm worker <worker link> … where ditswarm is installed as a package)

  <worker link>         the link the dashboard shows under "Add a worker", quoted: from another machine
                        https://HOST:PORT/worker.html#token=…&ca=… (ca= pins the server's own CA by its SHA-256:
                        this process trusts that CA, and is refused by a server showing another); on the server's
                        machine http://localhost:PORT/worker.html#token=…
  --ca FILE             trust this CA certificate (PEM; the server serves its own at /ca.crt) for an https link
                        that pins none; a server whose certificate is of a public CA needs neither
  --threads N           the cores to compute on (default: all ${availableParallelism()} of this machine's)
  --model-memory GiB    what a pipeline stage placed here may hold of the model's weights (default: no bound)
  --cache DIR           keep the weights it fetches in DIR, for its next start (default: ${DEFAULT_CACHE});
                        --cache '' keeps none
  --model-dir DIR       a model folder this machine has (as diffusers publishes it): each of its files whose size and
                        SHA-256 are the server's is read from here instead of downloaded
  --device D            what to compute on (default auto: the fastest that starts here, each timed at start):
                          cpu     onnxruntime-node on the CPU's cores
                          cuda    onnxruntime-node on an NVIDIA GPU (its CUDA providers installed:
                                  ${CUDA_PROVIDERS_INSTALL})
                          webgpu  onnxruntime-node on a GPU through WebGPU (Dawn, on Vulkan, Metal or D3D12)
                          wasm    onnxruntime-web's WebAssembly, as a tab computes`;

const fail = (message: string): never => {
  console.error(`worker: ${message}\n\n${USAGE}`);
  process.exit(2);
};

const { values, positionals } = (() => {
  try {
    return parseArgs({
      allowPositionals: true,
      options: WORKER_OPTIONS,
    });
  } catch (e) {
    return fail((e as Error).message);
  }
})();
if (values.help) {
  console.log(USAGE);
  process.exit(0);
}
const [link] = positionals;
if (!link || positionals.length > 1 || !URL.canParse(link)) fail('give the worker link, whole and quoted');
const { token, refused } = readWorkerLink(link, null);
if (!token)
  fail(refused ?? 'this link has no #token=: copy the worker link the dashboard shows (…/worker.html#token=…)');

const threads = values.threads === undefined ? availableParallelism() : Number(values.threads);
if (!Number.isInteger(threads) || threads < 1 || threads > 1024) fail('--threads takes a whole number from 1 to 1024');
const modelMemoryGiB = values['model-memory'] === undefined ? null : Number(values['model-memory']);
if (
  modelMemoryGiB !== null &&
  !(Number.isFinite(modelMemoryGiB) && modelMemoryGiB >= MIN_MODEL_MEMORY_GIB && modelMemoryGiB <= MAX_MODEL_MEMORY_GIB)
)
  fail(`--model-memory takes a number of GiB from ${MIN_MODEL_MEMORY_GIB} to ${MAX_MODEL_MEMORY_GIB}`);

const cacheDir = values.cache || null;
const modelDir = values['model-dir'] ?? null;
if (modelDir !== null && !existsSync(join(modelDir, 'model_index.json')))
  fail(`--model-dir ${modelDir}: no model_index.json there; give a model folder as diffusers publishes it`);
const DEVICES: readonly DeviceRequest[] = ['auto', ...NATIVE_DEVICES, 'wasm'];
const device = DEVICES.find((d) => d === values.device) ?? fail(`--device takes one of ${DEVICES.join(', ')}`);

// before anything else is sent: an https link's CA is checked against its pin, then trusted by a run of its own
const ca = await caToTrust(new URL(link), values.ca ?? null).catch((e: unknown) => {
  console.error(`worker: ${(e as Error).message}`);
  return process.exit(1);
});
if (ca) process.exit(await runTrusting(ca, fileURLToPath(import.meta.url)));

const { platform, compute } = await nodePlatform({ threads, device, cacheDir, modelDir }).catch((e: unknown) =>
  fail(`--device ${device}: ${(e as Error).message}`),
);
console.log(`worker: computing on ${compute.name}; weights kept ${cacheDir ? `in ${cacheDir}` : 'nowhere'}`);

let said = '';
const say = (s: WorkerStatus) => {
  if (!said) console.log(`worker: peer id ${s.peerId}`);
  const line = `${s.state}: ${s.detail}`;
  if (line === said) return;
  said = line;
  console.log(`worker: ${line}`);
};
const endpoint = await startWorkerEndpoint({
  origin: new URL(link).origin,
  token,
  modelMemoryGiB,
  platform,
  onStatus: say,
  // a revoked link does not come back: a process asking with it every few seconds for ever would only hide that
  onLinkRefused: (why) => {
    console.error(`worker: ${why}. Stopping: ask the dashboard for its worker link now`);
    process.exit(2);
  },
}).catch((e: unknown) => {
  console.error(`worker: could not join: ${(e as Error).message}${untrustedServer(e, link)}`);
  return process.exit(1);
});

let leaving = false;
const leave = (why: string) => {
  // a terminal's Ctrl-C reaches this run and the one that started it (runTrusting), which hands it on: heard once
  if (leaving) return;
  leaving = true;
  console.log(`worker: ${why}: leaving the swarm`);
  endpoint.leave();
  // the dashboard hears the link close; WebRTC's sockets need a moment to say so
  setTimeout(() => process.exit(0), 500);
};
process.on('SIGINT', () => leave('SIGINT'));
process.on('SIGTERM', () => leave('SIGTERM'));
// started by runTrusting: that process ended, however it ended, and no one is left to stop this one
process.once('disconnect', () => leave('the process that started it ended'));
