// The contract between a server that is its own certificate authority (server/certificates.ts) and the pages and
// worker processes of other machines that trust it: where the CA is downloaded, how its fingerprint is written, and
// how a worker link pins it.

/** where the server's local CA is downloaded from (PEM; `.crt` is what Windows, Android and ChromeOS open) */
export const CA_PATH = '/ca.crt';
/** answers 204 only over https: the trust page asks it whether this browser trusts the CA yet */
export const TLS_PROBE_PATH = '/tls-probe';
/** a worker link's fragment names the CA's fingerprint under this key, so a worker process can pin it */
export const CA_LINK_PARAM = 'ca';

/** A SHA-256 fingerprint (lowercase hex) as people compare it: upper-case byte pairs, colon-separated. */
export function spacedFingerprint(fingerprint: string): string {
  return (fingerprint.toUpperCase().match(/../g) ?? []).join(':');
}
