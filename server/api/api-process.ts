// `npm start -- --api …` as a child process of its own, called over HTTP with its key: what the e2e tests and the
// API's benchmark drive (a process, so that it can be killed as a machine kills it).

import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { API_KEY_FILE } from './api-key.ts';

const ROOT = resolve(import.meta.dirname, '../..');

export interface ApiProcess {
  url: string;
  /** its API key */
  key: string;
  process: ChildProcess;
  /** what it printed so far */
  log(): string;
  call(path: string, init?: Omit<RequestInit, 'headers'>): Promise<Response>;
  json<T>(path: string, init?: Omit<RequestInit, 'headers'>): Promise<T>;
  /** SIGTERM, then waits for it to exit */
  stop(): Promise<void>;
}

/** Starts the server with `--api --data dataDir --port 0` and `flags`; settles once it says the API is ready. */
export async function spawnApiServer(
  dataDir: string,
  flags: string[] = [],
  readyWithinMs = 90_000,
): Promise<ApiProcess> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', 'server/main.ts', '--api', '--data', dataDir, '--port', '0', ...flags],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const stop = () =>
    new Promise<void>((done) => {
      if (child.exitCode !== null || child.signalCode !== null) {
        done();
        return;
      }
      child.once('exit', () => done());
      child.kill('SIGTERM');
    });
  const end = Date.now() + readyWithinMs;
  while (!/^api: ready$/m.test(out)) {
    if (child.exitCode !== null) throw new Error(`the API server exited (${child.exitCode}):\n${out}`);
    if (Date.now() > end) {
      await stop();
      throw new Error(`the API server was not ready within ${readyWithinMs / 1000} s:\n${out}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  const url = `http://localhost:${/serving on port (\d+)/.exec(out)?.[1]}`;
  const key = readFileSync(join(dataDir, API_KEY_FILE), 'utf8').trim();
  const call = (path: string, init: Omit<RequestInit, 'headers'> = {}) =>
    fetch(`${url}${path}`, {
      ...init,
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    });
  return {
    url,
    key,
    process: child,
    log: () => out,
    call,
    json: async <T>(path: string, init?: Omit<RequestInit, 'headers'>) => (await (await call(path, init)).json()) as T,
    stop,
  };
}
