import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { extname, join, resolve } from 'node:path';
import { expect, test, type Page } from '@playwright/test';
import { build } from 'vite';
import { defined } from '../../core/defined.ts';
import { DEFAULT_PORT } from '../../server/serve.ts';
import { CI, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// The package as its users get it (issue 66): packed, installed with --omit=dev into a project outside the
// repository, where no dev tool is (no vite, no TypeScript, no @playwright/test). There `npx ditswarm start` serves
// a dashboard whose job on two worker tabs gives a video, `npx ditswarm worker LINK` joins its swarm, and the
// README's "In your own page" example, built with vite against the installed package, gives a video in a page of
// an origin of its own.

const ROOT = resolve(import.meta.dirname, '../..');
/** where the README's example finds the server (`ditswarm start`'s port), replaced by the test's own server */
const EXAMPLE_SERVER = `http://localhost:${DEFAULT_PORT}`;

/** The first ```ts block after the README's "In your own page" heading: the example a user copies. */
function readmeExample(): string {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const heading = defined(/^## In your own page\s*$/m.exec(readme), 'the README heading "## In your own page"');
  const block = /^```ts\n([\s\S]*?)^```/m.exec(readme.slice(heading.index));
  return defined(block?.[1], 'a ```ts block after "## In your own page"');
}

/** Runs `command` to its end in `cwd`; its output goes into the failure it throws where it fails. */
function run(command: string, args: string[], cwd: string): string {
  const done = spawnSync(command, args, { cwd, encoding: 'utf8', env: withoutNpmScript() });
  if (done.status !== 0)
    throw new Error(`${command} ${args.join(' ')} exited ${done.status}:\n${done.stdout}\n${done.stderr}`);
  return done.stdout;
}

/** this process's environment less what `npm test` puts in it for its own scripts (its package, its config) */
function withoutNpmScript(): NodeJS.ProcessEnv {
  return Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^npm_/i.test(name)));
}

interface Command {
  child: ChildProcess;
  output(): string;
  /** resolves with the first match of `pattern` in its output; rejects where it exits first */
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<RegExpExecArray>;
  /** SIGTERM to its process group (npx and the node it starts), then waits for it to exit */
  stop(): Promise<void>;
}

/** `npx args…` in the scratch project, in a process group of its own. */
function npx(args: string[], cwd: string): Command {
  const child = spawn('npx', ['--no-install', ...args], {
    cwd,
    env: withoutNpmScript(),
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  return {
    child,
    output: () => out,
    async waitFor(pattern, timeoutMs = 60_000) {
      const end = Date.now() + timeoutMs;
      for (;;) {
        const found = pattern.exec(out);
        if (found) return found;
        if (child.exitCode !== null) throw new Error(`npx ${args.join(' ')} exited ${child.exitCode}:\n${out}`);
        if (Date.now() > end) throw new Error(`npx ${args.join(' ')} printed no ${pattern} in time:\n${out}`);
        await new Promise((r) => setTimeout(r, 200));
      }
    },
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      process.kill(-defined(child.pid, 'the pid of npx'), 'SIGTERM');
      await exited;
    },
  };
}

const CONTENT_TYPES: Record<string, string> = {
  '.html': 'text/html',
  '.js': 'text/javascript',
  '.wasm': 'application/wasm',
  '.css': 'text/css',
};

/** A user's static server for the built page: an origin other than the swarm's. */
async function serveStatic(dir: string): Promise<{ origin: string; server: Server }> {
  const server = createServer((request, response) => {
    const path = join(dir, new URL(request.url ?? '/', 'http://page').pathname.replace(/\/$/, '/index.html'));
    if (!path.startsWith(dir) || !existsSync(path)) return void response.writeHead(404).end();
    response.writeHead(200, { 'Content-Type': CONTENT_TYPES[extname(path)] ?? 'application/octet-stream' });
    response.end(readFileSync(path));
  });
  await new Promise<void>((done) => server.listen(0, 'localhost', done));
  return { origin: `http://localhost:${(server.address() as AddressInfo).port}`, server };
}

const workerCount = (dashboard: Page) => dashboard.evaluate(() => window.ditswarm.workerCount());

test(
  'the packed package, installed without dev tools, serves a swarm, joins a worker process and builds the README example',
  CI,
  async ({ browser }) => {
    test.setTimeout(600_000);
    const scratch = mkdtempSync(join(tmpdir(), 'ditswarm-package-'));
    const commands: Command[] = [];
    let pageServer: Server | undefined;
    const context = await browser.newContext();
    try {
      // the package as `npm publish` would send it, installed as a user's project does, without devDependencies
      run('npm', ['run', 'build:lib'], ROOT);
      const tarball = run('npm', ['pack', '--ignore-scripts', '--pack-destination', scratch], ROOT).trim();
      const project = join(scratch, 'project');
      mkdirSync(project);
      // the install scripts a user's project lets run, as the README says: esbuild's, not onnxruntime-node's CUDA fetch
      // (which fails offline and drops the package) nor protobufjs's notice
      const allowScripts = { esbuild: true, 'onnxruntime-node': false, protobufjs: false };
      writeFileSync(
        join(project, 'package.json'),
        JSON.stringify({ name: 'my-page', private: true, type: 'module', allowScripts }),
      );
      run(
        'npm',
        [
          'install',
          '--omit=dev',
          '--prefer-offline',
          '--no-audit',
          '--no-fund',
          join(scratch, tarball.split('\n').at(-1) ?? ''),
        ],
        project,
      );
      const installed = readdirSync(join(project, 'node_modules'));
      for (const devTool of ['vite', 'typescript', '@playwright', 'vitest'])
        expect(installed, `${devTool} is no dependency`).not.toContain(devTool);
      expect(installed, 'the native runtime of worker processes, an optional dependency').toContain('onnxruntime-node');

      // the example's page, built with vite against the installed package (vite is the test's: the user's own)
      const example = readmeExample();
      expect(example, `the example names the server \`ditswarm start\` serves (${EXAMPLE_SERVER})`).toContain(
        EXAMPLE_SERVER,
      );
      const pageDir = join(project, 'page');
      mkdirSync(pageDir);
      writeFileSync(
        join(pageDir, 'index.html'),
        '<video controls></video><script type="module" src="./main.ts"></script>',
      );
      // the test's one addition: the example's swarm, so that the test opens its worker tabs at its joinUrl
      writeFileSync(
        join(pageDir, 'swarm-seen.js'),
        "import * as ditswarm from 'ditswarm';\nexport * from 'ditswarm';\n" +
          'export const openSwarm = async (...args) => (window.exampleSwarm = await ditswarm.openSwarm(...args));\n',
      );
      const { origin: pageOrigin, server } = await serveStatic(join(pageDir, 'dist'));
      pageServer = server;

      // `npx ditswarm start`, letting the example's page (an origin of its own) use it
      const start = npx(['ditswarm', 'start', '--port', '0', '--allow-origin', pageOrigin], project);
      commands.push(start);
      const serverUrl = `http://localhost:${(await start.waitFor(/serving on port (\d+)/))[1]}`;
      writeFileSync(join(pageDir, 'main.ts'), example.replaceAll(EXAMPLE_SERVER, serverUrl));
      await build({
        root: pageDir,
        configFile: false, // a page with no vite config of its own
        logLevel: 'warn',
        plugins: [
          {
            name: 'swarm-seen',
            enforce: 'pre', // before vite's own resolver, which would take 'ditswarm' to the package itself
            resolveId: (source, importer) =>
              source === 'ditswarm' && importer?.endsWith('main.ts') ? join(pageDir, 'swarm-seen.js') : null,
          },
        ],
      });

      // its dashboard's job on two worker tabs gives a video
      const dashboard = await context.newPage();
      await dashboard.goto(`${serverUrl}/`);
      const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
      const tabs = await Promise.all([0, 1].map(() => context.newPage()));
      for (const tab of tabs) await tab.goto(joinUrl);
      await expect.poll(() => workerCount(dashboard), { timeout: 60_000 }).toBe(2);
      const job = await dashboard.evaluate(() =>
        window.ditswarm.generate({
          prompt: 'a red square moving right',
          frames: 5,
          height: 64,
          width: 64,
          steps: 2,
          seed: 1,
          backend: 'swarm',
          workers: 2,
          ep: 'wasm',
        }),
      );
      expect(job.report.config.model, "the dashboard's default: the bundled demo model").toMatch(/tiny-wan-demo\/?$/);
      expect(Buffer.from(defined(job.video, 'the job’s video'), 'base64').subarray(0, 4)).toEqual(
        Buffer.from([0x1a, 0x45, 0xdf, 0xa3]), // a WebM's EBML header
      );

      // `npx ditswarm worker LINK` joins that swarm, and leaves it on SIGTERM
      const worker = npx(['ditswarm', 'worker', joinUrl, '--threads', '1', '--device', 'wasm', '--cache', ''], project);
      commands.push(worker);
      await expect
        .poll(() => workerCount(dashboard), {
          timeout: 60_000,
          message: `the worker process joined:\n${worker.output()}`,
        })
        .toBe(3);
      await worker.stop();
      await expect.poll(() => workerCount(dashboard), { timeout: 30_000 }).toBe(2);
      for (const page of [dashboard, ...tabs]) await page.close();

      // the README's example in a page of its own origin: two tabs join its swarm, and its <video> plays the result
      const page = await context.newPage();
      const errors: string[] = [];
      const said: string[] = [];
      page.on('pageerror', (e) => errors.push(e.message));
      page.on('console', (m) => said.push(m.text()));
      await page.goto(`${pageOrigin}/`);
      const exampleJoin = await page
        .waitForFunction(() => (window as { exampleSwarm?: { joinUrl: string } }).exampleSwarm?.joinUrl, null, {
          timeout: 30_000,
        })
        .then((handle) => handle.jsonValue())
        .catch((e: unknown) => {
          throw new Error(`the example opened no swarm: ${errors.join('\n')}\n${said.join('\n')}`, { cause: e });
        });
      for (const tab of await Promise.all([0, 1].map(() => context.newPage())))
        await tab.goto(defined(exampleJoin, 'its joinUrl'));
      const duration = await page
        .waitForFunction(
          () => {
            const video = document.querySelector('video');
            return video?.src.startsWith('blob:') && video.readyState >= 1 && video.duration;
          },
          null,
          { timeout: 180_000 },
        )
        .then((handle) => handle.jsonValue())
        .catch((e: unknown) => {
          throw new Error(`the example gave no video: ${errors.join('\n')}\n${said.slice(-20).join('\n')}`, {
            cause: e,
          });
        });
      expect(duration).toBeGreaterThan(0);
      expect(errors).toEqual([]);
      expect(
        said.some((line) => /^step (\d+)\/\1\b/.test(line)),
        `the example's progress:\n${said.join('\n')}`,
      ).toBe(true);
    } finally {
      await context.close();
      for (const command of commands) await command.stop();
      pageServer?.close();
      rmSync(scratch, { recursive: true, force: true });
    }
  },
);
