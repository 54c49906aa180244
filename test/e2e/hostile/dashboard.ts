// The honest dashboard under test conditions the product has no setting for, made from the page
// side before its scripts run: a shorter patience of its ranks for a peer's tensors (what
// prepareJob carries: half the coordinator's RPC timeout, a minute, otherwise), a browser whose
// storage is nearly full (IndexedDB refuses a write past a quota), and a record of the peer
// connections it holds for whoever dials it.
import type { Page } from '@playwright/test';

/**
 * From the next job on, the dashboard's prepareJob tells its ranks to name a peer silent after
 * `ms` (window.__exchangeTimeoutMs) instead of a minute. The product hook this stands in for: an
 * `rpcTimeoutMs` in the dashboard's automation API.
 */
export async function shortenExchangeTimeout(page: Page): Promise<void> {
  await page.addInitScript(() => {
    const stringify = JSON.stringify;
    JSON.stringify = function (value: unknown, ...rest: unknown[]) {
      const ms = window.__exchangeTimeoutMs;
      const message = value as { type?: unknown; method?: unknown; args?: { exchangeTimeoutMs?: unknown } } | null;
      if (ms && message?.type === 'request' && message.method === 'prepareJob' && message.args?.exchangeTimeoutMs) {
        value = { ...message, args: { ...message.args, exchangeTimeoutMs: ms } };
      }
      return Reflect.apply(stringify, JSON, [value, ...rest]) as string;
    } as typeof JSON.stringify;
  });
}

/**
 * IndexedDB as on a nearly full disk: once window.__quotaBytes is set, a put that would make the
 * finished jobs' videos and latents together grow past it throws QuotaExceededError, as the
 * browser's does, and navigator.storage.estimate() says how full it is. What is counted is kept
 * per record (a job without its result counts 0); window.__storedResultBytes holds it, by job id.
 */
export async function emulateStorageQuota(page: Page): Promise<void> {
  await page.addInitScript(() => {
    const w = window;
    w.__storedResultBytes = {};
    w.__refusedPuts = 0;
    /** a job's record as far as it counts: its result's latent and video */
    type Counted = {
      id?: unknown;
      result?: { latent?: { byteLength: number }; video?: { size: number } | null };
    } | null;
    const resultBytes = (job: Counted) => (job?.result?.latent?.byteLength ?? 0) + (job?.result?.video?.size ?? 0);
    // what earlier pages stored counts too: learnt as the queue reads its jobs back
    // eslint-disable-next-line @typescript-eslint/unbound-method -- called on its store below
    const getAll = IDBObjectStore.prototype.getAll;
    IDBObjectStore.prototype.getAll = function (this: IDBObjectStore, ...args: Parameters<IDBObjectStore['getAll']>) {
      const request = getAll.apply(this, args);
      if (this.name === 'jobs')
        request.addEventListener('success', () =>
          (request.result as { id: number }[]).forEach((job) => (w.__storedResultBytes[job.id] = resultBytes(job))),
        );
      return request;
    };
    // eslint-disable-next-line @typescript-eslint/unbound-method -- called on its store below
    const put = IDBObjectStore.prototype.put;
    IDBObjectStore.prototype.put = function (this: IDBObjectStore, value: unknown, key?: IDBValidKey) {
      const job = value as Counted;
      if (this.name === 'jobs' && job && typeof job.id === 'number') {
        const stored = w.__storedResultBytes;
        const before = Object.values(stored).reduce((n, bytes) => n + bytes, 0);
        const after = before - (job.id in stored ? stored[job.id] : 0) + resultBytes(job);
        // as a full disk: what makes it fuller fails, what frees room goes through
        if (w.__quotaBytes !== undefined && after > w.__quotaBytes && after > before) {
          w.__refusedPuts++;
          throw new DOMException('The quota has been exceeded.', 'QuotaExceededError');
        }
        stored[job.id] = resultBytes(job);
      }
      return put.call(this, value, key);
    };
    // and the browser's estimate says so, as a full disk's does: usage is what is stored, the quota the one set
    // eslint-disable-next-line @typescript-eslint/unbound-method -- called on its manager below
    const estimate = StorageManager.prototype.estimate;
    StorageManager.prototype.estimate = async function (this: StorageManager) {
      const real = await estimate.call(this);
      if (w.__quotaBytes === undefined) return real;
      return {
        ...real,
        quota: w.__quotaBytes,
        usage: Object.values(w.__storedResultBytes).reduce((n, bytes) => n + bytes, 0),
      };
    };
  });
}

/**
 * Records when the page took each peer connection an offer came in on and when it closed it
 * (window.__peerConnections), without changing what it does with them: what a page holds for
 * whoever dials it.
 */
export async function trackPeerConnections(page: Page): Promise<void> {
  await page.addInitScript(() => {
    const held = new Map<RTCPeerConnection, { offeredAt: number; closedAt: number | null }>();
    window.__peerConnections = () => [...held.values()];
    type SetRemote = (this: RTCPeerConnection, description: RTCSessionDescriptionInit) => Promise<void>;
    // the promise form: the callback form is deprecated, and PeerJS uses this one
    const prototype: { setRemoteDescription: SetRemote } = RTCPeerConnection.prototype;
    const setRemoteDescription = prototype.setRemoteDescription;
    // eslint-disable-next-line @typescript-eslint/unbound-method -- called on its connection below
    const { close } = RTCPeerConnection.prototype;
    const tracked: SetRemote = function (this, description) {
      if (description.type === 'offer' && !held.has(this)) held.set(this, { offeredAt: Date.now(), closedAt: null });
      return setRemoteDescription.call(this, description);
    };
    prototype.setRemoteDescription = tracked;
    RTCPeerConnection.prototype.close = function (this: RTCPeerConnection) {
      const entry = held.get(this);
      if (entry) entry.closedAt ??= Date.now();
      close.call(this);
    };
  });
}

/** The peer connections `page` took offers on since `since`: when, and when it closed them (null: still open). */
export function peerConnectionsSince(
  page: Page,
  since: number,
): Promise<{ offeredAt: number; closedAt: number | null }[]> {
  return page.evaluate((t) => window.__peerConnections().filter((c) => c.offeredAt >= t), since);
}

declare global {
  interface Window {
    /** shortenExchangeTimeout: the patience prepareJob tells the ranks, in ms (unset: the dashboard's own) */
    __exchangeTimeoutMs?: number;
    /** emulateStorageQuota: the quota once set, what each job's record counts, the puts refused */
    __quotaBytes?: number;
    __storedResultBytes: Record<string, number>;
    __refusedPuts: number;
    /** trackPeerConnections: the peer connections the page took offers on */
    __peerConnections: () => { offeredAt: number; closedAt: number | null }[];
  }
}
