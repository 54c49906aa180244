import { describe, expect, it } from 'vitest';
import { detect } from '../../demo/detector.ts';
import { encodeClip, PATCH_VAE_CONFIG, patchVaeWeights } from '../../demo/patch-vae.ts';
import {
  ALL_COMBOS,
  allFrames,
  BACKGROUND,
  CLIP,
  COLOURS,
  DIRECTIONS,
  HELD_OUT_COMBOS,
  MOTION,
  parsePrompt,
  promptOf,
  renderClip,
  sampleClip,
  SHAPES,
  TRAINING_COMBOS,
} from '../../demo/world.ts';
import {
  decodeLatent,
  decodePatchLatent,
  loadVaeDecoder,
  PATCH_VAE_DECODER_CLASS,
} from '../../core/model/vae-decoder.ts';
import { SeededRandom } from '../../core/random.ts';
import { writeSafetensors } from '../../core/safetensors.ts';

describe('the demo world', () => {
  it('has 75 prompt combinations, 35 for training and 40 held out, and training sees every pair of words together', () => {
    expect(ALL_COMBOS).toHaveLength(75);
    expect(TRAINING_COMBOS).toHaveLength(35);
    expect(HELD_OUT_COMBOS).toHaveLength(40);
    const trained = new Set(TRAINING_COMBOS.map(promptOf));
    expect(HELD_OUT_COMBOS.filter((c) => trained.has(promptOf(c)))).toEqual([]);
    const pairs = (f: (c: (typeof ALL_COMBOS)[number]) => string) => new Set(TRAINING_COMBOS.map(f)).size;
    expect(pairs((c) => `${c.colour} ${c.direction}`)).toBe(COLOURS.length * DIRECTIONS.length);
    expect(pairs((c) => `${c.colour} ${c.shape}`)).toBe(COLOURS.length * SHAPES.length);
    expect(pairs((c) => `${c.shape} ${c.direction}`)).toBe(SHAPES.length * DIRECTIONS.length);
  });

  it('writes prompts from the grammar and reads them back', () => {
    expect(promptOf({ colour: 'red', shape: 'square', direction: 'left' })).toBe('a red square moving left');
    expect(promptOf({ colour: 'blue', shape: 'circle', direction: 'still' })).toBe('a blue circle standing still');
    for (const c of ALL_COMBOS) expect(parsePrompt(promptOf(c))).toEqual(c);
    expect(parsePrompt('a red ball bouncing on a wooden floor')).toBeNull();
    expect(parsePrompt('a red square moving still')).toBeNull();
  });

  it('keeps the whole shape inside the frame for the whole clip', () => {
    const random = new SeededRandom(3);
    for (const c of ALL_COMBOS) {
      const spec = sampleClip(c, random);
      const reach = spec.size / 2;
      const travel = spec.speed * (CLIP.frames - 1);
      for (const t of [0, travel]) {
        const x = spec.x + (c.direction === 'right' ? t : c.direction === 'left' ? -t : 0);
        const y = spec.y + (c.direction === 'down' ? t : c.direction === 'up' ? -t : 0);
        expect(Math.min(x - reach, y - reach)).toBeGreaterThanOrEqual(0);
        expect(Math.max(x + reach, y + reach)).toBeLessThanOrEqual(CLIP.width);
      }
    }
  });
});

describe('the demo detector', () => {
  const random = new SeededRandom(11);
  const clips = ALL_COMBOS.flatMap((combo) => [0, 1].map(() => ({ combo, spec: sampleClip(combo, random) })));

  it('reads the colour and direction of every rendered ground-truth clip (150 clips, all 75 combinations)', () => {
    const wrong = clips.filter(({ combo, spec }) => {
      const seen = detect({
        count: CLIP.frames,
        height: CLIP.height,
        width: CLIP.width,
        rgb: renderClip(spec, allFrames(CLIP.frames)),
      });
      return seen.colour !== combo.colour || seen.direction !== combo.direction;
    });
    expect(wrong.map(({ combo }) => promptOf(combo))).toEqual([]);
  });

  it('reads them just as well after the patch VAE: encode the clip, decode all 9 frames', () => {
    const weights = patchVaeWeights();
    const wrong = clips.filter(({ combo, spec }) => {
      const latent = encodeClip(spec, CLIP.frames, CLIP.height, CLIP.width);
      const seen = detect(decodePatchLatent(weights, latent, PATCH_VAE_CONFIG));
      return seen.colour !== combo.colour || seen.direction !== combo.direction;
    });
    expect(wrong.map(({ combo }) => promptOf(combo))).toEqual([]);
  });

  it('calls an empty frame "none" rather than guessing', () => {
    const rgb = renderClip(sampleClip(ALL_COMBOS[0], new SeededRandom(1)), allFrames(CLIP.frames)).fill(0.06);
    expect(detect({ count: CLIP.frames, height: CLIP.height, width: CLIP.width, rgb })).toMatchObject({
      colour: 'none',
      direction: 'none',
    });
  });
});

describe('the patch VAE', () => {
  it('is exact on every frame up to 4×4 quadrant averaging: decode(encode(clip)) = the quadrant means of the clip', () => {
    for (const [i, direction] of DIRECTIONS.entries()) {
      const spec = sampleClip({ colour: 'yellow', shape: 'triangle', direction }, new SeededRandom(5 + i));
      const rgb = renderClip(spec, allFrames(CLIP.frames));
      const latent = encodeClip(spec, CLIP.frames, CLIP.height, CLIP.width);
      expect(latent.shape).toEqual([16, 3, 8, 8]);
      const video = decodePatchLatent(patchVaeWeights(), latent, PATCH_VAE_CONFIG);
      expect([video.count, video.height, video.width]).toEqual([9, 64, 64]);
      let worst = 0;
      for (let o = 0; o < 3; o++)
        for (let f = 0; f < 9; f++)
          for (let y = 0; y < 64; y++)
            for (let x = 0; x < 64; x++) {
              // frame f is frame 0's quadrant means moved by f·speed (what it uncovers is background)
              const [mx, my] = MOTION[direction];
              const sx = x - spec.speed * f * mx;
              const sy = y - spec.speed * f * my;
              let mean = sx < 0 || sx > 63 || sy < 0 || sy > 63 ? BACKGROUND[o] : 0;
              if (!mean)
                for (let a = 0; a < 4; a++)
                  for (let b = 0; b < 4; b++) mean += rgb[(o * 9 * 64 + (sy & ~3) + a) * 64 + (sx & ~3) + b] / 16;
              worst = Math.max(worst, Math.abs(video.rgb[((o * 9 + f) * 64 + y) * 64 + x] - mean));
            }
      expect(worst, direction).toBeLessThan(1e-5);
      // the motion channels hold the direction; the last two stay zero
      const plane = 3 * 64;
      expect([latent.data[12 * plane], latent.data[13 * plane]]).toEqual(MOTION[direction].map((m) => 2 * m));
      expect(latent.data.subarray(14 * plane).every((v) => v === 0)).toBe(true);
    }
  });

  it('loads by its _class_name beside the PixelVaeDecoder, which decodes as before', async () => {
    const read = (path: string) =>
      Promise.resolve(
        path === 'vae/config.json'
          ? new TextEncoder().encode(JSON.stringify({ _class_name: PATCH_VAE_DECODER_CLASS }))
          : writeSafetensors(patchVaeWeights()),
      );
    const files = {
      read,
      readRange: async (path: string, begin: number, end: number) => (await read(path)).subarray(begin, end),
    };
    const decode = await loadVaeDecoder(files);
    const latent = { shape: [16, 2, 1, 1], data: new SeededRandom(2).normals(32) };
    expect(decode(latent).rgb).toEqual(decodePatchLatent(patchVaeWeights(), latent).rgb);
    const pixel = new Map([
      ['conv_out.weight', { shape: [3, 16], data: new Float32Array(48).fill(0.1) }],
      ['conv_out.bias', { shape: [3], data: new Float32Array(3) }],
    ]);
    const frames = decodeLatent(pixel, { shape: [16, 2, 1, 1], data: new Float32Array(32).fill(1) });
    expect([frames.count, frames.height, frames.width]).toEqual([5, 8, 8]);
    expect(frames.rgb[0]).toBeCloseTo(1 / (1 + Math.exp(-1.6)), 6);
  });
});
