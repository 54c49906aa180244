import { describe, expect, it } from 'vitest';
import { framesOf, type Frames } from '../../core/model/wan-vae.ts';
import { blendTiles, cutTile, tilesOf, type VaeTile } from '../../core/model/wan-vae-tiling.ts';

// diffusers' tiled_decode's arithmetic on tiles of constant colour, where every blended value can be written by hand:
// tiles of 24 pixels (3 latent) every 16 (2 latent), so neighbours blend over 8 pixels with weights x/8. The
// decoder itself, and tiles of a real decoding, are held to diffusers in wan-vae-reference.test.ts.
const TILING = { tile: 24, stride: 16 };
const FRAMES = 2;

/** Tile i decoded: frames [F, 3, 8·height, 8·width], every value `level(i) + 0.1·frame − 0.05·channel`. */
const decodedOf = (tiles: VaeTile[], level: (i: number) => number): Frames[] =>
  tiles.map((tile, i) => {
    const frames = framesOf(FRAMES, 3, 8 * tile.height, 8 * tile.width);
    const plane = frames.height * frames.width;
    for (let t = 0; t < FRAMES; t++)
      for (let c = 0; c < 3; c++)
        frames.data.fill(level(i) + 0.1 * t - 0.05 * c, (t * 3 + c) * plane, (t * 3 + c + 1) * plane);
    return frames;
  });

/** The value of tile levels blended along a line of 40 pixels (tiles at 0, 16 and 32), clamped to [−1, 1]. */
const along = (levels: number[], at: number): number => {
  const [a, b, c] = levels;
  const x = (at % 16) / 8;
  const v = at < 16 ? a : at < 24 ? a * (1 - x) + b * x : at < 32 ? b : b * (1 - x) + c * x;
  return Math.min(1, Math.max(-1, v));
};

describe("diffusers' tiled decode, on tiles of one colour", () => {
  const levels = [0.5, -0.5, 2];

  it('cuts a latent into a row of tiles every stride, the last one short, and blends each into the one before it over tile − stride pixels', () => {
    const tiles = tilesOf(2, 5, TILING);
    expect(tiles).toEqual([
      { row: 0, col: 0, y: 0, x: 0, height: 2, width: 3 },
      { row: 0, col: 1, y: 0, x: 2, height: 2, width: 3 },
      { row: 0, col: 2, y: 0, x: 4, height: 2, width: 1 },
    ]);
    const video = blendTiles(
      tiles,
      decodedOf(tiles, (i) => levels[i]),
      2,
      5,
      TILING,
    );
    expect(video.shape).toEqual([3, FRAMES, 16, 40]);
    for (let c = 0; c < 3; c++)
      for (let t = 0; t < FRAMES; t++)
        for (const y of [0, 9, 15])
          for (let x = 0; x < 40; x++)
            expect(video.data[((c * FRAMES + t) * 16 + y) * 40 + x], `c ${c}, t ${t}, y ${y}, x ${x}`).toBeCloseTo(
              along(
                levels.map((l) => l + 0.1 * t - 0.05 * c),
                x,
              ),
              6,
            );
  });

  it('blends a column of tiles from the one above, the same way', () => {
    const tiles = tilesOf(5, 2, TILING);
    expect(tiles.map((t) => [t.row, t.col, t.y, t.height])).toEqual([
      [0, 0, 0, 3],
      [1, 0, 2, 3],
      [2, 0, 4, 1],
    ]);
    const video = blendTiles(
      tiles,
      decodedOf(tiles, (i) => levels[i]),
      5,
      2,
      TILING,
    );
    expect(video.shape).toEqual([3, FRAMES, 40, 16]);
    for (let y = 0; y < 40; y++)
      for (const x of [0, 7, 15])
        expect(video.data[((2 * FRAMES + 1) * 40 + y) * 16 + x], `channel 2, frame 1, y ${y}, x ${x}`).toBeCloseTo(
          along(
            levels.map((l) => l + 0.1 * 1 - 0.05 * 2),
            y,
          ),
          6,
        );
  });

  it('blends a grid tile first from above, then from the left, each neighbour as already blended', () => {
    // 2×2 tiles of levels a b / c d (24, 16 pixels): each blends 8 rows from above, then 8 columns from its left
    const tiles = tilesOf(4, 4, TILING);
    expect(tiles.map((t) => [t.row, t.col, t.height, t.width])).toEqual([
      [0, 0, 3, 3],
      [0, 1, 3, 2],
      [1, 0, 2, 3],
      [1, 1, 2, 2],
    ]);
    const [a, b, c, d] = [0.8, -0.4, 0.2, -0.8];
    const video = blendTiles(
      tiles,
      decodedOf(tiles, (i) => [a, b, c, d][i]),
      4,
      4,
      TILING,
    );
    expect(video.shape).toEqual([3, FRAMES, 32, 32]);
    const at = (y: number, x: number) => video.data[y * 32 + x]; // channel 0, frame 0
    // 4 pixels into a blend: half of each
    const bFromA = (a + b) / 2; // b's columns 0-7 take a's
    const cFromA = (a + c) / 2; // c's rows 0-7 take a's
    const dFromB = (bFromA + d) / 2; // d's rows take b's as b blended them
    expect(at(20, 20)).toBeCloseTo((cFromA + dFromB) / 2, 6); // then d's columns take c's as c blended them
    expect(at(20, 0)).toBeCloseTo(cFromA, 6);
    expect(at(0, 20)).toBeCloseTo(bFromA, 6);
    expect(at(31, 31)).toBeCloseTo(d, 6);
    expect(at(31, 16)).toBeCloseTo(c, 6);
    expect(at(16, 31)).toBeCloseTo(b, 6);
    expect(at(15, 15)).toBeCloseTo(a, 6);
  });

  it('keeps a latent that fits one tile whole, unblended but clamped', () => {
    const tiles = tilesOf(3, 2, TILING);
    expect(tiles).toEqual([{ row: 0, col: 0, y: 0, x: 0, height: 3, width: 2 }]);
    const video = blendTiles(
      tiles,
      decodedOf(tiles, () => 0.95),
      3,
      2,
      TILING,
    );
    expect(video.shape).toEqual([3, FRAMES, 24, 16]);
    expect(video.data[0]).toBeCloseTo(0.95, 6);
    expect(video.data[(0 * FRAMES + 1) * 24 * 16 + 23 * 16 + 15]).toBe(1); // frame 1: 1.05, clamped
    expect(video.data[(2 * FRAMES + 0) * 24 * 16 + 5]).toBeCloseTo(0.85, 6);
  });

  it("cuts a tile's latent rows and columns from every channel and frame", () => {
    // latent [2, 2, 3, 4] whose value is its index
    const latent = { shape: [2, 2, 3, 4], data: Float32Array.from({ length: 48 }, (_, i) => i) };
    const part = cutTile(latent, { row: 1, col: 1, y: 1, x: 2, height: 2, width: 2 });
    expect(part.shape).toEqual([2, 2, 2, 2]);
    // each (channel, frame) plane of 12 starts at 12·ct; rows 1-2, columns 2-3
    expect([...part.data]).toEqual([0, 12, 24, 36].flatMap((p) => [p + 6, p + 7, p + 10, p + 11]));
  });
});
