import {
  checkJobParams,
  createPipeline,
  DEFAULT_JOB,
  FEW_STEP_SAMPLING,
  DEFAULT_MODEL_URL,
  encodeWebM,
  loadFormModel,
  loadJobDefaults,
  loadModelConfig,
  openJobQueue,
  openPromptCache,
  openSwarm,
  describeEstimate,
  describeLeft,
  needsConfirmation,
  PhaseRates,
  preloadOnJoin,
  PRELOAD_FROM_BYTES,
  probeWebM,
  describeDecodeProgress,
  validDegrees,
  WAN_SIZES,
  type Backend,
  type JobEstimate,
  type JobInputs,
  type JobParams,
  type JobPlacement,
  type JobQueue,
  type JobRequest,
  type Pipeline,
  type PromptCache,
  type RunJob,
  type StoredJob,
  type Swarm,
  type SwarmIdentity,
} from '../coordinator/index.ts';
import type { ModelFamily } from '../core/model/family.ts';
import { isSettled } from '../coordinator/job-store.ts';
import { defined } from '../core/defined.ts';
import { jobParams } from '../core/job.ts';
import { parseLoraFlag, type LoraRef } from '../core/model/lora.ts';
import { OWNER_KEY_PARAM } from '../core/net/join-token.ts';
import type { AutomationProgress, Base64Floats, DashboardAutomation, JobOverrides, JoinLinks } from './automation.ts';
import { bytesToBase64, decodeImageFile, imageField } from './views/image-field.ts';
import { summarizeReport, type KeptReport } from './views/report-summary.ts';
import { $ } from './views/dom.ts';
import { renderGallery, videoUrl } from './views/gallery.ts';
import { offerRevoke, showJoinLink } from './views/join-link.ts';
import { confirmJob } from './views/confirm-job.ts';
import { renderQueue, showJobPhase, showJobProgress } from './views/queue-view.ts';
import { renderSwarm } from './views/swarm-view.ts';
import { addTimelineStep, resetTimeline } from './views/timeline.ts';

// The dashboard: a thin client of the library API. No math here, only the form and the views.
const form = $('job-form', HTMLFormElement);
const field = (name: string) => form.elements.namedItem(name) as HTMLInputElement | HTMLSelectElement;
const NUMERIC: (keyof JobParams)[] = ['frames', 'height', 'width', 'steps', 'guidance', 'flowShift', 'seed'];
const IDENTITY_KEY = 'ditswarm.swarm';
/** localStorage's key of the swarm's measurements (coordinator/measurements.ts) */
const MEASUREMENTS_KEY = 'ditswarm.measurements';
/** the fields that are the user's once typed in: a change of model leaves them be */
const TYPED: (keyof JobParams)[] = ['prompt', 'negativePrompt', 'seed'];
const sizeSelect = field('size') as HTMLSelectElement;
/** the size presets of the form's model's family (core/model/family.ts): Wan2.1's until its folder is read */
let sizes: ModelFamily['sizes'] = WAN_SIZES;

/** The size select offers `family`'s sizes, then custom. */
function offerSizes(family: Pick<ModelFamily, 'sizes'>): void {
  sizes = family.sizes;
  for (const option of [...sizeSelect.options]) if (option.value !== 'custom') option.remove();
  sizeSelect.prepend(
    ...Object.entries(sizes).map(([name, { height, width }]) => new Option(`${name} · ${height}×${width}`, name)),
  );
  showPreset();
}

/** the defaults the form was last filled with: a TYPED field that differs from them was typed */
let shownDefaults: JobParams | null = null;

/** Fills the form with a model's defaults, keeping what the user typed in TYPED fields. */
function showDefaults(defaults: JobParams): void {
  for (const key of Object.keys(defaults) as (keyof JobParams)[]) {
    if (shownDefaults && TYPED.includes(key) && field(key).value !== String(shownDefaults[key])) continue;
    field(key).value = String(defaults[key]);
  }
  shownDefaults = defaults;
  showPreset();
}

/** A preset sets the size and the flow shift Wan gives it; "custom" leaves the fields as they are. */
function choosePreset(): void {
  const preset = Object.entries(sizes).find(([name]) => name === sizeSelect.value)?.[1];
  if (preset) for (const [key, value] of Object.entries(preset)) field(key).value = String(value);
}

/**
 * The fast preset: a step-distilled LoRA's sampling (FEW_STEP_SAMPLING), which a user picks without knowing its
 * numbers; the LoRA field is where the adapter goes, and says so while it is empty.
 */
$('fast-preset').addEventListener('click', () => {
  for (const [key, value] of Object.entries(FEW_STEP_SAMPLING)) field(key).value = String(value);
  const loras = field('loras') as HTMLInputElement;
  if (!loras.value.trim()) {
    loras.placeholder = 'a step-distilled LoRA (lightx2v, CausVid) as FILE:STRENGTH: 4 steps need one';
    loras.focus();
  }
  showErrors(checkJobParams(readForm().params));
});

/** The size select names the preset the height and width are, else custom. */
function showPreset(): void {
  const [height, width] = [Number(field('height').value), Number(field('width').value)];
  sizeSelect.value =
    Object.entries(sizes).find(([, size]) => size.height === height && size.width === width)?.[0] ?? 'custom';
}

offerSizes({ sizes });
showDefaults(DEFAULT_JOB);

/** the form's job rehearsed ahead (rehearseFormJob), under way or done: a job starts after it */
let rehearsingAhead: Promise<void> = Promise.resolve();
/** the smallest model workers preload as they join (the automation API's preloadFrom): all unless a driver says */
let preloadFromBytes = PRELOAD_FROM_BYTES;

let swarm: Swarm | null = null;
let queue: JobQueue | null = null;
let pipeline: { key: string; pipe: Pipeline } | null = null;
/** the form's model's head count, once its config is read: the degrees a job may ask for divide it */
let modelHeads: number | null = null;
/** where the last job done ran: the swarm table says what its placement's notes say of each worker */
let lastPlacement: KeptReport['placement'] = undefined;
/** encoded prompts kept across jobs and reloads (none where IndexedDB is unavailable: every prompt is encoded) */
let promptCache: PromptCache | undefined;

function readForm(): { params: Partial<Record<keyof JobParams, unknown>>; placement: JobPlacement } {
  const params: Partial<Record<keyof JobParams, unknown>> = {
    prompt: field('prompt').value,
    negativePrompt: field('negativePrompt').value,
    scheduler: field('scheduler').value,
  };
  for (const key of NUMERIC) params[key] = field(key).value.trim() === '' ? NaN : Number(field(key).value);
  const degree = field('degree').value;
  const ep = field('ep').value as JobPlacement['ep'];
  const cfg = field('cfg').value;
  const cfgParallel = cfg === 'auto' ? undefined : cfg === 'parallel';
  const model = field('model').value.trim() || DEFAULT_MODEL_URL;
  const cache = field('cache').value;
  const loras = field('loras')
    .value.split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  return {
    params,
    placement: {
      backend: field('backend').value as Backend,
      workers: degree === 'auto' ? 'auto' : Number(degree),
      ep,
      cfgParallel,
      model,
      ...(loras.length && { loras: loras.map(loraOfField) }),
      cache: cache === 'off' || cache === 'auto' ? cache : { method: 'magcache', threshold: Number(cache) },
    },
  };
}

/** An adapter as the LoRA field gives it; one the field cannot give is shown beside it, not sent. */
function loraOfField(text: string): LoraRef {
  try {
    return parseLoraFlag(text);
  } catch {
    // the planner refuses it, saying why, before any worker fetches anything
    return { url: text, strength: NaN };
  }
}

/** Marks each bad field and says why; true when there is nothing to say. */
function showErrors(errors: Partial<Record<string, string>>): boolean {
  for (const el of form.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
  for (const key of Object.keys(errors))
    (form.elements.namedItem(key) as HTMLElement | null)?.setAttribute('aria-invalid', 'true');
  $('form-errors').textContent = Object.entries(errors)
    .map(([k, v]) => `${k} ${v}`)
    .join('\n');
  return Object.keys(errors).length === 0;
}

/** localStorage's key of a model's phase rates, before its URL */
const PHASE_RATES_KEY = 'ditswarm-phase-rates:';

// One pipeline per model and backend: where each job runs is its placement's business,
// decided by the pipeline's placer.
async function pipelineFor({ backend, model = DEFAULT_MODEL_URL }: JobPlacement): Promise<Pipeline> {
  const key = `${model}/${backend}`;
  if (pipeline?.key === key) return pipeline.pipe;
  await pipeline?.pipe.shutdown({ graceMs: 2000 });
  pipeline = null;
  const pipe = await createPipeline({
    model,
    backend,
    swarm: swarm ?? undefined,
    placementTimeoutMs: 60_000,
    promptCache: (promptCache ??= await openPromptCache().catch(() => undefined)),
    // kept in the browser: the next job's estimate (generate's next run, a reload) starts from what this one measured
    phaseRates: new PhaseRates(localStorage.getItem(`${PHASE_RATES_KEY}${model}`), (json) =>
      localStorage.setItem(`${PHASE_RATES_KEY}${model}`, json),
    ),
  });
  pipeline = { key, pipe };
  return pipe;
}

/** A job as the pipeline takes it: as it was stored, the planner deciding what it leaves unset. */
function requestOf({ params, placement, inputs }: Pick<StoredJob, 'params' | 'placement' | 'inputs'>): JobRequest {
  const { backend: _backend, model: _model, workers, ...request } = placement;
  return { ...params, ...inputs, placement: { ...request, ulyssesDegree: workers } };
}

function runJob(job: StoredJob, hooks: Parameters<RunJob>[1]) {
  // a rehearsal ahead loads the form's model on the workers: a job of another model placed beside it would compute
  // on whichever weights its engines held last
  return rehearsingAhead
    .then(() => pipelineFor(job.placement))
    .then((pipe) => pipe.generate({ ...requestOf(job), ...hooks }));
}

/**
 * What a job would take on the swarm as it is now; null where it cannot be told without stopping a running job's
 * pipeline (another model's) or the estimate failed (the job itself will say why).
 */
async function estimateOf(job: Pick<StoredJob, 'params' | 'placement' | 'inputs'>): Promise<JobEstimate | null> {
  const { backend, model = DEFAULT_MODEL_URL } = job.placement;
  const running = queue?.list().some((j) => j.status === 'running');
  if (running && pipeline?.key !== `${model}/${backend}`) return null;
  return pipelineFor(job.placement)
    .then((pipe) => pipe.estimate(requestOf(job)))
    .catch(() => null);
}

/**
 * The form's job rehearsed on the workers while none runs (Placer.rehearseAhead): Enter then finds its placement
 * measured. Nothing is said of one that cannot be: the job itself says why when it is submitted.
 */
function rehearseFormJob(): Promise<void> {
  if (queue?.list().some((j) => !isSettled(j.status))) return Promise.resolve();
  // taken before any await: a job submitted from here on waits for this rehearsal (runJob)
  const rehearsal = rehearsingAhead.then(async () => {
    const job = await jobFromForm().catch(() => null);
    if (!job || job.placement.backend !== 'swarm') return;
    await pipelineFor(job.placement)
      .then((pipe) => pipe.rehearseAhead(requestOf(job)))
      .catch((e: unknown) => console.info(`the form's job was not rehearsed ahead: ${(e as Error).message}`));
  });
  rehearsingAhead = rehearsal;
  return rehearsal;
}

/**
 * The form's model: its head count (the degrees a job may ask for divide it), and its job
 * defaults, which fill the form.
 */
async function readModel(): Promise<void> {
  const model = readForm().placement.model;
  modelHeads = null;
  try {
    const { config, family, noJobs, defaults } = await loadFormModel(model);
    if (model !== readForm().placement.model) return; // changed again meanwhile: the newer read fills the form
    modelHeads = config?.numHeads ?? null;
    offerSizes(family);
    showDefaults(defaults);
    showErrors(checkJobParams(readForm().params));
    if (noJobs) $('status').textContent = `The model ${model}: ${noJobs}.`;
  } catch (e) {
    $('status').textContent = `The model ${model} cannot be read: ${(e as Error).message}`;
  }
  refreshSwarm();
}

function refreshSwarm(): void {
  if (!swarm) return;
  renderSwarm(swarm, lastPlacement ?? null);
  const degreeSelect = field('degree') as HTMLSelectElement;
  const chosen = degreeSelect.value;
  const degrees = modelHeads === null ? [] : validDegrees(modelHeads, Math.max(1, swarm.workers().length));
  if (degreeSelect.options.length !== degrees.length + 1) {
    degreeSelect.replaceChildren(new Option('auto', 'auto'), ...degrees.map((d) => new Option(String(d), String(d))));
    degreeSelect.value = [...degreeSelect.options].some((o) => o.value === chosen) ? chosen : 'auto';
  }
}

/** The last job done: its video and report, and what its placement said of each worker in the swarm table. */
function showDone(job: StoredJob): void {
  lastPlacement = job.result?.report.placement;
  showFinished(job);
  refreshSwarm();
}

function showFinished(job: StoredJob): void {
  const video = $('video', HTMLVideoElement);
  const url = videoUrl(job);
  const download = $('download', HTMLAnchorElement);
  download.hidden = !url;
  if (url) {
    video.src = url;
    void video.play().catch(() => {});
    download.href = url;
    download.download = `ditswarm-${job.id}.webm`;
  } else video.removeAttribute('src');
  const r: KeptReport = defined(job.result, `job #${job.id}'s result`).report;
  $('report').textContent = JSON.stringify(r, null, 2);
  $('status').textContent = summarizeReport(job.id, r, job.storageNote);
}

/** The form's job with `overrides` over it, checked; an error saying what is wrong. */
async function jobFromForm(overrides: JobOverrides = {}): Promise<Pick<StoredJob, 'params' | 'placement' | 'inputs'>> {
  const formValues = readForm();
  const { model, promptEmbeds, negativePromptEmbeds, outputType, image, ...rest } = overrides;
  // what it gives of the job's parameters goes over the form's; the rest of it is its placement request
  // a field given as undefined leaves the form's
  const given = Object.entries(rest as Record<string, unknown>).filter(([, value]) => value !== undefined);
  const isParam = ([key]: [string, unknown]) => key in DEFAULT_JOB;
  // a job on another model than the form's (npm run generate --model) is that model's defaults beneath what it gives
  const beneath =
    model !== undefined && model !== formValues.placement.model ? await loadJobDefaults(model) : formValues.params;
  const params = { ...beneath, ...Object.fromEntries(given.filter(isParam)) };
  if (!showErrors(checkJobParams(params)))
    return Promise.reject(new Error(`invalid job: ${$('form-errors').textContent}`));
  if (!queue) return Promise.reject(new Error('the dashboard is still starting'));
  const asked: Partial<JobPlacement> = Object.fromEntries(given.filter((entry) => !isParam(entry)));
  const placement: JobPlacement = { ...formValues.placement, ...asked, model: model ?? formValues.placement.model };
  const inputs: JobInputs = {
    outputType,
    promptEmbeds: promptEmbeds && embedsFromBase64(promptEmbeds),
    negativePromptEmbeds: negativePromptEmbeds && embedsFromBase64(negativePromptEmbeds),
  };
  // the form's image unless the automation API gives one
  const file = image ?? imageInput.image;
  if (file) inputs.image = await decodeImageFile(file);
  return { params: jobParams(params), placement, inputs };
}

const queueJob = ({ params, placement, inputs }: Awaited<ReturnType<typeof jobFromForm>>): Promise<StoredJob> =>
  defined(queue, 'the queue').submit(params, placement, inputs);

const submitFromForm = async (overrides: JobOverrides = {}): Promise<StoredJob> =>
  queueJob(await jobFromForm(overrides));

/** How long an estimate waits for joined workers' first measurements. */
const MEASURED_WITHIN_MS = 60_000;

/** A person's job: one the swarm would take hours over is queued only once they confirm it. */
async function submitConfirmed(): Promise<void> {
  const job = await jobFromForm();
  const estimate = await estimateOf(job);
  if (estimate && needsConfirmation(estimate)) {
    const workers = swarm?.workers().length ?? 0;
    const question =
      `This job would take ${describeEstimate(estimate)} on the ${workers} worker(s) joined ` +
      `(${job.params.frames} frames of ${job.params.width}×${job.params.height}, ${job.params.steps} steps). ` +
      'Fewer frames, a smaller size or fewer steps take far less. Queue it anyway?';
    if (!(await confirmJob(question))) {
      $('status').textContent = `Not queued: the job would take ${describeEstimate(estimate)}.`;
      return;
    }
  }
  await queueJob(job);
}

const embedsFromBase64 = ({ shape, base64 }: Base64Floats) => {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  return { shape, data: new Float32Array(bytes.buffer, 0, bytes.byteLength >> 2) };
};

form.addEventListener('submit', (event) => {
  event.preventDefault();
  submitConfirmed().catch(() => {});
});
const formSize = () => ({ height: Number(field('height').value), width: Number(field('width').value) });
const imageInput = imageField(form, formSize);
form.addEventListener('input', (event) => {
  if (event.target === sizeSelect) choosePreset();
  else showPreset();
  showErrors(checkJobParams(readForm().params));
  if (event.target === field('height') || event.target === field('width')) imageInput.preview(formSize());
});
form.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey && event.target instanceof HTMLTextAreaElement) {
    event.preventDefault();
    form.requestSubmit();
  }
});

/** The swarm's keys this browser kept, as far as they are strings: storage is anyone's to edit. */
function savedIdentity(): SwarmIdentity {
  let saved: unknown;
  try {
    saved = JSON.parse(localStorage.getItem(IDENTITY_KEY) ?? '{}');
  } catch {
    return {};
  }
  if (typeof saved !== 'object' || saved === null) return {};
  const text = (value: unknown) => (typeof value === 'string' ? value : undefined);
  const { token, dashboardKey } = saved as Record<string, unknown>;
  return { token: text(token), dashboardKey: text(dashboardKey) };
}

function showIdentity(opened: Swarm): JoinLinks {
  localStorage.setItem(IDENTITY_KEY, JSON.stringify(opened.identity));
  showJoinLink(opened.lanJoinUrl, opened.joinUrl);
  return { joinUrl: opened.joinUrl, lanJoinUrl: opened.lanJoinUrl };
}

/** The Revoke button's work: a new link on show and kept, the old one's workers gone. */
async function revokeJoinLink(): Promise<JoinLinks | null> {
  try {
    const opened = defined(swarm, 'the swarm (the dashboard is still starting)');
    await opened.revokeJoinLink();
    $('swarm-events').textContent = 'The old worker link is revoked: share the new one.';
    return showIdentity(opened);
  } catch (e) {
    $('swarm-events').textContent = `Could not revoke the link: ${(e as Error).message}`;
    return null;
  }
}

/** The server's owner key, where this dashboard was opened from another machine at the link `npm start` prints. */
function ownerKeyOfLink(): string | undefined {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const key = fragment.get(OWNER_KEY_PARAM) ?? undefined;
  fragment.delete(OWNER_KEY_PARAM);
  // out of the address bar: it opens swarms on the server
  if (key)
    history.replaceState(
      history.state,
      '',
      `${location.pathname}${location.search}${fragment.size ? `#${fragment}` : ''}`,
    );
  return key;
}

async function start() {
  // the same peer id and token after a reload, so the workers' links and reconnections still work
  swarm = await openSwarm(location.origin, { ...savedIdentity(), ownerKey: ownerKeyOfLink() });
  // what its workers' browsers were measured at before the reload: they are not probed nor rehearsed again
  swarm.measurements.keepIn({
    read: () => localStorage.getItem(MEASUREMENTS_KEY),
    write: (json) => localStorage.setItem(MEASUREMENTS_KEY, json),
  });
  showIdentity(swarm);
  offerRevoke(() => void revokeJoinLink());
  swarm.on((e) => {
    if (e.type === 'leave') $('swarm-events').textContent = `Worker ${e.worker.id.slice(-6)} left: ${e.reason}.`;
    if (e.type === 'refused') $('swarm-events').textContent = `Refused ${e.peer.slice(-6)}: ${e.reason}.`;
    refreshSwarm();
  });
  // the model the server was started with (`npm start -- --model PATH|URL`), else the bundled demo
  interface Served {
    default: string | null;
    loras?: LoraRef[];
    preloadFromBytes?: number;
  }
  const served = await fetch('/models.json').then(
    (r) => r.json() as Promise<Served>,
    (): Served => ({ default: null, loras: [] }),
  );
  field('model').value = served.default ?? DEFAULT_MODEL_URL;
  // a harness whose jobs are its own (tests, benchmarks, generate) has only large models preloaded
  if (served.preloadFromBytes !== undefined) preloadFromBytes = served.preloadFromBytes;
  // and the adapters it was started with (`--lora FILE[:STRENGTH]`)
  field('loras').value = (served.loras ?? []).map(({ url, strength }) => `${url}:${strength}`).join(', ');
  await readModel();
  field('model').addEventListener('change', () => void readModel());
  queue = await openJobQueue(runJob);
  const jobs = queue;
  // weights before the first job: each worker loads the form's model as it joins
  preloadOnJoin(swarm, {
    modelUrl: () => new URL(field('model').value.trim() || DEFAULT_MODEL_URL, location.href).href,
    config: (url) => loadModelConfig(url),
    busy: () => jobs.list().some((j) => j.status === 'running'),
    fromBytes: () => preloadFromBytes,
    log: (line) => console.info(line),
    onPreloaded: () => void rehearseFormJob(),
  });
  const refreshJobs = () => {
    renderQueue(jobs.list(), {
      cancel: (id) => void jobs.cancel(id),
      retry: (id) => void jobs.retry(id).catch((e: unknown) => console.warn((e as Error).message)),
      dismiss: (id) => void jobs.remove(id).catch((e: unknown) => console.warn((e as Error).message)),
    });
    renderGallery(jobs.list(), showFinished);
  };
  jobs.on((e) => {
    if (e.type === 'progress') {
      showJobProgress(e.job, e.progress);
      addTimelineStep(e.progress.stepMs, e.progress.ranks);
      $('status').textContent = `#${e.job.id} step ${e.progress.step} of ${e.progress.steps}.`;
    } else if (e.type === 'removed') {
      refreshJobs();
    } else if (e.type === 'storage') {
      $('status').textContent = `#${e.job.id}: ${e.message}`;
    } else if (e.type === 'phase') {
      showJobPhase(e.job, e.phase, e.detail, e.left);
      // minutes of encoding and loading before the first step: the status line says which, and what is left
      $('status').textContent = `#${e.job.id} ${e.phase}${e.detail ? `: ${e.detail}` : ''}… ${describeLeft(e.left)}.`;
      if (e.phase === 'placing') resetTimeline();
    } else {
      if (e.job.status === 'done') showDone(e.job);
      if (e.job.status === 'failed') $('status').textContent = `#${e.job.id} failed: ${e.job.error ?? ''}`;
      if (e.job.status === 'cancelled') $('status').textContent = `#${e.job.id} cancelled.`;
      refreshJobs();
    }
  });
  refreshJobs();
  resetTimeline();
  const latest = jobs
    .list()
    .filter((j) => j.status === 'done')
    .at(-1);
  if (latest) showDone(latest);
  return { swarmId: swarm.id, joinUrl: swarm.joinUrl, lanJoinUrl: swarm.lanJoinUrl };
}

// What `npm run generate`, the benchmarks and the e2e tests drive (app/automation.ts): the same queue
// as the Generate button.
const automation: DashboardAutomation = {
  preloadFrom(bytes) {
    preloadFromBytes = bytes;
  },
  ready: start(),
  workerCount: () => swarm?.workers().length ?? 0,
  workers: () =>
    (swarm?.workers() ?? []).map((w) => ({
      id: w.id,
      ep: w.measurement?.auto.ep ?? null,
      threads: w.info.threads,
      adapter: w.info.adapter,
      transport: w.transport,
      state: w.activity ?? w.pulse?.state ?? 'idle',
      thisMachine: defined(swarm, 'the swarm').isThisMachine(w),
    })),
  revokeJoinLink,
  ranks: () => pipeline?.pipe.executor?.workers.map((w) => w.id) ?? [],
  jobs: () =>
    (queue?.list() ?? []).map(({ id, status, params, checkpoint, error }) => ({
      id,
      status,
      prompt: params.prompt,
      step: checkpoint?.step ?? null,
      error,
    })),
  async submit(overrides) {
    return (await submitFromForm(overrides)).id;
  },
  async estimate(overrides) {
    const job = await jobFromForm(overrides);
    // a driver asks before its job, often as its workers join: their measurements are what the steps are predicted by
    await swarm?.allMeasured(MEASURED_WITHIN_MS);
    const estimate = await estimateOf(job);
    if (!estimate) throw new Error('the job cannot be estimated now: see the dashboard');
    return estimate;
  },
  async cancel(id) {
    await defined(queue, 'the job queue (the dashboard is still starting)').cancel(id);
  },
  async discard(id) {
    const jobs = defined(queue, 'the job queue (the dashboard is still starting)');
    await jobs.cancel(id);
    await jobs.settled(id);
    await jobs.remove(id);
  },
  async result(id) {
    if (!queue) throw new Error('the dashboard is still starting');
    const job = await queue.settled(id);
    if (job.status === 'failed') throw new Error(job.error);
    if (job.status === 'cancelled') throw new Error(`job ${id} was cancelled`);
    const { latent, video, report } = defined(job.result, `job #${id}'s result`);
    return {
      report,
      latent: bytesToBase64(new Uint8Array(latent.buffer, latent.byteOffset, latent.byteLength)),
      video: video && bytesToBase64(new Uint8Array(await video.arrayBuffer())),
    };
  },
  // the step latents are the benchmarks' deviation per step
  async generate(overrides, { stepLatents = false } = {}) {
    const after = new Map<number, string[]>(); // job id → base64 latent after each step
    // no queue yet: submit says the dashboard is still starting
    const off =
      stepLatents && queue
        ? queue.on((e) => {
            if (e.type !== 'progress' || !e.job.checkpoint) return;
            const { latent } = e.job.checkpoint;
            const steps = after.get(e.job.id) ?? [];
            steps[e.progress.step - 1] = bytesToBase64(
              new Uint8Array(latent.buffer, latent.byteOffset, latent.byteLength),
            );
            after.set(e.job.id, steps);
          })
        : () => {};
    try {
      const id = await automation.submit(overrides);
      return { ...(await automation.result(id)), stepLatents: stepLatents ? (after.get(id) ?? []) : null };
    } finally {
      off();
    }
  },
  async decode({ model, latent, ep = 'auto', webm = false }) {
    const pipe = await pipelineFor({ model, backend: 'swarm', workers: 'auto', ep });
    const { video, frames, report } = await pipe.decode(embedsFromBase64(latent), {
      ep,
      onProgress: (p) => tellProgress({ phase: 'decoding', detail: describeDecodeProgress(p) }),
    });
    if (!video)
      throw new Error(
        `${model ?? DEFAULT_MODEL_URL}'s VAE is a stand-in that makes display frames, not a video in [-1, 1]`,
      );
    return {
      report,
      video: {
        shape: video.shape,
        base64: bytesToBase64(new Uint8Array(video.data.buffer, video.data.byteOffset, video.data.byteLength)),
      },
      webm: webm
        ? bytesToBase64(new Uint8Array(await (await encodeWebM(frames, { fps: pipe.family.fps })).arrayBuffer()))
        : null,
    };
  },
  async inspectVideo() {
    const video = $('video', HTMLVideoElement);
    if (video.readyState < HTMLMediaElement.HAVE_METADATA)
      await new Promise((r) => video.addEventListener('loadedmetadata', r, { once: true }));
    const blob = await (await fetch(video.src)).blob();
    return {
      duration: video.duration,
      videoWidth: video.videoWidth,
      videoHeight: video.videoHeight,
      file: await probeWebM(blob),
      download: $('download', HTMLAnchorElement).href,
    };
  },
};
window.ditswarm = automation;
automation.ready.catch((e: unknown) => ($('status').textContent = `Could not start: ${(e as Error).message}`));

// the command line listens to progress through an exposed function, when it exposed one
const tellProgress = (progress: AutomationProgress) => void window.ditswarmProgress?.(progress);
automation.ready
  .then(() =>
    defined(queue, 'the job queue').on((e) => {
      if (e.type === 'progress')
        tellProgress({
          job: e.job.id,
          step: e.progress.step,
          steps: e.progress.steps,
          stepMs: e.progress.stepMs,
          etaMs: e.progress.etaMs,
        });
      if (e.type === 'phase') tellProgress({ job: e.job.id, phase: e.phase, detail: e.detail, left: e.left });
    }),
  )
  .catch(() => {}); // a dashboard that did not start says so above

window.addEventListener('pagehide', () => {
  void pipeline?.pipe.shutdown({ graceMs: 0 });
  swarm?.close();
});
