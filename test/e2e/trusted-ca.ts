import { spawnSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

/**
 * A home folder whose NSS database trusts the CA in `caFile`, as a machine's owner trusts a swarm's CA once (Chromium
 * on Linux reads `$HOME/.pki/nssdb`): a browser launched with `HOME` there opens the server's https links with no
 * certificate error, and nothing is ignored. Needs `certutil` (Debian's libnss3-tools).
 */
export function trustingHome(home: string, caFile: string): string {
  const nssdb = join(home, '.pki/nssdb');
  mkdirSync(nssdb, { recursive: true });
  for (const args of [
    ['-N', '--empty-password'],
    ['-A', '-t', 'C,,', '-n', 'ditswarm test CA', '-i', caFile],
  ]) {
    const run = spawnSync('certutil', ['-d', `sql:${nssdb}`, ...args], { encoding: 'utf8' });
    if (run.status !== 0)
      throw new Error(
        `certutil ${args.join(' ')}: ${run.stderr || run.error?.message} (Debian: apt-get install libnss3-tools)`,
      );
  }
  return home;
}

/** Where a server whose HOME is `home` keeps its local CA (server/certificates.ts, under its state folder). */
export const serverCaFile = (home: string): string => join(home, '.cache/ditswarm/server/tls/ca.pem');
