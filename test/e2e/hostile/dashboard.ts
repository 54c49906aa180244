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
    JSON.stringify = function (value: any, ...rest: any[]) {
      const ms = (window as unknown as { __exchangeTimeoutMs?: number }).__exchangeTimeoutMs;
      if (ms && value?.type === 'request' && value.method === 'prepareJob' && value.args?.exchangeTimeoutMs) {
        value = { ...value, args: { ...value.args, exchangeTimeoutMs: ms } };
      }
      return stringify.call(JSON, value, ...(rest as [])) as string;
    } as typeof JSON.stringify;
  });
}

/**
 * IndexedDB as on a nearly full disk: once window.__quotaBytes is set, a put that would make the
 * finished jobs' videos and latents together grow past it throws QuotaExceededError, as the
 * browser's does, and navigator.storage.estimate() says how full it is. What is counted is kept per record (a job without its result counts 0);
 * window.__storedResultBytes holds it, by job id.
 */
export async function emulateStorageQuota(page: Page): Promise<void> {
  await page.addInitScript(() => {
    const w = window as unknown as {
      __quotaBytes?: number;
      __storedResultBytes: Record<string, number>;
      __refusedPuts: number;
    };
    w.__storedResultBytes = {};
    w.__refusedPuts = 0;
    const resultBytes = (value) => (value?.result?.latent?.byteLength ?? 0) + (value?.result?.video?.size ?? 0);
    // what earlier pages stored counts too: learnt as the queue reads its jobs back
    const getAll = IDBObjectStore.prototype.getAll;
    IDBObjectStore.prototype.getAll = function (this: IDBObjectStore, ...args: Parameters<IDBObjectStore['getAll']>) {
      const request = getAll.apply(this, args);
      if (this.name === 'jobs')
        request.addEventListener('success', () =>
          request.result.forEach((job) => (w.__storedResultBytes[job.id] = resultBytes(job))),
        );
      return request;
    };
    const put = IDBObjectStore.prototype.put;
    IDBObjectStore.prototype.put = function (this: IDBObjectStore, value: any, key?: IDBValidKey) {
      if (this.name === 'jobs' && value && typeof value.id === 'number') {
        const stored = w.__storedResultBytes;
        const before = Object.values(stored).reduce((n, bytes) => n + bytes, 0);
        const after = before - (stored[value.id] ?? 0) + resultBytes(value);
        // as a full disk: what makes it fuller fails, what frees room goes through
        if (w.__quotaBytes !== undefined && after > w.__quotaBytes && after > before) {
          w.__refusedPuts++;
          throw new DOMException('The quota has been exceeded.', 'QuotaExceededError');
        }
        stored[value.id] = resultBytes(value);
      }
      return put.call(this, value, key);
    };
    // and the browser's estimate says so, as a full disk's does: usage is what is stored, the quota the one set
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
    (window as unknown as { __peerConnections: () => unknown[] }).__peerConnections = () => [...held.values()];
    const { setRemoteDescription, close } = RTCPeerConnection.prototype;
    RTCPeerConnection.prototype.setRemoteDescription = function (
      this: RTCPeerConnection,
      description: RTCSessionDescriptionInit,
    ) {
      if (description?.type === 'offer' && !held.has(this)) held.set(this, { offeredAt: Date.now(), closedAt: null });
      return (setRemoteDescription as (this: RTCPeerConnection, d: RTCSessionDescriptionInit) => Promise<void>).call(
        this,
        description,
      );
    } as typeof RTCPeerConnection.prototype.setRemoteDescription;
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
  return page.evaluate(
    (t) =>
      ((window as any).__peerConnections() as { offeredAt: number; closedAt: number | null }[]).filter(
        (c) => c.offeredAt >= t,
      ),
    since,
  );
}
