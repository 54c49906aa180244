// PeerJS's published browser bundle in a page of the app: what the test pages that are no part of
// the product (bare peers, an attacker) reach the signaling server with.
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import type { Page } from '@playwright/test';

const PEERJS_BUNDLE = resolve(import.meta.dirname, '../../node_modules/peerjs/dist/peerjs.min.js');

/** Adds the bundle to `page`: window.peerjs from then on. */
export async function addPeerJs(page: Page): Promise<void> {
  await page.addScriptTag({ content: await readFile(PEERJS_BUNDLE, 'utf8') });
}

declare global {
  interface Window {
    /** the bundle's exports, once addPeerJs added it */
    peerjs: typeof import('peerjs');
  }
}
