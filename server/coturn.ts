// A coturn of its own for a test or a benchmark: Debian's `turnserver` on a free port of the
// loopback, sharing a fresh secret with the ditswarm server (use-auth-secret), with its log, pid
// file and database in a folder of its own, so that it neither needs nor touches a system one
// (Debian's package may have started a service). Stopped by its pid.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TurnServer } from './turn-credentials.ts';

export const TURNSERVER = process.env.TURNSERVER ?? '/usr/bin/turnserver';
const READY_MS = 10_000;

export interface Coturn {
  /** what the ditswarm server is started with: its secret and its URL */
  turn: TurnServer;
  pid: number;
  /** the log so far (one line per allocation, permission and channel, and each closed allocation's usage) */
  log(): string;
  /** what it relayed between peers, summed over the allocations closed so far (their `peer usage` lines) */
  peerBytes(): { received: number; sent: number; allocations: number };
  stop(): Promise<void>;
}

export async function startCoturn(): Promise<Coturn> {
  if (!existsSync(TURNSERVER))
    throw new Error(
      `no TURN server at ${TURNSERVER}: install Debian's coturn (apt-get install -y coturn) or set TURNSERVER`,
    );
  const dir = mkdtempSync(join(tmpdir(), 'ditswarm-coturn-'));
  const port = await freePort();
  const secret = randomBytes(16).toString('hex');
  const logFile = join(dir, 'turn.log');
  const child = spawn(
    TURNSERVER,
    [
      '-n', // no configuration file: these flags alone
      '--use-auth-secret',
      `--static-auth-secret=${secret}`,
      '--realm=ditswarm',
      `--listening-port=${port}`,
      '--listening-ip=127.0.0.1',
      '--relay-ip=127.0.0.1',
      '--allow-loopback-peers', // the pages are all on this machine
      '--no-cli',
      '--no-tls',
      '--no-dtls',
      '--verbose',
      `--log-file=${logFile}`,
      '--simple-log',
      `--pidfile=${join(dir, 'turnserver.pid')}`,
      `--userdb=${join(dir, 'turndb')}`,
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-2000)));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const pid = child.pid;
  const log = () => (existsSync(logFile) ? readFileSync(logFile, 'utf8') : '');
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      process.kill(pid ?? 0, 'SIGTERM');
      const killed = setTimeout(() => child.kill('SIGKILL'), 3_000);
      await exited;
      clearTimeout(killed);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  if (pid === undefined) throw new Error(`${TURNSERVER} did not start: ${stderr}`);
  const ready = Date.now() + READY_MS;
  while (!(await listening(port))) {
    if (child.exitCode !== null || Date.now() > ready) {
      const why =
        child.exitCode !== null ? `exited with ${child.exitCode}` : `not listening within ${READY_MS / 1000} s`;
      await stop();
      throw new Error(`${TURNSERVER} on port ${port} ${why}: ${stderr || log().slice(-2000)}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    turn: { secret, urls: [`turn:127.0.0.1:${port}`] },
    pid,
    log,
    peerBytes() {
      const usage = [...log().matchAll(/peer usage: .*?rb=(\d+), sp=\d+, sb=(\d+)/g)];
      return {
        received: usage.reduce((n, m) => n + Number(m[1]), 0),
        sent: usage.reduce((n, m) => n + Number(m[2]), 0),
        allocations: usage.length,
      };
    },
    stop,
  };
}

/** A TCP port of the loopback nobody listens on now (the TURN server takes it for UDP and TCP both). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port')),
      );
    });
  });
}

function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}
