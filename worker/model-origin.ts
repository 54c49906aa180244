// Which model folders a worker page reads: a page fetches what its coordinator names, and its
// coordinator is whoever holds the dashboard's link.

/**
 * Why a worker of `origin` will not read the model folder at `modelUrl`, or null: it reads its own
 * server's folders and the one that server was started on (`npm start -- --model URL`), nothing
 * else, so that whoever holds the coordinator's link cannot make it fetch any URL.
 */
export function modelRefusal(origin: string, servedModel: string | null): (modelUrl: string) => string | null {
  const own = new URL(origin).origin;
  const served = servedModel && new URL(servedModel, origin).href.replace(/\/$/, '');
  return (modelUrl) => {
    let url: URL;
    try {
      url = new URL(modelUrl);
    } catch {
      return `${JSON.stringify(modelUrl.slice(0, 200))} is not a URL`;
    }
    if (url.origin === own || url.href.replace(/\/$/, '') === served) return null;
    return `this worker reads model folders from ${own}${served ? ` and ${served}` : ''} only, not ${url.origin}`;
  };
}
