// Wan2.1's VAE encoder (the plan encoderPlan makes without is_residual), in the plain TypeScript
// reference and as ONNX graphs, held to diffusers' AutoencoderKLWan: wan-vae-encode.fixture.json is
// what test/reference/wan_vae_numpy.py (a line-by-line numpy transcription of autoencoder_kl_wan.py,
// run in float64) gives for the tiny seeded Wan2.1 VAE of wan-vae.fixture.json. Regenerate it with
// `npx tsx test/reference/make-wan-vae-fixture.ts wan2.1-encode`.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { parseWanVaeConfig } from '../../core/model/wan-vae.ts';
import {
  ENCODE_FIXTURE_PATH,
  INIT,
  seededVaeTensors,
  seededVideo,
  TINY_VAE_CONFIG,
  VIDEO_INIT,
} from '../reference/make-wan-vae-fixture.ts';
import { onnxVaeEncoder, type VaeEncoder } from '../../rank/vae-encoder.ts';
import { expectCase, readVaeFixture, runCase } from './vae-fixture-check.ts';

const fixture = readVaeFixture(ENCODE_FIXTURE_PATH);
const cfg = parseWanVaeConfig(fixture.config, 'wan-vae-encode.fixture.json');
const tensors = seededVaeTensors(cfg, fixture.seed);

/** As wan22-vae-reference.test.ts's: ten times the float32 rounding that the reference and the graphs carry. */
const TOLERANCE = 2e-5;

describe("Wan2.1's VAE encoder against diffusers' AutoencoderKLWan (numpy, float64)", () => {
  let encoder: VaeEncoder | undefined;
  beforeAll(async () => {
    encoder = await onnxVaeEncoder(cfg, tensors);
  });
  afterAll(async () => {
    await encoder?.release();
  });

  it('uses the fixture as it was made', () => {
    expect(fixture.config).toEqual(TINY_VAE_CONFIG);
    expect(fixture.init).toBe(`${INIT}; ${VIDEO_INIT}`);
    expect(fixture.cases.map((c) => c.name)).toEqual(['an image', 'nine frames']);
    expect([cfg.isResidual, cfg.patchSize]).toEqual([false, 1]);
  });

  for (const c of fixture.cases) {
    const shape = c.videoShape ?? [];
    it(`encodes ${c.name} [${shape.join(',')}] in the reference`, () => {
      expectCase(c, fixture.seed, runCase(cfg, tensors, fixture.seed, c).out, TOLERANCE);
    });
    it(`encodes ${c.name} [${shape.join(',')}] in the ONNX graphs`, async () => {
      const latent = await defined(encoder, 'the ONNX encoder').encode(seededVideo(fixture.seed, shape));
      expectCase(c, fixture.seed, latent, TOLERANCE);
    });
  }
});
