import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { localTls, type ServerTls } from '../../server/certificates.ts';
import { serverNames } from '../../server/origins.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';
import { caToTrust, pinnedServerCa, TRUSTED_CA_ENV, untrustedServer } from '../../worker/node/server-ca.ts';

// A worker process joins an https link of a server that is its own CA (issue 63) only once the CA the server shows is
// the one the link pins by its SHA-256, or the one given with --ca.
const scratch = mkdtempSync(join(tmpdir(), 'ditswarm-worker-ca-test-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

describe("a worker process pins its server's CA", () => {
  let server: RunningServer;
  let tls: ServerTls;
  /** another swarm's CA: what a link of another server, or of this one before its CA was made again, pins */
  let other: ServerTls;
  let origin = '';
  const fingerprint = () => tls.ca?.fingerprint ?? '';
  const link = (pin: string) => new URL(`${origin}/worker.html#token=t0&ca=${pin}`);
  beforeAll(async () => {
    tls = localTls(join(scratch, 'server'), serverNames(['swarm.test']));
    other = localTls(join(scratch, 'other'), ['localhost']);
    server = await startServer({ port: 0, quiet: true, tls, hosts: ['swarm.test'] });
    origin = `https://127.0.0.1:${server.port}`;
  });
  afterAll(async () => server.close());

  it('takes the CA the server serves where its SHA-256 is the pinned one', async () => {
    expect(await pinnedServerCa(origin, fingerprint())).toBe(tls.ca?.pem);
    expect(await caToTrust(link(fingerprint()), null)).toEqual({ pem: tls.ca?.pem, fingerprint: fingerprint() });
  });

  it('refuses a CA whose SHA-256 is not the pinned one, naming both and what to do', async () => {
    const pinned = other.ca?.fingerprint ?? '';
    const refusal = `the server at ${origin} showed a CA whose SHA-256 is ${fingerprint()}, not the link's ${pinned}: `;
    await expect(pinnedServerCa(origin, pinned)).rejects.toThrow(refusal);
    await expect(caToTrust(link(pinned), null)).rejects.toThrow(/copy the worker link the dashboard shows now/);
  });

  it('takes --ca FILE without asking the server, and refuses a file that is not the CA the link pins', async () => {
    const file = join(scratch, 'given.pem');
    writeFileSync(file, other.ca?.pem ?? '');
    const unpinned = new URL(`${origin}/worker.html#token=t0`);
    expect(await caToTrust(unpinned, file)).toEqual({ pem: other.ca?.pem, fingerprint: other.ca?.fingerprint });
    await expect(caToTrust(link(fingerprint()), file)).rejects.toThrow(
      `--ca ${file} is a CA whose SHA-256 is ${other.ca?.fingerprint}, not the link's ${fingerprint()}`,
    );
    await expect(caToTrust(unpinned, join(scratch, 'none.pem'))).rejects.toThrow('no such file');
  });

  it('adds nothing for http, an https link that pins nothing (the system roots), or a run that trusts the CA', async () => {
    expect(await caToTrust(new URL(`http://localhost:${server.port}/worker.html#token=t0`), null)).toBeNull();
    expect(await caToTrust(new URL(`${origin}/worker.html#token=t0`), null)).toBeNull();
    vi.stubEnv(TRUSTED_CA_ENV, fingerprint());
    try {
      expect(await caToTrust(link(fingerprint()), null)).toBeNull();
    } finally {
      vi.unstubAllEnvs();
    }
    await expect(caToTrust(link('12ab'), null)).rejects.toThrow('not a SHA-256 fingerprint (64 hex digits)');
  });

  it('says what to do where a server is of a CA this process does not trust', async () => {
    const failure = await fetch(`${origin}/signaling.json`).catch((e: unknown) => e);
    expect(untrustedServer(failure, link(fingerprint()).href)).toMatch(/a CA this machine does not trust; join by/);
    expect(untrustedServer(new Error('fetch failed'), origin)).toBe('');
  });
});
