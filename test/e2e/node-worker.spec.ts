import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, test, type Page } from '@playwright/test';
import { defined } from '../../core/defined.ts';
import { startNodeWorker } from '../../server/cli/browser-swarm.ts';
import { PUBLIC_DIR } from '../../server/app-build.ts';
import { localTls } from '../../server/certificates.ts';
import { serverNames } from '../../server/origins.ts';
import { startServer } from '../../server/serve.ts';
import { hostileLog, makeHostile, setRules } from './hostile/wire.ts';
import {
  CI,
  maxAbsDiff,
  openTestSwarm,
  runJob,
  SMALL_WASM_JOB,
  TEST_MODEL,
  WASM_ONLY_BROWSER,
  workerId,
  type JobOutcome,
} from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // the tabs compute on WASM, as the processes' CPU does

// Machines as workers (issue 40): `npm run worker -- LINK` processes join the swarm a test's tabs are in, over
// WebRTC (werift) or the relay, and their jobs equal the same job on one tab.

/**
 * How far a job with a process in it may be from the same job on one tab, of the latent's largest value (issue 40:
 * 1e-5 where the kernels differ).
 * They do: natively, onnxruntime-node's CPU kernels are not WASM's (other instruction sets, other orders of
 * summation); on WebAssembly, Node loads onnxruntime-web's Node build of its WASM where a tab loads the browser
 * bundle's, where tabs among themselves agree to the bit. Measured on this job: 6e-7 to 8e-7 on WebAssembly, 2e-6
 * natively. Activations sent as float16, the smallest error README names (~3e-4), is 30 times this bound.
 */
const PROCESS_TOLERANCE = 1e-5;

/**
 * The same for a process computing on a GPU through WebGPU (Dawn): a GPU's kernels (WGSL matrix tiles, its exp and
 * erf) differ from a CPU's far more than two CPUs' do. Measured on this job: 7.5e-5. A wrong operator or tensor moves
 * the latent by tenths of its largest value, a thousand times this bound.
 */
const DAWN_TOLERANCE = 2e-4;

/** max-abs of `run` from `reference`, of the reference's largest value */
function offBy(run: Float32Array, reference: Float32Array): number {
  return maxAbsDiff(run, reference) / reference.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
}

/** where this spec's worker processes keep the weights they fetch (not the machine's own folder) */
let cacheDir = '';
test.beforeAll(() => {
  cacheDir = mkdtempSync(join(tmpdir(), 'ditswarm-worker-weights-'));
});
test.afterAll(() => rmSync(cacheDir, { recursive: true, force: true }));

/**
 * A worker process joined to the dashboard's swarm by `link` (the dashboard's own link unless given), its lines kept;
 * resolves once the dashboard counts it.
 */
async function joinProcess(
  dashboard: Page,
  flags: string[] = [],
  env: NodeJS.ProcessEnv = {},
  link?: string,
): Promise<NodeWorker> {
  const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
  const before = await dashboard.evaluate(() => window.ditswarm.workerCount());
  const lines: string[] = [];
  const child = startNodeWorker(
    link ?? joinUrl,
    1,
    'node worker',
    (line) => lines.push(line),
    ['--cache', cacheDir, ...flags],
    env,
  );
  await expect
    .poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), {
      timeout: 60_000,
      message: `the worker process joined:\n${lines.join('\n')}`,
    })
    .toBe(before + 1);
  const id = defined(/peer id (\S+)/.exec(lines.join('\n'))?.[1], 'the peer id the worker process printed');
  return { child, id, lines };
}

interface NodeWorker {
  child: ChildProcess;
  id: string;
  lines: string[];
}

/** SIGTERM, as its user's Ctrl-C: the process leaves the swarm and the dashboard counts one worker fewer. */
async function leave(dashboard: Page, worker: NodeWorker): Promise<void> {
  const before = await dashboard.evaluate(() => window.ditswarm.workerCount());
  const exited = new Promise((resolve) => worker.child.once('exit', resolve));
  worker.child.kill('SIGTERM');
  expect(await exited).toBe(0);
  await expect
    .poll(() => dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 })
    .toBe(before - 1);
}

/** Every link of a job of two ranks, a data channel (WebRTC between werift and Chromium). */
const DIRECT_LINKS = ['1->0:direct', 'coordinator->0:direct', 'coordinator->1:direct'];

/** The job's forwards were spot-checked, and every check agreed: no honest worker was accused. */
function expectChecksAgreed(run: JobOutcome): void {
  expect(run.report.spotChecks.length).toBeGreaterThan(0);
  expect(run.report.spotChecks.map((c) => c.verdict)).toEqual(run.report.spotChecks.map(() => 'agreed'));
}

const kinds = (run: JobOutcome) => run.report.workers.map((w) => w.kind).sort();
const links = (run: JobOutcome) => run.report.links.map((l) => `${l.from}->${l.to}:${l.transport}`).sort();

test(
  'one tab and one worker process equal one tab within 1e-5, natively and on WebAssembly in Node; the process leaves on SIGTERM',
  CI,
  async ({ browser, baseURL }) => {
    test.setTimeout(300_000);
    const swarm = await openTestSwarm(browser, baseURL, 1);
    try {
      const single = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 1 });

      const wasm = await joinProcess(swarm.dashboard, ['--device', 'wasm']);
      const onWasm = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 2 });
      await leave(swarm.dashboard, wasm);
      expect(kinds(onWasm)).toEqual(['node', 'tab']);
      const wasmWorker = defined(
        onWasm.report.workers.find((w) => w.kind === 'node'),
        'the process',
      );
      expect(wasmWorker).toMatchObject({
        id: wasm.id,
        ep: 'wasm',
        adapter: expect.stringMatching(/^WebAssembly in Node/),
      });
      expect(wasmWorker.nativeDevice).toBeUndefined();
      expect(links(onWasm)).toEqual(DIRECT_LINKS);
      const wasmDiff = offBy(onWasm.latent, single.latent);
      expect(wasmDiff).toBeLessThanOrEqual(PROCESS_TOLERANCE);

      const native = await joinProcess(swarm.dashboard);
      const onNative = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 2 });
      await leave(swarm.dashboard, native);
      const nativeWorker = defined(
        onNative.report.workers.find((w) => w.kind === 'node'),
        'the process',
      );
      expect(nativeWorker).toMatchObject({ id: native.id, host: expect.any(String), nativeDevice: 'cpu' });
      expect(nativeWorker.adapter).toMatch(/^onnxruntime-node on the CPU/);
      // the first process kept the weights it fetched in the folder the second reads them from
      expect(wasmWorker.weights).toMatchObject({ cacheBytes: 0, note: '' });
      expect(wasmWorker.weights.networkBytes).toBeGreaterThan(0);
      expect(nativeWorker.weights).toEqual({ networkBytes: 0, cacheBytes: wasmWorker.weights.networkBytes, note: '' });
      expect(links(onNative)).toEqual(DIRECT_LINKS);
      const diff = offBy(onNative.latent, single.latent);
      // the final steps' forwards are spot-checked, each rank's rows recomputed by the other: a tab and a process
      // computing on other kernels still agree, and no honest worker is accused
      for (const run of [onWasm, onNative]) expectChecksAgreed(run);
      console.log(
        `links ${links(onWasm).join(' ')} / ${links(onNative).join(' ')}; ` +
          `spot checks' largest difference ${Math.max(...onNative.report.spotChecks.map((c) => c.difference)).toExponential(2)}; ` +
          `one tab and a process vs one tab, of the latent's largest value: max-abs ${wasmDiff.toExponential(2)} on WASM, ${diff.toExponential(2)} native`,
      );
      expect(diff).not.toBe(wasmDiff); // else the process did not compute natively
      expect(diff).toBeLessThanOrEqual(PROCESS_TOLERANCE);
    } finally {
      await swarm.close();
    }
  },
);

test('a worker process holding a pipeline stage, or running the unconditional passes (CFG parallel), gives the latent of one tab; one given its own copy of the model folder downloads none of it', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(300_000);
  const swarm = await openTestSwarm(browser, baseURL, 1);
  try {
    const single = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 1 });
    // the model folder the server serves, as this machine has it: keeping nothing, the process reads all from there
    const native = await joinProcess(swarm.dashboard, ['--cache', '', '--model-dir', join(PUBLIC_DIR, TEST_MODEL)]);
    const staged = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 1, stages: 2 });
    const cfg = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 1, cfgParallel: true });
    await leave(swarm.dashboard, native);

    const { placement, workers } = staged.report;
    expect(placement.layout).toMatchObject({ world: 2, stages: 2 });
    expect(kinds(staged)).toEqual(['node', 'tab']);
    // each holds its stage alone, as the planner cut it
    expect(workers.map((w) => w.heldWeightBytes)).toEqual(placement.stages?.map((s) => s.heldBytes));
    const stageProcess = defined(
      workers.find((w) => w.kind === 'node'),
      'the process',
    );
    expect(stageProcess.weights).toMatchObject({ networkBytes: 0, note: '' });
    expect(stageProcess.weights.cacheBytes).toBeGreaterThan(0);
    expect(offBy(staged.latent, single.latent)).toBeLessThanOrEqual(PROCESS_TOLERANCE);

    expect(cfg.report.placement.layout).toMatchObject({ world: 2, cfgGroups: 2 });
    expect(kinds(cfg)).toEqual(['node', 'tab']);
    expect(offBy(cfg.latent, single.latent)).toBeLessThanOrEqual(PROCESS_TOLERANCE);
    console.log(
      `a process as a stage: ${offBy(staged.latent, single.latent).toExponential(2)}, ` +
        `as a CFG group: ${offBy(cfg.latent, single.latent).toExponential(2)} of the latent's largest value`,
    );
  } finally {
    await swarm.close();
  }
});

test('a displaced job with a worker process for one of its two ranks equals the same job on two tabs', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(300_000);
  const job = {
    ...SMALL_WASM_JOB,
    steps: 4,
    workers: 2,
    parallel: 'displaced',
    warmupSteps: 1,
    shares: 'even',
  } as const;
  const swarm = await openTestSwarm(browser, baseURL, 2);
  try {
    const onTabs = await runJob(swarm.dashboard, job);
    await swarm.workers[1].close();
    await expect.poll(() => swarm.dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 }).toBe(1);
    const native = await joinProcess(swarm.dashboard);
    const withProcess = await runJob(swarm.dashboard, job);
    await leave(swarm.dashboard, native);
    for (const run of [onTabs, withProcess])
      expect(run.report.placement).toMatchObject({ settings: { parallel: 'displaced' }, warmupSteps: 1 });
    expect(kinds(withProcess)).toEqual(['node', 'tab']);
    // 3 of the 4 steps attended to keys and values a step old: the same stale ones, whoever computed them
    const diff = offBy(withProcess.latent, onTabs.latent);
    console.log(`displaced, a tab and a process vs two tabs: ${diff.toExponential(2)} of the latent's largest value`);
    expect(diff).toBeLessThanOrEqual(PROCESS_TOLERANCE);
  } finally {
    await swarm.close();
  }
});

test(
  "a worker process joins by the https link other machines get, pinning the server's CA, and equals one tab; one given a wrong pin is refused before it sends its token",
  CI,
  async ({ browser }) => {
    test.setTimeout(300_000);
    const tlsDir = mkdtempSync(join(tmpdir(), 'ditswarm-tls-'));
    const tls = localTls(tlsDir, serverNames(['swarm.test']));
    const fingerprint = defined(tls.ca, 'the local CA').fingerprint;
    const secure = await startServer({ port: 0, quiet: true, tls, hosts: ['swarm.test'] });
    // the dashboard at the server's localhost, as `npm start` says to open it
    const swarm = await openTestSwarm(browser, secure.url, 1);
    try {
      const single = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 1 });
      const { lanJoinUrl } = await swarm.dashboard.evaluate(() => window.ditswarm.ready);
      expect(lanJoinUrl).toMatch(`https://swarm.test:${secure.port}/worker.html#token=`);
      expect(lanJoinUrl).toMatch(new RegExp(`&ca=${fingerprint}$`));
      // swarm.test resolves nowhere for a process: it reaches the server at localhost, a name the certificate names too
      const link = lanJoinUrl.replace('https://swarm.test:', 'https://localhost:');

      // a link whose pin is not the server's CA, holding a token of this server that nothing else uses: any request
      // that proves it (a join, the relay) would ask the server whether it stands by the token's room
      const token = secure.joinTokens.issue();
      const room = token.split('.')[0];
      const asked: string[] = [];
      const standing = secure.joinTokens.standing.bind(secure.joinTokens);
      secure.joinTokens.standing = (r) => {
        asked.push(r);
        return standing(r);
      };
      const wrongPin = `${fingerprint.slice(0, -1)}${fingerprint.endsWith('0') ? '1' : '0'}`;
      const refusedLines: string[] = [];
      const refused = startNodeWorker(
        link.replace(/token=[^&]+/, `token=${token}`).replace(`ca=${fingerprint}`, `ca=${wrongPin}`),
        1,
        'wrong pin',
        (line) => refusedLines.push(line),
        ['--cache', cacheDir, '--device', 'wasm'],
      );
      const status = await new Promise((resolve) => refused.once('exit', resolve));
      const said = refusedLines.join('\n');
      expect(status, said).toBe(1);
      expect(said).toContain(
        `worker: the server at https://localhost:${secure.port} showed a CA whose SHA-256 is ${fingerprint}, ` +
          `not the link's ${wrongPin}: nothing of the swarm's was sent to it.`,
      );
      expect(said).not.toContain('peer id');
      expect(asked.filter((r) => r === room)).toEqual([]);

      // keeping no weights, it fetches them all over https, in its engine's thread
      const pinned = await joinProcess(swarm.dashboard, ['--device', 'wasm', '--cache', ''], {}, link);
      const run = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 2 });
      await leave(swarm.dashboard, pinned);
      expect(kinds(run)).toEqual(['node', 'tab']);
      const processWorker = defined(
        run.report.workers.find((w) => w.kind === 'node'),
        'the process',
      );
      expect(processWorker.id).toBe(pinned.id);
      expect(processWorker.weights.networkBytes).toBeGreaterThan(0);
      const diff = offBy(run.latent, single.latent);
      console.log(
        `a process joined over https with a pinned CA: ${diff.toExponential(2)} of the latent's largest value`,
      );
      expect(diff).toBeLessThanOrEqual(PROCESS_TOLERANCE);
    } finally {
      await swarm.close();
      await secure.close();
      rmSync(tlsDir, { recursive: true, force: true });
    }
  },
);

test('a worker process whose links all go through the relay gives the latent of one tab', async ({ browser }) => {
  test.setTimeout(300_000);
  const forced = await startServer({ port: 0, quiet: true, relay: 'force' });
  const swarm = await openTestSwarm(browser, forced.url, 1);
  try {
    const single = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 1 });
    const wasm = await joinProcess(swarm.dashboard, ['--device', 'wasm']);
    const relayed = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 2 });
    await leave(swarm.dashboard, wasm);
    expect(kinds(relayed)).toEqual(['node', 'tab']);
    expect(links(relayed)).toEqual(['1->0:relay', 'coordinator->0:relay', 'coordinator->1:relay']);
    expect(offBy(relayed.latent, single.latent)).toBeLessThanOrEqual(PROCESS_TOLERANCE);
  } finally {
    await swarm.close();
    await forced.close();
  }
});

test('a worker process killed mid-job is re-placed as a tab is, and the job keeps the latent', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(300_000);
  const job = { ...SMALL_WASM_JOB, steps: 4 };
  const swarm = await openTestSwarm(browser, baseURL, 2);
  try {
    const uninterrupted = await runJob(swarm.dashboard, { ...job, workers: 2 });
    const wasm = await joinProcess(swarm.dashboard, ['--device', 'wasm']);
    // killed as its second step starts, without a word to anyone
    let killedAt = 0;
    wasm.child.stdout?.on('data', (data: Buffer) => {
      if (!killedAt && /computing: job \d+ step [2-9]/.test(data.toString())) {
        killedAt = Date.now();
        wasm.child.kill('SIGKILL');
      }
    });
    const run = await runJob(swarm.dashboard, { ...job, workers: 3 });
    expect(killedAt).toBeGreaterThan(0);
    const [failure] = run.report.failures;
    expect(failure).toMatchObject({ phase: 'denoising', degreeBefore: 3, degreeAfter: 2 });
    expect(failure.lost.map((l) => l.worker)).toEqual([wasm.id]);
    console.log(`killed process detected after ${failure.detectedAt - killedAt} ms (${failure.lost[0].cause})`);
    expect(kinds(run)).toEqual(['tab', 'tab']);
    expect(offBy(run.latent, uninterrupted.latent)).toBeLessThanOrEqual(PROCESS_TOLERANCE);
  } finally {
    await swarm.close();
  }
});

/**
 * The Vulkan a worker process's WebGPU (Dawn, in onnxruntime-node) finds on this GPU-less machine: Chromium's
 * SwiftShader, a Vulkan on the CPU, and the Vulkan loader Chromium ships beside it.
 */
function chromiumSwiftShader(): NodeJS.ProcessEnv {
  const dir = '/usr/lib/chromium';
  const icd = join(dir, 'vk_swiftshader_icd.json');
  if (!existsSync(icd) || !existsSync(join(dir, 'libvulkan.so.1')))
    throw new Error(
      `no SwiftShader Vulkan in ${dir}: this test needs Debian's chromium package (apt-get install chromium)`,
    );
  return { LD_LIBRARY_PATH: dir, VK_ICD_FILENAMES: icd };
}

test('a worker process computing on WebGPU through Dawn (SwiftShader here) equals one tab within a GPU tolerance', async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(300_000);
  const swarm = await openTestSwarm(browser, baseURL, 1);
  try {
    const single = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 1 });
    const dawn = await joinProcess(swarm.dashboard, ['--device', 'webgpu'], chromiumSwiftShader());
    const run = await runJob(swarm.dashboard, { ...SMALL_WASM_JOB, workers: 2 });
    await leave(swarm.dashboard, dawn);
    const processWorker = defined(
      run.report.workers.find((w) => w.kind === 'node'),
      'the process',
    );
    expect(processWorker).toMatchObject({ id: dawn.id, ep: 'wasm', nativeDevice: 'webgpu' });
    expect(processWorker.adapter).toMatch(/^onnxruntime-node on WebGPU \(Dawn\): [\d.]+ GFLOP\/s, as asked/);
    expect(processWorker.why).toMatch(/^WebGPU \(Dawn\): /);
    const diff = offBy(run.latent, single.latent);
    console.log(
      `one tab and a process on Dawn's WebGPU vs one tab: ${diff.toExponential(2)} of the latent's largest value`,
    );
    expect(diff).toBeGreaterThan(0); // else the process did not compute on another device
    expect(diff).toBeLessThanOrEqual(DAWN_TOLERANCE);
    // the final steps' spot checks recompute each rank's rows on the other: a GPU's kernels are no liar's numbers
    expectChecksAgreed(run);
  } finally {
    await swarm.close();
  }
});

test("a liar tab beside a worker process: the liar alone is banned, the process is not let go, and the latent is the honest ranks'", async ({
  browser,
  baseURL,
}) => {
  test.setTimeout(300_000);
  // liar-matrix.spec.ts's job: a few tokens, float32 Ulysses, the default spot-check rate
  const job = {
    ...SMALL_WASM_JOB,
    height: 32,
    width: 32,
    steps: 4,
    guidance: 1,
    seed: 7,
    shares: 'even',
    outputType: 'latent',
  } as const;
  const swarm = await openTestSwarm(browser, baseURL, 1);
  // a ban covers the liar's browser: it is a context of its own
  const own = await browser.newContext();
  try {
    const native = await joinProcess(swarm.dashboard);
    const honest = await runJob(swarm.dashboard, { ...job, workers: 2 });
    const liar = await own.newPage();
    await makeHostile(liar);
    await liar.goto((await swarm.dashboard.evaluate(() => window.ditswarm.ready)).joinUrl);
    await expect.poll(() => swarm.dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 60_000 }).toBe(3);
    const liarId = await workerId(liar);
    // huge finite activations to its peers from step 3 (issue 33's #1): the process is one of the peers they reach
    await setRules(liar, { mesh: { step: 2, make: 'huge' } });
    const run = await runJob(swarm.dashboard, { ...job, workers: 3 });
    const log = await hostileLog(liar);
    expect(log.world).toBe(3);
    expect(log.tensorsPoisoned).toBeGreaterThanOrEqual(1);
    const lost = run.report.failures.flatMap((f) => f.lost);
    expect(lost.map((l) => l.worker)).toEqual([liarId]);
    expect(lost[0].evidence).toMatch(/beyond the \S+ its layer can produce/);
    await expect(liar.locator('#detail')).toContainText('banned from this swarm for lying', { timeout: 20_000 });
    // the job ended on the tab and the process, and the process heard nothing against it
    expect(kinds(run)).toEqual(['node', 'tab']);
    expect(native.lines.filter((line) => /refused|lost the dashboard|banned/.test(line))).toEqual([]);
    const diff = offBy(run.latent, honest.latent);
    console.log(
      `a liar among a tab and a process: ${diff.toExponential(2)} of the latent's largest value from the honest job`,
    );
    expect(diff).toBeLessThanOrEqual(PROCESS_TOLERANCE);
    await leave(swarm.dashboard, native);
  } finally {
    await own.close();
    await swarm.close();
  }
});
