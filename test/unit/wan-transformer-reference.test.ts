// The transformer forward the workers run (the ONNX stages on onnxruntime-web's wasm, alone and split
// over Ulysses ranks) and core/model/reference.ts, held to diffusers' WanTransformer3DModel as the
// upstream Python computes it: wan-transformer.fixture.json is what test/reference/
// wan_transformer_numpy.py (a float64 numpy transcription of transformer_wan.py) gives for seeded
// folders in the published layout, one with the 1.3B's heads stored as float32 and one with the
// 14B's 40 heads stored as bfloat16. Regenerate it with
// `npx tsx test/reference/make-wan-transformer-fixture.ts`; this test makes the same folders and
// inputs without Python and loads them by the loader a worker uses.

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readFileSync } from 'node:fs';
import * as ort from 'onnxruntime-web';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseWanConfig } from '../../core/model/config.ts';
import { randomForwardInputs, readForwardInputs } from '../../core/model/forward-io.ts';
import { referenceForward, type WanModel } from '../../core/model/reference.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import type { Tensor } from '../../core/tensor.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import { forwardInProcess } from '../../rank/ulysses.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { applyLoras } from '../../core/model/lora.ts';
import {
  CASES,
  FIXTURE_PATH,
  LORA_FILE,
  writeCaseFolder,
  writeCaseLora,
  type FixtureCase,
} from '../reference/make-wan-transformer-fixture.ts';

const fixture = JSON.parse(readFileSync(FIXTURE_PATH, 'utf8')) as {
  cases: (FixtureCase & { shape: number[]; sample: number[] })[];
};

/**
 * Largest difference from diffusers' float64 output, relative to its largest value. A float32
 * forward stays a few 1e-6 from it; the narrowest wrong reading tried, GELU's erf form in place of
 * its tanh approximation, moves it 1e-4 (a RoPE pair turned the other way or the output head's
 * shift and scale swapped: 3e-2 and more).
 */
const TOLERANCE = 1e-5;
/** the blocks' weights rounded to float16 (11 bits of mantissa) move the output 2–3e-4 of its largest value */
const HALF_WEIGHTS_TOLERANCE = 1e-3;

function relativeError(out: Tensor, expected: number[]): number {
  let [diff, scale] = [0, 0];
  expected.forEach((v, i) => {
    diff = Math.max(diff, Math.abs(out.data[i] - v));
    scale = Math.max(scale, Math.abs(v));
  });
  return diff / scale;
}

describe.each(CASES)("diffusers' WanTransformer3DModel on $name", (c) => {
  const expected = fixture.cases.find((f) => f.name === c.name);
  let dir: string;
  let model: WanModel;
  let inputs: ReturnType<typeof readForwardInputs>;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ditswarm-wan-transformer-'));
    await writeCaseFolder(c, dir);
    model = await loadTransformer(folderFiles(dir));
    if (c.lora) {
      // the adapter as a worker reads one: through its folder's files, merged into the loaded weights
      writeCaseLora(c, dir);
      await applyLoras(model, [{ url: join(dir, LORA_FILE), strength: c.lora.strength }], () => ({
        files: folderFiles(dir),
        path: LORA_FILE,
      }));
    }
    inputs = readForwardInputs(model.config, randomForwardInputs(parseWanConfig(c.config, c.name), c.input), c.name);
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));

  it('is in the fixture, made from this config and these inputs', () => {
    expect(expected, `no fixture case "${c.name}": regenerate the fixture`).toBeDefined();
    expect({ config: expected?.config, dtype: expected?.dtype, input: expected?.input, lora: expected?.lora }).toEqual({
      config: c.config,
      dtype: c.dtype,
      input: c.input,
      lora: c.lora,
    });
    expect(expected?.shape).toEqual([1, ...inputs.latent.shape]);
  });

  it('the plain TypeScript reference equals it within 1e-5 of its largest value', () => {
    const out = referenceForward(model, inputs.latent, inputs.timestep, inputs.text);
    expect(relativeError(out, expected?.sample ?? [])).toBeLessThan(TOLERANCE);
  });

  it.each([1, 4])(
    'the ONNX stages on wasm over %i Ulysses rank(s) equal it within 1e-5 of its largest value',
    async (degree) => {
      ort.env.wasm.numThreads = 1;
      const stages = await onnxStages(model, 'wasm');
      const out = await forwardInProcess(
        model.config,
        stages,
        memoryExchanges(degree),
        inputs.latent,
        inputs.timestep,
        inputs.text,
      );
      expect(relativeError(out, expected?.sample ?? [])).toBeLessThan(TOLERANCE);
    },
  );

  it("the ONNX stages on wasm holding the blocks' weights as float16 are within 1e-3 of it: a bfloat16 checkpoint's within 1e-5", async () => {
    ort.env.wasm.numThreads = 1;
    const stages = await onnxStages(model, 'wasm', { weightType: 'float16' });
    expect(stages.weightType).toBe('float16');
    const out = await forwardInProcess(
      model.config,
      stages,
      memoryExchanges(2),
      inputs.latent,
      inputs.timestep,
      inputs.text,
    );
    const error = relativeError(out, expected?.sample ?? []);
    console.log(`${c.name}: float16 weights ${error.toExponential(2)} of the largest value from diffusers'`);
    // a bfloat16 checkpoint's weights (8 bits of mantissa) are float16's (11) exactly: nothing lost; a float32 one's
    // rounded, and further than held as float32
    if (c.dtype === 'BF16') expect(error).toBeLessThan(TOLERANCE);
    else expect(error).toBeGreaterThan(TOLERANCE);
    expect(error).toBeLessThan(HALF_WEIGHTS_TOLERANCE);
  });
});
