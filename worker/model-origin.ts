// Which model folders a worker page reads, and from where: a page fetches what its coordinator names, and its
// coordinator is whoever holds the dashboard's link.

/**
 * Where a worker of `origin` reads the model folder (or adapter file) at `modelUrl`; throws, saying why, where it
 * will not. It reads its own server's files and the ones that server was started on (`npm start -- --model URL --lora
 * URL`), nothing else, so that whoever holds the coordinator's link cannot make it fetch any URL. A URL at any of
 * `serverOrigins`, the names its server answers to (a dashboard at `http://localhost` names the server so; a worker
 * on another machine reaches it at `https://<LAN name>`), is read from this worker's own origin.
 */
export function modelSource(
  origin: string,
  served: readonly string[],
  serverOrigins: readonly string[] = [],
): (modelUrl: string) => string {
  const own = new URL(origin).origin;
  const named = served.map((url) => new URL(url, origin).href.replace(/\/$/, ''));
  const elsewhere = named.filter((url) => new URL(url).origin !== own);
  const ours = new Set(serverOrigins.filter((o) => URL.canParse(o)).map((o) => new URL(o).origin));
  return (modelUrl) => {
    let url: URL;
    try {
      url = new URL(modelUrl);
    } catch {
      throw new Error(`${JSON.stringify(modelUrl.slice(0, 200))} is not a URL`);
    }
    if (ours.has(url.origin)) url = new URL(`${url.pathname}${url.search}`, own);
    if (url.origin === own || named.includes(url.href.replace(/\/$/, ''))) return url.href;
    throw new Error(
      `this worker reads model folders from ${[own, ...elsewhere].join(' and ')} only, not ${url.origin}`,
    );
  };
}
