import { formatBytes, MAX_MODEL_MEMORY_GIB, MIN_MODEL_MEMORY_GIB } from '../core/worker-api.ts';
import { memoryBudget, STAGE_MEMORY_SHARE } from '../coordinator/stage-plan.ts';
import { startWorkerEndpoint, type WorkerEndpoint, type WorkerStatus } from '../worker/endpoint.ts';
import { tabPlatform } from '../worker/tab.ts';
import { $ } from './views/dom.ts';
import { addressAfterJoining, fragmentToken, readWorkerLink, WORKER_TOKEN_KEY } from './worker-link.ts';

// The worker page: joins the swarm when opened and shows what it is doing. No compute here.
const link = readWorkerLink(location.href, sessionStorage.getItem(WORKER_TOKEN_KEY));
const { token } = link;
history.replaceState(history.state, '', link.address);

// every state change this page went through, for anyone checking what happened (tests included)
const states: string[] = [];
window.ditswarmWorkerHistory = states;

function render(s: WorkerStatus): void {
  if (states.at(-1) !== `${s.state}: ${s.detail}`) states.push(`${s.state}: ${s.detail}`);
  if (s.connected && token) {
    // joined: the token leaves the address bar, kept for a reload of this tab
    sessionStorage.setItem(WORKER_TOKEN_KEY, token);
    if (fragmentToken(new URL(location.href)))
      history.replaceState(history.state, '', addressAfterJoining(location.href));
  }
  if (s.state === 'ready' && states.at(-2)?.startsWith('loading')) void showStorage();
  $('state').textContent = s.connected
    ? s.state
    : s.state === 'left' || s.state === 'refused'
      ? s.state
      : 'not connected';
  $('detail').textContent = s.detail;
  const ep = s.ep ?? s.info?.ep;
  $('ep').textContent = ep
    ? `${ep === 'webgpu' ? 'WebGPU' : 'WebAssembly (CPU)'}${s.epWhy ? ` — ${s.epWhy}` : ''}`
    : '';
  $('link').textContent = s.transport
    ? {
        direct: 'direct (WebRTC)',
        turn: 'WebRTC through the TURN server',
        relay: 'through the server (relay): WebRTC could not connect',
      }[s.transport]
    : '';
  $('background').textContent = backgroundText();
  $('adapter').textContent = s.info?.adapter ?? '';
  $('threads').textContent = s.cores ? coresText(s.cores) : '';
  $('coordinator').textContent = s.coordinator ?? 'searching…';
  const { steps, computeMs, bytesSent } = s.totals;
  $('totals').textContent = steps
    ? `${steps} forward passes, ${(computeMs / 1000).toFixed(1)} s compute, ${(bytesSent / 1e6).toFixed(2)} MB sent`
    : 'nothing yet';
  $('dropped').textContent = String(s.framesDropped);
  $('peer-id').textContent = s.peerId;
  document.title = `ditswarm worker — ${s.state}`;
  window.ditswarmWorker = { ...s };
}

/** Whether this tab is in front, and what its browser last did to it in the background. */
let frozenOnce = false;
function backgroundText(): string {
  const now = document.visibilityState === 'visible' ? 'in front' : 'hidden: still computing';
  return frozenOnce
    ? `${now}; the browser froze this tab once, and its work went to the other workers (it has joined again)`
    : now;
}
document.addEventListener('visibilitychange', () => ($('background').textContent = backgroundText()));
document.addEventListener('resume', () => {
  frozenOnce = true;
  $('background').textContent = backgroundText();
});

// no StorageManager outside a secure context (a worker link to a LAN address over http), in part on older browsers
const storage = navigator.storage as Partial<StorageManager> | undefined;

/**
 * What this browser keeps of the models' weights (rank/weight-cache.ts) and whether it may evict
 * them: a persisted origin's storage is cleared only by its user. Asked for once, at the start.
 */
async function showStorage(): Promise<void> {
  if (!storage?.estimate) {
    $('storage').textContent = 'nothing: this browser has no storage for them (each load downloads the weights)';
    return;
  }
  const [{ usage = 0, quota = 0 }, persisted] = await Promise.all([storage.estimate(), storage.persisted?.() ?? false]);
  const kept = persisted ? 'persistent' : 'the browser may clear it when its disk runs low';
  $('storage').textContent =
    `${formatBytes(usage)} stored, room for ${formatBytes(Math.max(0, quota - usage))} more; ${kept}`;
}
void (storage?.persist?.() ?? Promise.resolve(false)).catch(() => false).then(showStorage);

/** "1 of 2 cores (2 worker tabs in this browser share them)", and what it takes up at its next job. */
function coresText({ threads, next, of, tabs }: NonNullable<WorkerStatus['cores']>): string {
  const share =
    `${threads} of ${of} core${of === 1 ? '' : 's'} ` +
    `(${tabs} worker tab${tabs === 1 ? '' : 's'} in this browser share them)`;
  return next === threads ? share : `${share}; ${next} from the next job`;
}

/**
 * What this browser's user lets the model's weights take on it (kept for the next visit): a pipeline
 * stage placed here holds no more. Empty: the dashboard's default, a share of what the browser reports.
 */
const MODEL_MEMORY_KEY = 'ditswarm-model-memory';
const modelMemoryField = $('model-memory', HTMLInputElement);
const deviceMemory = (navigator as Navigator & { deviceMemory?: number }).deviceMemory;
/** the dashboard's budget for this worker where its user sets none (stage-plan.ts) */
const defaultBudget = memoryBudget({ memoryGiB: deviceMemory ?? null });
modelMemoryField.placeholder = Number.isFinite(defaultBudget) ? String(defaultBudget / 2 ** 30) : 'no bound';
modelMemoryField.value = localStorage.getItem(MODEL_MEMORY_KEY) ?? '';

/** The field's GiB (null: empty, the default), or why it is no amount a worker may give. */
function readModelMemory(): { gib: number | null } | { error: string } {
  const text = modelMemoryField.value.trim();
  if (!text) return { gib: null };
  const gib = Number(text);
  return Number.isFinite(gib) && gib >= MIN_MODEL_MEMORY_GIB && gib <= MAX_MODEL_MEMORY_GIB
    ? { gib }
    : { error: `a number of GiB from ${MIN_MODEL_MEMORY_GIB} to ${MAX_MODEL_MEMORY_GIB}, or empty for the default` };
}

/** Shows what the field means now, and returns what it reads. */
function showModelMemory(): ReturnType<typeof readModelMemory> {
  const read = readModelMemory();
  const shown =
    'error' in read
      ? read.error
      : read.gib !== null
        ? 'the blocks of a pipeline stage placed here take no more'
        : deviceMemory
          ? `default: ${STAGE_MEMORY_SHARE * 100}% of the ${deviceMemory} GiB this browser reports ` +
            '(browsers report at most 8)'
          : 'default: this browser reports no memory, so no bound';
  $('model-memory-note').textContent = shown;
  modelMemoryField.setCustomValidity('error' in read ? read.error : '');
  return read;
}

function watchModelMemory(endpoint: WorkerEndpoint): void {
  modelMemoryField.addEventListener('change', () => {
    const read = showModelMemory();
    if ('error' in read) return;
    const { gib } = read;
    endpoint.setModelMemory(gib);
    if (gib === null) localStorage.removeItem(MODEL_MEMORY_KEY);
    else localStorage.setItem(MODEL_MEMORY_KEY, String(gib));
  });
}

if (!token) {
  // without a token the dashboard would refuse this page: ask for the real link instead
  const paste = $('paste-link', HTMLFormElement);
  paste.hidden = false;
  $('state').textContent = link.refused ? 'refused' : 'waiting for a join link';
  if (link.refused) $('detail').textContent = link.refused;
  paste.addEventListener('submit', (event) => {
    event.preventDefault();
    const pasted = new URL((paste.elements.namedItem('link') as HTMLInputElement).value, location.href);
    if (!fragmentToken(pasted))
      $('detail').textContent = 'That link has no #token= either: copy the worker link from the dashboard.';
    else if (pasted.href.split('#')[0] !== location.href.split('#')[0]) location.href = pasted.href;
    else {
      location.hash = pasted.hash; // the same page with a fragment: no navigation, so load it again
      location.reload();
    }
  });
} else {
  join();
}

function join(): void {
  const memory = showModelMemory();
  const modelMemoryGiB = 'error' in memory ? null : memory.gib;
  startWorkerEndpoint({ origin: location.origin, token, onStatus: render, modelMemoryGiB, platform: tabPlatform })
    .then((endpoint) => {
      watchModelMemory(endpoint);
      $('leave').addEventListener('click', () => endpoint.leave());
      window.addEventListener('pagehide', () => endpoint.leave());
    })
    .catch((e: unknown) => {
      $('state').textContent = 'failed';
      $('detail').textContent = (e as Error).message;
    });
}
