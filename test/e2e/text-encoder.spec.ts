import { expect, test } from '@playwright/test';
import type { JobOverrides } from '../../app/automation.ts';
import { umt5Encoding, type TextHost } from '../../coordinator/text-encoding.ts';
import { textLayers } from '../../rank/text-layers.ts';
import { unkeptModelFiles } from '../../rank/weight-cache.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { FULL_LAYOUT_MODEL_PATH } from './global-setup.ts';
import { maxAbsDiff, openTestSwarm, runJob, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// A folder whose text encoder is umT5, as the published ones: the dashboard tokenizes the prompt,
// the workers run the encoder's layers (split between them), and the encoded prompts are kept in
// the dashboard's IndexedDB: the same job again encodes nothing.
test("a prompt through umT5's layers on three worker tabs; the same prompts again come from the dashboard's cache, to the same latent", async ({
  browser,
  baseURL,
}) => {
  const swarm = await openTestSwarm(browser, baseURL, 3);
  try {
    const job = {
      prompt: 'a red ball moving right',
      negativePrompt: 'a blue square',
      frames: 5,
      height: 32,
      width: 32,
      steps: 2,
      guidance: 4,
      seed: 5,
      backend: 'swarm',
      workers: 2,
      ep: 'wasm',
      outputType: 'latent',
      model: FULL_LAYOUT_MODEL_PATH,
    } satisfies JobOverrides;
    const first = await runJob(swarm.dashboard, job);
    const { prompt, negativePrompt } = first.report.encoding;
    expect(prompt).toMatchObject({ source: 'encoded', truncated: false });
    expect(prompt.tokens).toBeGreaterThan(1);
    // three layers over the three workers (the job itself runs on two): one layer each
    expect(prompt.layers.map((l) => [l.from, l.to])).toEqual([
      [0, 1],
      [1, 2],
      [2, 3],
    ]);
    expect(new Set(prompt.layers.map((l) => l.worker)).size).toBe(3);
    expect(negativePrompt).toMatchObject({ source: 'encoded' });
    await expect(swarm.dashboard.locator('#status')).toContainText('The prompt was encoded on 3 worker(s) in');

    const second = await runJob(swarm.dashboard, job);
    expect(second.report.encoding.prompt).toMatchObject({ source: 'cache', layers: [] });
    expect(second.report.encoding.negativePrompt).toMatchObject({ source: 'cache' });
    expect(second.latent).toEqual(first.latent);
    await expect(swarm.dashboard.locator('#status')).toContainText('The prompt came from the cache.');

    // the same prompts encoded in this process by one stand-in worker (all three layers), given to the
    // job as embeddings: the three tabs' split encoding is the same numbers (the latent within 1e-5)
    const dir = process.env.DITSWARM_FULL_LAYOUT_DIR;
    if (!dir) return; // a server given from outside: its folder is not on this machine
    const files = folderFiles(dir);
    const oneHost: TextHost = {
      id: 'node',
      pulse: null,
      api: {
        encodeText: (args) => textLayers(() => unkeptModelFiles(files)).encode({ ...args, ep: 'wasm' }),
      },
    };
    const encoding = umt5Encoding({
      modelUrl: 'node',
      files,
      maxLength: 512,
      runs: (numLayers) => Promise.resolve([{ host: oneHost, from: 0, to: numLayers }]),
      convict: (host, why) => {
        throw new Error(`worker ${host.id} in this process was convicted: ${why}`);
      },
      ep: 'wasm',
      timeoutMs: 60_000,
    });
    const asEmbeds = async (text: string) => {
      const { embeds } = await encoding.encode(text);
      return {
        shape: [512, 64],
        base64: Buffer.from(embeds.buffer, embeds.byteOffset, embeds.byteLength).toString('base64'),
      };
    };
    const given = await runJob(swarm.dashboard, {
      ...job,
      promptEmbeds: await asEmbeds(job.prompt),
      negativePromptEmbeds: await asEmbeds(job.negativePrompt),
    });
    expect(given.report.encoding.prompt.source).toBe('given');
    const scale = first.latent.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    expect(maxAbsDiff(given.latent, first.latent) / scale).toBeLessThan(1e-5);
  } finally {
    await swarm.close();
  }
});
