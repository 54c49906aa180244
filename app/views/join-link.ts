import qrcode from 'qrcode-generator';
import { CA_LINK_PARAM, spacedFingerprint } from '../../core/net/local-ca.ts';
import { $, h } from './dom.ts';

/**
 * The worker link, copyable and as a QR code, so a phone or another machine can join (`url`: at
 * the server's LAN address when this page is at localhost), and this machine's own (`local`).
 */
export function showJoinLink(url: string, local: string): void {
  const localLink = $('local-join-link', HTMLAnchorElement);
  localLink.href = localLink.textContent = local;
  $('local-join').hidden = local === url;
  const link = $('join-link', HTMLAnchorElement);
  link.href = link.textContent = url;
  showTrustOnce(url);
  const qr = qrcode(0, 'M');
  qr.addData(url);
  qr.make();
  $('join-qr').innerHTML = qr.createSvgTag({ cellSize: 3, margin: 2, scalable: true });
  const copy = $('copy-link', HTMLButtonElement);
  copy.onclick = async () => {
    try {
      await navigator.clipboard.writeText(url);
      copy.textContent = 'Copied';
    } catch {
      getSelection()?.selectAllChildren(link);
      copy.textContent = 'Press Ctrl+C';
    }
    setTimeout(() => (copy.textContent = 'Copy link'), 2000);
  };
}

/**
 * A link over https by the server's own CA names it (`#…&ca=`): a machine that does not trust it yet opens the same
 * link over plain http, whose page shows how to trust it once, with the fingerprint to compare, and then goes on.
 */
function showTrustOnce(url: string): void {
  const fingerprint = new URLSearchParams(new URL(url).hash.slice(1)).get(CA_LINK_PARAM);
  $('trust-once').hidden = fingerprint === null;
  if (fingerprint === null) return;
  const trustLink = $('trust-link', HTMLAnchorElement);
  trustLink.href = url.replace(/^https:/, 'http:');
  trustLink.textContent = new URL(trustLink.href).origin;
  $('ca-fingerprint').textContent = spacedFingerprint(fingerprint);
}

/**
 * The Revoke button beside the link (for a link that went where it should not): it asks first, then `revoke`s, which
 * shows the new link. One button for the dashboard and the API's page, which revoke by their own means.
 */
export function offerRevoke(revoke: () => void): void {
  if (document.getElementById('revoke-link')) return;
  const button = h('button', {
    type: 'button',
    id: 'revoke-link',
    className: 'secondary',
    title: 'The link went where it should not: make a new one; the workers that joined with this one leave',
    textContent: 'Revoke link',
  });
  button.onclick = () => {
    if (
      confirm(
        'Revoke this worker link? It stops working, the workers that joined with it leave, and a new link replaces it.',
      )
    )
      revoke();
  };
  $('copy-link').after(' ', button);
}
