import { chromium, expect, test, type Browser, type Page } from '@playwright/test';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { JobOverrides } from '../../app/automation.ts';
import { defined } from '../../core/defined.ts';
import { CA_LINK_PARAM } from '../../core/net/local-ca.ts';
import { chromiumArgs, chromiumExecutable } from '../../server/chromium.ts';
import { serverCaFile, trustingHome } from './trusted-ca.ts';
import { CI, maxAbsDiff, runJob, SMALL_WASM_JOB, TEST_MODEL } from './swarm-page.ts';

// Other machines join over https (issue 63): `npm start` as a user runs it, each "machine" a browser of its own (no
// shared storage or cores' count) whose NSS database trusts the server's CA as its owner would once, reaching the
// server by a name of it that resolves to the loopback. Nothing ignores a certificate error: a browser that does not
// trust the CA cannot open the https links at all.
const HOST = 'swarm.test';
const WEBGPU_JOB = { ...SMALL_WASM_JOB, height: 32, width: 32, guidance: 1, ep: 'webgpu' } satisfies JobOverrides;

test.describe.serial('workers on other machines, over https with the CA trusted', CI, () => {
  const scratch = mkdtempSync(join(tmpdir(), 'ditswarm-https-'));
  let server: ChildProcess | undefined;
  let printed = '';
  let port = 0;
  /** a home whose NSS database trusts the server's CA: what each other machine's owner did once */
  const trusting = join(scratch, 'trusting-home');
  const browsers: Browser[] = [];
  /** the jobs of a localhost tab that each https worker's must equal ('entered': through the form, with Enter) */
  const reference: Partial<Record<'wasm' | 'webgpu' | 'entered', { latent: Float32Array }>> = {};

  test.beforeAll(async () => {
    test.setTimeout(120_000);
    // the server's state folder (its CA among it) in a home of the test's own
    server = spawn(
      process.execPath,
      ['--import', 'tsx', 'server/main.ts', '--port', '0', '--host', HOST, '--model', TEST_MODEL],
      {
        env: { ...process.env, HOME: join(scratch, 'server-home') },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    printed = await untilPrinted(server, /signaling/);
    port = Number(defined(/serving on port (\d+)/.exec(printed), 'the port npm start printed')[1]);
    trustingHome(trusting, serverCaFile(join(scratch, 'server-home')));
  });

  test.afterAll(async () => {
    await Promise.allSettled(browsers.map((b) => b.close()));
    server?.kill();
    rmSync(scratch, { recursive: true, force: true });
  });

  /** a browser of another machine: its own profile, the CA trusted, the server's name resolving to it */
  async function machine(): Promise<Browser> {
    const browser = await chromium.launch({
      executablePath: chromiumExecutable(),
      args: [...chromiumArgs, `--host-resolver-rules=MAP ${HOST} 127.0.0.1`],
      env: { ...process.env, HOME: trusting },
    });
    browsers.push(browser);
    return browser;
  }

  async function joinAt(browser: Browser, link: string): Promise<Page> {
    const page = await browser.newPage();
    await page.goto(link);
    // a plain-http link's page goes on to https by itself once the browser trusts the CA
    await page.waitForURL(/^https?:\/\/[^/]+\/worker\.html/);
    if (link.startsWith('http:') && !link.startsWith('http://localhost')) await page.waitForURL(/^https:/);
    await expect
      .poll(() => page.evaluate(() => window.ditswarmWorker?.connected ?? false), { timeout: 60_000 })
      .toBe(true);
    return page;
  }

  test('npm start prints https links for other machines and how to trust its CA once', () => {
    expect(printed).toContain(`  dashboard   http://localhost:${port}/\n`);
    expect(printed).toMatch(new RegExp(`^ +https://${HOST}:${port}/#owner=[0-9a-f]+ `, 'm'));
    expect(printed).toContain(`http://${HOST}:${port}/ shows how`);
    expect(printed).toMatch(/SHA-256 ([0-9A-F]{2}:){31}[0-9A-F]{2}/);
  });

  test('a dashboard at localhost and workers at the https link: secure, isolated, WebGPU and threads, jobs equal localhost tabs', async () => {
    test.setTimeout(300_000);
    const home = await machine();
    const dashboard = await home.newPage();
    // npm start prints the dashboard's worker links as it opens: the very links it shows
    const linksPrinted = untilPrinted(defined(server, 'npm start'), /worker\.html#token=.*\n.*worker\.html#token=.*\n/);
    await dashboard.goto(`http://localhost:${port}/`);
    const { joinUrl, lanJoinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    const links = await linksPrinted;
    expect(links).toContain(`  worker      ${joinUrl}  (tabs of this machine)\n`);
    expect(links).toContain(`              ${lanJoinUrl}  (other machines`);
    expect(new URL(lanJoinUrl).origin).toBe(`https://${HOST}:${port}`);
    expect(new URLSearchParams(new URL(lanJoinUrl).hash.slice(1)).get(CA_LINK_PARAM)).toMatch(/^[0-9a-f]{64}$/);
    await expect(dashboard.locator('#trust-once')).toBeVisible();

    // a localhost tab's jobs, on the dashboard's machine
    const local = await joinAt(home, joinUrl);
    await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount())).toBe(1);
    reference.wasm = await runJob(dashboard, { ...SMALL_WASM_JOB, workers: 1 });
    reference.webgpu = await runJob(dashboard, { ...WEBGPU_JOB, workers: 1 });
    reference.entered = await enterJob(dashboard, 1);
    await local.close();
    await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 }).toBe(0);

    // a worker on another machine, by the https link
    const worker = await joinAt(await machine(), lanJoinUrl);
    const context = await worker.evaluate(async () => ({
      secure: isSecureContext,
      isolated: crossOriginIsolated,
      adapter: (await (navigator as Navigator & { gpu: GPUish }).gpu.requestAdapter()) !== null,
      threads: window.ditswarmWorker?.cores?.threads ?? 0,
      cores: navigator.hardwareConcurrency,
    }));
    console.log(`https worker: ${JSON.stringify(context)}`);
    expect(context).toMatchObject({ secure: true, isolated: true, adapter: true });
    // every core of its machine: wasm threads need the isolation only a secure context gets
    expect(context.threads).toBe(Math.max(context.cores, 1));
    const wasm = await runJob(dashboard, { ...SMALL_WASM_JOB, workers: 1 });
    const webgpu = await runJob(dashboard, { ...WEBGPU_JOB, workers: 1 });
    expect(webgpu.report.workers[0].ep).toBe('webgpu');
    const diffs = {
      wasm: maxAbsDiff(wasm.latent, defined(reference.wasm, 'the localhost WASM job').latent),
      webgpu: maxAbsDiff(webgpu.latent, defined(reference.webgpu, 'the localhost WebGPU job').latent),
    };
    console.log(`https worker vs a localhost tab: max-abs ${JSON.stringify(diffs)}`);
    // the same kernels on the same inputs: the model folder its server's, whichever name the dashboard gave it
    expect(diffs.wasm).toBeLessThanOrEqual(1e-6);
    expect(diffs.webgpu).toBeLessThanOrEqual(1e-6);

    // a second machine joins from the link's plain-http form, which goes on to https once its browser trusts the CA;
    // then the user's path: Enter on the dashboard, a playable video on the two of them
    const second = await joinAt(await machine(), lanJoinUrl.replace(/^https:/, 'http:'));
    expect(new URL(second.url()).protocol).toBe('https:');
    await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 }).toBe(2);
    const entered = await enterJob(dashboard, 2);
    const diff = maxAbsDiff(entered.latent, defined(reference.entered, 'the localhost tab’s job').latent);
    console.log(`Enter on 2 https workers (P = 2) vs a localhost tab: max-abs ${diff.toExponential(2)}`);
    // P = 2 against P = 1, as across hosts over http (multihost.spec.ts)
    expect(diff).toBeLessThanOrEqual(1e-4);
  });

  test('the dashboard itself on another machine, at the LAN dashboard link: WebCodecs, crypto.subtle, a playable video', async () => {
    test.setTimeout(240_000);
    const owner = defined(/#owner=([0-9a-f]+)/.exec(printed), 'the owner key npm start printed')[1];
    const dashboard = await (await machine()).newPage();
    await dashboard.goto(`https://${HOST}:${port}/#owner=${owner}`);
    expect(
      await dashboard.evaluate(() => [isSecureContext, crossOriginIsolated, 'VideoEncoder' in window, !!crypto.subtle]),
    ).toEqual([true, true, true, true]);
    const { lanJoinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
    for (let i = 0; i < 2; i++) await joinAt(await machine(), lanJoinUrl);
    await expect.poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 }).toBe(2);
    const entered = await enterJob(dashboard, 2);
    const diff = maxAbsDiff(entered.latent, defined(reference.entered, 'the localhost tab’s job').latent);
    console.log(`a dashboard on another machine, 2 https workers vs a localhost tab: max-abs ${diff.toExponential(2)}`);
    expect(diff).toBeLessThanOrEqual(1e-4);
  });
});

/** navigator.gpu, as far as this test asks it */
interface GPUish {
  requestAdapter(): Promise<object | null>;
}

/**
 * Enter on the dashboard's form with SMALL_WASM_JOB's parameters, Ulysses over `degree` workers; the video it shows
 * plays; its latent.
 */
async function enterJob(dashboard: Page, degree: number): Promise<{ latent: Float32Array }> {
  const job = SMALL_WASM_JOB;
  // the model npm start was given: the form starts with it
  await expect(dashboard.locator('[name=model]')).toHaveValue(TEST_MODEL);
  await expect(dashboard.locator(`[name=degree] option[value="${degree}"]`)).toHaveCount(1);
  await dashboard.fill('[name=prompt]', job.prompt);
  for (const [field, value] of Object.entries({
    frames: job.frames,
    height: job.height,
    width: job.width,
    steps: job.steps,
    guidance: job.guidance,
    seed: job.seed,
  }))
    await dashboard.fill(`[name=${field}]`, String(value));
  await dashboard.selectOption('[name=degree]', String(degree));
  await dashboard.selectOption('[name=cfg]', 'serial');
  await dashboard.selectOption('[name=ep]', job.ep);
  await dashboard.focus('[name=prompt]');
  await dashboard.keyboard.press('Enter');
  await expect(dashboard.locator('#status')).toHaveText(/^#\d+ done: /, { timeout: 150_000 });
  const video = await dashboard.evaluate(() => window.ditswarm.inspectVideo());
  expect(video.duration).toBeGreaterThan(0);
  expect(video.file.frameCount).toBe(job.frames);
  const { latent, report } = await dashboard.evaluate(async () => {
    const last = window.ditswarm.jobs().at(-1);
    if (!last) throw new Error('no job on the dashboard');
    return window.ditswarm.result(last.id);
  });
  expect(report.placement.layout.ulyssesDegree).toBe(degree);
  const bytes = Buffer.from(latent, 'base64');
  return { latent: new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4) };
}

/** What `child` printed once it matched `until` (its output keeps being read, so it never blocks on a full pipe). */
function untilPrinted(child: ChildProcess, until: RegExp): Promise<string> {
  return new Promise((resolve, reject) => {
    let output = '';
    const timer = setTimeout(() => reject(new Error(`npm start did not start within 60 s:\n${output}`)), 60_000);
    const read = (chunk: Buffer) => {
      output += chunk.toString();
      if (until.test(output)) {
        clearTimeout(timer);
        resolve(output);
      }
    };
    defined(child.stdout, "npm start's output").on('data', read);
    defined(child.stderr, "npm start's errors").on('data', read);
    child.once('exit', (code) => reject(new Error(`npm start exited with ${code}:\n${output}`)));
  });
}
