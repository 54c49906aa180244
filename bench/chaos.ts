// The chaos soak (issue 34): jobs on the bundled demo model while a driver kills, crashes, freezes,
// slows and reloads random worker tabs at random moments of every phase, with the machine
// oversubscribed by spinning processes; each job's latent is held to the same job run once before,
// uninterrupted and unloaded, on one worker. Each worker tab is a machine of its own (a Chromium in
// a cpu cgroup of its own, as bench/machines.ts makes them), so that one can be slowed alone; a
// lost tab is replaced by a new one on its machine, so the swarm does not run out of workers.
// Writes bench/out/chaos.json: the faults as they landed, the jobs, the latents, the workers let go.
//
//   npm run chaos -- [--jobs 6] [--seed 1] [--workers 4] [--degree 3] [--faults-per-job 2]
//     [--busy-per-core 4] [--variants 4] [--frames 9 --height 64 --width 64 --steps 8]
//
// Slowing needs a writable cpu cgroup (root; cgroup v1's cpu controller or v2's cpu.max): without
// one, slow faults are skipped and the report says so.

import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium, type BrowserContext, type CDPSession, type Page } from '@playwright/test';
import type { AutomationProgress, JobOverrides, JobResult } from '../app/automation.ts';
import { chromiumArgs, chromiumExecutable } from '../server/chromium.ts';
import { startServer } from '../server/serve.ts';
import { startBusyLoad, type BusyLoad } from './busy-load.ts';
import {
  compareLatents,
  explainingFault,
  FAULT_KINDS,
  FAULT_PHASES,
  jobVariants,
  landingPoint,
  parseSwarmNotice,
  planFaults,
  type FaultPhase,
  type JobVariant,
  type LandedFault,
  type PlannedFault,
} from './chaos-plan.ts';
import { isMain, latentFromBase64, log, machine, median, round, writeReport } from './lib.ts';

export interface ChaosOptions {
  jobs: number;
  seed: number;
  /** worker tabs, each on a machine of its own */
  workers: number;
  /** the workers each job asks for: fewer than the tabs, so a job can be placed while a lost tab is replaced */
  degree: number;
  faultsPerJob: number;
  /** spinning processes beside the job, per core */
  busyPerCore: number;
  /** distinct jobs (prompt and seed), each run once uninterrupted as the reference of its kind */
  variants: number;
  frames: number;
  height: number;
  width: number;
  steps: number;
  /** a job not settled after this long is reported hung, and the soak stops */
  jobTimeoutS: number;
}

export const DEFAULT_CHAOS: ChaosOptions = {
  jobs: 6,
  seed: 1,
  workers: 4,
  degree: 3,
  faultsPerJob: 2,
  busyPerCore: 4,
  variants: 4,
  frames: 9,
  height: 64,
  width: 64,
  steps: 8,
  jobTimeoutS: 600,
};

/** long enough that the least slow share (chaos-plan.ts) is still a quota the kernel takes (≥ 1 ms) */
const CPU_PERIOD_US = 50_000;
/** how long a new or reloaded tab may take to join */
const JOIN_TIMEOUT_MS = 90_000;
/** how long after a job the driver waits for the swarm to be whole again */
const REGROUP_TIMEOUT_MS = 90_000;
/** a frozen page's timer is sampled this often: its ticks during the freeze say whether it really froze */
const TICK_MS = 100;

/** A cgroup holding one worker machine's Chromium, unlimited until a slow fault limits it. */
interface CpuQuota {
  dir: string;
  limit(share: number): void;
  unlimit(): void;
  /** periods the kernel throttled the group in, so far */
  throttled(): number;
  remove(): void;
}

/** A cpu cgroup of its own for a machine, or why there is none. */
function openCpuQuota(name: string): CpuQuota | string {
  const v1 = '/sys/fs/cgroup/cpu';
  const v2 = '/sys/fs/cgroup';
  try {
    if (existsSync(join(v1, 'cpu.cfs_quota_us'))) {
      const dir = join(v1, name);
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
      writeFileSync(join(dir, 'cpu.cfs_quota_us'), '-1');
      return {
        dir,
        limit: (share) => writeFileSync(join(dir, 'cpu.cfs_quota_us'), String(Math.round(share * CPU_PERIOD_US))),
        unlimit: () => writeFileSync(join(dir, 'cpu.cfs_quota_us'), '-1'),
        throttled: () => Number(/nr_throttled (\d+)/.exec(readFileSync(join(dir, 'cpu.stat'), 'utf8'))?.[1] ?? NaN),
        remove: () => rmdirSync(dir),
      };
    }
    if (
      existsSync(join(v2, 'cgroup.controllers')) &&
      readFileSync(join(v2, 'cgroup.controllers'), 'utf8').includes('cpu')
    ) {
      writeFileSync(join(v2, 'cgroup.subtree_control'), '+cpu');
      const dir = join(v2, name);
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, 'cpu.max'), `max ${CPU_PERIOD_US}`);
      return {
        dir,
        limit: (share) => writeFileSync(join(dir, 'cpu.max'), `${Math.round(share * CPU_PERIOD_US)} ${CPU_PERIOD_US}`),
        unlimit: () => writeFileSync(join(dir, 'cpu.max'), `max ${CPU_PERIOD_US}`),
        throttled: () => Number(/nr_throttled (\d+)/.exec(readFileSync(join(dir, 'cpu.stat'), 'utf8'))?.[1] ?? NaN),
        remove: () => rmdirSync(dir),
      };
    }
    return 'no cpu cgroup is mounted (cgroup v1 cpu or v2 cpu.max)';
  } catch (e) {
    return `the cpu cgroup is not writable here: ${(e as Error).message}`;
  }
}

/** Sends `signal` to the renderer processes of a machine's Chromium (or to `pids`); the pids it reached. */
function signalRenderers(quota: CpuQuota | null, signal: 'SIGSTOP' | 'SIGCONT', pids?: number[]): number[] {
  const targets =
    pids ??
    (quota
      ? readFileSync(join(quota.dir, 'cgroup.procs'), 'utf8')
          .split('\n')
          .filter(Boolean)
          .map(Number)
          .filter((pid) => {
            try {
              return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('--type=renderer');
            } catch {
              return false; // gone meanwhile
            }
          })
      : []);
  return targets.filter((pid) => {
    try {
      process.kill(pid, signal);
      return true;
    } catch {
      return false;
    }
  });
}

/** A worker machine: its Chromium, its one worker tab (replaced when lost), its cgroup. */
interface WorkerMachine {
  name: string;
  context: BrowserContext;
  page: Page;
  quota: CpuQuota | null;
  /** the tab's peer id, once it joined */
  id: string | null;
  /** under a fault (or being replaced): not a target of another */
  busy: boolean;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `promise`, or `fallback` after `ms` (a frozen page never answers an evaluate). */
const within = <T>(promise: Promise<T>, ms: number, fallback: T): Promise<T> =>
  Promise.race([promise.catch(() => fallback), sleep(ms).then(() => fallback)]);

/** The fault as the report keeps it: as planned, and what became of it. */
interface FaultRecord extends PlannedFault {
  /** the worker's peer id (null: it never landed) */
  worker: string | null;
  /** the rank it held in the job then, or null (not one of the job's ranks, or no placement yet) */
  rank: number | null;
  /** ms after the job was submitted */
  landedMs: number | null;
  landedAt: number | null;
  /** the phase and the steps done as the driver last heard them when the fault landed */
  landedPhase: string | null;
  landedStep: number | null;
  /** freeze, slow: when it ended (ms since the epoch) */
  endedAt: number | null;
  outcome: 'injected' | 'skipped' | 'not reached' | 'error';
  note: string | null;
  /** kill, crash, reload: the tab that took its place, and how long after the fault it joined */
  replacement: { id: string; joinedAfterMs: number } | null;
  /** what shows it happened: a crash event, a frozen page's timer ticks, throttled periods */
  evidence: string | null;
}

interface JobRecord {
  job: number;
  variant: number;
  prompt: string;
  seed: number;
  /** the dashboard's job id */
  id: number | null;
  completed: boolean;
  error: string | null;
  /** the phase the job was in when it failed */
  failedInPhase: string | null;
  ms: number;
  degree: number | null;
  latentSha256: string | null;
  identical: boolean | null;
  maxAbs: number | null;
  /** ranks the job lost and re-placed, as its report lists them */
  failures: {
    step: number;
    error: string;
    lost: { rank: number; worker: string; cause: string; evidence: string; silentMs: number }[];
    degreeBefore: number;
    degreeAfter: number;
    replanMs: number;
  }[];
  loadAverage1m: number;
}

/** What the dashboard told the driver last about the job under way. */
class JobTracker {
  job: number | null = null;
  phase: string | null = null;
  step = 0;
  private listeners: ((p: AutomationProgress) => void)[] = [];
  hear(p: AutomationProgress): void {
    if (!('job' in p)) return;
    if (p.job !== this.job) {
      this.job = p.job;
      this.step = 0;
    }
    if ('phase' in p) this.phase = p.phase;
    else {
      this.phase = 'denoising';
      this.step = p.step;
    }
    for (const l of this.listeners) l(p);
  }
  on(listener: (p: AutomationProgress) => void): () => void {
    this.listeners.push(listener);
    return () => (this.listeners = this.listeners.filter((l) => l !== listener));
  }
}

export async function runChaos(options: Partial<ChaosOptions> = {}) {
  const o = { ...DEFAULT_CHAOS, ...options };
  if (o.degree > o.workers) throw new Error(`--degree ${o.degree} needs at least as many --workers, got ${o.workers}`);
  const started = Date.now();
  const plan = planFaults({ jobs: o.jobs, faultsPerJob: o.faultsPerJob, seed: o.seed });
  const variants = jobVariants(Math.min(o.variants, o.jobs), o.seed);
  log(`chaos: ${o.jobs} jobs, ${o.faultsPerJob} faults each, ${o.workers} worker machines, jobs on ${o.degree}`);

  const dir = mkdtempSync(join(tmpdir(), 'ditswarm-chaos-'));
  const server = await startServer({ port: 0, quiet: true });
  const contexts: BrowserContext[] = [];
  const machines: WorkerMachine[] = [];
  let busy: BusyLoad | null = null;
  let slowSkipped: string | null = null;
  const close = async () => {
    busy?.stop();
    for (const c of contexts) await c.close().catch(() => {});
    for (const m of machines) {
      try {
        m.quota?.remove();
      } catch (e) {
        log(`could not remove the cgroup ${m.quota?.dir}: ${(e as Error).message}`);
      }
    }
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  };

  try {
    const launch = async (name: string, quota: CpuQuota | null) => {
      const wrapper = join(dir, `chromium-${name}.sh`);
      const enter = quota ? `echo $$ > ${join(quota.dir, 'cgroup.procs')}\n` : '';
      writeFileSync(wrapper, `#!/bin/sh\n${enter}exec ${chromiumExecutable()} "$@"\n`);
      chmodSync(wrapper, 0o755);
      const context = await chromium.launchPersistentContext(join(dir, `profile-${name}`), {
        executablePath: wrapper,
        args: [...chromiumArgs],
      });
      contexts.push(context);
      return context;
    };
    const dashboardContext = await launch('dashboard', null);
    const browserVersion = dashboardContext.browser()?.version() ?? 'unknown';
    const dashboard = await dashboardContext.newPage();
    const tracker = new JobTracker();
    await dashboard.exposeFunction('ditswarmProgress', (p: AutomationProgress) => tracker.hear(p));
    // every line the dashboard shows about a worker leaving or being refused, as it shows it
    /** what the soak is doing: the tabs joining, a reference run, a job of the soak, or between jobs */
    let stage = 'joining';
    const notices: { at: number; text: string; during: string }[] = [];
    await dashboard.exposeFunction('chaosSwarmNotice', (text: string) =>
      notices.push({ at: Date.now(), text, during: `${stage}${stageDetail()}` }),
    );
    const stageDetail = () =>
      stage.startsWith('job') && tracker.phase
        ? `, ${tracker.phase}${tracker.phase === 'denoising' ? ` after step ${tracker.step}` : ''}`
        : '';
    await dashboard.goto(`${server.url}/`);
    const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    await dashboard.evaluate(() => {
      const events = document.getElementById('swarm-events');
      if (!events) throw new Error('the dashboard has no #swarm-events');
      const tell = (window as unknown as { chaosSwarmNotice: (t: string) => void }).chaosSwarmNotice;
      new MutationObserver((records) => {
        for (const r of records) for (const n of r.addedNodes) if (n.textContent) tell(n.textContent);
      }).observe(events, { childList: true, characterData: true, subtree: true });
    });

    const idOf = (page: Page) =>
      within(
        page.evaluate(() => (window.ditswarmWorker?.connected ? window.ditswarmWorker.peerId : null)),
        2_000,
        null,
      );
    /** A worker tab on the machine, once it joined: its peer id. */
    const openTab = async (m: WorkerMachine): Promise<string> => {
      m.page = await m.context.newPage();
      await m.page.goto(joinUrl);
      return joined(m);
    };
    const joined = async (m: WorkerMachine): Promise<string> => {
      const deadline = Date.now() + JOIN_TIMEOUT_MS;
      for (;;) {
        const id = await idOf(m.page);
        if (id) return (m.id = id);
        if (Date.now() > deadline) throw new Error(`${m.name}'s tab did not join within ${JOIN_TIMEOUT_MS / 1000} s`);
        await sleep(250);
      }
    };
    const everyId = new Set<string>();
    for (let i = 0; i < o.workers; i++) {
      const name = `w${i}`;
      const quota = openCpuQuota(`ditswarm-chaos-${name}`);
      if (typeof quota === 'string') slowSkipped ??= quota;
      const context = await launch(name, typeof quota === 'string' ? null : quota);
      // a one-core machine's tab, as bench/machines.ts tells its pages
      await context.addInitScript(() =>
        Object.defineProperty(Navigator.prototype, 'hardwareConcurrency', { get: () => 1 }),
      );
      const m: WorkerMachine = {
        name,
        context,
        page: null as unknown as Page,
        quota: typeof quota === 'string' ? null : quota,
        id: null,
        busy: false,
      };
      machines.push(m);
      if (m.quota && !readFileSync(join(m.quota.dir, 'cgroup.procs'), 'utf8').trim()) {
        slowSkipped ??= `the ${name} Chromium did not enter its cgroup ${m.quota.dir}`;
        m.quota = null;
      }
      everyId.add(await openTab(m));
    }
    await dashboard.waitForFunction((n) => window.ditswarm.workerCount() >= n, o.workers, { timeout: 60_000 });
    log(`chaos: ${o.workers} worker tabs joined${slowSkipped ? `; slow faults skipped: ${slowSkipped}` : ''}`);

    const jobOf = (v: JobVariant, workers: number): JobOverrides => ({
      prompt: v.prompt,
      seed: v.seed,
      frames: o.frames,
      height: o.height,
      width: o.width,
      steps: o.steps,
      backend: 'swarm',
      ep: 'wasm',
      workers,
    });
    type Settled = { id: number } & ({ result: JobResult } | { error: string });
    const runJob = (overrides: JobOverrides): Promise<Settled> =>
      dashboard.evaluate(async (job) => {
        const id = await window.ditswarm.submit(job);
        try {
          return { id, result: await window.ditswarm.result(id) };
        } catch (e) {
          return { id, error: e instanceof Error ? e.message : String(e) };
        }
      }, overrides);

    // the references: each variant once, on one worker, before any fault or load
    const references = [];
    for (const [i, v] of variants.entries()) {
      stage = `reference ${i}`;
      log(`chaos: reference ${i + 1} of ${variants.length} (one worker, unloaded, uninterrupted)…`);
      const settled = await runJob(jobOf(v, 1));
      if ('error' in settled) throw new Error(`the uninterrupted reference job ${i} failed: ${settled.error}`);
      const { report, latent } = settled.result;
      references.push({
        variant: i,
        ...v,
        latent: latentFromBase64(latent),
        latentSha256: report.latentSha256,
        phasesMs: report.phasesMs,
        stepMs: report.medianStepMs,
        steps: report.steps.length,
        totalMs: round(report.totalMs, 0),
      });
    }

    busy = startBusyLoad(o.busyPerCore);
    log(`chaos: ${busy.processes} spinning processes beside the jobs`);

    const faults: FaultRecord[] = plan.flat().map((p) => ({
      ...p,
      worker: null,
      rank: null,
      landedMs: null,
      landedAt: null,
      landedPhase: null,
      landedStep: null,
      endedAt: null,
      outcome: 'not reached',
      note: null,
      replacement: null,
      evidence: null,
    }));

    /** Carries out one fault on a worker tab the job runs on (else another); resolves once the tab is back. */
    const inflict = async (f: FaultRecord, submittedAt: number) => {
      const ranks = await within(
        dashboard.evaluate(() => window.ditswarm.ranks()),
        5_000,
        [] as string[],
      );
      const free = machines.filter((m) => !m.busy && m.id);
      const rankId = ranks.length ? ranks[Math.floor(f.target * ranks.length)] : null;
      const m = free.find((c) => c.id === rankId) ?? free.at(Math.floor(f.target * free.length));
      f.landedAt = Date.now();
      f.landedMs = f.landedAt - submittedAt;
      f.landedPhase = tracker.phase;
      f.landedStep = tracker.step;
      if (!m?.id) {
        f.outcome = 'skipped';
        f.note = 'every worker tab was under another fault';
        return;
      }
      const id = m.id;
      f.worker = id;
      f.rank = ranks.includes(id) ? ranks.indexOf(id) : null;
      m.busy = true;
      let cdp: CDPSession | null = null;
      try {
        f.outcome = 'injected';
        switch (f.kind) {
          case 'kill': {
            await m.page.close();
            await sleep(f.replaceAfterMs);
            break;
          }
          case 'crash': {
            cdp = await m.context.newCDPSession(m.page);
            const crashed = new Promise<boolean>((r) => m.page.once('crash', () => r(true)));
            void cdp.send('Page.crash').catch(() => {});
            f.evidence = (await within(crashed, 10_000, false)) ? 'the page crashed' : 'no crash event in 10 s';
            await sleep(f.replaceAfterMs);
            await m.page.close().catch(() => {});
            break;
          }
          case 'reload': {
            await m.page.reload({ waitUntil: 'load' });
            const newId = await joined(m);
            f.replacement = { id: newId, joinedAfterMs: Date.now() - f.landedAt };
            everyId.add(newId);
            return;
          }
          case 'freeze': {
            cdp = await m.context.newCDPSession(m.page);
            await m.page.evaluate((tickMs) => {
              const w = window as unknown as { chaosTicks?: number };
              if (w.chaosTicks !== undefined) return;
              w.chaosTicks = 0;
              setInterval(() => (w.chaosTicks = (w.chaosTicks ?? 0) + 1), tickMs);
            }, TICK_MS);
            const ticks = () => m.page.evaluate(() => (window as unknown as { chaosTicks?: number }).chaosTicks ?? 0);
            const before = await ticks();
            await cdp.send('Page.setWebLifecycleState', { state: 'frozen' });
            // the lifecycle state alone leaves this Chromium's timers running: its renderers stop too
            const stopped = m.quota ? signalRenderers(m.quota, 'SIGSTOP') : [];
            await sleep(f.holdMs);
            signalRenderers(m.quota, 'SIGCONT', stopped);
            await cdp.send('Page.setWebLifecycleState', { state: 'active' });
            f.endedAt = Date.now();
            const during = (await within(ticks(), 10_000, NaN)) - before;
            f.evidence =
              `${during} timer ticks of ${Math.round(f.holdMs / TICK_MS)} while frozen; ` +
              `${stopped.length} renderer process(es) stopped`;
            await joined(m);
            return;
          }
          case 'slow': {
            if (!m.quota) {
              f.outcome = 'skipped';
              f.note = `no cpu cgroup: ${slowSkipped}`;
              return;
            }
            const before = m.quota.throttled();
            m.quota.limit(f.share);
            await sleep(f.holdMs);
            m.quota.unlimit();
            f.endedAt = Date.now();
            f.evidence = `throttled in ${m.quota.throttled() - before} periods of ${CPU_PERIOD_US / 1000} ms`;
            return;
          }
        }
        // kill and crash: a new tab on the same machine
        const newId = await openTab(m);
        f.replacement = { id: newId, joinedAfterMs: Date.now() - f.landedAt };
        everyId.add(newId);
      } catch (e) {
        f.outcome = 'error';
        f.note = (e as Error).message.split('\n')[0];
        // whatever state the tab is in, the machine gets a working one back
        signalRenderers(m.quota, 'SIGCONT');
        if (!m.page.isClosed()) await m.page.close().catch(() => {});
        await openTab(m)
          .then((newId) => everyId.add(newId))
          .catch((err: unknown) => log(`chaos: ${m.name} has no tab: ${(err as Error).message}`));
      } finally {
        m.busy = false;
        await cdp?.detach().catch(() => {});
      }
    };

    const jobs: JobRecord[] = [];
    for (let j = 0; j < o.jobs; j++) {
      const variant = j % variants.length;
      const reference = references[variant];
      const mine = faults.filter((f) => f.job === j);
      const pending: Promise<void>[] = [];
      const submittedAt = Date.now();
      stage = `job ${j}`;
      const expectedMs = (phase: FaultPhase) => ({
        phaseMs: reference.phasesMs[phase],
        steps: reference.steps,
        stepMs: reference.stepMs,
      });
      const fired = new Set<FaultRecord>();
      const fire = (f: FaultRecord, delayMs: number) => {
        fired.add(f);
        pending.push(sleep(delayMs).then(() => inflict(f, submittedAt)));
      };
      const off = tracker.on((p) => {
        for (const f of mine) {
          if (fired.has(f)) continue;
          const { afterStep, delayMs } = landingPoint(f, expectedMs(f.phase));
          const entered = 'phase' in p && p.phase === f.phase && afterStep === 0;
          const stepped = 'step' in p && f.phase === 'denoising' && afterStep > 0 && p.step === afterStep;
          if (entered || stepped) fire(f, delayMs);
        }
      });
      log(`chaos: job ${j + 1} of ${o.jobs}: ${mine.map((f) => `${f.kind} in ${f.phase}`).join(', ')}`);
      const settled = await Promise.race([
        runJob(jobOf(reference, o.degree)),
        sleep(o.jobTimeoutS * 1000).then(() => null),
      ]);
      off();
      const record: JobRecord = {
        job: j,
        variant,
        prompt: reference.prompt,
        seed: reference.seed,
        id: settled?.id ?? tracker.job,
        completed: !!settled && 'result' in settled,
        error: !settled ? `not settled after ${o.jobTimeoutS} s` : 'error' in settled ? settled.error : null,
        failedInPhase: settled && 'result' in settled ? null : tracker.phase,
        ms: Date.now() - submittedAt,
        degree: null,
        latentSha256: null,
        identical: null,
        maxAbs: null,
        failures: [],
        loadAverage1m: round(loadavg()[0], 2),
      };
      if (settled && 'result' in settled) {
        const { report, latent } = settled.result;
        const comparison = compareLatents(latentFromBase64(latent), reference.latent);
        Object.assign(record, {
          degree: report.placement.layout.ulyssesDegree,
          latentSha256: report.latentSha256,
          identical: comparison.identical,
          maxAbs: comparison.maxAbs,
          failures: report.failures.map((f) => ({
            step: f.step,
            error: f.error,
            lost: f.lost.map(({ rank, worker, cause, evidence, silentMs }) => ({
              rank,
              worker,
              cause,
              evidence,
              silentMs,
            })),
            degreeBefore: f.degreeBefore,
            degreeAfter: f.degreeAfter,
            replanMs: round(f.replanMs, 0),
          })),
        });
      }
      // a fault whose phase the job never reached (it failed first) stays 'not reached'
      await Promise.all(pending);
      jobs.push(record);
      const outcome = record.completed
        ? `done, latent ${record.identical ? 'identical' : `max-abs ${record.maxAbs}`}`
        : `FAILED in ${record.failedInPhase}: ${record.error}`;
      log(`chaos: job ${j + 1}: ${outcome}; ${record.failures.length} re-placement(s)`);
      stage = `between jobs ${j} and ${j + 1}`;
      if (!settled) break;
      // the next job starts on a whole swarm
      const whole = await within(
        dashboard
          .waitForFunction((n) => window.ditswarm.workerCount() >= n, o.workers, { timeout: REGROUP_TIMEOUT_MS })
          .then(() => true),
        REGROUP_TIMEOUT_MS + 5_000,
        false,
      );
      if (!whole) log(`chaos: the swarm is short of workers after job ${j + 1}`);
    }
    busy.stop();

    // who was let go, and whether a fault explains it
    const landed: LandedFault[] = faults.flatMap((f) =>
      f.worker && f.landedAt !== null && f.outcome === 'injected'
        ? [{ kind: f.kind, worker: f.worker, landedAt: f.landedAt, endedAt: f.endedAt }]
        : [],
    );
    const fullId = (suffix: string) => [...everyId].find((id) => id.endsWith(suffix)) ?? suffix;
    const departures = notices.flatMap(({ at, text, during }) => {
      const notice = parseSwarmNotice(text);
      if (!notice) return [];
      const worker = fullId(notice.workerSuffix);
      const cause = notice.type === 'leave' ? explainingFault(worker, at, landed) : null;
      return [
        {
          type: notice.type,
          worker,
          at,
          during,
          reason: notice.reason,
          explainedBy: cause && { kind: cause.kind, landedAt: cause.landedAt },
        },
      ];
    });
    const histories = await Promise.all(
      machines.map((m) =>
        within(
          m.page.evaluate(() => window.ditswarmWorkerHistory),
          5_000,
          [] as string[],
        ),
      ),
    );
    const bannedLines = [
      ...departures
        .filter((d) => d.type === 'refused' && /banned/.test(d.reason))
        .map((d) => `${d.worker}: ${d.reason}`),
      ...histories.flat().filter((line) => /banned/.test(line)),
      ...jobs.flatMap((j) =>
        j.failures.flatMap((f) =>
          f.lost.filter((l) => l.cause === 'misbehaved').map((l) => `${l.worker}: ${l.evidence}`),
        ),
      ),
    ];
    const honestLetGo = departures.filter((d) => d.type === 'leave' && !d.explainedBy);
    const byKindAndPhase = Object.fromEntries(
      FAULT_KINDS.map((kind) => [
        kind,
        Object.fromEntries(
          FAULT_PHASES.map((phase) => [
            phase,
            faults.filter((f) => f.kind === kind && f.landedPhase === phase && f.outcome === 'injected').length,
          ]),
        ),
      ]),
    );
    const completed = jobs.filter((j) => j.completed);
    return {
      benchmark: 'chaos',
      date: new Date(started).toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: {
        ...o,
        model: 'the bundled demo model (/models/tiny-wan-demo)',
        ep: 'wasm',
        machines:
          'each worker tab in a Chromium of its own in a cpu cgroup of its own (unlimited but while slowed), ' +
          'its pages told they have one core; the dashboard in a Chromium of its own',
        oversubscription: `${busy.processes} spinning processes (${o.busyPerCore} per core) beside the jobs`,
        slowSkipped,
        faults: {
          kill: 'the tab closed; a new tab on its machine after replaceAfterMs',
          crash: 'CDP Page.crash; the crashed tab closed and a new one opened after replaceAfterMs',
          freeze:
            "CDP Page.setWebLifecycleState 'frozen' for holdMs, and (with a cgroup) its machine's renderer " +
            'processes stopped (SIGSTOP) meanwhile: the lifecycle state alone does not stop its timers here',
          slow: "its machine's cgroup given `share` of a core for holdMs",
          reload: 'the tab reloaded (it joins again under a new peer id)',
        },
      },
      machine: machine(browserVersion),
      summary: {
        jobs: jobs.length,
        completed: completed.length,
        identicalLatents: completed.filter((j) => j.identical).length,
        maxAbs: completed.reduce((m, j) => Math.max(m, j.maxAbs ?? 0), 0),
        failed: jobs.filter((j) => !j.completed).map((j) => ({ job: j.job, phase: j.failedInPhase, error: j.error })),
        faultsInjected: faults.filter((f) => f.outcome === 'injected').length,
        faultsSkipped: faults.filter((f) => f.outcome === 'skipped').length,
        faultsNotReached: faults.filter((f) => f.outcome === 'not reached').length,
        faultsInError: faults.filter((f) => f.outcome === 'error').length,
        /** faults that landed, by kind and by the phase the job was in as they landed */
        byKindAndPhase,
        rePlacements: jobs.reduce((t, j) => t + j.failures.length, 0),
        honestWorkersLetGo: honestLetGo.map((d) => ({ worker: d.worker, during: d.during, reason: d.reason })),
        banned: bannedLines,
        medianJobS: round(median(jobs.map((j) => j.ms)) / 1000, 1),
      },
      references: references.map(({ latent: _latent, ...r }) => r),
      jobs,
      faults,
      departures,
    };
  } finally {
    await close();
  }
}

export function parseChaosArgs(args: string[]): Partial<ChaosOptions> {
  const flag = (key: string) => key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
  const { values } = parseArgs({
    args,
    options: Object.fromEntries(Object.keys(DEFAULT_CHAOS).map((k) => [flag(k), { type: 'string' as const }])),
  });
  const out: Partial<ChaosOptions> = {};
  for (const key of Object.keys(DEFAULT_CHAOS) as (keyof ChaosOptions)[]) {
    const v = values[flag(key)];
    if (v === undefined) continue;
    const n = Number(v);
    const fraction = key === 'busyPerCore';
    if (!(fraction ? n >= 0 : Number.isInteger(n) && n >= (key === 'seed' ? 0 : 1)))
      throw new Error(`--${flag(key)} takes ${fraction ? 'a number ≥ 0' : 'a whole number ≥ 1'}, got ${v}`);
    out[key] = n;
  }
  return out;
}

if (isMain(import.meta)) {
  const report = await runChaos(parseChaosArgs(process.argv.slice(2)));
  writeReport('chaos.json', report);
  console.log(JSON.stringify(report.summary, null, 2));
}
