import {
  checkJobParams,
  createPipeline,
  DEFAULT_JOB,
  openSwarm,
  probeWebM,
  validDegrees,
  type Backend,
  type ExecutionProviderChoice,
  type GenerateResult,
  type JobParams,
  type Pipeline,
  type StepProgress,
  type Swarm,
} from '../coordinator/index.ts';

// The dashboard: a thin client of the library API. No math here, only the form and the views.
const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const form = $<HTMLFormElement>('job-form');
const field = (name: string) => form.elements.namedItem(name) as HTMLInputElement | HTMLSelectElement;
const NUMERIC: (keyof JobParams)[] = ['frames', 'height', 'width', 'steps', 'guidance', 'seed'];
const TINY_MODEL_HEADS = 12;

for (const [key, value] of Object.entries(DEFAULT_JOB)) {
  const input = form.elements.namedItem(key) as HTMLInputElement | null;
  if (input) input.value = String(value);
}

let swarm: Swarm | null = null;
let pipeline: { key: string; pipe: Pipeline } | null = null;
let busy = false;

function readForm(): { params: Partial<Record<keyof JobParams, unknown>>; backend: Backend; degree: number | 'auto' } {
  const params: Partial<Record<keyof JobParams, unknown>> = { prompt: field('prompt').value, negativePrompt: field('negativePrompt').value };
  for (const key of NUMERIC) params[key] = field(key).value.trim() === '' ? NaN : Number(field(key).value);
  const degree = field('degree').value;
  return { params, backend: field('backend').value as Backend, degree: degree === 'auto' ? 'auto' : Number(degree) };
}

function showErrors(errors: Partial<Record<string, string>>): boolean {
  for (const el of form.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
  for (const key of Object.keys(errors)) form.elements.namedItem(key) && (form.elements.namedItem(key) as HTMLElement).setAttribute('aria-invalid', 'true');
  $('form-errors').textContent = Object.entries(errors).map(([k, v]) => `${k} ${v}`).join('\n');
  return Object.keys(errors).length === 0;
}

async function pipelineFor(backend: Backend, degree: number | 'auto', ep: ExecutionProviderChoice): Promise<Pipeline> {
  const key = `${backend}/${degree}/${ep}`;
  if (pipeline?.key === key) return pipeline.pipe;
  await pipeline?.pipe.shutdown({ graceMs: 2000 });
  pipeline = null;
  const pipe = await createPipeline({ backend, swarm: swarm ?? undefined, workers: degree, ep, placementTimeoutMs: 60_000 });
  pipeline = { key, pipe };
  return pipe;
}

function renderWorkers(): void {
  const workers = swarm?.workers() ?? [];
  $('worker-count').textContent = `${workers.length} worker${workers.length === 1 ? '' : 's'}`;
  $('workers').querySelector('tbody')!.replaceChildren(
    ...workers.map((w) => row([w.id.slice(-6), w.info.ep, w.info.adapter, w.activity])),
  );
  const degreeSelect = field('degree') as HTMLSelectElement;
  const chosen = degreeSelect.value;
  degreeSelect.replaceChildren(new Option('auto', 'auto'), ...validDegrees(TINY_MODEL_HEADS, Math.max(1, workers.length)).map((d) => new Option(String(d), String(d))));
  degreeSelect.value = [...degreeSelect.options].some((o) => o.value === chosen) ? chosen : 'auto';
}

function row(cells: (string | number)[]): HTMLTableRowElement {
  const tr = document.createElement('tr');
  for (const c of cells) tr.append(Object.assign(document.createElement('td'), { textContent: String(c) }));
  return tr;
}

function showProgress(p: StepProgress): void {
  const progress = $<HTMLProgressElement>('progress');
  progress.max = p.steps;
  progress.value = p.step;
  $('status').textContent = `Step ${p.step} of ${p.steps}: ${p.stepMs.toFixed(0)} ms, about ${(p.etaMs / 1000).toFixed(1)} s left.`;
  $('ranks').querySelector('tbody')!.replaceChildren(...p.ranks.map((r) => row([r.rank, r.computeMs.toFixed(0), r.commMs.toFixed(0), (r.bytesSent / 1024).toFixed(1)])));
}

function showResult(result: GenerateResult): void {
  const url = URL.createObjectURL(result.video);
  const video = $<HTMLVideoElement>('video');
  video.src = url;
  void video.play().catch(() => {});
  const download = $<HTMLAnchorElement>('download');
  download.href = url;
  download.hidden = false;
  $('report').textContent = JSON.stringify(result.report, null, 2);
  const r = result.report;
  $('status').textContent = `Done: ${r.config.frames} frames in ${(r.totalMs / 1000).toFixed(1)} s on ${r.config.workers} ${r.config.backend} rank${r.config.workers === 1 ? '' : 's'}.`;
}

/** Runs one job from the form's values (or overrides); shared by the button and automation. */
async function runJob(overrides: Partial<Record<string, unknown>> = {}, onProgress?: (p: StepProgress) => void): Promise<GenerateResult> {
  const form = readForm();
  const { backend = form.backend, workers: degree = form.degree, ep = 'auto', ...rest } = overrides as { backend?: Backend; workers?: number | 'auto'; ep?: ExecutionProviderChoice };
  const params = { ...form.params, ...rest };
  if (!showErrors(checkJobParams(params))) throw new Error(`invalid job: ${$('form-errors').textContent}`);
  if (busy) throw new Error('a job is already running');
  busy = true;
  $<HTMLButtonElement>('generate').disabled = true;
  try {
    const pipe = await pipelineFor(backend, degree, ep);
    const result = await pipe.generate({
      ...(params as Partial<JobParams>),
      onPhase: (phase) => ($('status').textContent = phase === 'placing' ? 'Placing the job on workers…' : `${phase[0].toUpperCase()}${phase.slice(1)}…`),
      onProgress: (p) => {
        showProgress(p);
        onProgress?.(p);
      },
    });
    showResult(result);
    return result;
  } catch (e) {
    $('status').textContent = `Failed: ${(e as Error).message}`;
    throw e;
  } finally {
    busy = false;
    $<HTMLButtonElement>('generate').disabled = false;
  }
}

form.addEventListener('submit', (event) => {
  event.preventDefault();
  runJob().catch(() => {});
});
form.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey && event.target instanceof HTMLTextAreaElement) {
    event.preventDefault();
    form.requestSubmit();
  }
});

const bytesToBase64 = (bytes: Uint8Array) => {
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
};

// What `npm run generate` and the e2e tests drive: the same path as the Generate button.
const automation = {
  ready: (async () => {
    swarm = await openSwarm();
    const link = $<HTMLAnchorElement>('join-link');
    link.href = link.textContent = swarm.joinUrl;
    swarm.on(renderWorkers);
    renderWorkers();
    return { swarmId: swarm.id, joinUrl: swarm.joinUrl };
  })(),
  workerCount: () => swarm?.workers().length ?? 0,
  /** What the page's <video> and the WebM file itself say about the last video. */
  async inspectVideo() {
    const video = $<HTMLVideoElement>('video');
    if (video.readyState < HTMLMediaElement.HAVE_METADATA) await new Promise((r) => video.addEventListener('loadedmetadata', r, { once: true }));
    const blob = await (await fetch(video.src)).blob();
    return { duration: video.duration, videoWidth: video.videoWidth, videoHeight: video.videoHeight, file: await probeWebM(blob), download: $<HTMLAnchorElement>('download').href };
  },
  async generate(overrides: Record<string, unknown>) {
    // the command line listens through an exposed function, when it exposed one
    const report = (window as unknown as { ditswarmProgress?: (p: Omit<StepProgress, 'ranks'>) => void }).ditswarmProgress;
    const result = await runJob(overrides, report && (({ ranks: _, ...p }) => void report(p)));
    return {
      report: result.report,
      latent: bytesToBase64(new Uint8Array(result.latent.buffer, result.latent.byteOffset, result.latent.byteLength)),
      video: bytesToBase64(new Uint8Array(await result.video.arrayBuffer())),
    };
  },
};
(window as unknown as { ditswarm: typeof automation }).ditswarm = automation;
automation.ready.catch((e) => ($('status').textContent = `Could not open the swarm: ${(e as Error).message}`));

window.addEventListener('pagehide', () => {
  void pipeline?.pipe.shutdown({ graceMs: 0 });
  swarm?.close();
});
