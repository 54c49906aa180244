import { expect, test } from '@playwright/test';
import type { AutomationProgress, JobOverrides } from '../../app/automation.ts';
import { defined } from '../../core/defined.ts';
import { parseWanVaeConfig } from '../../core/model/wan-vae.ts';
import { tiledDecoding, type TileHost } from '../../coordinator/vae-decoding.ts';
import { vaeTiles } from '../../rank/vae-tiles.ts';
import { unkeptModelFiles } from '../../rank/weight-cache.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { FULL_LAYOUT_MODEL_PATH, FULL_LAYOUT_VAE } from './global-setup.ts';
import { CI, maxAbsDiff, openTestSwarm, runJob } from './swarm-page.ts';

// A folder of the published classes (umT5, AutoencoderKLWan, UniPC) at small widths: a text
// prompt goes prompt → umT5 → transformer → VAE on the workers, the dashboard saying how far
// each phase is, and the VAE's tiles (diffusers' 256-pixel tiles: 4 of them at 256×320) decode
// to the same video on three tabs, on two, on one, and on one worker in this process.
test(
  "a prompt through umT5, the transformer and AutoencoderKLWan's tiles on three tabs plays in the dashboard; its tiles decode alike on 3 tabs, 2, 1, and one worker in Node",
  CI,
  async ({ browser, baseURL }) => {
    // a job and four decodes of the full-layout folder: over 4 minutes on a machine busy with other work
    test.setTimeout(420_000);
    const swarm = await openTestSwarm(browser, baseURL, 3);
    try {
      const phases: { phase: string; detail?: string }[] = [];
      await swarm.dashboard.exposeFunction('ditswarmProgress', (p: AutomationProgress) => {
        if ('phase' in p) phases.push({ phase: p.phase, detail: p.detail });
      });
      const job = {
        prompt: 'a red ball moving right',
        negativePrompt: 'a blue square',
        frames: 5,
        height: 256,
        width: 320,
        steps: 2,
        guidance: 4,
        seed: 7,
        backend: 'swarm',
        workers: 2,
        ep: 'wasm',
        model: FULL_LAYOUT_MODEL_PATH,
      } satisfies JobOverrides;
      const { report, latent } = await runJob(swarm.dashboard, job);
      expect(report.schedule.scheduler).toBe('UniPCMultistepScheduler');
      expect(report.encoding.prompt.source).toBe('encoded');
      expect(report.decoding).toMatchObject({
        where: 'workers',
        tiles: 4,
        tiling: { tile: 256, stride: 192 },
        retried: 0,
      });
      const { ranks } = defined(report.decoding, 'the decoding report');
      expect(ranks.reduce((n, r) => n + r.tiles, 0)).toBe(4);
      for (const r of ranks) expect(r.weightBytes).toBeGreaterThan(0);
      // every phase said how far it was: the text encoder's layers per worker, then the tiles one by one
      expect(
        phases.some((p) => p.phase === 'encoding' && /text encoder layers 1–1 of 3 on worker/.test(p.detail ?? '')),
      ).toBe(true);
      // (a worker still reading the decoder's weights a second into its first tile says so in between)
      const decoding = phases.flatMap((p) => (p.phase === 'decoding' && p.detail ? [p.detail] : []));
      expect(decoding.filter((d) => !/; worker \S+ reading the decoder's weights: /.test(d))).toEqual([
        'tile 1 of 4',
        'tile 2 of 4',
        'tile 3 of 4',
        'tile 4 of 4',
      ]);
      const shown = await swarm.dashboard.evaluate(() => window.ditswarm.inspectVideo());
      expect(shown).toMatchObject({ videoWidth: 320, videoHeight: 256 });
      // the first job of the dashboard counted only what was measured (not the encoding, the load nor the tiles); the
      // same job again is estimated from this one: its prompts cached, its workers holding the model
      expect(report.estimate.unmeasured.map((u) => u.split(':')[0])).toEqual(
        expect.arrayContaining(['encoding', 'placing', 'decoding']),
      );
      const again = await swarm.dashboard.evaluate((j) => window.ditswarm.estimate(j), job);
      console.log(`estimate of the same job again: ${JSON.stringify(again)}; the first took ${report.totalMs} ms`);
      expect(again.unmeasured).toEqual(['placing: no job here was placed on workers holding this model yet']);
      expect(again.phasesMs.encoding).toBe(0);
      // the workers hold the model now: no job placed on workers holding it has measured placing yet
      expect(again.loadBytes).toBe(0);
      expect(again.phasesMs.decoding).toBeCloseTo(report.phasesMs.decoding, 6);

      const dir = process.env.DITSWARM_FULL_LAYOUT_DIR;
      if (!dir) return; // a server given from outside: its folder is not on this machine
      const latentArg = {
        shape: report.latentShape,
        base64: Buffer.from(latent.buffer, latent.byteOffset, latent.byteLength).toString('base64'),
      };
      const decodeOnTabs = async () => {
        const { video, report: decoding } = await swarm.dashboard.evaluate((a) => window.ditswarm.decode(a), {
          model: FULL_LAYOUT_MODEL_PATH,
          latent: latentArg,
        });
        const bytes = Buffer.from(video.base64, 'base64');
        return {
          shape: video.shape,
          data: new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4),
          decoding,
        };
      };
      const onThree = await decodeOnTabs();
      expect(onThree.shape).toEqual([3, 5, 256, 320]);
      expect(new Set(onThree.decoding.ranks.filter((r) => r.tiles > 0).map((r) => r.worker)).size).toBeGreaterThan(1);

      await swarm.workers[2].close();
      await expect
        .poll(() => swarm.dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 })
        .toBe(2);
      const onTwo = await decodeOnTabs();
      await swarm.workers[1].close();
      await expect
        .poll(() => swarm.dashboard.evaluate(() => window.ditswarm.workerCount()), { timeout: 30_000 })
        .toBe(1);
      const onOne = await decodeOnTabs();
      expect(onOne.decoding.ranks.filter((r) => r.tiles > 0)).toHaveLength(1);
      expect(maxAbsDiff(onThree.data, onOne.data)).toBeLessThan(1e-5);
      expect(maxAbsDiff(onTwo.data, onOne.data)).toBeLessThan(1e-5);

      // one worker in this process: the same tiles, one after another
      const files = folderFiles(dir);
      const tiles = vaeTiles(() => unkeptModelFiles(files));
      const host: TileHost = {
        id: 'node',
        pulse: null,
        api: { decodeTile: (args) => tiles.decode({ ...args, ep: 'wasm' }) },
      };
      const one = tiledDecoding({
        modelUrl: 'node',
        files,
        config: parseWanVaeConfig(FULL_LAYOUT_VAE, 'test'),
        tileHosts: () => Promise.resolve({ hosts: [host], maxBufferBytes: Infinity }),
        convict: (worker, why) => {
          throw new Error(`worker ${worker.id} in this process was convicted: ${why}`);
        },
        ep: 'wasm',
        timeoutMs: 120_000,
      });
      const alone = await one.decode({ shape: report.latentShape, data: latent });
      expect(alone.report.ranks).toEqual([expect.objectContaining({ worker: 'node', tiles: 4 })]);
      const video = defined(alone.video, "AutoencoderKLWan's video");
      const scale = video.data.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
      expect(scale).toBeGreaterThan(0.1);
      expect(maxAbsDiff(onThree.data, video.data)).toBeLessThan(1e-5);
      expect(maxAbsDiff(onTwo.data, video.data)).toBeLessThan(1e-5);
    } finally {
      await swarm.close();
    }
  },
);

// On WebGPU the decoder's weights are uploaded to GPU buffers once and the causal caches stay in GPU
// buffers between a tile's chunks (SwiftShader here, slow: a small latent).
test("AutoencoderKLWan's tiles on a WebGPU worker equal WASM's", async ({ browser, baseURL }) => {
  test.setTimeout(240_000);
  const swarm = await openTestSwarm(browser, baseURL, 1);
  try {
    const shape = [16, 3, 2, 3];
    const data = Float32Array.from({ length: 16 * 3 * 2 * 3 }, (_, i) => Math.sin(i * 0.7));
    const latent = { shape, base64: Buffer.from(data.buffer).toString('base64') };
    const decode = async (ep: 'webgpu' | 'wasm') => {
      const { video } = await swarm.dashboard.evaluate((a) => window.ditswarm.decode(a), {
        model: FULL_LAYOUT_MODEL_PATH,
        latent,
        ep,
      });
      const bytes = Buffer.from(video.base64, 'base64');
      expect(video.shape).toEqual([3, 9, 16, 24]);
      return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    };
    const gpu = await decode('webgpu');
    const cpu = await decode('wasm');
    const diff = maxAbsDiff(gpu, cpu);
    console.log(`VAE webgpu vs wasm: max-abs ${diff.toExponential(2)}`);
    expect(cpu.some((v) => Math.abs(v) > 0.1)).toBe(true);
    expect(diff).toBeLessThan(5e-4);
  } finally {
    await swarm.close();
  }
});
