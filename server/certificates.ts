// HTTPS for the pages of other machines: a worker's WebGPU, wasm threads (SharedArrayBuffer),
// WebCodecs and crypto.subtle exist only in a secure context, which a plain-http LAN address is
// not. Public CAs do not certify private addresses, so the server is its own local certificate
// authority (the mkcert pattern): made once, kept in its state folder with the private key readable
// by the owner alone, and trusted once on each worker machine; the server certificate it signs
// names every address and name of this machine and is made again when they change. `--cert`/`--key`
// take a real certificate instead (a DNS name with Let's Encrypt, the user's own CA, mkcert's).
import { createHash, createPrivateKey, X509Certificate } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { hostname } from 'node:os';
import { join } from 'node:path';
import forge from 'node-forge';

/** What the server's TLS listens with. */
export interface ServerTls {
  key: string;
  cert: string;
  /** the server's own local CA, which worker machines trust once; null for a certificate given with --cert */
  ca: LocalCa | null;
  /** whether the certificate is good for `name` (a host name or an IP address): only such names go in links */
  covers(name: string): boolean;
}

export interface LocalCa {
  /** PEM, served to worker machines to trust */
  pem: string;
  /** SHA-256 of its DER, lowercase hex: what a person compares, and what a worker process's link pins */
  fingerprint: string;
}

const CA_YEARS = 10;
/** a server certificate's life; it is made again this long before it ends */
const SERVER_DAYS = 365;
const RENEW_BEFORE_DAYS = 30;
const DAY_MS = 86_400_000;

/** SHA-256 of a certificate's DER, lowercase hex. */
export function certificateFingerprint(pem: string): string {
  return createHash('sha256').update(new X509Certificate(pem).raw).digest('hex');
}

/**
 * The server's own certificate for `names`, signed by its local CA, from `dir` (made there the first time, the CA kept
 * for good, the server certificate made again when a name is missing from it or it nears its end). `log` says what was
 * made, for the server's output.
 */
export function localTls(dir: string, names: readonly string[], log: (line: string) => void = () => {}): ServerTls {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const files = {
    caCert: join(dir, 'ca.pem'),
    caKey: join(dir, 'ca-key.pem'),
    cert: join(dir, 'server.pem'),
    key: join(dir, 'server-key.pem'),
  };
  let ca = readPair(files.caCert, files.caKey);
  if (!ca || daysLeft(ca.cert) < RENEW_BEFORE_DAYS) {
    ca = makeCa();
    writePair(files.caCert, files.caKey, ca);
    log(`made a local certificate authority in ${dir}: trust it once on each worker machine`);
  }
  let server = readPair(files.cert, files.key);
  const stands = ({ cert }: Pair, by: Pair) =>
    names.every((n) => covers(cert, n)) && signedBy(cert, by.cert) && daysLeft(cert) >= RENEW_BEFORE_DAYS;
  if (!server || !stands(server, ca)) {
    server = makeServerCertificate(ca, names);
    writePair(files.cert, files.key, server);
    log(`made this server's certificate for ${names.join(', ')}`);
  }
  const certificate = server.cert;
  return {
    key: server.key,
    cert: certificate,
    ca: { pem: ca.cert, fingerprint: certificateFingerprint(ca.cert) },
    covers: (name) => covers(certificate, name),
  };
}

/**
 * A certificate and key of the user's (`--cert FILE --key FILE`); refused, saying what to give, when they are no PEM
 * certificate and key, do not match, or have ended.
 */
export function givenTls(certFile: string, keyFile: string): ServerTls {
  const read = (file: string, what: string) => {
    if (!existsSync(file)) throw new Error(`${what} ${file}: no such file; give a PEM file`);
    return readFileSync(file, 'utf8');
  };
  const cert = read(certFile, '--cert');
  const key = read(keyFile, '--key');
  let x509: X509Certificate;
  try {
    x509 = new X509Certificate(cert);
  } catch (e) {
    throw new Error(`--cert ${certFile} is no PEM certificate (${(e as Error).message})`, { cause: e });
  }
  let matches: boolean;
  try {
    matches = x509.checkPrivateKey(createPrivateKey(key));
  } catch (e) {
    throw new Error(`--key ${keyFile} is no PEM private key (${(e as Error).message})`, { cause: e });
  }
  if (!matches) throw new Error(`--key ${keyFile} is not the private key of --cert ${certFile}`);
  if (new Date(x509.validTo).getTime() < Date.now())
    throw new Error(`--cert ${certFile} ended on ${x509.validTo}: renew it`);
  return { key, cert, ca: null, covers: (name) => covers(cert, name) };
}

interface Pair {
  cert: string;
  key: string;
}

function readPair(certFile: string, keyFile: string): Pair | null {
  if (!existsSync(certFile) || !existsSync(keyFile)) return null;
  try {
    const pair = { cert: readFileSync(certFile, 'utf8'), key: readFileSync(keyFile, 'utf8') };
    new X509Certificate(pair.cert); // a damaged file is made again
    return pair;
  } catch {
    return null;
  }
}

function writePair(certFile: string, keyFile: string, pair: Pair): void {
  writeFileSync(keyFile, pair.key, { mode: 0o600 });
  chmodSync(keyFile, 0o600); // a file that was there keeps its mode through writeFileSync
  writeFileSync(certFile, pair.cert);
}

function daysLeft(pem: string): number {
  return (new Date(new X509Certificate(pem).validTo).getTime() - Date.now()) / DAY_MS;
}

function covers(pem: string, name: string): boolean {
  const x509 = new X509Certificate(pem);
  const bare = name.replace(/^\[|\]$/g, '');
  return isIP(bare) ? x509.checkIP(bare) !== undefined : x509.checkHost(bare, { subject: 'never' }) !== undefined;
}

function signedBy(pem: string, caPem: string): boolean {
  return new X509Certificate(pem).verify(new X509Certificate(caPem).publicKey);
}

function makeCa(): Pair {
  // a name of its own per machine and making: two swarms' CAs are told apart in a trust store
  const subject = [
    {
      name: 'commonName',
      value: `ditswarm local CA ${hostname()} ${forge.util.bytesToHex(forge.random.getBytesSync(4))}`,
    },
    { name: 'organizationName', value: 'ditswarm' },
  ];
  return certify(CA_YEARS * 365, subject, [
    { name: 'basicConstraints', cA: true, pathLenConstraint: 0, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
}

function makeServerCertificate(ca: Pair, names: readonly string[]): Pair {
  const altNames = names.map((name) => {
    const bare = name.replace(/^\[|\]$/g, '');
    return isIP(bare) ? { type: 7, ip: bare } : { type: 2, value: bare };
  });
  const extensions = [
    { name: 'basicConstraints', cA: false, critical: true },
    { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
    { name: 'extKeyUsage', serverAuth: true },
    { name: 'subjectAltName', altNames },
  ];
  return certify(SERVER_DAYS, [{ name: 'commonName', value: hostname() }], extensions, ca);
}

/** A new key and its certificate for `days`, of `subject` with `extensions`, signed by `issuer` (by itself without). */
function certify(days: number, subject: forge.pki.CertificateField[], extensions: object[], issuer?: Pair): Pair {
  const keys = forge.pki.rsa.generateKeyPair(2048);
  const cert = forge.pki.createCertificate();
  cert.publicKey = keys.publicKey;
  cert.serialNumber = serialNumber();
  const now = Date.now();
  // from a day back: a machine whose clock is a little behind still takes it
  cert.validity.notBefore = new Date(now - DAY_MS);
  cert.validity.notAfter = new Date(now + days * DAY_MS);
  cert.setSubject(subject);
  cert.setIssuer(issuer ? forge.pki.certificateFromPem(issuer.cert).subject.attributes : subject);
  cert.setExtensions(extensions);
  cert.sign(issuer ? forge.pki.privateKeyFromPem(issuer.key) : keys.privateKey, forge.md.sha256.create());
  return { cert: forge.pki.certificateToPem(cert), key: forge.pki.privateKeyToPem(keys.privateKey) };
}

/** a positive serial of 16 random bytes (RFC 5280: at most 20 octets, positive) */
function serialNumber(): string {
  const bytes = forge.random.getBytesSync(16);
  return `01${forge.util.bytesToHex(bytes).slice(2)}`;
}
