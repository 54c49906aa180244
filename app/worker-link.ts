// The worker link as the worker page reads it: the join token in the fragment (`#token=`), which a
// browser sends to no server and puts in no Referer. Once the page has joined, the token leaves the
// address bar (and so its history, bookmarks and shared screens): the page keeps it in memory and
// in its tab's session storage, so that a reload of the tab joins again.

/** where the worker page keeps its token for a reload of its tab */
export const WORKER_TOKEN_KEY = 'ditswarm-worker-token';

export const OLD_TOKEN_LINK =
  'this link has its join token in "?token=", which the browser sends to servers in Referer headers: ' +
  'it is not taken. Open the worker link the dashboard shows now (…/worker.html#token=…)';

/** the token of a link's fragment, or null */
export const fragmentToken = (url: URL): string | null => new URLSearchParams(url.hash.slice(1)).get('token');

/**
 * What the worker page joins with: the token of its link's fragment, else the one its tab kept; a
 * link with `?token=` is refused (and the token leaves the address bar at once). `address` is what
 * the address bar shows from now on.
 */
export function readWorkerLink(
  href: string,
  kept: string | null,
): { token: string | null; refused: string | null; address: string } {
  const url = new URL(href);
  if (url.searchParams.has('token')) {
    url.searchParams.delete('token');
    return { token: null, refused: OLD_TOKEN_LINK, address: withoutToken(url) };
  }
  return { token: fragmentToken(url) ?? kept, refused: null, address: url.href };
}

/** `href` without the token in its fragment: what the address bar shows once the page has joined */
export const addressAfterJoining = (href: string): string => withoutToken(new URL(href));

function withoutToken(url: URL): string {
  const fragment = new URLSearchParams(url.hash.slice(1));
  fragment.delete('token');
  url.hash = fragment.size ? fragment.toString() : '';
  return url.href;
}
