// The cores of this machine, shared among the worker tabs of this browser: each tab holds a Web Lock
// of its own while it lives, counts the ditswarm locks held, and takes ⌊cores / tabs⌋ WASM threads,
// at least one. No timers (worker tabs are hidden, and hidden tabs' timers are throttled): a tab
// that joins says so on a BroadcastChannel, and every tab queues for the others' locks, which the
// browser grants it the moment their tab closes or crashes — then it counts again.

import { nonce } from '../core/net/hmac.ts';
import { BROWSER_ID_KEY } from '../core/worker-api.ts';
import { usableCores } from '../rank/engine-client.ts';

const LOCK_PREFIX = 'ditswarm-worker-tab-';
const CHANNEL = 'ditswarm-worker-tabs';

export interface CoreShare {
  /** the machine's cores, as the browser tells them */
  readonly cores: number;
  /** an id every worker tab of this browser has (WorkerInfo.browser) */
  readonly browser: string;
  /** WASM threads this tab should use now */
  threads(): number;
  /** worker tabs of this browser on this machine, this one included */
  tabs(): number;
  leave(): void;
}

/** Joins the tabs' share of the cores; `onChange` hears the new share whenever the count of tabs changes after. */
export async function shareCores(id: string, onChange: (threads: number, tabs: number) => void): Promise<CoreShare> {
  const cores = Math.max(1, navigator.hardwareConcurrency || 1);
  // no Web Locks on a page that is no secure context (plain http on a LAN)
  const { locks } = navigator as Partial<Pick<Navigator, 'locks'>>;
  const own = LOCK_PREFIX + id;
  const channel = typeof BroadcastChannel === 'function' ? new BroadcastChannel(CHANNEL) : null;
  const watching = new Set<string>();
  let tabs = 1;
  let release: () => void = () => {};
  let left = false;
  let joined = false;
  const usable = usableCores();
  const share = () => Math.max(1, Math.floor(usable / tabs));

  const recount = async (): Promise<void> => {
    if (!locks || left) return; // no Web Locks (an old browser, an insecure page): this tab alone takes all cores
    const names = new Set(
      ((await locks.query()).held ?? []).map((l) => l.name ?? '').filter((n) => n.startsWith(LOCK_PREFIX)),
    );
    for (const name of names) {
      if (name === own || watching.has(name)) continue;
      // granted once that tab is gone; released at once, it only tells this one to count again
      watching.add(name);
      void locks
        .request(name, () => {
          watching.delete(name);
        })
        .then(() => recount());
    }
    const count = Math.max(1, names.size);
    if (count === tabs) return;
    tabs = count;
    if (joined) onChange(share(), tabs);
  };

  if (locks) {
    // held until release(): the lock lives as long as this tab stays in the swarm
    await new Promise<void>((acquired) => {
      void locks.request(own, () => {
        acquired();
        return new Promise<void>((done) => (release = done));
      });
    });
  }
  channel?.addEventListener('message', () => void recount());
  await recount();
  joined = true;
  channel?.postMessage('joined');

  return {
    cores,
    browser: await browserId(locks),
    threads: share,
    tabs: () => tabs,
    leave() {
      left = true;
      release();
      channel?.close();
    },
  };
}

const BROWSER_KEY = BROWSER_ID_KEY;

/**
 * This browser's id, kept where all its tabs of this origin read it, made under a Web Lock so that
 * two tabs opening at once do not make two (a new one each time where storage is refused: a tab alone).
 */
async function browserId(locks: LockManager | undefined): Promise<string> {
  const keptOrMade = () => {
    try {
      const kept = localStorage.getItem(BROWSER_KEY);
      if (kept) return kept;
      const made = nonce(); // crypto.randomUUID is for secure contexts, and a LAN page on plain http is none
      localStorage.setItem(BROWSER_KEY, made);
      return made;
    } catch {
      return nonce();
    }
  };
  return locks ? locks.request(`${BROWSER_KEY}-id`, keptOrMade) : keptOrMade();
}
