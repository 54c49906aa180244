import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { loadTransformer } from '../../core/model/transformer.ts';
import { RankLayout } from '../../core/parallel.ts';
import { SeededRandom } from '../../core/random.ts';
import type { Tensor } from '../../core/tensor.ts';
import type { EngineApi } from '../../rank/engine.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import { stubEngine, tinyModelFiles } from './fixtures.ts';
import { InProcessExecutor, type InProcessOptions } from './in-process-executor.ts';

// Which forwards the executor checks, and who checks them, come from crypto.getRandomValues, one draw
// per forward (issue 33): the draws are set here through it, so the test sees the executor take them.
let engine: EngineApi;
let options: InProcessOptions;
const random = new SeededRandom(33);
let text: Float32Array;
const latent = (): Tensor => ({ shape: [16, 1, 14, 10], data: random.normals(16 * 14 * 10) });

beforeAll(async () => {
  const model = await loadTransformer(tinyModelFiles);
  engine = stubEngine(await onnxStages(model, 'wasm'), model.config);
  text = random.normals(16 * model.config.textDim);
  options = { config: model.config, modelUrl: '/models/tiny-wan', rpcTimeoutMs: 10_000, layout: new RankLayout(2) };
});

/** The next draws crypto.getRandomValues gives, as fractions of 2^32; the real CSPRNG's once they are taken. */
function drawsFromCrypto(draws: number[]): void {
  vi.restoreAllMocks();
  const real = crypto.getRandomValues.bind(crypto);
  vi.spyOn(crypto, 'getRandomValues').mockImplementation((array: ArrayBufferView) => {
    const next = draws.shift();
    if (next === undefined || !(array instanceof Uint32Array)) return real(array);
    array.fill(next * 2 ** 32);
    return array;
  });
}

afterEach(() => vi.restoreAllMocks());

describe("the executor's spot checks (issue 33)", () => {
  it("draw each forward on its own from the CSPRNG: the unconditional pass alone can be checked, by the rank drawn, and a job's final step always is", async () => {
    const executor = new InProcessExecutor({ ...options, spotCheckRate: 0.5 }, engine, 'rpc');
    await executor.initialize();
    await executor.prepareJob(4, [text, text], [16, 1, 14, 10]);
    const x = latent();
    // step 1 of 3: the conditional pass's draw above the rate, the unconditional's under it, then the checker: rank 1
    drawsFromCrypto([0.9, 0.1, 0.75]);
    await executor.velocity({ job: 4, step: 0, steps: 3, timestep: 500, latent: x }, 4);
    expect(executor.takeSpotChecks().map(({ step, pass, checker }) => ({ step, pass, checker }))).toEqual([
      { step: 0, pass: 1, checker: 1 },
    ]);
    expect(executor.received[1]).toContain('recompute');
    // the final step: both passes checked whatever is drawn
    drawsFromCrypto([0.99, 0.99]);
    await executor.velocity({ job: 4, step: 2, steps: 3, timestep: 400, latent: x }, 4);
    expect(executor.takeSpotChecks().map((c) => [c.step, c.pass, c.verdict])).toEqual([
      [2, 0, 'agreed'],
      [2, 1, 'agreed'],
    ]);
    await executor.shutdown({ graceMs: 500 });
  });
});
