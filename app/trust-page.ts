// The page a plain-http LAN address shows in place of the app (server/lan-https.ts): how to trust the swarm's CA
// once, and on to the same page over https as soon as this browser does (at once, where it does already).
import { CA_PATH, spacedFingerprint, TLS_PROBE_PATH } from '../core/net/local-ca.ts';
import { $ } from './views/dom.ts';

const PROBE_EVERY_MS = 3_000;

/** the page this link was for, over https: the same path and fragment (the join token), the app's root for this one */
const onward = new URL(location.href);
onward.protocol = 'https:';
if (onward.pathname === '/trust.html') onward.pathname = '/';

$('server-host').textContent = location.host;
$('onward', HTMLAnchorElement).href = onward.href;
$('ca-download', HTMLAnchorElement).href = CA_PATH;

void fetch('/signaling.json')
  .then((r): Promise<{ ca?: { fingerprint?: unknown } | null }> => r.json())
  .then(({ ca }) => {
    $('fingerprint').textContent =
      typeof ca?.fingerprint === 'string' ? spacedFingerprint(ca.fingerprint) : '(the server did not say)';
  })
  .catch(() => ($('fingerprint').textContent = '(the server did not answer)'));

/** whether this browser opens the server's https side without a certificate error */
async function trusted(): Promise<boolean> {
  try {
    return (await fetch(new URL(TLS_PROBE_PATH, onward), { cache: 'no-store' })).status === 204;
  } catch {
    return false;
  }
}

async function goOnWhenTrusted(): Promise<void> {
  if (await trusted()) {
    $('state').textContent = 'This browser trusts the swarm: going on over https…';
    location.replace(onward.href);
    return;
  }
  $('state').textContent = 'This browser does not trust the swarm yet: take the steps below, once.';
  setTimeout(() => void goOnWhenTrusted(), PROBE_EVERY_MS);
}
void goOnWhenTrusted();
