// The API's key: every call carries `Authorization: Bearer <key>`. DITSWARM_API_KEY gives it; else the server makes
// one on its first start and keeps it in the data folder (readable by its owner alone), so it outlives restarts.

import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export interface ApiKey {
  key: string;
  /** where it came from: the environment, or the file it is kept in */
  where: string;
}

export const API_KEY_FILE = 'api-key';

/** `fromEnv` (DITSWARM_API_KEY) if given, else the key kept in `dataDir`, made there on the first start. */
export function loadApiKey(dataDir: string, fromEnv: string | undefined): ApiKey {
  if (fromEnv !== undefined) {
    if (fromEnv.length < 16)
      throw new Error('DITSWARM_API_KEY is at least 16 characters: a key anyone can guess is none');
    return { key: fromEnv, where: 'DITSWARM_API_KEY' };
  }
  const file = join(dataDir, API_KEY_FILE);
  if (!existsSync(file)) {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    writeFileSync(file, `ds-${randomBytes(24).toString('base64url')}\n`, { mode: 0o600 });
    chmodSync(file, 0o600);
  }
  const mode = statSync(file).mode & 0o777;
  if (mode & 0o077)
    throw new Error(
      `${file} may be read by other users of this machine (mode ${mode.toString(8)}), and the key in it runs jobs: ` +
        `make it yours alone (chmod 600 ${file}), or delete it to have a new key made`,
    );
  const key = readFileSync(file, 'utf8').trim();
  if (key.length < 16) throw new Error(`${file} holds no key of 16 characters or more: delete it to have one made`);
  return { key, where: file };
}

const digest = (text: string) => createHash('sha256').update(text).digest();

/**
 * Whether an Authorization header carries `key`. Compared as SHA-256 digests in constant time: neither the key's
 * length nor how much of it a guess got right shows in how long the answer takes.
 */
export function authorized(header: string | undefined, key: string): boolean {
  const given = /^Bearer\s+(\S+)\s*$/i.exec(header ?? '')?.[1] ?? '';
  return timingSafeEqual(digest(given), digest(key));
}
