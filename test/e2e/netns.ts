import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { defined } from '../../core/defined.ts';

/**
 * Test hosts made of Linux network namespaces: a "switch" namespace holding a bridge, and one
 * namespace per host with its own lo and an eth0 wired to that bridge by a veth pair. Nothing
 * is added to the root namespace: a host reaches only the other hosts of its run, over the
 * bridge, so browsers in two hosts share no loopback, storage or BroadcastChannel.
 *
 * Namespaces are named `ditswarm-<pid>-…` after the process that made them, so concurrent runs
 * never touch each other's, and a crashed run's leftovers are recognised by their dead pid.
 */
const PREFIX = 'ditswarm-';
/** The private test subnet; it exists only on the bridge inside the switch namespace. */
export const TEST_SUBNET = '10.213.0.0/24';
const hostAddress = (index: number) => `10.213.0.${10 + index}`;
const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((path) => existsSync(path));
const REPO_ROOT = resolve(import.meta.dirname, '../..');
const IP =
  ['/usr/sbin/ip', '/sbin/ip', '/usr/bin/ip', '/bin/ip'].find((path) => spawnSync(path, ['-V']).status === 0) ?? 'ip';

export interface TestHost {
  /** network namespace name */
  ns: string;
  /** IPv4 address on the test subnet */
  address: string;
  /** the veth port of this host on the bridge, inside the switch namespace */
  port: string;
}

export interface TestNetwork {
  hosts: TestHost[];
  /** Spawns `command args…` inside the host's namespace (cwd: the repo root); cleanup() kills it if still running. */
  spawnIn(
    host: TestHost,
    command: string,
    args: string[],
    options?: { env?: NodeJS.ProcessEnv; cwd?: string },
  ): ChildProcess;
  /** An executable that starts Chromium inside the host's namespace (for Playwright's executablePath). */
  chromiumIn(host: TestHost, chromium: string): string;
  /**
   * Makes UDP impossible from the host (sends fail with EACCES; TCP is untouched), as on a network
   * that blocks UDP: WebRTC there cannot connect and a relay has to carry the frames.
   */
  blockUdp(host: TestHost): void;
  /** Bytes the bridge received from and sent to the host since the network was made. */
  trafficOf(host: TestHost): { fromHost: number; toHost: number };
  /** Kills every process in the namespaces and deletes them; safe to call twice. */
  cleanup(): void;
}

/** Whether this process can build test hosts; when not, `reason` says why, for a test skip. */
export function canCreateNamespaces(): { ok: true } | { ok: false; reason: string } {
  if (process.platform !== 'linux')
    return { ok: false, reason: `network namespaces need Linux, this is ${process.platform}` };
  if (process.getuid?.() !== 0)
    return { ok: false, reason: `network namespaces need root (uid 0), this runs as uid ${process.getuid?.()}` };
  if (spawnSync(IP, ['-V']).status !== 0)
    return { ok: false, reason: '`ip` (iproute2) is not installed: apt-get install -y iproute2' };
  const probe = `${PREFIX}${process.pid}-probe`;
  const added = spawnSync(IP, ['netns', 'add', probe], { encoding: 'utf8' });
  spawnSync(IP, ['netns', 'del', probe]);
  if (added.status !== 0)
    return { ok: false, reason: `\`ip netns add\` failed: ${added.stderr.trim() || `exit ${added.status}`}` };
  return { ok: true };
}

/** Builds `count` hosts (h0…h{count−1}) on one bridge. Call cleanup() in a finally/afterAll. */
export function createTestNetwork(count: number): TestNetwork {
  removeLeftovers();
  const run = `${PREFIX}${process.pid}-`;
  const switchNs = `${run}sw`;
  const hosts: TestHost[] = Array.from({ length: count }, (_, i) => ({
    ns: `${run}h${i}`,
    address: hostAddress(i),
    port: `port${i}`,
  }));
  const children = new Set<ChildProcess>();
  const scratch = mkdtempSync(join(tmpdir(), run));
  let cleaned = false;
  const cleanup = () => {
    if (cleaned) return;
    cleaned = true;
    process.off('exit', cleanup);
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    for (const ns of [...hosts.map((h) => h.ns), switchNs]) removeNamespace(ns);
    rmSync(scratch, { recursive: true, force: true });
  };
  // A test runner that exits without running afterAll still takes the namespaces down.
  process.once('exit', cleanup);
  try {
    ip('netns', 'add', switchNs);
    ip('-n', switchNs, 'link', 'set', 'lo', 'up');
    ip('-n', switchNs, 'link', 'add', 'br0', 'type', 'bridge');
    ip('-n', switchNs, 'link', 'set', 'br0', 'up');
    for (const host of hosts) {
      ip('netns', 'add', host.ns);
      ip('-n', host.ns, 'link', 'set', 'lo', 'up');
      // Both ends are born inside namespaces, so the root namespace never sees an interface.
      ip('-n', switchNs, 'link', 'add', host.port, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', host.ns);
      ip('-n', switchNs, 'link', 'set', host.port, 'master', 'br0', 'up');
      ip('-n', host.ns, 'addr', 'add', `${host.address}/24`, 'dev', 'eth0');
      ip('-n', host.ns, 'link', 'set', 'eth0', 'up');
      // Chromium offers ICE candidates only on the interface of the default route (without a
      // camera permission it does not enumerate the others), as on any real LAN host. The bridge
      // has no uplink, so whatever takes this route still ends on the bridge.
      ip('-n', host.ns, 'route', 'add', 'default', 'dev', 'eth0');
    }
  } catch (error) {
    cleanup();
    throw error;
  }
  const counters = (host: TestHost) => {
    // On the bridge's port, rx is what the host sent and tx is what it received.
    const [link] = JSON.parse(ipOut('-j', '-s', '-n', switchNs, 'link', 'show', 'dev', host.port)) as {
      stats64: { rx: { bytes: number }; tx: { bytes: number } };
    }[];
    return { fromHost: link.stats64.rx.bytes, toHost: link.stats64.tx.bytes };
  };
  const baseline = new Map(hosts.map((h) => [h.ns, counters(h)]));
  return {
    hosts,
    spawnIn(host, command, args, options = {}) {
      // setpriv's parent-death signal takes the child down with this process even on a SIGKILL.
      const orphanGuard = SETPRIV ? [SETPRIV, '--pdeathsig', 'KILL'] : [];
      const child = spawn(IP, ['netns', 'exec', host.ns, ...orphanGuard, command, ...args], {
        cwd: options.cwd ?? REPO_ROOT,
        env: options.env ?? process.env,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      children.add(child);
      child.once('exit', () => children.delete(child));
      return child;
    },
    chromiumIn(host, chromium) {
      const path = join(scratch, `chromium-${host.ns}`);
      // exec keeps the pid and the inherited pipe fds 3/4 that Playwright drives Chromium through.
      writeFileSync(path, `#!/bin/sh\nexec ${IP} netns exec ${host.ns} ${chromium} "$@"\n`);
      chmodSync(path, 0o755);
      return path;
    },
    blockUdp(host) {
      // A policy rule ahead of the main table; the local table (priority 0) still serves lo.
      ip('-n', host.ns, 'rule', 'add', 'ipproto', 'udp', 'prohibit', 'priority', '100');
    },
    trafficOf(host) {
      const now = counters(host);
      const start = defined(baseline.get(host.ns), `the traffic counters of ${host.ns} at the start`);
      return { fromHost: now.fromHost - start.fromHost, toHost: now.toHost - start.toHost };
    },
    cleanup,
  };
}

/** Deletes namespaces that a run which is no longer alive left behind (a crash, a SIGKILL). */
function removeLeftovers(): void {
  for (const ns of listNamespaces()) {
    const owner = /^ditswarm-(\d+)-/.exec(ns);
    if (owner && !isAlive(Number(owner[1]))) removeNamespace(ns);
  }
}

function removeNamespace(ns: string): void {
  if (!listNamespaces().includes(ns)) return;
  // Only processes inside this run's own namespace: those it started, and their children.
  for (let attempt = 0; attempt < 20; attempt++) {
    const pids = ipOut('netns', 'pids', ns).split(/\s+/).filter(Boolean).map(Number);
    if (pids.length === 0) break;
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    spawnSync('sleep', ['0.05']);
  }
  spawnSync(IP, ['netns', 'del', ns]);
}

function listNamespaces(): string[] {
  return ipOut('netns', 'list')
    .split('\n')
    .map((line) => line.split(' ')[0])
    .filter((name) => name.startsWith(PREFIX));
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function ip(...args: string[]): void {
  const result = spawnSync(IP, args, { encoding: 'utf8' });
  if (result.status !== 0)
    throw new Error(`ip ${args.join(' ')} failed: ${result.stderr.trim() || `exit ${result.status}`}`);
}

function ipOut(...args: string[]): string {
  // no output at all when ip could not be started
  return (spawnSync(IP, args, { encoding: 'utf8' }).stdout as string | null)?.trim() ?? '';
}
