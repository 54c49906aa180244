// Wan2.2's VAE in a model folder: writeWanVaeFolder makes it in the published layout (seeded random
// weights, as nothing can be downloaded here), openWanVae reads it back, the decoder's and the
// encoder's tensors checked against the config, and the decoder's output bound covers its 12 patch
// channels.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  decoderHeadNames,
  decoderOutputBound,
  decoderWeightShapes,
  encoderWeightShapes,
  openWanVae,
  type WanVaeCheckpoint,
} from '../../core/model/wan-vae.ts';
import { decodeTileReference } from '../../core/model/wan-vae-reference.ts';
import { folderFiles, writeWanVaeFolder } from '../../server/model-folder.ts';
import { SEED, seededLatent, seededVaeTensors, TINY_VAE22_CONFIG } from '../reference/make-wan-vae-fixture.ts';

let dir: string;
let vae: WanVaeCheckpoint;

describe("writeWanVaeFolder and openWanVae with Wan2.2's VAE", () => {
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ditswarm-vae22-'));
    await writeWanVaeFolder(dir, TINY_VAE22_CONFIG, { seed: SEED });
    vae = await openWanVae(folderFiles(dir));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("writes the fixture's weights, and reads back the decoder's and the encoder's tensors by name", async () => {
    expect(vae.config).toMatchObject({ isResidual: true, patchSize: 2, zDim: 48 });
    const seeded = seededVaeTensors(vae.config, SEED);
    const decoder = await vae.decoderTensors();
    const encoder = await vae.encoderTensors();
    expect([...decoder.keys()].sort()).toEqual([...decoderWeightShapes(vae.config).keys()].sort());
    expect([...encoder.keys()].sort()).toEqual([...encoderWeightShapes(vae.config).keys()].sort());
    for (const [name, t] of [...decoder, ...encoder]) expect(t.data, name).toEqual(seeded.get(name)?.data);
    expect(vae.decoderBytes).toBe(4 * [...decoder.values()].reduce((n, t) => n + t.data.length, 0));
  });

  it("bounds each of the decoder's 12 patch channels, and the decoded frames stay within", async () => {
    const decoder = await vae.decoderTensors();
    const bound = decoderOutputBound(vae.config, await vae.decoderTensors(decoderHeadNames(vae.config)));
    expect(bound).toHaveLength(12);
    const frames = decodeTileReference(vae.config, decoder, seededLatent(SEED, [48, 2, 2, 2]));
    const plane = frames.height * frames.width;
    for (let c = 0; c < 12; c++) {
      let largest = 0;
      for (let t = 0; t < frames.frames; t++)
        for (let p = 0; p < plane; p++) largest = Math.max(largest, Math.abs(frames.data[(t * 12 + c) * plane + p]));
      expect(largest, `channel ${c}`).toBeLessThanOrEqual(bound[c]);
      expect(largest, `channel ${c}`).toBeGreaterThan(0);
    }
  });
});
