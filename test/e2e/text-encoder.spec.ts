import { expect, test } from '@playwright/test';
import { UMT5_MODEL_PATH } from './global-setup.ts';
import { openTestSwarm, runJob } from './swarm-page.ts';

// A folder whose text encoder is umT5, as the published ones: the dashboard tokenizes the prompt,
// the workers run the encoder's layers (split between them), and the encoded prompts are kept in
// the dashboard's IndexedDB: the same job again encodes nothing.
test("a prompt through umT5's layers on two worker tabs; the same prompts again come from the dashboard's cache, to the same latent", async ({ browser, baseURL }) => {
  const swarm = await openTestSwarm(browser, baseURL!, 2);
  try {
    const job = { prompt: 'a red ball moving right', negativePrompt: 'a blue square', frames: 5, height: 32, width: 32, steps: 2, guidance: 4, seed: 5, backend: 'swarm', workers: 2, ep: 'wasm', outputType: 'latent', model: UMT5_MODEL_PATH };
    const first = await runJob(swarm.dashboard, job);
    const { prompt, negativePrompt } = first.report.encoding;
    expect(prompt).toMatchObject({ source: 'encoded', truncated: false });
    expect(prompt.tokens).toBeGreaterThan(1);
    // three layers over the two workers: [0, 1) on one, [1, 3) on the other
    expect(prompt.layers.map((l: any) => [l.from, l.to])).toEqual([[0, 1], [1, 3]]);
    expect(new Set(prompt.layers.map((l: any) => l.worker)).size).toBe(2);
    expect(negativePrompt).toMatchObject({ source: 'encoded' });

    const second = await runJob(swarm.dashboard, job);
    expect(second.report.encoding.prompt).toMatchObject({ source: 'cache', layers: [] });
    expect(second.report.encoding.negativePrompt).toMatchObject({ source: 'cache' });
    expect(second.latent).toEqual(first.latent);
  } finally {
    await swarm.close();
  }
});
