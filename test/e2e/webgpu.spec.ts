import { expect, test } from '@playwright/test';
import type { JobOverrides } from '../../app/automation.ts';
import { CI, maxAbsDiff, runJob, suiteSwarm } from './swarm-page.ts';

// The WebGPU path keeps each rank's weights, residual stream and conditioning in GPU buffers (SwiftShader here).
test.describe.serial('WebGPU worker: device-resident activations', CI, () => {
  const swarm = suiteSwarm(1);
  const job = {
    prompt: 'a red ball',
    frames: 5,
    height: 32,
    width: 32,
    steps: 2,
    guidance: 1,
    seed: 7,
    backend: 'swarm',
    workers: 1,
  } satisfies JobOverrides;

  test('x, temb, tproj and context stay on the GPU: the latent equals WASM within 5e-4, only q/k/v, o and rows are read back, nothing leaks', async () => {
    test.setTimeout(300_000);
    const worker = swarm.workers[0];
    const totals = () =>
      worker.evaluate(() => {
        if (!window.ditswarmWorker) throw new Error('the worker page has shown no status yet');
        return { ...window.ditswarmWorker.totals };
      });
    const measured = async (ep: 'webgpu' | 'wasm') => {
      const before = await totals();
      const run = await runJob(swarm.dashboard, { ...job, ep });
      // 2 steps, one pass each (no guidance)
      await expect.poll(async () => (await totals()).steps).toBe(before.steps + 2);
      const after = await totals();
      const bytes = {
        downloaded: after.bytesDownloaded - before.bytesDownloaded,
        kept: after.bytesKept - before.bytesKept,
        tensorsLeft: after.deviceTensorsLeft,
      };
      const stepMs = run.report.steps.map((s) => s.ms.toFixed(0)).join('/');
      console.log(`${ep}: downloaded ${bytes.downloaded} B, kept on device ${bytes.kept} B, step ms ${stepMs}`);
      return { run, bytes };
    };
    const gpu = await measured('webgpu');
    expect(gpu.run.report.workers[0].ep).toBe('webgpu');
    // the blocks' weights live in GPU buffers: float32 here (SwiftShader has no shader-f16); the
    // stages are cut to the adapter's largest binding (SwiftShader: 1 GiB), which the report gives
    expect(gpu.run.report.workers[0]).toMatchObject({ weightType: 'float32', maxBufferBytes: 2 ** 30 });
    expect(gpu.run.report.workers[0].gpuWeightBytes).toBeGreaterThan(0);
    const cpu = await measured('wasm');
    expect(cpu.run.report.workers[0]).toMatchObject({ ep: 'wasm', gpuWeightBytes: 0 });

    const diff = maxAbsDiff(gpu.run.latent, cpu.run.latent);
    console.log(`webgpu (device-resident) vs wasm: max-abs ${diff.toExponential(2)}`);
    // SwiftShader's WebGPU kernels differ from WASM's by ~2e-4 here whether or not x stays on the GPU
    // (the same run reading every output back gave a bit-identical latent); 5e-4 leaves room for that only
    expect(diff).toBeLessThanOrEqual(5e-4);

    // 8 tokens (2 × 4 × 4 latent, 1×2×2 patches) × D 288, 2 blocks, 2 passes: per block q, k, v and o
    // come down (4·S·D floats), then the rows (S·64)
    const [S, D, layers, passes] = [8, 288, 2, 2];
    expect(gpu.bytes.downloaded).toBe(passes * 4 * (4 * S * D * layers + S * 64));
    expect(cpu.bytes.kept).toBe(0);
    expect(gpu.bytes.kept).toBeGreaterThan(0);
    expect(gpu.bytes.downloaded + gpu.bytes.kept).toBe(cpu.bytes.downloaded); // WASM reads every output
    expect(gpu.bytes.tensorsLeft).toBe(0);
  });
});
