// The demo model's procedural world: one shape of one colour moving in one direction (or standing
// still) on a plain dark background, with its prompt from a small grammar. Clips are rendered on
// the fly from a seed, so the data set is the generator; a fixed split of the 75 prompt
// combinations keeps some for evaluation only.

import { SeededRandom } from '../core/random.ts';
import { DEFAULT_JOB } from '../core/job.ts';

export const COLOURS = ['red', 'green', 'blue', 'yellow', 'white'] as const;
export const SHAPES = ['circle', 'square', 'triangle'] as const;
export const DIRECTIONS = ['left', 'right', 'up', 'down', 'still'] as const;

export type Colour = (typeof COLOURS)[number];
export type Shape = (typeof SHAPES)[number];
export type Direction = (typeof DIRECTIONS)[number];

export interface Combo {
  colour: Colour;
  shape: Shape;
  direction: Direction;
}

/** RGB in [0, 1]; far enough apart that the detector's nearest-colour rule separates them. */
export const PALETTE: Record<Colour, [number, number, number]> = {
  red: [0.92, 0.12, 0.12],
  green: [0.12, 0.8, 0.2],
  blue: [0.15, 0.3, 0.95],
  yellow: [0.95, 0.85, 0.1],
  white: [0.95, 0.95, 0.95],
};
export const BACKGROUND: [number, number, number] = [0.06, 0.06, 0.08];

/** Unit steps in image coordinates (y grows downward). */
export const MOTION: Record<Direction, [number, number]> = {
  left: [-1, 0],
  right: [1, 0],
  up: [0, -1],
  down: [0, 1],
  still: [0, 0],
};

export function promptOf(c: Combo): string {
  return c.direction === 'still'
    ? `a ${c.colour} ${c.shape} standing still`
    : `a ${c.colour} ${c.shape} moving ${c.direction}`;
}

/** The grammar read back: the combination a prompt names, or null when it is not one of ours. */
export function parsePrompt(prompt: string): Combo | null {
  const m = /^a (\w+) (\w+) (?:moving (\w+)|standing (still))$/.exec(prompt.trim().toLowerCase());
  if (!m) return null;
  const [, colour, shape] = m;
  // one of the two alternatives matched: the other's group is undefined
  const moving = m.at(3);
  const still = m.at(4);
  const direction = moving ?? still;
  if (
    !COLOURS.includes(colour as Colour) ||
    !SHAPES.includes(shape as Shape) ||
    !DIRECTIONS.includes(direction as Direction) ||
    moving === 'still'
  )
    return null;
  return { colour: colour as Colour, shape: shape as Shape, direction: direction as Direction };
}

export const ALL_COMBOS: Combo[] = COLOURS.flatMap((colour) =>
  SHAPES.flatMap((shape) => DIRECTIONS.map((direction) => ({ colour, shape, direction }))),
);

/**
 * 35 training combinations, 40 held out. Training keeps, for each colour × direction pair, the
 * shape (c + d) mod 3, which also covers every colour × shape and shape × direction pair, plus
 * the shape (c + d + 1) mod 3 for left and right; a held-out prompt is a new combination of
 * words the model has each seen with every other.
 */
export function isTrainingCombo(c: Combo): boolean {
  const ci = COLOURS.indexOf(c.colour);
  const si = SHAPES.indexOf(c.shape);
  const di = DIRECTIONS.indexOf(c.direction);
  return (ci + di) % 3 === si || (di < 2 && (ci + di + 1) % 3 === si);
}

export const TRAINING_COMBOS = ALL_COMBOS.filter(isTrainingCombo);
export const HELD_OUT_COMBOS = ALL_COMBOS.filter((c) => !isTrainingCombo(c));

export interface ClipSpec extends Combo {
  /** centre at frame 0, pixels */
  x: number;
  y: number;
  /** circumscribed diameter, pixels */
  size: number;
  /** pixels per frame along the direction */
  speed: number;
}

export const CLIP = { frames: DEFAULT_JOB.frames, height: DEFAULT_JOB.height, width: DEFAULT_JOB.width } as const;
/** How to sample the demo model (the product's default job is made for it). */
export const DEMO_SAMPLING = { ...CLIP, steps: DEFAULT_JOB.steps, guidance: DEFAULT_JOB.guidance } as const;

const SIZE = { min: 14, max: 20 };
/**
 * Pixels per frame: 4, so a moving shape crosses at least 32 of the 64 pixels over a 9-frame
 * clip, far beyond the detector's threshold for standing still; the VAE's unit of motion.
 */
export const SPEED = 4;
const MARGIN = 1;

/** A clip's layout from a seed: anywhere the shape stays wholly inside the frame for the whole clip. */
export function sampleClip(
  combo: Combo,
  random: SeededRandom,
  frames: number = CLIP.frames,
  height: number = CLIP.height,
  width: number = CLIP.width,
): ClipSpec {
  const size = SIZE.min + (SIZE.max - SIZE.min) * random.uniform();
  const speed = combo.direction === 'still' ? 0 : SPEED;
  const [mx, my] = MOTION[combo.direction];
  const travel = speed * (frames - 1);
  const r = size / 2 + MARGIN;
  // the range of starting centres that keeps start and end inside [r, side − r]
  const range = (side: number, m: number): [number, number] => [
    r + Math.max(0, -m * travel),
    side - r - Math.max(0, m * travel),
  ];
  const [x0, x1] = range(width, mx);
  const [y0, y1] = range(height, my);
  return { ...combo, size, speed, x: x0 + (x1 - x0) * random.uniform(), y: y0 + (y1 - y0) * random.uniform() };
}

/** Fraction of the pixel (px, py) (its unit square) that the shape covers, by 4×4 supersampling. */
function coverage(shape: Shape, cx: number, cy: number, size: number, px: number, py: number): number {
  const r = size / 2;
  let inside = 0;
  for (let a = 0; a < 4; a++)
    for (let b = 0; b < 4; b++) {
      const dx = px + (b + 0.5) / 4 - cx;
      const dy = py + (a + 0.5) / 4 - cy;
      if (insideShape(shape, dx, dy, r)) inside++;
    }
  return inside / 16;
}

function insideShape(shape: Shape, dx: number, dy: number, r: number): boolean {
  switch (shape) {
    case 'circle':
      return dx * dx + dy * dy <= r * r;
    case 'square': {
      const half = r / Math.SQRT2 + 0.15 * r; // a bit larger than inscribed, so the three read as similar sizes
      return Math.abs(dx) <= half && Math.abs(dy) <= half;
    }
    case 'triangle': {
      // pointing up, apex at −r, base at +r/2 (an equilateral triangle in a circle of radius r)
      if (dy < -r || dy > r / 2) return false;
      const halfWidth = (((dy + r) / (1.5 * r)) * (r * Math.sqrt(3))) / 2;
      return Math.abs(dx) <= halfWidth;
    }
  }
}

/** RGB frames [3, frames.length, height, width] of the clip at the given frame indices. */
export function renderClip(
  spec: ClipSpec,
  frames: readonly number[],
  height: number = CLIP.height,
  width: number = CLIP.width,
): Float32Array {
  const n = frames.length;
  const plane = height * width;
  const rgb = new Float32Array(3 * n * plane);
  const colour = PALETTE[spec.colour];
  const [mx, my] = MOTION[spec.direction];
  frames.forEach((f, k) => {
    const cx = spec.x + mx * spec.speed * f;
    const cy = spec.y + my * spec.speed * f;
    for (let c = 0; c < 3; c++) rgb.fill(BACKGROUND[c], (c * n + k) * plane, (c * n + k + 1) * plane);
    const reach = spec.size / 2 + 1;
    for (let y = Math.max(0, Math.floor(cy - reach)); y < Math.min(height, Math.ceil(cy + reach)); y++)
      for (let x = Math.max(0, Math.floor(cx - reach)); x < Math.min(width, Math.ceil(cx + reach)); x++) {
        const a = coverage(spec.shape, cx, cy, spec.size, x, y);
        if (a > 0)
          for (let c = 0; c < 3; c++)
            rgb[(c * n + k) * plane + y * width + x] = BACKGROUND[c] + a * (colour[c] - BACKGROUND[c]);
      }
  });
  return rgb;
}

/** Every frame index of a clip: 0 … frames − 1. */
export const allFrames = (frames: number): number[] => Array.from({ length: frames }, (_, i) => i);
