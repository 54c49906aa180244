import { type Swarm, type SwarmWorker, type WorkerMeasurement } from '../../coordinator/index.ts';
import { workerPlanNotes, type PlacementNotes } from '../../coordinator/planner.ts';
import { memoryBudget } from '../../coordinator/stage-plan.ts';
import { defined } from '../../core/defined.ts';
import { cpuName } from '../../core/cost-model.ts';
import { describeLoad, formatBytes } from '../../core/worker-api.ts';
import type { Transport } from '../../core/net/channel.ts';
import { $, h } from './dom.ts';

/** How a link goes, in the swarm view's words: a data channel, one relayed by TURN, or through the server's relay. */
const PATH_NAMES: Record<Transport, string> = { direct: 'direct', turn: 'TURN', relay: 'relayed' };

/**
 * Who joined and what each is doing: one row per worker, updated in place, with what the last job's placement said of
 * it (left out, given few heads, sharing its machine's cores) in the planner's words.
 */
export function renderSwarm(swarm: Swarm, lastPlacement: PlacementNotes | null = null): void {
  const workers = swarm.workers();
  $('worker-count').textContent = `${workers.length} worker${workers.length === 1 ? '' : 's'}`;
  const body = defined($('workers').querySelector('tbody'), "the swarm table's body");
  body.replaceChildren(
    ...(workers.length
      ? workers.map((w) =>
          workerRow(swarm, w, w.measurement, lastPlacement ? workerPlanNotes(lastPlacement, w.id) : []),
        )
      : [
          h(
            'tr',
            {},
            h(
              'td',
              { colSpan: 6, className: 'empty' },
              'No workers yet: open the link above in another tab or on another machine.',
            ),
          ),
        ]),
  );
}

function workerRow(
  swarm: Swarm,
  w: SwarmWorker,
  m: WorkerMeasurement | null,
  planNotes: string[],
): HTMLTableRowElement {
  // with 'auto' a worker computes on the EP it measured faster: the speed column says so, and why
  const chosen = m?.auto ?? null;
  const speedOfLink = !m ? '' : `${(m.bandwidth / 1e6).toFixed(1)} MB/s, ${m.rttMs.toFixed(0)} ms`;
  // the rank links that do not go direct, by the path they took
  const indirect = (['turn', 'relay'] as const)
    .map((path) => [path, (w.pulse?.mesh ?? []).filter((l) => l.transport === path).length] as const)
    .filter(([, n]) => n > 0)
    .map(([path, n]) => `${n} rank link${n === 1 ? '' : 's'} ${path === 'turn' ? 'through TURN' : 'relayed'}`);
  const bad = w.framesDropped + (w.pulse?.framesDropped ?? 0);
  return h(
    'tr',
    { dataset: { worker: w.id } },
    h('td', { title: w.id }, w.id.slice(-6), h('span', { className: 'sub' }, trustBox(swarm, w))),
    h(
      'td',
      {},
      chosen
        ? chosen.ep === 'webgpu'
          ? 'WebGPU'
          : cpuName(w.info.nativeDevice)
        : w.info.ep === 'webgpu'
          ? 'WebGPU or WASM'
          : cpuName(w.info.nativeDevice),
      h(
        'span',
        { className: 'sub' },
        (w.info.kind === 'node' ? `process on ${w.info.host ?? 'a machine'} · ` : '') +
          `${w.info.threads} thread${w.info.threads === 1 ? '' : 's'} · ${w.info.adapter}${memoryText(w)}`,
      ),
    ),
    h(
      'td',
      {},
      chosen?.why ?? 'measuring…',
      planNotes.length
        ? h('span', { className: 'sub plan' }, planNotes.map((n) => `${n[0].toUpperCase()}${n.slice(1)}.`).join(' '))
        : '',
    ),
    h(
      'td',
      {},
      PATH_NAMES[w.transport],
      h('span', { className: 'sub' }, [speedOfLink, ...indirect].filter(Boolean).join(' · ')),
    ),
    h(
      'td',
      {},
      w.activity ?? w.pulse?.state ?? 'idle',
      w.pulse?.load ? h('span', { className: 'sub load' }, describeLoad(w.pulse.load)) : '',
    ),
    h('td', { className: bad ? 'bad' : '' }, String(bad)),
  );
}

/**
 * Whether the job may rest on this worker alone and its word outweighs an untrusted one's (coordinator/accusations.ts):
 * the tabs of this browser are, whatever is marked; the user marks others, a browser at a time.
 */
function trustBox(swarm: Swarm, w: SwarmWorker): HTMLElement {
  const thisMachine = swarm.isThisMachine(w);
  return h(
    'label',
    { title: thisMachine ? 'a tab of this browser: trusted' : 'trust this worker’s browser with a job alone' },
    h('input', {
      type: 'checkbox',
      name: 'trusted',
      checked: swarm.isTrusted(w),
      disabled: thisMachine,
      onchange: (e: Event) => swarm.markTrusted(w, (e.target as HTMLInputElement).checked),
    }),
    thisMachine ? ' this machine' : ' trusted',
  );
}

/** What a pipeline stage may hold on the worker, and whether its user set it. */
function memoryText(w: SwarmWorker): string {
  const budget = memoryBudget(w.info);
  if (!Number.isFinite(budget)) return '';
  return ` · weights ≤ ${formatBytes(budget)}${w.info.modelMemoryGiB === undefined ? '' : ' (set on its page)'}`;
}
