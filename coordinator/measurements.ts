// What the swarm's jobs measured, for the planner's next predictions: each group's rehearsed
// forwards, each plan's measured steps, the rank-to-rank link of the last mesh probe and the
// buffers each worker's adapter allows. Keys are typed; their one string form is made here.
import type { LinkSpeed } from '../core/cost-model.ts';
import type { ParallelMode } from '../core/parallel.ts';
import type { ExecutionProvider } from '../core/worker-api.ts';

/** A job's shape on a group of workers at their threads, on an EP. */
export interface WorkerGroup {
  modelUrl: string;
  ep: ExecutionProvider | 'auto';
  shape: number[];
  members: { id: string; threads: number }[];
}

/** How a plan ran on its group: one rank has no mode, one group of one no transport (bytesPerElement 0). */
export interface PlanRun {
  ulyssesDegree: number;
  cfgParallel: boolean;
  heads: number[] | null;
  mode: ParallelMode | null;
  bytesPerElement: number;
}

const groupKey = ({ modelUrl, ep, shape, members }: WorkerGroup): string =>
  JSON.stringify([modelUrl, ep, shape, members.map((m) => [m.id, m.threads])]);
const runKey = (group: WorkerGroup, run: PlanRun): string => JSON.stringify([groupKey(group), run]);

export class Measurements {
  /** the rank-to-rank link the last mesh probe measured (its slowest rank) */
  meshLink: LinkSpeed | null = null;
  /** seconds of one forward by degree, rehearsed on a group, for each of its workers */
  private readonly rehearsals = new Map<string, Map<number, number[]>>();
  /** seconds of a step of a plan as the jobs that ran it measured, the last weighing half */
  private readonly steps = new Map<string, number>();
  /** the largest buffer each worker's adapter allows, by worker id, as its last load said */
  private readonly buffers = new Map<string, number>();

  rehearsal(group: WorkerGroup, degree: number): number[] | undefined {
    return this.rehearsals.get(groupKey(group))?.get(degree);
  }

  setRehearsal(group: WorkerGroup, degree: number, seconds: number[]): void {
    const key = groupKey(group);
    const byDegree = this.rehearsals.get(key) ?? new Map<number, number[]>();
    byDegree.set(degree, seconds);
    this.rehearsals.set(key, byDegree);
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
  }

  maxBufferBytes(worker: string): number | undefined {
    return this.buffers.get(worker);
  }

  setMaxBufferBytes(worker: string, bytes: number): void {
    this.buffers.set(worker, bytes);
  }
}
