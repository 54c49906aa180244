// What the swarm's jobs measured, for the planner's next predictions: each group's rehearsed
// forwards, each plan's measured steps, the rank-to-rank link of the last mesh probe, the buffers
// each worker's adapter allows and the compute probes of each browser's share of its cores. Keys are
// typed; their one string form is made here. Workers are known by their browser where they say one
// (a tab that reloads and joins again under a new peer id computes on the same machine), and what
// was measured can be kept in the dashboard's storage (keepIn) for as long as it is young.
import type { LinkSpeed } from '../core/cost-model.ts';
import type { ParallelMode } from '../core/parallel.ts';
import type { ComputeProbe, ExecutionProvider } from '../core/worker-api.ts';

/** A worker as its measurements know it: its page's peer id, and its browser's id where it has one. */
export interface MeasuredWorker {
  id: string;
  browser?: string;
}

/** Who a measurement is of, across its page's reloads: its browser where it says one, else its page. */
export type MeasuredAs = `browser:${string}` | `peer:${string}`;

export const measuredAs = ({ id, browser }: MeasuredWorker): MeasuredAs =>
  browser ? `browser:${browser}` : `peer:${id}`;

/** A job's shape on a group of workers at their threads, on an EP. */
export interface WorkerGroup {
  modelUrl: string;
  ep: ExecutionProvider | 'auto';
  shape: number[];
  members: (MeasuredWorker & { threads: number })[];
}

/** How a plan ran on its group: one rank has no mode, one group of one no transport (bytesPerElement 0). */
export interface PlanRun {
  ulyssesDegree: number;
  cfgParallel: boolean;
  heads: number[] | null;
  mode: ParallelMode | null;
  bytesPerElement: number;
}

export type ComputeProbes = Partial<Record<ExecutionProvider, ComputeProbe>>;

/**
 * How long a measurement is taken as the machine's: a day covers a working session's jobs and reloads, while past it
 * the machine's load (its other programs, its tabs, its power settings) may have changed, and measuring again costs
 * seconds where a stale speed costs a whole job placed unevenly.
 */
export const MEASUREMENT_MAX_AGE_MS = 24 * 60 * 60_000;

/** Where measurements are kept across the dashboard's reloads (its localStorage). */
export interface MeasurementStorage {
  read(): string | null;
  write(json: string): void;
}

const groupKey = ({ modelUrl, ep, shape, members }: WorkerGroup): string =>
  JSON.stringify([modelUrl, ep, shape, members.map((m) => [measuredAs(m), m.threads])]);
const rehearsalKey = (group: WorkerGroup, degree: number): string => JSON.stringify([groupKey(group), degree]);
const runKey = (group: WorkerGroup, run: PlanRun): string => JSON.stringify([groupKey(group), run]);
const computeKey = (browser: string, threads: number): string => JSON.stringify([browser, threads]);

type Kept<V> = [key: string, at: number, value: V];

/** Values by key, each with the time it was measured: one older than MEASUREMENT_MAX_AGE_MS is none. */
class Aged<V> {
  private readonly kept = new Map<string, { at: number; value: V }>();

  constructor(
    private readonly now: () => number,
    private readonly isValue: (v: unknown) => v is V,
  ) {}

  get(key: string): V | undefined {
    const kept = this.kept.get(key);
    return kept && this.young(kept.at) ? kept.value : undefined;
  }

  set(key: string, value: V, at = this.now()): void {
    this.kept.set(key, { at, value });
  }

  /** the young values, to be kept */
  saved(): Kept<V>[] {
    return [...this.kept].filter(([, k]) => this.young(k.at)).map(([key, k]) => [key, k.at, k.value]);
  }

  /** takes the young values of `saved` where nothing newer was measured; what is not a kept value is skipped */
  restore(saved: unknown): void {
    if (!Array.isArray(saved)) return;
    for (const entry of saved as unknown[]) {
      if (!Array.isArray(entry) || entry.length !== 3) continue;
      const [key, at, value] = entry as unknown[];
      if (typeof key !== 'string' || typeof at !== 'number' || !this.young(at) || !this.isValue(value)) continue;
      if ((this.kept.get(key)?.at ?? -Infinity) < at) this.set(key, value, at);
    }
  }

  private young(at: number): boolean {
    return this.now() - at < MEASUREMENT_MAX_AGE_MS;
  }
}

const isSeconds = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v) && v >= 0;
const isSecondsList = (v: unknown): v is number[] => Array.isArray(v) && v.every(isSeconds);
const isProbes = (v: unknown): v is ComputeProbes =>
  typeof v === 'object' &&
  v !== null &&
  Object.values(v).every(
    (p: unknown) =>
      typeof p === 'object' &&
      p !== null &&
      ['flops', 'softmaxRate', 'stageMs'].every((f) => typeof (p as Record<string, unknown>)[f] === 'number'),
  );

export class Measurements {
  /** the rank-to-rank link the last mesh probe measured (its slowest rank): a mesh's own, never kept */
  meshLink: LinkSpeed | null = null;
  /** seconds of one forward by group and degree, rehearsed on a group, for each of its workers */
  private readonly rehearsals: Aged<number[]>;
  /** seconds of a step of a plan as the jobs that ran it measured, the last weighing half */
  private readonly steps: Aged<number>;
  /** the largest buffer each worker's adapter allows, by MeasuredAs, as its last load said */
  private readonly buffers: Aged<number>;
  /** compute probes by browser and its share of the cores (the threads a tab had) */
  private readonly compute: Aged<ComputeProbes>;
  private storage: MeasurementStorage | null = null;

  constructor(now: () => number = Date.now) {
    this.rehearsals = new Aged(now, isSecondsList);
    this.steps = new Aged(now, isSeconds);
    this.buffers = new Aged(now, isSeconds);
    this.compute = new Aged(now, isProbes);
  }

  /**
   * Takes the young measurements `storage` kept (a dashboard before its reload measured them), and keeps every
   * measurement there from now on.
   */
  keepIn(storage: MeasurementStorage): void {
    let saved: Record<string, unknown> = {};
    try {
      saved = (JSON.parse(storage.read() ?? '{}') as Record<string, unknown> | null) ?? {};
    } catch {
      // what was kept is unreadable: measured again
    }
    this.rehearsals.restore(saved.rehearsals);
    this.steps.restore(saved.steps);
    this.buffers.restore(saved.buffers);
    this.compute.restore(saved.compute);
    this.storage = storage;
    this.save();
  }

  rehearsal(group: WorkerGroup, degree: number): number[] | undefined {
    return this.rehearsals.get(rehearsalKey(group, degree));
  }

  setRehearsal(group: WorkerGroup, degree: number, seconds: number[]): void {
    this.rehearsals.set(rehearsalKey(group, degree), seconds);
    this.save();
  }

  measuredStep(group: WorkerGroup, run: PlanRun): number | undefined {
    return this.steps.get(runKey(group, run));
  }

  /**
   * A job's median step on a plan, averaged with the jobs' before it (each older one weighing half
   * as much): one job's median step moves by tens of per cent from the next one's on a busy machine.
   */
  recordStep(group: WorkerGroup, run: PlanRun, seconds: number): void {
    const key = runKey(group, run);
    const before = this.steps.get(key);
    this.steps.set(key, before === undefined ? seconds : (before + seconds) / 2);
    this.save();
  }

  maxBufferBytes(worker: MeasuredWorker): number | undefined {
    return this.buffers.get(measuredAs(worker));
  }

  setMaxBufferBytes(worker: MeasuredWorker, bytes: number): void {
    this.buffers.set(measuredAs(worker), bytes);
    this.save();
  }

  /** The compute probes of a tab of `browser` on `threads` of its cores: any of its tabs on that share computes so. */
  computeOf(browser: string, threads: number): ComputeProbes | undefined {
    return this.compute.get(computeKey(browser, threads));
  }

  setCompute(browser: string, threads: number, probes: ComputeProbes): void {
    this.compute.set(computeKey(browser, threads), probes);
    this.save();
  }

  private save(): void {
    if (!this.storage) return;
    const json = JSON.stringify({
      rehearsals: this.rehearsals.saved(),
      steps: this.steps.saved(),
      buffers: this.buffers.saved(),
      compute: this.compute.saved(),
    });
    try {
      this.storage.write(json);
    } catch (e) {
      // a full storage costs the next reload its measurements, not this job
      console.warn(`could not keep the swarm's measurements: ${(e as Error).message}`);
    }
  }
}
