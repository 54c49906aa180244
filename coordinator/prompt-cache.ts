// The dashboard's encoded prompts, kept in IndexedDB across jobs and reloads: umT5 takes seconds to
// minutes a prompt on a swarm (its layers are GBs), and the same prompt — the negative prompt
// above all — comes back job after job. A prompt's entry is its last hidden state before padding
// ([tokens, 4096], 16 KB a token) and the workers that computed or checked it, so that a worker
// convicted of wrong results later takes its entries with it; the cache keeps the most recent
// MAX_ENTRIES.
import { openDB } from 'idb';
import type { CachedPrompt, PromptCache } from './text-encoding.ts';

const MAX_ENTRIES = 256;
/** 2: entries name their workers; those of version 1, which no check had vouched for, are dropped */
const VERSION = 2;

export async function openPromptCache(name = 'ditswarm-prompts'): Promise<PromptCache> {
  const db = await openDB(name, VERSION, {
    upgrade(database) {
      if (database.objectStoreNames.contains('prompts')) database.deleteObjectStore('prompts');
      database.createObjectStore('prompts').createIndex('usedAt', 'usedAt');
    },
  });
  return {
    async get(key) {
      const entry = (await db.get('prompts', key)) as CachedPrompt | undefined;
      if (entry) await db.put('prompts', { ...entry, usedAt: Date.now() }, key);
      return entry && { hidden: entry.hidden, truncated: entry.truncated, workers: entry.workers };
    },
    async put(key, { hidden, truncated, workers }) {
      await db.put('prompts', { hidden, truncated, workers, usedAt: Date.now() }, key);
      const keys = await db.getAllKeysFromIndex('prompts', 'usedAt');
      for (const old of keys.slice(0, Math.max(0, keys.length - MAX_ENTRIES))) await db.delete('prompts', old);
    },
    async purge(worker) {
      const transaction = db.transaction('prompts', 'readwrite');
      for (let cursor = await transaction.store.openCursor(); cursor; cursor = await cursor.continue())
        if ((cursor.value as CachedPrompt).workers.includes(worker)) await cursor.delete();
      await transaction.done;
    },
  };
}
