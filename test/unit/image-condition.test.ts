// core/model/image-condition.ts held to diffusers' WanImageToVideoPipeline before its VAE:
// image-condition.fixture.json is what test/reference/image_condition_numpy.py (a numpy
// transcription of diffusers' VaeImageProcessor.preprocess and Pillow's Resample.c, written
// apart from the TypeScript) makes of seeded images, and the values here are worked by hand from
// Pillow's filter. Regenerate the fixture with `npx tsx test/reference/make-image-condition-fixture.ts`.

import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  dropAlpha,
  imageConditionVideo,
  imageProblem,
  lanczosAxisWeights,
  resizeLanczos,
} from '../../core/model/image-condition.ts';
import { IMAGE_CASES, IMAGE_FIXTURE_PATH, IMAGE_INIT, seededImage } from '../reference/make-image-condition-fixture.ts';

interface FixtureCase {
  name: string;
  image: { width: number; height: number };
  video: { width: number; height: number };
  video32: string;
}
const fixture = JSON.parse(readFileSync(IMAGE_FIXTURE_PATH, 'utf8')) as {
  seed: string;
  init: string;
  cases: FixtureCase[];
};
const floats = (b64: string) => {
  const bytes = Buffer.from(b64, 'base64');
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
};

describe("an image as diffusers' WanImageToVideoPipeline hands it to the VAE", () => {
  it('uses the fixture as it was made', () => {
    expect(fixture.init).toBe(IMAGE_INIT);
    expect(fixture.cases.map((c) => [c.name, c.image, c.video])).toEqual(
      IMAGE_CASES.map((c) => [c.name, c.image, c.video]),
    );
  });

  for (const c of fixture.cases)
    it(`stretches ${c.image.width}×${c.image.height} to ${c.video.width}×${c.video.height} (${c.name}) to the bit of PIL's LANCZOS and diffusers' 2x − 1`, () => {
      const video = imageConditionVideo(seededImage(fixture.seed, c.image.width, c.image.height), {
        height: c.video.height,
        width: c.video.width,
      });
      expect(video.shape).toEqual([3, 1, c.video.height, c.video.width]);
      const expected = floats(c.video32);
      let differing = 0;
      for (let i = 0; i < expected.length; i++) if (video.data[i] !== expected[i]) differing++;
      expect(differing).toBe(0);
    });

  it("weighs as Pillow does: halving [0, 255] is 128 (two taps of ½, rounded up), and each output's weights sum to 2²²", () => {
    // scale 2: support 6, center 1, inputs 0 and 1 at ±¼ of the filter's width, weights ½ and ½
    const half = lanczosAxisWeights(2, 1);
    expect([half.first[0], half.count[0], half.weights[0], half.weights[1]]).toEqual([0, 2, 1 << 21, 1 << 21]);
    const row = { data: Uint8Array.from([0, 0, 0, 255, 255, 255]), width: 2, height: 1 };
    expect([...resizeLanczos(row, 1, 1).data]).toEqual([128, 128, 128]);
    for (const [from, to] of [
      [61, 48],
      [23, 32],
      [190, 48],
      [7, 48],
    ]) {
      const axis = lanczosAxisWeights(from, to);
      for (let i = 0; i < to; i++) {
        const sum = axis.weights.subarray(i * axis.taps, i * axis.taps + axis.count[i]).reduce((a, b) => a + b, 0);
        // each weight rounded to 22 bits on its own: the sum within half a unit per tap of 2²²
        expect(Math.abs(sum - (1 << 22)), `${from}→${to}, output ${i}`).toBeLessThanOrEqual(axis.count[i] / 2);
      }
    }
  });

  it('keeps a flat colour flat, drops alpha without blending, and leaves an image of the video size as it is', () => {
    const flat = { data: new Uint8ClampedArray(4 * 13 * 7), width: 13, height: 7 };
    for (let p = 0; p < 13 * 7; p++) flat.data.set([200, 10, 77, p % 256], 4 * p);
    const video = imageConditionVideo(flat, { height: 16, width: 32 });
    const plane = 16 * 32;
    for (const [c, byte] of [200, 10, 77].entries())
      expect(new Set(video.data.subarray(c * plane, (c + 1) * plane))).toEqual(
        new Set([Math.fround(2 * Math.fround(byte / 255) - 1)]),
      );
    const image = seededImage('same', 16, 8);
    const same = resizeLanczos(dropAlpha(image), 16, 8);
    expect(same.data).toEqual(dropAlpha(image).data);
    // channels are planes in RGB order: red first
    const red = { data: Uint8ClampedArray.from([255, 0, 0, 255]), width: 1, height: 1 };
    expect([...imageConditionVideo(red, { height: 1, width: 1 }).data]).toEqual([1, -1, -1]);
  });

  it('refuses an image whose bytes are not its size, and sizes of no pixels, saying what it expected', () => {
    expect(imageProblem({ data: new Uint8Array(11), width: 3, height: 1 })).toBe(
      'an RGBA image of 3×1 has 12 bytes, got 11',
    );
    expect(imageProblem({ data: new Uint8Array(0), width: 0, height: 4 })).toMatch(/^an image is 1 to 16384 pixels/);
    expect(() => imageConditionVideo(seededImage('x', 4, 4), { height: 0, width: 16 })).toThrow(
      'the video is 1 to 16384 pixels each way, got 16×0',
    );
  });
});
