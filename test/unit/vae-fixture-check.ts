// The fixtures of test/reference/make-wan-vae-fixture.ts as the VAE tests read them: each case run by
// the reference (encoded, decoded whole, or decoded in diffusers' tiles), and held to the case: the
// sampled values one by one, then each (frame, channel) plane's sum, the sum and the sum of squares.

import { readFileSync } from 'node:fs';
import { expect } from 'vitest';
import type { WanVaeConfig } from '../../core/model/wan-vae.ts';
import {
  decodeTileReference,
  decodeWanVaeReference,
  encodeWanVaeReference,
} from '../../core/model/wan-vae-reference.ts';
import { blendTiles, cutTile, tilesOf } from '../../core/model/wan-vae-tiling.ts';
import type { TensorMap } from '../../core/safetensors.ts';
import { sizeOf, type Tensor } from '../../core/tensor.ts';
import { seededLatent, seededVideo, summarise } from '../reference/make-wan-vae-fixture.ts';

export interface SummaryCase {
  name: string;
  shape: number[];
  sum: number;
  sumOfSquares: number;
  frameChannelSums: number[][];
  positions: number[];
  values: number[];
}

export interface VaeFixtureCase extends SummaryCase {
  /** decoded: [z_dim, T, h, w] */
  latentShape?: number[];
  /** encoded: [3, F, H, W] */
  videoShape?: number[];
  tiling: { tile: number; stride: number } | null;
  tiles: number;
}

export interface VaeFixture {
  config: Record<string, unknown>;
  seed: string;
  init: string;
  cases: VaeFixtureCase[];
}

export const readVaeFixture = (path: string) => JSON.parse(readFileSync(path, 'utf8')) as VaeFixture;

/** A case's output by the reference, and how many tiles it decoded in (0: untiled). */
export function runCase(
  cfg: WanVaeConfig,
  tensors: TensorMap,
  seed: string,
  c: VaeFixtureCase,
): { out: Tensor; tiles: number } {
  if (c.videoShape) return { out: encodeWanVaeReference(cfg, tensors, seededVideo(seed, c.videoShape)), tiles: 0 };
  const latent = seededLatent(seed, c.latentShape ?? []);
  if (!c.tiling) return { out: decodeWanVaeReference(cfg, tensors, latent), tiles: 0 };
  const [, , h, w] = latent.shape;
  const tiles = tilesOf(h, w, c.tiling, cfg.patchSize);
  const decoded = tiles.map((tile) => decodeTileReference(cfg, tensors, cutTile(latent, tile)));
  return { out: blendTiles(tiles, decoded, h, w, c.tiling, cfg.patchSize), tiles: tiles.length };
}

/** The largest |Δ| over the case's sampled values, and where it is ([channel, frame, y, x]). */
export function worstSample(c: SummaryCase, seed: string, out: Tensor): { worst: number; at: number[] } {
  const ours = summarise(c.name, seed, out.shape, out.data);
  expect(ours.positions).toEqual(c.positions);
  let worst = 0;
  let where = -1;
  ours.values.forEach((v, i) => {
    const d = Math.abs(v - c.values[i]);
    if (d > worst) [worst, where] = [d, c.positions[i]];
  });
  const [, F, H, W] = c.shape;
  const at = [Math.floor(where / (F * H * W)), Math.floor(where / (H * W)) % F, Math.floor(where / W) % H, where % W];
  return { worst, at };
}

/** The output equals the case to `tolerance` per value: sampled values, plane sums, sum, sum of squares. */
export function expectCase(c: SummaryCase, seed: string, out: Tensor, tolerance: number): void {
  expect(out.shape).toEqual(c.shape);
  const { worst, at } = worstSample(c, seed, out);
  expect(
    worst,
    `max |Δ| over ${c.values.length} sampled values, worst at [c, t, y, x] = [${at.join(',')}]`,
  ).toBeLessThan(tolerance);
  const ours = summarise(c.name, seed, out.shape, out.data);
  const n = sizeOf(c.shape);
  const plane = c.shape[2] * c.shape[3];
  ours.frameChannelSums.forEach((row, t) =>
    row.forEach((s, ch) =>
      expect(Math.abs(s - c.frameChannelSums[t][ch]), `sum of frame ${t}, channel ${ch}`).toBeLessThan(
        tolerance * plane,
      ),
    ),
  );
  expect(Math.abs(ours.sum - c.sum)).toBeLessThan(tolerance * n);
  expect(Math.abs(ours.sumOfSquares - c.sumOfSquares)).toBeLessThan(tolerance * n);
}
