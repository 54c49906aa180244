// What a video shows, read the simple way: the foreground blob is the largest region of pixels far
// from the background (the median colour of the frame's border); its colour is the palette colour
// whose direction away from the background is closest to the foreground's mean offset from it (so
// pixels the shape only partly covers, which mix in the background, still count for its colour);
// its motion is the shift of its centroid from the first frame to the last. Used to score the demo
// model and to check decoded frames in the e2e test.

import { BACKGROUND, COLOURS, PALETTE, type Colour, type Direction } from './world.ts';

export interface Detection {
  colour: Colour | 'none';
  direction: Direction | 'none';
  /** mean foreground RGB minus the background */
  offset: [number, number, number];
  /** centroid shift first → last frame, pixels (y down) */
  dx: number;
  dy: number;
  /** mean foreground area per frame, pixels */
  area: number;
}

export interface Frames {
  count: number;
  height: number;
  width: number;
  rgb: Float32Array; // [3, count, height, width]
}

/** A pixel belongs to the foreground when its RGB distance to the background exceeds this. */
const FOREGROUND_DISTANCE = 0.25;
/** Below this many pixels a frame is called empty. */
const MIN_AREA = 6;
/** A centroid moving less than this many pixels over the clip is standing still. */
const STILL_PIXELS = 4;

interface Blob {
  area: number;
  cx: number;
  cy: number;
  /** summed RGB offsets from the background */
  sum: [number, number, number];
}

export function detect(video: Frames): Detection {
  const blobs = Array.from({ length: video.count }, (_, f) => frameBlob(video, f));
  const area = blobs.reduce((n, b) => n + b.area, 0) / video.count;
  const total = blobs.reduce<[number, number, number]>(
    (s, b) => [s[0] + b.sum[0], s[1] + b.sum[1], s[2] + b.sum[2]],
    [0, 0, 0],
  );
  const pixels = blobs.reduce((n, b) => n + b.area, 0);
  const offset: [number, number, number] = pixels
    ? [total[0] / pixels, total[1] / pixels, total[2] / pixels]
    : [0, 0, 0];
  const first = blobs[0];
  const last = blobs[blobs.length - 1];
  if (first.area < MIN_AREA || last.area < MIN_AREA)
    return { colour: 'none', direction: 'none', offset, dx: 0, dy: 0, area };
  const dx = last.cx - first.cx;
  const dy = last.cy - first.cy;
  return { colour: colourOf(offset), direction: directionOf(dx, dy), offset, dx, dy, area };
}

/** The palette colour whose offset from the background points most nearly the same way (cosine). */
export function colourOf(offset: readonly number[]): Colour {
  let best: Colour = COLOURS[0];
  let bestCosine = -Infinity;
  for (const c of COLOURS) {
    const direction = PALETTE[c].map((v, i) => v - BACKGROUND[i]);
    const cosine =
      direction.reduce((s, v, i) => s + v * offset[i], 0) / Math.hypot(...direction) / (Math.hypot(...offset) || 1);
    if (cosine > bestCosine) [best, bestCosine] = [c, cosine];
  }
  return best;
}

export function directionOf(dx: number, dy: number): Direction {
  if (Math.hypot(dx, dy) < STILL_PIXELS) return 'still';
  if (Math.abs(dx) >= Math.abs(dy)) return dx > 0 ? 'right' : 'left';
  return dy > 0 ? 'down' : 'up';
}

/**
 * The foreground blob of one frame: the largest 8-connected region of pixels far from the
 * background (specks elsewhere do not pull its centroid), its area, centroid and summed colour.
 */
function frameBlob(video: Frames, f: number): Blob {
  const { count, height: H, width: W, rgb } = video;
  const plane = H * W;
  const at = (c: number, p: number) => rgb[(c * count + f) * plane + p];
  const background = borderMedian(video, f);
  const foreground = new Uint8Array(plane);
  for (let p = 0; p < plane; p++)
    foreground[p] =
      Math.hypot(at(0, p) - background[0], at(1, p) - background[1], at(2, p) - background[2]) > FOREGROUND_DISTANCE
        ? 1
        : 0;
  const label = new Int32Array(plane).fill(-1);
  let best: number[] = [];
  for (let seed = 0; seed < plane; seed++) {
    if (!foreground[seed] || label[seed] >= 0) continue;
    const region = [seed];
    label[seed] = seed;
    for (let i = 0; i < region.length; i++) {
      const p = region[i];
      const [y, x] = [Math.floor(p / W), p % W];
      for (let dy = -1; dy <= 1; dy++)
        for (let dx = -1; dx <= 1; dx++) {
          const [ny, nx] = [y + dy, x + dx];
          const q = ny * W + nx;
          if (ny < 0 || ny >= H || nx < 0 || nx >= W || !foreground[q] || label[q] >= 0) continue;
          label[q] = seed;
          region.push(q);
        }
    }
    if (region.length > best.length) best = region;
  }
  const sum: [number, number, number] = [0, 0, 0];
  let cx = 0;
  let cy = 0;
  for (const p of best) {
    cx += (p % W) + 0.5;
    cy += Math.floor(p / W) + 0.5;
    for (let c = 0; c < 3; c++) sum[c] += at(c, p) - background[c];
  }
  const area = best.length;
  return { area, cx: area ? cx / area : W / 2, cy: area ? cy / area : H / 2, sum };
}

function borderMedian(video: Frames, f: number): number[] {
  const { count, height: H, width: W, rgb } = video;
  const border: number[] = [];
  for (let x = 0; x < W; x++) border.push(x, (H - 1) * W + x);
  for (let y = 1; y < H - 1; y++) border.push(y * W, y * W + W - 1);
  return [0, 1, 2].map((c) => {
    const values = border.map((p) => rgb[(c * count + f) * H * W + p]).sort((a, b) => a - b);
    return values[values.length >> 1];
  });
}
