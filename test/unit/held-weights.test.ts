import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { MissingFile, type ModelFiles } from '../../core/model/files.ts';
import { TRANSFORMER_CONFIG, TRANSFORMER_WEIGHTS, loadTransformer } from '../../core/model/transformer.ts';
import { patchify, tokenGrid } from '../../core/model/tokens.ts';
import { SeededRandom } from '../../core/random.ts';
import { writeSafetensors } from '../../core/safetensors.ts';
import type { WeightType } from '../../core/worker-api.ts';
import { modelBounds } from '../../rank/bounds.ts';
import { loadHeld } from '../../rank/engine.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import { hostValues } from '../../rank/stages.ts';
import { tinyModelFiles } from './fixtures.ts';

/** the tiny model's folder with its checkpoint stored as float16, as a published half-precision one is */
let halfFiles: ModelFiles;
const config = async () => tinyModelFiles.read(TRANSFORMER_CONFIG);

beforeAll(async () => {
  const { weights } = await loadTransformer(tinyModelFiles);
  const folder = new Map([
    [TRANSFORMER_CONFIG, await config()],
    [TRANSFORMER_WEIGHTS, writeSafetensors(weights, undefined, 'F16')],
  ]);
  const file = (path: string) => {
    const bytes = folder.get(path);
    if (!bytes) throw new MissingFile(`no ${path}`);
    return bytes;
  };
  halfFiles = {
    read: (path) => Promise.resolve(file(path)),
    readRange: (path, begin, end) => Promise.resolve(file(path).slice(begin, end)),
  };
  // made once a process, not per load, so not counted: onnxruntime's wasm heap views, float16's widening table
  await loadHeld(halfFiles, () => {}, { from: 1, to: 2 }, 'wasm', 'float16');
});

/**
 * The bytes of every Float32Array made with memory of its own while `work` runs (typed arrays' own methods make theirs
 * through the same constructor); views of a buffer (onnxruntime's of its wasm heap) are not counted.
 */
async function float32Made<T>(work: () => Promise<T>): Promise<{ result: T; bytes: number[] }> {
  const bytes: number[] = [];
  class Counted extends Float32Array {
    constructor(...args: unknown[]) {
      super(...(args as []));
      if (!(args[0] instanceof ArrayBuffer || args[0] instanceof SharedArrayBuffer)) bytes.push(this.byteLength);
    }
  }
  vi.stubGlobal('Float32Array', Counted);
  try {
    return { result: await work(), bytes };
  } finally {
    vi.unstubAllGlobals();
  }
}

afterEach(() => vi.unstubAllGlobals());

/** the pieces a test load reads: small beside the tiny model's tensors, as 4 MB is beside a 14B block's */
const PIECE_BYTES = 32 << 10;
/** the pieces a load has in flight (held-weights.ts) */
const IN_FLIGHT = 4;

describe('a stage loads in the type it holds its weights in', () => {
  it.each<[WeightType, { from: number; to: number } | undefined]>([
    ['float16', undefined],
    ['float16', { from: 1, to: 2 }],
    ['int8', { from: 0, to: 1 }],
  ])(
    'as %s, blocks %o of a float16 checkpoint: no float32 array larger than a piece is made, so the load peaks at ≤ 1.3× what it holds',
    async (weightType, blocks) => {
      const { result, bytes } = await float32Made(() =>
        loadHeld(halfFiles, () => {}, blocks, 'wasm', weightType, PIECE_BYTES),
      );
      const held = result.runner.heldWeightBytes;
      const largest = Math.max(...bytes);
      // a piece of float32 and the float16 bytes it was widened from, IN_FLIGHT at a time, beside what is held
      expect(largest).toBeLessThanOrEqual(PIECE_BYTES);
      expect(held + IN_FLIGHT * 1.5 * largest).toBeLessThanOrEqual(1.3 * held);
      // widening a stage whole (loadTransformer) makes float32 arrays of its largest tensors, and of all of them
      const { bytes: whole } = await float32Made(() => loadTransformer(halfFiles, undefined, blocks));
      expect(Math.max(...whole)).toBeGreaterThan(0.3 * held);
      expect(whole.reduce((a, b) => a + b, 0)).toBeGreaterThan(1.9 * held);
    },
  );

  it.each<WeightType>(['float16', 'int8', 'float32'])(
    'as %s, the runner holds and computes what one narrowing the float32 model does, to the bit, and has its bounds',
    async (weightType) => {
      const { runner, bounds } = await loadHeld(halfFiles, () => {}, undefined, 'wasm', weightType, PIECE_BYTES);
      const m = await loadTransformer(halfFiles);
      const narrowed = await onnxStages(m, 'wasm', { weightType });
      expect(runner.heldWeightBytes).toBe(narrowed.heldWeightBytes);
      const random = new SeededRandom(5);
      const latent = { shape: [16, 1, 8, 8], data: random.normals(16 * 64) };
      const patches = patchify(m.config, latent).data;
      const text = random.normals(4 * m.config.textDim);
      const [a, b] = await Promise.all([runner, narrowed].map((r) => r.embed(patches, Float32Array.of(0.5), text)));
      expect(hostValues(a.x)).toEqual(hostValues(b.x));
      const o = random.normals(tokenGrid(m.config, latent.shape).count * m.config.dim);
      const after = await Promise.all(
        [runner, narrowed].map(async (r) =>
          hostValues(await r.postAttention(1, b.x, o, b.tproj, new Int32Array(64 / 4), b.context)),
        ),
      );
      expect(after[0]).toEqual(after[1]);
      // bounds of the values held: float32's are the model's, float16's and int8's within their rounding of them
      const exact = modelBounds(m);
      const tolerance = weightType === 'int8' ? 2e-2 : weightType === 'float16' ? 1e-3 : 0;
      for (const [i, block] of bounds.blocks.entries()) {
        const want = exact.blocks[i];
        if (!block || !want) throw new Error(`block ${i} has no bounds`);
        for (const key of ['q', 'k', 'vRowNorms', 'vBias', 'modulation'] as const)
          block[key].forEach((x, c) =>
            expect(Math.abs(x - want[key][c])).toBeLessThanOrEqual(tolerance * (1 + Math.abs(want[key][c]))),
          );
      }
    },
  );
});
