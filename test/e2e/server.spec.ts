// The ditswarm server is real: it serves both pages cross-origin isolated, and two tabs
// find each other through its PeerServer and exchange binary data over WebRTC.

import { resolve } from 'node:path';
import { expect, test, type Page } from '@playwright/test';
import { defined } from '../../core/defined.ts';
import { addPeerJs } from './peerjs-bundle.ts';
import { CI } from './swarm-page.ts';

const PAYLOAD_BYTES = 200 * 1024; // one data-channel message: under Chromium's 256 KiB limit

for (const path of ['/', '/worker.html']) {
  test(`GET ${path} is 200 with COOP, COEP and CORP, and the page is cross-origin isolated`, async ({ page }) => {
    const response = defined(await page.goto(path), `the response to GET ${path}`);
    expect(response.status()).toBe(200);
    const headers = response.headers();
    expect(headers['cross-origin-opener-policy']).toBe('same-origin');
    expect(headers['cross-origin-embedder-policy']).toBe('require-corp');
    expect(headers['cross-origin-resource-policy']).toBe('same-origin');
    expect(await page.evaluate(() => self.crossOriginIsolated)).toBe(true);
  });
}

test(
  'two tabs connect through the PeerServer and a 200 KiB ArrayBuffer arrives intact',
  CI,
  async ({ context, request }) => {
    const signaling = (await (await request.get('/signaling.json')).json()) as { path: string; key: string };
    const run = Date.now().toString(36);
    const [receiver, sender] = [`receiver-${run}`, `sender-${run}`];
    const receiverPage = await openPeer(await context.newPage(), receiver, signaling);
    const senderPage = await openPeer(await context.newPage(), sender, signaling);

    // no peer discovery: a list of ids would tell anyone which dashboard's id to take when its owner goes (issue 17)
    expect((await request.get(`${signaling.path}/${signaling.key}/peers`)).ok()).toBe(false);

    // Listen before the sender dials, so the connection event cannot be missed.
    await receiverPage.evaluate(() => {
      window.firstMessage = new Promise((resolve) => {
        window.peer.on('connection', (connection) => {
          connection.on('data', (data) => {
            void crypto.subtle.digest('SHA-256', data as ArrayBuffer).then((sha) => {
              const digest = Array.from(new Uint8Array(sha), (byte) => byte.toString(16).padStart(2, '0')).join('');
              resolve({ bytes: (data as ArrayBuffer).byteLength, digest });
            });
          });
        });
      });
    });

    const sent = await senderPage.evaluate(
      ({ to, bytes }) =>
        new Promise<{ digest: string; channelIsExposed: boolean; binaryType: string }>((resolve, reject) => {
          const connection = window.peer.connect(to, { serialization: 'raw', reliable: true });
          connection.on('error', reject);
          const send = async () => {
            const payload = new Uint8Array(bytes);
            let state = 2463534242; // xorshift32: every byte position gets a different value
            for (let i = 0; i < bytes; i++) {
              state ^= state << 13;
              state ^= state >>> 17;
              state ^= state << 5;
              payload[i] = state & 0xff;
            }
            const hash = new Uint8Array(await crypto.subtle.digest('SHA-256', payload));
            void connection.send(payload.buffer);
            return {
              digest: Array.from(hash, (byte) => byte.toString(16).padStart(2, '0')).join(''),
              channelIsExposed: connection.dataChannel instanceof RTCDataChannel,
              binaryType: connection.dataChannel.binaryType,
            };
          };
          connection.on('open', () => void send().then(resolve, reject));
        }),
      { to: receiver, bytes: PAYLOAD_BYTES },
    );

    expect(sent.channelIsExposed).toBe(true);
    expect(sent.binaryType).toBe('arraybuffer');
    expect(await receiverPage.evaluate(() => window.firstMessage)).toEqual({
      bytes: PAYLOAD_BYTES,
      digest: sent.digest,
    });
    await Promise.all([receiverPage, senderPage].map((page) => page.evaluate(() => window.peer.destroy())));
  },
);

declare global {
  interface Window {
    peer: import('peerjs').Peer;
    firstMessage: Promise<{ bytes: number; digest: string }>;
  }
}

/** Loads PeerJS into a page of the app and registers `id` with the PeerServer. */
async function openPeer(page: Page, id: string, signaling: { path: string; key: string }): Promise<Page> {
  await page.goto('/');
  await addPeerJs(page);
  await page.evaluate(
    ({ id, path, key }) =>
      new Promise<void>((resolve, reject) => {
        const options = { host: location.hostname, port: Number(location.port), path, key };
        // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- a bag, not a class
        window.peer = new window.peerjs.Peer(id, options);
        window.peer.on('open', () => resolve());
        window.peer.on('error', reject);
      }),
    { id, ...signaling },
  );
  return page;
}

// `npm start -- --model DIR`: the folder is served with Range requests and the dashboard starts on it.
test('a server started on a model folder serves it by ranges and its dashboard starts on that model', async ({
  browser,
}) => {
  const { servedModel, startServer, LOCAL_MODEL_PATH } = await import('../../server/serve.ts');
  const folder = resolve(import.meta.dirname, '../../public/models/tiny-wan');
  expect(servedModel('https://example.org/Wan2.1-T2V-1.3B-Diffusers')).toEqual({
    defaultModel: 'https://example.org/Wan2.1-T2V-1.3B-Diffusers',
  });
  const server = await startServer({ port: 0, quiet: true, ...servedModel(folder) });
  const context = await browser.newContext();
  try {
    expect(await (await fetch(`${server.url}/models.json`)).json()).toEqual({ default: LOCAL_MODEL_PATH, loras: [] });
    const ranged = await fetch(`${server.url}${LOCAL_MODEL_PATH}/transformer/diffusion_pytorch_model.safetensors`, {
      headers: { Range: 'bytes=0-7' },
    });
    expect(ranged.status).toBe(206);
    expect((await ranged.arrayBuffer()).byteLength).toBe(8);
    const dashboard = await context.newPage();
    // the dashboard reads the served folder's config (its head count decides the degree menu), not the bundled one
    const configRead = dashboard.waitForResponse(
      (r) => new URL(r.url()).pathname === `${LOCAL_MODEL_PATH}/transformer/config.json` && r.ok(),
    );
    const bundledRead: string[] = [];
    dashboard.on('request', (r) => {
      if (new URL(r.url()).pathname.startsWith('/models/tiny-wan/')) bundledRead.push(r.url());
    });
    await dashboard.goto(`${server.url}/`);
    await dashboard.evaluate(() => window.ditswarm.ready);
    await configRead;
    await expect(dashboard.locator('input[name=model]')).toHaveValue(LOCAL_MODEL_PATH);
    await expect(dashboard.locator('select[name=degree] option')).toHaveText(['auto', '1']);
    expect(bundledRead).toEqual([]);
  } finally {
    await context.close();
    await server.close();
  }
});
