// A worker process joining an https link of a server that is its own certificate authority (server/certificates.ts)
// trusts that CA, and only once it is sure it is the one the link names: the link's fragment pins the CA's SHA-256
// (core/net/local-ca.ts), or `--ca FILE` gives it. Nothing carrying the join token leaves before that check.
//
// How the whole process then trusts it: NODE_EXTRA_CA_CERTS in a fresh run of the same command. Node reads it as a
// process starts and adds it to the roots of every TLS connection of every thread: the fetches of signaling.json,
// models.json and the join requests, the engine thread's weight fetches, `ws`'s signaling and relay sockets, and
// whatever connects next. Trusting it in place instead takes an undici dispatcher for fetch and a `ws` subclass, each
// given `ca` in every thread (where `ca` replaces the system's roots unless they are added back), and a connection
// any of them misses fails or, worse, trusts something else. So the process that checked the pin starts its
// successor, hands it its signals and ends with it. A server with a certificate of a public CA needs neither: the
// system's roots apply, and the process runs on as it is.
import { spawn } from 'node:child_process';
import { readFileSync, mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import https from 'node:https';
import { constants, tmpdir } from 'node:os';
import { join } from 'node:path';
import { CA_LINK_PARAM, CA_PATH, spacedFingerprint } from '../../core/net/local-ca.ts';
import { certificateFingerprint } from '../../server/certificates.ts';

/** set in the run that trusts the CA, to its fingerprint: that run checks nothing again and starts no other */
export const TRUSTED_CA_ENV = 'DITSWARM_WORKER_CA';

/** the most a CA certificate in PEM takes: an answer longer than this is no CA of a ditswarm server */
const MAX_CA_BYTES = 64 * 1024;
const CA_FETCH_TIMEOUT_MS = 15_000;

/** A CA certificate and its SHA-256 (of its DER, lowercase hex). */
export interface TrustedCa {
  pem: string;
  fingerprint: string;
}

/**
 * The CA a worker process joining `link` must trust before it sends anything: the one of `caFile` (`--ca`), else the
 * server's own, fetched and checked against the link's pin. null where there is nothing to add: a plain-http link, an
 * https link with no pin and no file (the system's roots apply), or a run that trusts it already. Throws, saying what
 * was expected, what came and what to do, where a file or the server's CA is not the one pinned.
 */
export async function caToTrust(link: URL, caFile: string | null): Promise<TrustedCa | null> {
  if (link.protocol !== 'https:') return null;
  const pinned = linkPin(link);
  const given = caFile === null ? null : caOfFile(caFile);
  if (given && pinned !== null && given.fingerprint !== pinned)
    throw new Error(
      `--ca ${caFile} is a CA whose SHA-256 is ${given.fingerprint}, not the link's ${pinned}: give the CA of the ` +
        `server that made the link (${link.origin}${CA_PATH}, its fingerprint shown on the dashboard), ` +
        'or leave --ca out',
    );
  const expected = given?.fingerprint ?? pinned;
  if (expected === null || process.env[TRUSTED_CA_ENV] === expected) return null;
  return given ?? { pem: await pinnedServerCa(link.origin, expected), fingerprint: expected };
}

/** the fingerprint a link's fragment pins (`#…&ca=`), lowercase hex; null where it pins none */
function linkPin(link: URL): string | null {
  const pin = new URLSearchParams(link.hash.slice(1)).get(CA_LINK_PARAM);
  if (pin === null) return null;
  const hex = pin.replace(/:/g, '').toLowerCase();
  if (!/^[0-9a-f]{64}$/.test(hex))
    throw new Error(
      `the link's ${CA_LINK_PARAM}= is ${JSON.stringify(pin)}, not a SHA-256 fingerprint (64 hex digits): ` +
        'copy the worker link the dashboard shows, whole and quoted',
    );
  return hex;
}

/** The CA certificate of a PEM file (`--ca FILE`), refused, saying what to give, where it is none. */
export function caOfFile(file: string): TrustedCa {
  if (!existsSync(file)) throw new Error(`--ca ${file}: no such file; give the swarm's CA certificate (PEM)`);
  const pem = readFileSync(file, 'utf8');
  try {
    return { pem, fingerprint: certificateFingerprint(pem) };
  } catch (e) {
    throw new Error(
      `--ca ${file} is no PEM certificate (${(e as Error).message}): ` +
        `give the CA the swarm's server serves at ${CA_PATH}`,
      { cause: e },
    );
  }
}

/**
 * The CA certificate the server at `origin` serves (CA_PATH), fetched without trusting it (there is nothing yet to
 * trust it by) and taken only where its SHA-256 is `pinned`. The request carries nothing of the swarm's.
 */
export async function pinnedServerCa(origin: string, pinned: string): Promise<string> {
  const pem = await fetchUntrusted(new URL(CA_PATH, origin));
  let fingerprint: string;
  try {
    fingerprint = certificateFingerprint(pem);
  } catch (e) {
    throw new Error(
      `the server at ${origin} answered ${CA_PATH} with no PEM certificate (${(e as Error).message}): is the link ` +
        'of a ditswarm server that is its own CA? Copy the worker link its dashboard shows, or give --ca FILE',
      { cause: e },
    );
  }
  if (fingerprint !== pinned)
    throw new Error(
      `the server at ${origin} showed a CA whose SHA-256 is ${fingerprint}, not the link's ${pinned}: nothing of ` +
        `the swarm's was sent to it. Compare the CA fingerprint its dashboard shows: if it is ` +
        `${spacedFingerprint(fingerprint)}, the CA was made again since the link was copied (copy the worker link ` +
        "the dashboard shows now); if not, this address reaches another machine than the swarm's server (check it)",
    );
  return pem;
}

function fetchUntrusted(url: URL): Promise<string> {
  return new Promise((resolve, reject) => {
    const failed = (why: string) =>
      reject(new Error(`could not fetch the server's CA at ${url.href}: ${why}; is the server up at that address?`));
    const request = https.get(url, { rejectUnauthorized: false, timeout: CA_FETCH_TIMEOUT_MS }, (response) => {
      if (response.statusCode !== 200) {
        response.resume();
        failed(`HTTP ${response.statusCode}`);
        return;
      }
      let body = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => {
        body += chunk;
        if (body.length > MAX_CA_BYTES) request.destroy(new Error(`more than ${MAX_CA_BYTES} bytes`));
      });
      response.on('end', () => resolve(body));
      response.on('error', (e) => failed(e.message));
    });
    request.on('timeout', () => request.destroy(new Error(`no answer in ${CA_FETCH_TIMEOUT_MS / 1000} s`)));
    request.on('error', (e) => failed(e.message));
  });
}

/**
 * Runs this worker again (`entry` with this process's arguments) trusting `ca` besides the system's roots and any
 * NODE_EXTRA_CA_CERTS of the user's; this process hands it SIGINT and SIGTERM and resolves with its exit status.
 */
export function runTrusting(ca: TrustedCa, entry: string): Promise<number> {
  // a file of this run's: Node reads it as the new run first connects, and it goes when the run ends
  const dir = mkdtempSync(join(tmpdir(), 'ditswarm-worker-ca-'));
  const file = join(dir, `${ca.fingerprint}.pem`);
  const theirs = process.env.NODE_EXTRA_CA_CERTS;
  const kept = theirs && existsSync(theirs) ? readFileSync(theirs, 'utf8') : '';
  writeFileSync(file, `${ca.pem.trim()}\n${kept}`);
  // TypeScript by tsx's loader, whichever way this process was started (tsx's CLI, `--import tsx`, bin/ditswarm.mjs)
  const child = spawn(process.execPath, ['--import', import.meta.resolve('tsx'), entry, ...process.argv.slice(2)], {
    // the IPC channel closes when this process dies, however it dies: the new run hears it and leaves the swarm
    stdio: ['inherit', 'inherit', 'inherit', 'ipc'],
    env: { ...process.env, NODE_EXTRA_CA_CERTS: file, [TRUSTED_CA_ENV]: ca.fingerprint },
  });
  const signals = ['SIGINT', 'SIGTERM'] as const;
  const handOn = (signal: NodeJS.Signals) => child.kill(signal);
  for (const signal of signals) process.on(signal, handOn);
  return new Promise((resolve) => {
    const ended = (status: number) => {
      for (const s of signals) process.off(s, handOn);
      rmSync(dir, { recursive: true, force: true });
      resolve(status);
    };
    child.once('error', (e) => {
      console.error(`worker: could not start again trusting the server's CA: ${e.message}`);
      ended(1);
    });
    // a shell's status for a run a signal ended
    child.once('exit', (code, signal) => ended(code ?? 128 + (signal ? constants.signals[signal] : 0)));
  });
}

/** what OpenSSL says when a certificate chains to no root this process trusts */
const UNTRUSTED_CODES = new Set([
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
]);

/**
 * What to do where joining `link` failed on the server's certificate, to follow the error's message; '' where it did
 * not. fetch says only "fetch failed": the certificate's complaint is in the error's causes.
 */
export function untrustedServer(error: unknown, link: string): string {
  for (let e = error; e instanceof Error; e = e.cause) {
    const code = (e as Error & { code?: unknown }).code;
    if (typeof code !== 'string') continue;
    if (UNTRUSTED_CODES.has(code))
      return (
        ` (${e.message}): the server's certificate is of a CA this machine does not trust; join by the worker link ` +
        `its dashboard shows, whose ${CA_LINK_PARAM}= pins the server's own CA, or give --ca FILE`
      );
    if (code === 'ERR_TLS_CERT_ALTNAME_INVALID')
      return (
        ` (${e.message}): the server's certificate does not name ${new URL(link).hostname}; ` +
        'join at a name it does (npm start -- --host NAME adds one)'
      );
  }
  return '';
}
