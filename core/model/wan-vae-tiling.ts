// diffusers' tiled decode of AutoencoderKLWan (tiled_decode): overlapping tiles of the latent, each
// decoded on its own, blended where they overlap. The workers decode the tiles, the coordinator blends.
// With Wan2.2's patches (patch p = 2) a tile decodes to patch frames [F, 3·p², 8h, 8w]; diffusers
// blends those, in their own pixels (tile and stride divided by p), and unpatchifies the whole.

import type { Tensor } from '../tensor.ts';
import { SCALE_FACTOR_SPATIAL, unpatchify, type Frames } from './wan-vae.ts';

/** diffusers' defaults: 256-pixel tiles every 192 pixels */
export const TILE_PIXELS = 256;
export const TILE_STRIDE_PIXELS = 192;

/** A tile: latent rows [y, y + height) and columns [x, x + width); row and column in the grid. */
export interface VaeTile {
  row: number;
  col: number;
  y: number;
  x: number;
  height: number;
  width: number;
}

export interface Tiling {
  /** tile and stride in video pixels (multiples of 8·p) */
  tile: number;
  stride: number;
}

/**
 * The tiles diffusers' tiled_decode makes of an h×w latent (one tile when it fits in one, as _decode
 * decides), for a VAE whose patches are p×p.
 */
export function tilesOf(h: number, w: number, { tile, stride }: Tiling, patch = 1): VaeTile[] {
  const [t, s] = [tile / (SCALE_FACTOR_SPATIAL * patch), stride / (SCALE_FACTOR_SPATIAL * patch)];
  if (h <= t && w <= t) return [{ row: 0, col: 0, y: 0, x: 0, height: h, width: w }];
  const tiles: VaeTile[] = [];
  for (let y = 0, row = 0; y < h; y += s, row++)
    for (let x = 0, col = 0; x < w; x += s, col++)
      tiles.push({ row, col, y, x, height: Math.min(t, h - y), width: Math.min(t, w - x) });
  return tiles;
}

/** Tile `tile`'s latent [C, T, tile.height, tile.width] cut from [C, T, h, w]. */
export function cutTile(latent: Tensor, tile: VaeTile): Tensor {
  const [C, T, h, w] = latent.shape;
  const data = new Float32Array(C * T * tile.height * tile.width);
  for (let ct = 0; ct < C * T; ct++)
    for (let y = 0; y < tile.height; y++) {
      const from = (ct * h + tile.y + y) * w + tile.x;
      data.set(latent.data.subarray(from, from + tile.width), (ct * tile.height + y) * tile.width);
    }
  return { shape: [C, T, tile.height, tile.width], data };
}

/**
 * Decoded tiles blended as tiled_decode blends them, in its order and in place (each tile takes
 * the rows above from the finished tile above it, then the columns to its left from the finished
 * tile before it), each cropped to the stride, joined, unpatchified, clamped to [−1, 1]:
 * video [3, F, 8p·h, 8p·w].
 */
export function blendTiles(
  tiles: VaeTile[],
  decoded: Frames[],
  h: number,
  w: number,
  tiling: Tiling,
  patch = 1,
): Tensor {
  const { frames: F, channels: C } = decoded[0];
  if (C !== 3 * patch * patch)
    throw new Error(
      `decoded tiles of ${C} channels are not RGB in ${patch}×${patch} patches (${3 * patch * patch} channels): ` +
        `blend them with the VAE's patch_size (${Math.sqrt(C / 3)})`,
    );
  const [H, W] = [h * SCALE_FACTOR_SPATIAL, w * SCALE_FACTOR_SPATIAL];
  const stride = tiling.stride / patch;
  const blend = tiling.tile / patch - stride;
  const byPlace = new Map(tiles.map((t, i) => [`${t.row},${t.col}`, decoded[i]]));
  const single = tiles.length === 1;
  const out = new Float32Array(C * F * H * W);
  for (const [i, tile] of tiles.entries()) {
    const b = decoded[i];
    const above = byPlace.get(`${tile.row - 1},${tile.col}`);
    const left = byPlace.get(`${tile.row},${tile.col - 1}`);
    const at = (f: Frames, t: number, c: number, y: number, x: number) => ((t * C + c) * f.height + y) * f.width + x;
    if (above) {
      const extent = Math.min(above.height, b.height, blend);
      // Stryker disable next-line EqualityOperator: t = F writes past the end of a typed array, which does nothing
      for (let t = 0; t < F; t++)
        for (let c = 0; c < C; c++)
          for (let y = 0; y < extent; y++)
            for (let x = 0; x < b.width; x++)
              b.data[at(b, t, c, y, x)] =
                above.data[at(above, t, c, above.height - extent + y, x)] * (1 - y / extent) +
                b.data[at(b, t, c, y, x)] * (y / extent);
    }
    if (left) {
      const extent = Math.min(left.width, b.width, blend);
      // Stryker disable next-line EqualityOperator: t = F writes past the end of a typed array, which does nothing
      for (let t = 0; t < F; t++)
        for (let c = 0; c < C; c++)
          for (let y = 0; y < b.height; y++)
            for (let x = 0; x < extent; x++)
              b.data[at(b, t, c, y, x)] =
                left.data[at(left, t, c, y, left.width - extent + x)] * (1 - x / extent) +
                b.data[at(b, t, c, y, x)] * (x / extent);
    }
    // the part of this tile the video keeps: up to the stride (all of it when it is the only one)
    const [y0, x0] = [tile.y * SCALE_FACTOR_SPATIAL, tile.x * SCALE_FACTOR_SPATIAL];
    // Stryker disable next-line ArithmeticOperator: tilesOf's tiles end in the latent: H − y0 ≥ b.height
    const keepH = single ? b.height : Math.min(stride, b.height, H - y0);
    // Stryker disable next-line ArithmeticOperator: tilesOf's tiles end in the latent: W − x0 ≥ b.width
    const keepW = single ? b.width : Math.min(stride, b.width, W - x0);
    for (let t = 0; t < F; t++)
      // Stryker disable next-line EqualityOperator: c = C writes past the end of a typed array, which does nothing
      for (let c = 0; c < C; c++)
        for (let y = 0; y < keepH; y++)
          for (let x = 0; x < keepW; x++)
            out[((c * F + t) * H + y0 + y) * W + x0 + x] = Math.min(1, Math.max(-1, b.data[at(b, t, c, y, x)]));
  }
  return unpatchify({ shape: [C, F, H, W], data: out }, patch);
}
