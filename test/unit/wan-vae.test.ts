import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { SeededRandom } from '../../core/random.ts';
import type { TensorMap } from '../../core/safetensors.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import { openWanVae, type WanVaeConfig } from '../../core/model/wan-vae.ts';
import { decodeTileReference } from '../../core/model/wan-vae-reference.ts';
import { onnxVaeDecoder, type VaeTileDecoder } from '../../rank/vae-decoder.ts';
import { folderFiles, writeWanVaeFolder } from '../../server/model-folder.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';

// Wan2.1's VAE at a small width (base 8: decoder widths 32, 32, 32, 16, 8), its published layout and latent statistics
const CONFIG = { ...WAN21_T2V_1_3B.vae, base_dim: 8 };

let dir: string;
let cfg: WanVaeConfig;
let tensors: TensorMap;
// undefined where beforeAll failed before making it
let decoder: VaeTileDecoder | undefined;

const latentOf = (shape: number[], seed: number): Tensor => ({
  shape,
  data: new SeededRandom(seed).normals(shape.reduce((a, b) => a * b, 1)),
});

describe("Wan2.1's VAE decoder on onnxruntime-web", () => {
  // here, not at the file's top: Stryker counts a failed file-level hook as no failed test (its tests are skipped)
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ditswarm-vae-'));
    await writeWanVaeFolder(dir, CONFIG, { seed: '16' });
    const vae = await openWanVae(folderFiles(dir));
    cfg = vae.config;
    tensors = await vae.decoderTensors();
    decoder = await onnxVaeDecoder(cfg, tensors, 'wasm');
  });
  afterAll(async () => {
    await decoder?.release();
    rmSync(dir, { recursive: true, force: true });
  });

  for (const shape of [
    [16, 1, 2, 3],
    [16, 2, 3, 2],
    [16, 3, 4, 4],
  ]) {
    it(`equals the reference on a latent [${shape.join(',')}]`, async () => {
      const latent = latentOf(shape, shape[1]);
      const expected = decodeTileReference(cfg, tensors, latent);
      const got = await defined(decoder, 'the ONNX decoder').decode(latent);
      expect([got.frames, got.channels, got.height, got.width]).toEqual([
        1 + 4 * (shape[1] - 1),
        3,
        8 * shape[2],
        8 * shape[3],
      ]);
      const scale = Math.max(...expected.data.map(Math.abs));
      expect(scale).toBeGreaterThan(0.05);
      expect(maxAbsDiff(got.data, expected.data)).toBeLessThan(1e-4 * Math.max(1, scale));
    });
  }
});
