// The pure parts of the chaos soak (bench/chaos.ts): its seeded choices of what goes wrong where,
// the job variants, how a latent is compared with its uninterrupted run, and which of the swarm's
// departures the faults explain. No browser here, so the unit tests hold them.

/** What the driver does to a worker tab. */
export const FAULT_KINDS = ['kill', 'crash', 'freeze', 'slow', 'reload'] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

/** The phases of a job a fault is aimed at, as the dashboard announces them. */
export const FAULT_PHASES = ['encoding', 'placing', 'denoising', 'decoding'] as const;
export type FaultPhase = (typeof FAULT_PHASES)[number];

/** A fault the schedule chose: every field a draw of the seeded generator, decided before any job runs. */
export interface PlannedFault {
  job: number;
  kind: FaultKind;
  phase: FaultPhase;
  /** where in the phase it lands, as a fraction of the phase's expected length */
  at: number;
  /** which of the job's ranks (a fraction of their count: the ranks are known only when it lands) */
  target: number;
  /** freeze and slow: how long the tab stays frozen or slowed */
  holdMs: number;
  /** slow: the share of a core its machine keeps meanwhile */
  share: number;
  /** kill and crash: how long until a new tab replaces the lost one */
  replaceAfterMs: number;
}

export interface FaultScheduleOptions {
  jobs: number;
  faultsPerJob: number;
  seed: number;
}

export const HOLD_MS = { min: 1_000, max: 12_000 } as const;
export const SLOW_SHARE = { min: 0.05, max: 0.4 } as const;
export const REPLACE_AFTER_MS = { min: 0, max: 5_000 } as const;

/** mulberry32: a small seeded generator of numbers in [0, 1), the same sequence for the same seed everywhere. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

function shuffled<T>(items: readonly T[], random: () => number): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

const between = (random: () => number, { min, max }: { min: number; max: number }) => min + random() * (max - min);

/**
 * Every job's faults. Each kind meets each phase equally often: the pairs are dealt from a shuffled
 * deck of all of them, a new deck when one runs out, so a soak of a few decks covers them all.
 */
export function planFaults({ jobs, faultsPerJob, seed }: FaultScheduleOptions): PlannedFault[][] {
  const random = seededRandom(seed);
  const pairs = FAULT_KINDS.flatMap((kind) => FAULT_PHASES.map((phase) => ({ kind, phase })));
  let deck: typeof pairs = [];
  return Array.from({ length: jobs }, (_, job) =>
    Array.from({ length: faultsPerJob }, () => {
      if (!deck.length) deck = shuffled(pairs, random);
      const { kind, phase } = deck.pop() as (typeof pairs)[number];
      return {
        job,
        kind,
        phase,
        at: random(),
        target: random(),
        holdMs: Math.round(between(random, HOLD_MS)),
        share: Number(between(random, SLOW_SHARE).toFixed(2)),
        replaceAfterMs: Math.round(between(random, REPLACE_AFTER_MS)),
      };
    }),
  );
}

/** Prompts of the demo model's grammar (demo/world.ts), so its videos show what they say. */
export const CHAOS_PROMPTS = [
  'a red square moving right',
  'a blue circle moving left',
  'a green triangle moving up',
  'a yellow square standing still',
] as const;

export interface JobVariant {
  prompt: string;
  seed: number;
}

/** `count` distinct jobs (prompt and seed), the same for the same seed. */
export function jobVariants(count: number, seed: number): JobVariant[] {
  const random = seededRandom(seed ^ 0x5eed);
  return Array.from({ length: count }, (_, i) => ({
    prompt: CHAOS_PROMPTS[i % CHAOS_PROMPTS.length],
    seed: Math.floor(random() * 1e6),
  }));
}

/**
 * Where a fault aimed at `at` of a phase lands: denoising at a step (0: as the phase begins) and a
 * delay into it; the other phases at a delay after they begin. Lengths are the uninterrupted run's.
 */
export function landingPoint(
  fault: Pick<PlannedFault, 'phase' | 'at'>,
  expected: { phaseMs: number; steps: number; stepMs: number },
): { afterStep: number; delayMs: number } {
  if (fault.phase !== 'denoising') return { afterStep: 0, delayMs: Math.round(fault.at * expected.phaseMs) };
  const position = fault.at * expected.steps;
  const afterStep = Math.min(Math.floor(position), expected.steps - 1);
  return { afterStep, delayMs: Math.round((position - afterStep) * expected.stepMs) };
}

export interface LatentComparison {
  /** the same bytes: what a bit-exact recovery gives */
  identical: boolean;
  /** the largest |a − b| (NaN where either holds a NaN) */
  maxAbs: number;
}

export function compareLatents(a: Float32Array, b: Float32Array): LatentComparison {
  if (a.length !== b.length) throw new Error(`cannot compare latents of ${a.length} and ${b.length} values`);
  const bytesA = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const bytesB = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  let identical = true;
  for (let i = 0; i < bytesA.length && identical; i++) identical = bytesA[i] === bytesB[i];
  let maxAbs = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (Number.isNaN(d)) return { identical, maxAbs: NaN };
    maxAbs = Math.max(maxAbs, d);
  }
  return { identical, maxAbs };
}

/** A line of the dashboard's swarm events (app/dashboard.ts), read back. */
export type SwarmNotice =
  { type: 'leave'; workerSuffix: string; reason: string } | { type: 'refused'; workerSuffix: string; reason: string };

export function parseSwarmNotice(text: string): SwarmNotice | null {
  const leave = /^Worker (\S+) left: ([\s\S]*)\.$/.exec(text);
  if (leave) return { type: 'leave', workerSuffix: leave[1], reason: leave[2] };
  const refused = /^Refused (\S+): ([\s\S]*)\.$/.exec(text);
  if (refused) return { type: 'refused', workerSuffix: refused[1], reason: refused[2] };
  return null;
}

/** A fault as it landed on one worker: when, and (freeze, slow) until when. */
export interface LandedFault {
  kind: FaultKind;
  worker: string;
  landedAt: number;
  /** freeze and slow: when the tab was thawed or given its core back (null: not yet) */
  endedAt: number | null;
}

/** after a thaw, how long a worker's departure is still the freeze's: the dashboard notices silence late */
export const THAW_GRACE_MS = 15_000;

/**
 * The fault that explains a worker leaving the swarm at `at`: its tab closed, crashed or reloaded
 * before, or it was frozen then (or thawed just before). A slowed worker is alive: nothing explains
 * letting it go, nor letting go a worker nothing was done to.
 */
export function explainingFault(worker: string, at: number, faults: readonly LandedFault[]): LandedFault | null {
  return (
    faults.find((f) => {
      if (f.worker !== worker || f.landedAt > at) return false;
      if (f.kind === 'kill' || f.kind === 'crash' || f.kind === 'reload') return true;
      if (f.kind === 'freeze') return f.endedAt === null || at <= f.endedAt + THAW_GRACE_MS;
      return false;
    }) ?? null
  );
}
