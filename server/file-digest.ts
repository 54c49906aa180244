// The SHA-256 of a file's content, as RFC 9530's Repr-Digest gives it (`sha-256=:base64:`): what lets a worker
// process use a model folder it already has (`--model-dir`) instead of downloading the server's, once both sides'
// digests agree. Hashing GBs takes minutes: each file's digest is computed once per size and modification time, and
// a worker process keeps those of its model folder across starts (KeptDigests, in its cache folder).
import { createHash } from 'node:crypto';
import { createReadStream, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { stat } from 'node:fs/promises';

const known = new Map<string, Promise<string>>();

/**
 * `sha-256=:…:` of the file at `path`, remembered while its size and modification time stay the same: in this
 * process, and in `kept` across runs where given.
 */
export async function reprDigest(path: string, kept?: KeptDigests): Promise<string> {
  const { size, mtimeMs } = await stat(path);
  const key = `${path}\0${size}\0${mtimeMs}`;
  let digest = known.get(key);
  if (!digest) {
    const remembered = kept?.get(path, size, mtimeMs);
    digest = remembered
      ? Promise.resolve(remembered)
      : new Promise<string>((resolve, reject) => {
          const hash = createHash('sha256');
          createReadStream(path)
            .on('data', (chunk) => hash.update(chunk))
            .on('error', reject)
            .on('end', () => resolve(`sha-256=:${hash.digest('base64')}:`));
        });
    known.set(key, digest);
    digest.catch(() => known.delete(key));
  }
  const result = await digest;
  if (kept && kept.get(path, size, mtimeMs) !== result)
    try {
      kept.set(path, size, mtimeMs, result);
    } catch {
      // not kept (a full disk, a read-only folder): hashed again at the next start
    }
  return result;
}

interface KeptDigest {
  size: number;
  mtimeMs: number;
  digest: string;
}

/** Files' digests kept in a JSON file across runs, each valid while its file's size and modification time hold. */
export class KeptDigests {
  private readonly entries: Record<string, KeptDigest>;

  constructor(private readonly file: string) {
    let read: unknown;
    try {
      read = JSON.parse(readFileSync(file, 'utf8'));
    } catch {
      read = null; // none kept yet, or a file broken by a crash: hashed again
    }
    this.entries = read !== null && typeof read === 'object' ? (read as Record<string, KeptDigest>) : {};
  }

  get(path: string, size: number, mtimeMs: number): string | undefined {
    const entry = this.entries[path] as Partial<KeptDigest> | undefined;
    return entry?.size === size && entry.mtimeMs === mtimeMs && typeof entry.digest === 'string'
      ? entry.digest
      : undefined;
  }

  set(path: string, size: number, mtimeMs: number, digest: string): void {
    this.entries[path] = { size, mtimeMs, digest };
    // whole or not at all: a crash mid-write leaves the last whole file
    writeFileSync(`${this.file}.tmp`, JSON.stringify(this.entries));
    renameSync(`${this.file}.tmp`, this.file);
  }
}

/** whether a request's Want-Repr-Digest asks for SHA-256 (at any preference above 0) */
export const wantsSha256 = (header: string | undefined): boolean =>
  !!header && /(^|,)\s*sha-256\s*=\s*([1-9]|10)\s*(,|$)/i.test(header);
