// The image an image-to-video job starts from, as diffusers' WanImageToVideoPipeline hands it to the
// VAE (Wan2.2-TI2V-5B: expand_timesteps, the image encoded alone into the first latent frame).
// Followed: pipeline_wan_i2v.py `self.video_processor.preprocess(image, height=height, width=width)`
// and image_processor.py's VaeImageProcessor with the VideoProcessor's defaults (do_resize,
// resample "lanczos", reducing_gap None, resize_mode "default", do_normalize): the image is
// stretched to width×height by PIL's Image.resize(LANCZOS), with no crop and no kept aspect, then
// read as bytes / 255 and normalised to 2x − 1. The image is RGB first: diffusers' load_image does
// `convert("RGB")`, which drops alpha (PIL resizes RGBA premultiplied, RGB as is). The resize is a
// transcription of Pillow's libImaging/Resample.c for 8-bit images: a separable filter, horizontal
// pass first, each pass's weights fixed-point (22 bits) and its output rounded and clamped to a byte.
//
// (Wan's own repository crops the image to the output's aspect before resizing; diffusers does not,
// and this follows diffusers, whose output the tests hold it to.)

import type { Tensor } from '../tensor.ts';

/** An image as a canvas's ImageData holds it: RGBA bytes, row by row. */
export interface RgbaImage {
  data: Uint8ClampedArray | Uint8Array;
  width: number;
  height: number;
}

/** An image of RGB bytes, row by row (PIL's mode "RGB"). */
export interface RgbImage {
  data: Uint8Array;
  width: number;
  height: number;
}

/** Pillow's PRECISION_BITS for 8-bit images: 32 − 8 − 2, room for a byte and the filter's overshoot */
const PRECISION_BITS = 22;
/** Pillow's LANCZOS support: a = 3 lobes */
const LANCZOS_SUPPORT = 3;

/** The largest side an image or a job may have here: far past 720p, and small enough that no size overflows. */
export const MAX_IMAGE_SIDE = 16_384;

function sinc(x: number): number {
  if (x === 0) return 1;
  const px = x * Math.PI;
  return Math.sin(px) / px;
}

/** Pillow's lanczos_filter: sinc(x)·sinc(x/3) on [−3, 3). */
function lanczos(x: number): number {
  return x >= -LANCZOS_SUPPORT && x < LANCZOS_SUPPORT ? sinc(x) * sinc(x / LANCZOS_SUPPORT) : 0;
}

/** C's (int) cast of a double: toward zero. */
const toInt = (x: number) => Math.trunc(x);

/**
 * One axis's weights, as Pillow's precompute_coeffs and normalize_coeffs_8bpc make them: for output
 * pixel i, inputs first[i] … first[i] + count[i] − 1, their weights weights[i·taps …] in 22-bit
 * fixed point.
 */
export interface AxisWeights {
  taps: number;
  first: Int32Array;
  count: Int32Array;
  weights: Int32Array;
}

export function lanczosAxisWeights(inSize: number, outSize: number): AxisWeights {
  const scale = inSize / outSize;
  const filterScale = Math.max(scale, 1);
  const support = LANCZOS_SUPPORT * filterScale;
  const taps = Math.ceil(support) * 2 + 1;
  const first = new Int32Array(outSize);
  const count = new Int32Array(outSize);
  const weights = new Int32Array(outSize * taps);
  const k = new Float64Array(taps);
  // Pillow multiplies by the reciprocal (inv_filterscale), which rounds differently from a division
  const invFilterScale = 1 / filterScale;
  for (let i = 0; i < outSize; i++) {
    const center = (i + 0.5) * scale;
    const xmin = Math.max(0, toInt(center - support + 0.5));
    const n = Math.min(inSize, toInt(center + support + 0.5)) - xmin;
    let total = 0;
    for (let x = 0; x < n; x++) total += k[x] = lanczos((x + xmin - center + 0.5) * invFilterScale);
    for (let x = 0; x < n; x++) {
      const w = total !== 0 ? k[x] / total : k[x];
      weights[i * taps + x] = toInt(w < 0 ? -0.5 + w * (1 << PRECISION_BITS) : 0.5 + w * (1 << PRECISION_BITS));
    }
    first[i] = xmin;
    count[i] = n;
  }
  return { taps, first, count, weights };
}

/** Pillow's clip8: the fixed-point sum, rounded down to a byte and clamped. */
function clip8(sum: number): number {
  const v = sum >> PRECISION_BITS;
  return v < 0 ? 0 : v > 255 ? 255 : v;
}

/**
 * One pass of Pillow's resample over RGB bytes: `lines` lines of `along` pixels each become lines of
 * the axis weights' outputs; `stride` and `step` say how pixels of a line and lines lie in memory.
 */
function resamplePass(
  from: Uint8Array,
  to: Uint8Array,
  axis: AxisWeights,
  lines: number,
  { inPixel, inLine, outPixel, outLine }: { inPixel: number; inLine: number; outPixel: number; outLine: number },
): void {
  const outSize = axis.first.length;
  for (let line = 0; line < lines; line++)
    for (let i = 0; i < outSize; i++) {
      const at = line * inLine + axis.first[i] * inPixel;
      for (let c = 0; c < 3; c++) {
        let sum = 1 << (PRECISION_BITS - 1);
        for (let x = 0; x < axis.count[i]; x++) sum += from[at + x * inPixel + c] * axis.weights[i * axis.taps + x];
        to[line * outLine + i * outPixel + c] = clip8(sum);
      }
    }
}

/** One axis of an RGB image resampled to `size`, the other kept; the image itself where the axis keeps its size. */
function resizeAxis(image: RgbImage, axis: 'x' | 'y', size: number): RgbImage {
  const { width, height } = image;
  if (axis === 'x') {
    if (size === width) return image;
    const out = new Uint8Array(size * height * 3);
    resamplePass(image.data, out, lanczosAxisWeights(width, size), height, {
      inPixel: 3,
      inLine: 3 * width,
      outPixel: 3,
      outLine: 3 * size,
    });
    return { data: out, width: size, height };
  }
  if (size === height) return image;
  const out = new Uint8Array(width * size * 3);
  // columns are the lines: a pixel of a column is a row away
  resamplePass(image.data, out, lanczosAxisWeights(height, size), width, {
    inPixel: 3 * width,
    inLine: 3,
    outPixel: 3 * width,
    outLine: 3,
  });
  return { data: out, width, height: size };
}

/**
 * PIL's `image.resize((width, height), Image.LANCZOS)` of an RGB image: the horizontal pass, then
 * the vertical (ImagingResampleInner), each skipped where its side keeps its size; an image over
 * 100 times taller than wide and made shorter goes vertical first (Image.resize's own two calls).
 */
export function resizeLanczos(image: RgbImage, width: number, height: number): RgbImage {
  const resized =
    image.height > image.width * 100 && height < image.height
      ? resizeAxis(resizeAxis(image, 'y', height), 'x', width)
      : resizeAxis(resizeAxis(image, 'x', width), 'y', height);
  return resized === image ? { ...image, data: image.data.slice() } : resized;
}

/** PIL's `convert("RGB")` of an RGBA image: alpha dropped, the colours as they are. */
export function dropAlpha(image: RgbaImage): RgbImage {
  const { width, height } = image;
  const rgb = new Uint8Array(width * height * 3);
  for (let p = 0; p < width * height; p++) for (let c = 0; c < 3; c++) rgb[3 * p + c] = image.data[4 * p + c];
  return { data: rgb, width, height };
}

/** Why an image or the size asked of it cannot be read; null where it can. */
export function imageProblem(image: RgbaImage, size?: { height: number; width: number }): string | null {
  const side = (n: number) => Number.isInteger(n) && n >= 1 && n <= MAX_IMAGE_SIDE;
  if (!side(image.width) || !side(image.height))
    return `an image is 1 to ${MAX_IMAGE_SIDE} pixels each way, got ${image.width}×${image.height}`;
  if (image.data.length !== 4 * image.width * image.height)
    return (
      `an RGBA image of ${image.width}×${image.height} has ${4 * image.width * image.height} bytes, ` +
      `got ${image.data.length}`
    );
  if (size && (!side(size.width) || !side(size.height)))
    return `the video is 1 to ${MAX_IMAGE_SIDE} pixels each way, got ${size.width}×${size.height}`;
  return null;
}

/**
 * The VAE's input for an image-to-video job of height×width: the image stretched to that size as
 * diffusers' pipeline does (see the module comment), as a video of one frame [3, 1, height, width]
 * in [−1, 1].
 */
export function imageConditionVideo(image: RgbaImage, { height, width }: { height: number; width: number }): Tensor {
  const problem = imageProblem(image, { height, width });
  if (problem) throw new Error(problem);
  const resized = resizeLanczos(dropAlpha(image), width, height);
  const plane = height * width;
  const data = new Float32Array(3 * plane);
  for (let p = 0; p < plane; p++)
    for (let c = 0; c < 3; c++)
      // pil_to_numpy's float32 u / 255, then normalize's 2x − 1, each rounded to float32 as torch does
      data[c * plane + p] = 2 * Math.fround(resized.data[3 * p + c] / 255) - 1;
  return { shape: [3, 1, height, width], data };
}
