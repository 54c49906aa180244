import { createHash, X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { CA_PATH, TLS_PROBE_PATH } from '../../core/net/local-ca.ts';
import { givenTls, localTls, type ServerTls } from '../../server/certificates.ts';
import { serverNames } from '../../server/origins.ts';
import { startServer, type RunningServer } from '../../server/serve.ts';

// Other machines' pages are secure contexts only over https (issue 63): the server is its own CA, its
// certificate names every name it answers to, and one port answers http (localhost) and https alike.
const scratch = mkdtempSync(join(tmpdir(), 'ditswarm-tls-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

describe("the server's own certificate authority", () => {
  const dir = join(scratch, 'tls');
  const names = serverNames(['swarm.test']);
  let first: ServerTls;
  beforeAll(() => {
    first = localTls(dir, names);
  });

  it('signs a server certificate for every name of this machine, its key and the CA key readable by the owner alone', () => {
    const cert = new X509Certificate(first.cert);
    const ca = new X509Certificate(readFileSync(join(dir, 'ca.pem')));
    expect(cert.verify(ca.publicKey)).toBe(true);
    expect(cert.checkIssued(ca)).toBe(true);
    expect(ca.ca).toBe(true);
    expect(cert.ca).toBe(false);
    for (const name of ['localhost', '127.0.0.1', '::1', 'swarm.test', `${names[3]}.local`])
      expect(first.covers(name)).toBe(true);
    expect(first.covers('other.test')).toBe(false);
    expect(first.covers('10.99.99.99')).toBe(false);
    expect(first.ca?.fingerprint).toBe(createHash('sha256').update(ca.raw).digest('hex'));
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    for (const key of ['ca-key.pem', 'server-key.pem']) expect(statSync(join(dir, key)).mode & 0o777).toBe(0o600);
  });

  it('is kept across starts; a new name makes a new server certificate from the same CA', () => {
    const again = localTls(dir, names);
    expect(again.cert).toBe(first.cert);
    const renamed = localTls(dir, [...names, 'new-name.test']);
    expect(renamed.cert).not.toBe(first.cert);
    expect(renamed.ca?.fingerprint).toBe(first.ca?.fingerprint);
    expect(renamed.covers('new-name.test')).toBe(true);
  });

  it('takes a certificate of the user’s (--cert/--key) and refuses a key of another one, naming both files', () => {
    const given = givenTls(join(dir, 'server.pem'), join(dir, 'server-key.pem'));
    expect(given.ca).toBeNull();
    expect(given.covers('new-name.test')).toBe(true);
    expect(() => givenTls(join(dir, 'server.pem'), join(dir, 'ca-key.pem'))).toThrow(
      `--key ${join(dir, 'ca-key.pem')} is not the private key of --cert ${join(dir, 'server.pem')}`,
    );
    const junk = join(scratch, 'junk.pem');
    writeFileSync(junk, 'not a certificate');
    expect(() => givenTls(junk, join(dir, 'server-key.pem'))).toThrow(`--cert ${junk} is no PEM certificate`);
    expect(() => givenTls(join(scratch, 'none.pem'), junk)).toThrow('no such file; give a PEM file');
  });
});

describe('one port, http at localhost and https for other machines', () => {
  let server: RunningServer;
  let tls: ServerTls;
  beforeAll(async () => {
    tls = localTls(join(scratch, 'served'), serverNames(['swarm.test']));
    server = await startServer({ port: 0, quiet: true, tls, hosts: ['swarm.test'] });
  });
  afterAll(async () => server.close());

  /** GET `path` from another machine naming the server `host`: over https trusting `ca`, or plain http without `tls` */
  const get = (path: string, host: string, tls?: { ca: string | undefined }) =>
    new Promise<{ status: number; body: string; headers: Record<string, unknown> }>((resolve, reject) => {
      const options = { host: '127.0.0.1', port: server.port, path, headers: { host: `${host}:${server.port}` } };
      const answer = (response: http.IncomingMessage) => {
        let body = '';
        response.on('data', (chunk: Buffer) => (body += chunk.toString()));
        response.on('end', () => resolve({ status: response.statusCode ?? 0, body, headers: response.headers }));
      };
      const request = tls ? https.get({ ...options, servername: host, ca: tls.ca }, answer) : http.get(options, answer);
      request.on('error', reject);
    });
  const overHttps = (path: string, ca: string | undefined) => get(path, 'swarm.test', { ca });
  const overHttp = (path: string, host: string) => get(path, host);

  it('serves the app over https to a browser that trusts the CA, isolated for WebGPU and threads', async () => {
    const page = await overHttps('/worker.html', tls.ca?.pem);
    expect(page.status).toBe(200);
    expect(page.body).toContain('<title>ditswarm — worker</title>');
    expect(page.headers['cross-origin-embedder-policy']).toBe('require-corp');
    expect((await overHttps(TLS_PROBE_PATH, tls.ca?.pem)).status).toBe(204);
  });

  it('is refused over https by a client that does not trust the CA', async () => {
    await expect(overHttps('/worker.html', undefined)).rejects.toThrow(/self[- ]signed|unable to (get|verify)/i);
  });

  it('answers a plain-http LAN name with the trust page, at the same path, and localhost with the app', async () => {
    const lan = await overHttp('/worker.html', 'swarm.test');
    expect(lan.status).toBe(200);
    expect(lan.body).toContain('trust this swarm once');
    expect((await overHttp(TLS_PROBE_PATH, 'swarm.test')).status).toBe(404);
    const local = await overHttp('/worker.html', 'localhost');
    expect(local.body).toContain('<title>ditswarm — worker</title>');
    // the CA comes over plain http too: the machine that does not trust it yet downloads it there
    const ca = await overHttp(CA_PATH, 'swarm.test');
    expect(ca.body).toBe(tls.ca?.pem);
  });

  it('publishes its https links, every origin it answers at, and the CA fingerprint', async () => {
    const published = (await (await fetch(`${server.url}/signaling.json`)).json()) as {
      lanOrigins: string[];
      origins: string[];
      ca: { fingerprint: string };
    };
    expect(published.lanOrigins[0]).toBe(`https://swarm.test:${server.port}`);
    expect(published.lanOrigins.every((o) => o.startsWith('https://'))).toBe(true);
    expect(published.origins).toEqual(
      expect.arrayContaining([`http://localhost:${server.port}`, `https://swarm.test:${server.port}`]),
    );
    expect(published.ca).toEqual({ fingerprint: tls.ca?.fingerprint });
    expect(server.lanOrigins()).toEqual(published.lanOrigins);
  });

  it('takes the signaling websocket over TLS (wss) on the same port', async () => {
    const { path, key } = (await (await fetch(`${server.url}/signaling.json`)).json()) as { path: string; key: string };
    const first = await new Promise<string>((resolve, reject) => {
      const ws = new WebSocket(`wss://127.0.0.1:${server.port}${path}/peerjs?key=${key}&id=ditswarm-w-0a&token=t0`, {
        ca: tls.ca?.pem,
        headers: { host: `swarm.test:${server.port}`, origin: `https://swarm.test:${server.port}` },
      });
      ws.once('message', (data: Buffer) => {
        resolve(data.toString());
        ws.close();
      });
      ws.once('error', reject);
    });
    expect(JSON.parse(first)).toMatchObject({ type: 'OPEN' });
  });
});

describe('a server whose names changed while it ran', () => {
  it('serves a certificate made again for them from the next connection on, and links to them', async () => {
    const dir = join(scratch, 'renewed');
    const before = localTls(dir, serverNames());
    const server = await startServer({ port: 0, quiet: true, tls: before, hosts: ['swarm.test'] });
    try {
      const ask = () =>
        new Promise<number>((resolve, reject) => {
          const headers = { host: `swarm.test:${server.port}` };
          const options = { host: '127.0.0.1', port: server.port, path: TLS_PROBE_PATH, headers };
          https
            .get({ ...options, servername: 'swarm.test', ca: before.ca?.pem, agent: false }, (response) => {
              response.resume();
              resolve(response.statusCode ?? 0);
            })
            .on('error', reject);
        });
      expect(server.lanOrigins()).not.toContain(`https://swarm.test:${server.port}`);
      await expect(ask()).rejects.toThrow(/altnames/i);
      server.renewTls(localTls(dir, serverNames(['swarm.test'])));
      expect(await ask()).toBe(204);
      expect(server.lanOrigins()[0]).toBe(`https://swarm.test:${server.port}`);
    } finally {
      await server.close();
    }
  });
});

describe("the server's close, on one port for http and https", () => {
  it("is held by no connection: neither an idle keep-alive, nor one that sent nothing (a browser's preconnect)", async () => {
    const server = await startServer({
      port: 0,
      quiet: true,
      tls: localTls(join(scratch, 'silent'), serverNames()),
    });
    const agent = new http.Agent({ keepAlive: true });
    const kept = await new Promise<http.IncomingMessage>((resolve, reject) =>
      http.get({ host: '127.0.0.1', port: server.port, path: '/worker.html', agent }, resolve).on('error', reject),
    );
    kept.resume();
    await new Promise((resolve) => kept.once('end', resolve));
    const silent = connect(server.port, '127.0.0.1');
    await new Promise((resolve) => silent.once('connect', resolve));
    const closedBy = new Promise((resolve) => silent.once('close', () => resolve('closed')));
    const held = new Promise((resolve) => setTimeout(() => resolve('held'), 3000));
    expect(await Promise.race([server.close().then(() => 'closed'), held])).toBe('closed');
    expect(await closedBy).toBe('closed');
  });
});
