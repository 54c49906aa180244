// Which model folders a worker page reads: a page fetches what its coordinator names, and its
// coordinator is whoever holds the dashboard's link.

/**
 * Why a worker of `origin` will not read the model folder (or adapter file) at `modelUrl`, or null: it reads its own
 * server's files and the ones that server was started on (`npm start -- --model URL --lora URL`), nothing else, so
 * that whoever holds the coordinator's link cannot make it fetch any URL.
 */
export function modelRefusal(origin: string, served: readonly string[]): (modelUrl: string) => string | null {
  const own = new URL(origin).origin;
  const named = served.map((url) => new URL(url, origin).href.replace(/\/$/, ''));
  const elsewhere = named.filter((url) => new URL(url).origin !== own);
  return (modelUrl) => {
    let url: URL;
    try {
      url = new URL(modelUrl);
    } catch {
      return `${JSON.stringify(modelUrl.slice(0, 200))} is not a URL`;
    }
    if (url.origin === own || named.includes(url.href.replace(/\/$/, ''))) return null;
    return `this worker reads model folders from ${[own, ...elsewhere].join(' and ')} only, not ${url.origin}`;
  };
}
