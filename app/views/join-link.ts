import qrcode from 'qrcode-generator';
import { $ } from './dom.ts';

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
