// The page a person opens on a server that runs the video API (`npm start -- --api`): the API's own queue and swarm,
// read and driven through /v1 with the API's key, as a program would. The API's coordinator is a dashboard page in
// the server's headless Chromium; this page runs no coordinator of its own, so what it shows is what the API does.

import type { SwarmState } from '../server/api/coordinator-host.ts';
import type { VideoObject } from '../server/api/video-object.ts';
import { NAMED_SIZES } from '../server/api/video-request.ts';
import { $, h, seconds } from './views/dom.ts';
import { offerRevoke, showJoinLink } from './views/join-link.ts';

/** where the page keeps the key: this origin's pages alone read it */
const KEY_STORAGE = 'ditswarm.apiKey';
/** how often the page asks for the jobs and the swarm: a poll costs the server well under a millisecond */
const REFRESH_MS = 2000;

/** The API's error, as it words it: `param` names the field a refused body got wrong. */
class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly param: string | null,
  ) {
    super(message);
  }
}

/** The key from the link's fragment (`#key=`, which no server sees), else the one this browser kept. */
function readKey(): string | null {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get('key');
  if (given) {
    localStorage.setItem(KEY_STORAGE, given);
    fragment.delete('key');
    history.replaceState(null, '', `${location.pathname}${fragment.size ? `#${fragment.toString()}` : ''}`);
  }
  return localStorage.getItem(KEY_STORAGE);
}

let key = readKey();

async function call(path: string, init: RequestInit = {}): Promise<Response> {
  const response = await fetch(`/v1${path}`, {
    ...init,
    headers: { Authorization: `Bearer ${key ?? ''}`, 'Content-Type': 'application/json' },
  });
  if (response.ok) return response;
  const body = (await response.json().catch(() => null)) as { error?: { message?: string; param?: string } } | null;
  throw new ApiError(
    body?.error?.message ?? `${response.status} ${response.statusText}`,
    response.status,
    body?.error?.param ?? null,
  );
}
const json = async <T>(path: string, init?: RequestInit) => (await (await call(path, init)).json()) as T;

/** Asks for the key until the API takes one. */
function askForKey(why: string): void {
  $('key-section').hidden = false;
  $('key-errors').textContent = why;
}
$('key-form', HTMLFormElement).onsubmit = (e) => {
  e.preventDefault();
  const given = new FormData(e.target as HTMLFormElement).get('key');
  key = typeof given === 'string' ? given.trim() : '';
  localStorage.setItem(KEY_STORAGE, key);
  void refresh();
};

$('named-sizes').append(...NAMED_SIZES.map((size) => h('option', { value: size })));

const form = $('job-form', HTMLFormElement);
form.onsubmit = async (e) => {
  e.preventDefault();
  const fields = new FormData(form);
  const body: Record<string, string | number> = {};
  for (const [name, value] of fields) {
    if (typeof value !== 'string' || value.trim() === '') continue;
    body[name] = ['frames', 'steps', 'seed'].includes(name) ? Number(value) : value.trim();
  }
  for (const el of form.querySelectorAll('[aria-invalid]')) el.removeAttribute('aria-invalid');
  try {
    const job = await json<VideoObject>('/videos', { method: 'POST', body: JSON.stringify(body) });
    $('form-errors').textContent = '';
    $('status').textContent = `${job.id} queued.`;
    void refresh();
  } catch (error) {
    const { message, param } = error as ApiError;
    $('form-errors').textContent = message;
    if (param) form.querySelector(`[name="${param}"]`)?.setAttribute('aria-invalid', 'true');
  }
};

function renderSwarm(swarm: SwarmState): void {
  if (swarm.joinUrl) showJoinLink(swarm.lanJoinUrl || swarm.joinUrl, swarm.joinUrl);
  $('coordinator-state').textContent =
    `The API's coordinator page is ${swarm.coordinator}` +
    (swarm.restarts ? `; it was opened again ${swarm.restarts} time(s) after it went away.` : '.');
  $('worker-count').textContent = `${swarm.workers.length} worker${swarm.workers.length === 1 ? '' : 's'}`;
  const body = $('workers').querySelector('tbody');
  body?.replaceChildren(
    ...(swarm.workers.length
      ? swarm.workers.map((w) =>
          h(
            'tr',
            { dataset: { worker: w.id } },
            h('td', { title: w.id }, w.id.slice(-6), w.thisMachine ? ' (the server’s)' : ''),
            h('td', {}, `${w.ep ?? 'measuring'} · ${w.threads} thread${w.threads === 1 ? '' : 's'}`, ' ', w.adapter),
            h('td', {}, w.transport),
            h('td', {}, w.state),
          ),
        )
      : [h('tr', {}, h('td', { colSpan: 4, className: 'empty' }, 'No workers yet: open the worker link above.'))]),
  );
}

offerRevoke(
  () =>
    void json<SwarmState>('/swarm/revoke', { method: 'POST' }).then(
      (swarm) => {
        renderSwarm(swarm);
        $('swarm-events').textContent = 'The old worker link is revoked: share the new one.';
      },
      (e: unknown) => ($('swarm-events').textContent = `Could not revoke the link: ${(e as Error).message}`),
    ),
);

/** the video on show: its job, and the object URL to free when another takes its place */
let shown: { id: string; url: string } | null = null;

async function show(job: VideoObject): Promise<void> {
  const blob = await (await call(`/videos/${job.id}/content`)).blob();
  if (shown) URL.revokeObjectURL(shown.url);
  shown = { id: job.id, url: URL.createObjectURL(blob) };
  $('video', HTMLVideoElement).src = shown.url;
  $('video-of').textContent = `${job.id}: “${job.prompt}”`;
}

function describe(job: VideoObject): string {
  switch (job.status) {
    case 'queued':
      return job.phase ? `waiting (${job.phase})` : 'waiting';
    case 'in_progress':
      return (job.phase ?? 'starting') + (job.eta_seconds === null ? '' : ` · ${seconds(job.eta_seconds * 1000)} left`);
    case 'completed':
      return `done${job.report ? ` in ${seconds(job.report.totalMs)}` : ''}`;
    case 'failed':
      return `failed: ${job.error?.message ?? 'no reason given'}`;
    case 'cancelled':
      return 'cancelled';
  }
}

/** A job's line, kept from one refresh to the next so that a button in focus (or half-clicked) stays. */
interface JobLine {
  li: HTMLLIElement;
  bar: HTMLProgressElement;
  state: HTMLSpanElement;
  actions: HTMLSpanElement;
}
const lines = new Map<string, JobLine>();

function jobLine(job: VideoObject): HTMLLIElement {
  let line = lines.get(job.id);
  if (!line) {
    const bar = h('progress', { max: 100 });
    bar.setAttribute('aria-label', `progress of ${job.id}`);
    const [state, actions] = [h('span', { className: 'job-state' }), h('span', { className: 'job-actions' })];
    const li = h(
      'li',
      { dataset: { job: job.id } },
      h('span', { className: 'job-prompt' }, `${job.id.slice(-8)} “${job.prompt}”`),
      bar,
      state,
      actions,
    );
    line = { li, bar, state, actions };
    lines.set(job.id, line);
  }
  line.bar.value = job.progress;
  line.state.textContent = describe(job);
  if (line.li.dataset.status !== job.status) {
    // the buttons change with the status alone
    line.li.dataset.status = job.status;
    const act = (label: string, run: () => Promise<unknown>) =>
      h('button', {
        type: 'button',
        textContent: label,
        onclick: () => void run().then(refresh, (e: unknown) => ($('status').textContent = (e as Error).message)),
      });
    const final = job.status === 'completed' || job.status === 'failed' || job.status === 'cancelled';
    line.actions.replaceChildren(
      ...(job.status === 'completed' ? [act('Show', () => show(job))] : []),
      act(final ? 'Delete' : 'Cancel', () => call(`/videos/${job.id}`, { method: 'DELETE' })),
    );
  }
  return line.li;
}

let lastCompleted: string | null = null;

async function refresh(): Promise<void> {
  if (!key) {
    askForKey('');
    return;
  }
  try {
    const [{ data }, swarm] = await Promise.all([
      json<{ data: VideoObject[] }>('/videos?limit=20'),
      json<SwarmState>('/swarm'),
    ]);
    $('key-section').hidden = true;
    renderSwarm(swarm);
    for (const id of lines.keys()) if (!data.some((j) => j.id === id)) lines.delete(id);
    const wanted = data.map(jobLine);
    const list = $('queue');
    // the list is rebuilt only when jobs came or went: a rebuild takes the focus off a button
    if (wanted.length !== list.children.length || wanted.some((li, i) => list.children[i] !== li))
      list.replaceChildren(...wanted);
    const running = data.filter((j) => j.status === 'in_progress' || j.status === 'queued').length;
    $('status').textContent = data.length ? `${running} job(s) waiting or running.` : 'No jobs yet.';
    // the newest finished video comes on show as it completes
    const newest = data.find((j) => j.status === 'completed');
    if (newest && newest.id !== lastCompleted) {
      lastCompleted = newest.id;
      await show(newest);
    }
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) askForKey(e.message);
    else $('status').textContent = `The API did not answer: ${(e as Error).message}`;
  }
}

void refresh();
setInterval(() => void refresh(), REFRESH_MS);
