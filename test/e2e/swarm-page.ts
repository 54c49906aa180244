import {
  expect,
  test,
  type Browser,
  type BrowserContext,
  type ConsoleMessage,
  type Page,
  type Request,
} from '@playwright/test';
import type { JobOverrides, JobResult } from '../../app/automation.ts';
import { defined } from '../../core/defined.ts';
import { chromiumArgs, chromiumExecutable, WEBGPU_ARG } from '../../server/chromium.ts';

/**
 * For a spec whose jobs all compute on WASM (`test.use(WASM_ONLY_BROWSER)`): its browser has no
 * WebGPU adapter, as a browser without WebGPU is, and starts no GPU process. The WebGPU paths run in
 * the specs that ask for them (foundation, webgpu, vae, dashboard).
 */
/**
 * The tests CI runs (`npm run test:e2e`): one focused test of each part across tabs, a few minutes in all; the rest run
 * with `npm run test:e2e:full` (playwright.config.ts).
 */
export const CI = { tag: '@ci' };

export const WASM_ONLY_BROWSER = {
  launchOptions: {
    executablePath: chromiumExecutable(),
    args: chromiumArgs.filter((arg) => arg !== WEBGPU_ARG),
  },
};

/** A dashboard and N worker tabs of one browser context, driven the way `npm run generate` does. */
export interface TestSwarm {
  dashboard: Page;
  workers: Page[];
  /**
   * What its pages (and their Web Workers) logged as errors or failed to load since the dashboard opened: console
   * errors, uncaught exceptions, failed requests and answers of HTTP 400 and above, each with the page it came from.
   */
  failures(): string[];
  close(): Promise<void>;
}

/** Records what `context`'s pages log as errors or fail to load, from now on (TestSwarm.failures). */
export function recordFailures(context: BrowserContext): () => string[] {
  const failures: string[] = [];
  const at = (page: Page | null) => (page ? new URL(page.url()).pathname : 'no page');
  // a request before its frame exists (a navigation) or from a service worker has no frame to name
  const from = (request: Request) => {
    try {
      return at(request.frame().page());
    } catch {
      return 'no page';
    }
  };
  context.on('console', (m) => {
    if (m.type() === 'error') failures.push(`${at(m.page())} console error: ${m.text()}`);
  });
  context.on('weberror', (e) => failures.push(`${at(e.page())} uncaught: ${e.error().message}`));
  context.on('requestfailed', (r) =>
    failures.push(`${from(r)} ${r.method()} ${r.url()} failed: ${r.failure()?.errorText ?? ''}`),
  );
  context.on('response', (r) => {
    if (r.status() >= 400) failures.push(`${from(r.request())} ${r.request().method()} ${r.url()}: HTTP ${r.status()}`);
  });
  return () => [...failures];
}

/** The app's origin: the baseURL playwright.config.ts gives every test. */
export const appOrigin = (baseURL: string | undefined): string =>
  defined(baseURL, "the baseURL of playwright.config.ts's webServer");

export async function openTestSwarm(
  browser: Browser,
  baseURL: string | undefined,
  workers: number,
): Promise<TestSwarm> {
  const context = await browser.newContext();
  const failures = recordFailures(context);
  const dashboard = await context.newPage();
  await dashboard.goto(`${appOrigin(baseURL)}/`);
  const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
  const pages: Page[] = [];
  for (let i = 0; i < workers; i++) {
    const page = await context.newPage();
    await page.goto(joinUrl);
    pages.push(page);
  }
  await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 60_000 }).toBe(workers);
  return { dashboard, workers: pages, failures, close: () => context.close() };
}

/**
 * The swarm of a serial describe block: opened before its first test, closed after its last (if it
 * opened). Its members are the opened swarm's.
 */
export function suiteSwarm(workers: number): TestSwarm {
  let opened: TestSwarm | undefined;
  const current = () => defined(opened, 'the swarm beforeAll opens');
  test.beforeAll(async ({ browser, baseURL }) => {
    opened = await openTestSwarm(browser, baseURL, workers);
  });
  test.afterAll(async () => opened?.close());
  return {
    get dashboard() {
      return current().dashboard;
    },
    get workers() {
      return current().workers;
    },
    failures: () => current().failures(),
    close: () => current().close(),
  };
}

/** The peer id a worker page shows; fails when the page has shown no status yet. */
export const workerId = (page: Page): Promise<string> =>
  page.evaluate(() => {
    if (!window.ditswarmWorker) throw new Error('the worker page has shown no status yet');
    return window.ditswarmWorker.peerId;
  });

export interface JobOutcome {
  report: JobResult['report'];
  latent: Float32Array;
  /** the latent after each step */
  stepLatents: Float32Array[];
}

/**
 * The model the e2e jobs run unless they say otherwise: the untrained tiny checkpoint, whose
 * geometry (D 288, 2 blocks) the tests' byte counts are written for. The dashboard's default is
 * the trained demo model (test/e2e/demo.spec.ts).
 */
export const TEST_MODEL = '/models/tiny-wan';

/** A guided job of 2 steps on 5 frames of 96×96 over WASM tabs: small enough for CI, and through every part. */
export const SMALL_WASM_JOB = {
  prompt: 'a red ball',
  frames: 5,
  height: 96,
  width: 96,
  steps: 2,
  guidance: 5,
  seed: 3,
  backend: 'swarm',
  ep: 'wasm',
} as const satisfies JobOverrides;

export async function runJob(dashboard: Page, overrides: JobOverrides): Promise<JobOutcome> {
  const watching = watchDashboard(dashboard);
  const { report, latent, stepLatents } = await dashboard
    .evaluate(([o, options]) => window.ditswarm.generate(o, options), [
      { model: TEST_MODEL, ...overrides },
      { stepLatents: true },
    ] as const)
    .catch((e: unknown) => {
      // a job that hangs ends in the test's timeout: what the page showed until then says where
      throw new Error(`${(e as Error).message}\n${watching.seen()}`, { cause: e });
    })
    .finally(watching.stop);
  const floats = (b64: string) => {
    const bytes = Buffer.from(b64, 'base64');
    return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  };
  return {
    report,
    latent: floats(latent),
    stepLatents: defined(stepLatents, 'the step latents asked for').map(floats),
  };
}

export function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

/**
 * What a dashboard shows while a job runs, as it changes: its status line, its last job's status and step, and the
 * warnings and errors it logs.
 */
function watchDashboard(dashboard: Page): { seen: () => string; stop: () => void } {
  const lines: string[] = [];
  let last = '';
  const note = (line: string) => {
    if (line !== last) lines.push(`${new Date().toISOString()} ${line}`);
    last = line;
  };
  const onConsole = (m: ConsoleMessage) => {
    if (m.type() === 'warning' || m.type() === 'error') note(`console ${m.type()}: ${m.text()}`);
  };
  dashboard.on('console', onConsole);
  const timer = setInterval(() => {
    dashboard
      .evaluate(
        () =>
          `status "${document.querySelector('#status')?.textContent}", ${JSON.stringify(window.ditswarm.jobs().at(-1))}`,
      )
      .then(note, () => {});
  }, 5_000);
  return {
    seen: () => `what the dashboard showed meanwhile:\n${lines.slice(-30).join('\n')}`,
    stop: () => {
      clearInterval(timer);
      dashboard.off('console', onConsole);
    },
  };
}
