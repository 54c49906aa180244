// The first job as fast as the second (issue 66): a fresh server and fresh worker tabs on the bundled demo model, then
// the dashboard's own job (its form's defaults: what Enter on the default prompt submits) twice, each timed from its
// submission to its video. Per job: Enter-to-video, the pipeline's phases, the mesh probe, and a timeline of what each
// worker was doing (the dashboard's swarm table, polled) from the tabs' opening on: joined, measured, preloaded,
// rehearsed. Writes bench/out/first-job.json.
//
//   npm run bench -- first-job [--workers 2] [--enter ready|joined]
//
// --enter: when the first job is submitted. 'ready' (the default): once each tab's page says it holds the model
// (preloaded, warmed up) and the dashboard's swarm table says each is idle, as a person who opened the tabs sees them
// before going back to the dashboard. 'joined': as
// soon as the dashboard lists the tabs, before they are measured: the hardest case, whose wait is their measurement
// and warm-up.

import { parseArgs } from 'node:util';
import type { Page } from '@playwright/test';
import type { JobResult, WorkerSummary } from '../app/automation.ts';
import { PRELOAD_FROM_BYTES } from '../coordinator/preload.ts';
import { startLocalSwarm } from '../server/cli/browser-swarm.ts';
import { log, machine, round } from './lib.ts';

export interface FirstJobOptions {
  workers: number;
  enter: 'ready' | 'joined';
}

export const DEFAULT_FIRST_JOB: FirstJobOptions = { workers: 2, enter: 'ready' };
export const SMOKE_FIRST_JOB: FirstJobOptions = DEFAULT_FIRST_JOB;

/** How often the swarm table is read for the timeline. */
const POLL_MS = 100;

interface Activity {
  /** ms since the tabs were opened */
  atMs: number;
  /** a worker's peer id, as the dashboard's swarm table lists it; or `tab N`, as its own page says */
  worker: string;
  state: string;
}

export async function runFirstJob(options: Partial<FirstJobOptions> = {}) {
  const o = { ...DEFAULT_FIRST_JOB, ...options };
  const started = Date.now();
  // as npm start serves it: joining workers preload and warm up the form's model, and the form's job is rehearsed ahead
  const swarm = await startLocalSwarm({ preloadFromBytes: PRELOAD_FROM_BYTES, log: (l) => log(l) });
  const timeline: Activity[] = [];
  const last = new Map<string, string>();
  const opened = performance.now();
  const since = () => round(performance.now() - opened, 0);
  const tabs: Page[] = [];
  const note = (worker: string, stateNow: string) => {
    // a job's steps are one state: the timeline is of what comes before them
    const state = /step \d/.test(stateNow) ? "a job's steps" : stateNow;
    if (last.get(worker) === state) return;
    last.set(worker, state);
    timeline.push({ atMs: since(), worker, state });
  };
  const polling = new AbortController();
  const poll = (async () => {
    while (!polling.signal.aborted) {
      const workers = await swarm.dashboard.evaluate(() => window.ditswarm.workers()).catch((): WorkerSummary[] => []);
      for (const w of workers) note(w.id, w.ep === null && w.state === 'idle' ? 'joined, not measured' : w.state);
      for (const [i, tab] of tabs.entries()) {
        const status = await tab
          .evaluate(() => window.ditswarmWorker && `${window.ditswarmWorker.state}: ${window.ditswarmWorker.detail}`)
          .catch(() => undefined);
        if (status) note(`tab ${i}`, status);
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  })();
  try {
    for (let i = 0; i < o.workers; i++) tabs.push(await swarm.addWorker());
    await swarm.dashboard.waitForFunction((n) => window.ditswarm.workerCount() >= n, o.workers, { timeout: 60_000 });
    const joinedMs = since();
    log(`${o.workers} tabs joined ${joinedMs} ms after they were opened`);
    let readyMs: number | null = null;
    if (o.enter === 'ready') {
      // what each page last said goes into the failure of a wait that timed out: which of them never got ready
      const waiting = (what: string) => (e: unknown) => {
        const states = [...last].map(([worker, state]) => `${worker}: ${state}`).join('; ');
        throw new Error(`first-job: ${what} (${(e as Error).message.split('\n')[0]}); last states: ${states}`);
      };
      await Promise.all(
        tabs.map((tab) =>
          tab.waitForFunction(() => /model preloaded on/.test(window.ditswarmWorker?.detail ?? ''), null, {
            timeout: 120_000,
            polling: POLL_MS,
          }),
        ),
      ).catch(waiting('the tabs did not say they hold the model'));
      // and the dashboard lists them idle: it times the form's job on them ahead of it (rehearseAhead), and a person
      // who presses Enter while the table says "rehearsing" waits for that
      await swarm.dashboard
        .waitForFunction(() => window.ditswarm.workers().every((w) => w.state === 'idle'), null, {
          timeout: 120_000,
          polling: POLL_MS,
        })
        .catch(waiting('the dashboard did not list every tab idle'));
      readyMs = since();
      log(`the tabs hold the model and are idle ${readyMs} ms after they were opened`);
    }
    const job = async (name: string) => {
      const enterMs = since();
      const t0 = performance.now();
      const { report } = (await swarm.dashboard.evaluate(() => window.ditswarm.generate({}))) as JobResult;
      const enterToVideoMs = round(performance.now() - t0, 0);
      log(`${name} job: ${enterToVideoMs} ms from Enter to video`);
      return {
        name,
        enterMs,
        enterToVideoMs,
        phasesMs: Object.fromEntries(Object.entries(report.phasesMs).map(([k, v]) => [k, round(v, 0)])),
        meshProbeMs:
          report.meshProbe && 'ranks' in report.meshProbe
            ? round(Math.max(...report.meshProbe.ranks.map((r) => r.smallMs + r.largeMs)), 0)
            : null,
        stepMs: round(report.medianStepMs, 0),
        stepsMs: report.steps.map((step) => round(step.ms, 0)),
        predictedStepMs: report.placement.prediction ? round(report.placement.prediction.predictedStepMs, 0) : null,
        world: report.placement.layout.world,
        steps: report.config.steps,
      };
    };
    const first = await job('first');
    const second = await job('second');
    polling.abort();
    await poll;
    return {
      benchmark: 'first-job',
      date: new Date().toISOString(),
      durationS: round((Date.now() - started) / 1000, 1),
      config: { ...o, model: 'the bundled demo model', job: "the dashboard form's defaults" },
      machine: machine(swarm.browserVersion),
      joinedMs,
      readyMs,
      first,
      second,
      firstOverSecond: round(first.enterToVideoMs / second.enterToVideoMs, 2),
      timeline,
    };
  } finally {
    polling.abort();
    await poll;
    await swarm.close();
  }
}

export function parseFirstJobArgs(args: string[]): Partial<FirstJobOptions> {
  const { values } = parseArgs({ args, options: { workers: { type: 'string' }, enter: { type: 'string' } } });
  if (values.enter && values.enter !== 'ready' && values.enter !== 'joined')
    throw new Error(`first-job: --enter is ready or joined, got ${values.enter}`);
  return {
    ...(values.workers && { workers: Number(values.workers) }),
    ...(values.enter && { enter: values.enter as FirstJobOptions['enter'] }),
  };
}
