// The SHA-256 of a file's content, as RFC 9530's Repr-Digest gives it (`sha-256=:base64:`): what lets a worker
// process use a model folder it already has (`--model-dir`) instead of downloading the server's, once both sides'
// digests agree. Hashing GBs takes a while: each file's digest is computed once per size and modification time.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';

const known = new Map<string, Promise<string>>();

/** `sha-256=:…:` of the file at `path` (remembered while its size and modification time stay the same) */
export async function reprDigest(path: string): Promise<string> {
  const { size, mtimeMs } = await stat(path);
  const key = `${path}\0${size}\0${mtimeMs}`;
  let digest = known.get(key);
  if (!digest) {
    digest = new Promise<string>((resolve, reject) => {
      const hash = createHash('sha256');
      createReadStream(path)
        .on('data', (chunk) => hash.update(chunk))
        .on('error', reject)
        .on('end', () => resolve(`sha-256=:${hash.digest('base64')}:`));
    });
    known.set(key, digest);
    digest.catch(() => known.delete(key));
  }
  return digest;
}

/** whether a request's Want-Repr-Digest asks for SHA-256 (at any preference above 0) */
export const wantsSha256 = (header: string | undefined): boolean =>
  !!header && /(^|,)\s*sha-256\s*=\s*([1-9]|10)\s*(,|$)/i.test(header);
