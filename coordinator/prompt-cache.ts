// The dashboard's encoded prompts, kept in IndexedDB across jobs and reloads: umT5 takes seconds to
// minutes a prompt on a swarm (its layers are GBs), and the same prompt — the negative prompt
// above all — comes back job after job. A prompt's entry is its last hidden state before padding
// ([tokens, 4096], 16 KB a token); the cache keeps the most recent MAX_ENTRIES.
import { openDB } from 'idb';
import type { PromptCache } from './text-encoding.ts';

const MAX_ENTRIES = 256;

export async function openPromptCache(name = 'ditswarm-prompts'): Promise<PromptCache> {
  const db = await openDB(name, 1, {
    upgrade(database) {
      database.createObjectStore('prompts').createIndex('usedAt', 'usedAt');
    },
  });
  return {
    async get(key) {
      const entry = (await db.get('prompts', key)) as { hidden: Float32Array; truncated: boolean } | undefined;
      if (entry) await db.put('prompts', { ...entry, usedAt: Date.now() }, key);
      return entry && { hidden: entry.hidden, truncated: entry.truncated };
    },
    async put(key, { hidden, truncated }) {
      await db.put('prompts', { hidden, truncated, usedAt: Date.now() }, key);
      const keys = await db.getAllKeysFromIndex('prompts', 'usedAt');
      for (const old of keys.slice(0, Math.max(0, keys.length - MAX_ENTRIES))) await db.delete('prompts', old);
    },
  };
}
