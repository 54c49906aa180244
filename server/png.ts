// A PNG file's pixels as RGBA bytes (an ImageData's layout), for `npm run encode-image`: Node's
// zlib inflates the image data and the five scanline filters are undone here (PNG spec, section 9),
// so no image library is needed. Every colour type is read at 8 bits, and greyscale and palette
// images at 1, 2 and 4 too, as PIL opens them and `convert("RGB")` makes them RGB (grey repeated,
// palette looked up, lower depths scaled to 0…255); 16-bit and interlaced files are refused.
import { crc32, deflateSync, inflateSync } from 'node:zlib';
import type { RgbaImage } from '../core/model/image-condition.ts';
import { MAX_IMAGE_SIDE } from '../core/model/image-condition.ts';

export class PngError extends Error {
  override name = 'PngError';
}

const SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
/** samples a pixel has, by colour type: grey, RGB, palette index, grey and alpha, RGBA */
const SAMPLES: Record<number, number> = { 0: 1, 2: 3, 3: 1, 4: 2, 6: 4 };

export function decodePng(file: Uint8Array, source: string): RgbaImage {
  const fail = (why: string): never => {
    throw new PngError(`${source}: ${why}`);
  };
  if (file.length < 8 || SIGNATURE.some((b, i) => file[i] !== b))
    fail('is not a PNG file (its first bytes are not the PNG signature): give an image as a PNG');
  const view = new DataView(file.buffer, file.byteOffset, file.byteLength);
  let header: { width: number; height: number; depth: number; type: number } | null = null;
  let palette: Uint8Array | null = null;
  const data: Uint8Array[] = [];
  for (let at = 8; ;) {
    if (at + 8 > file.length) fail('ends before its IEND chunk');
    const length = view.getUint32(at);
    const type = String.fromCharCode(...file.subarray(at + 4, at + 8));
    if (at + 12 + length > file.length) fail(`its ${type} chunk runs past the end of the file`);
    const body = file.subarray(at + 8, at + 8 + length);
    at += 12 + length;
    if (type === 'IHDR') {
      if (body.length !== 13) fail(`has an IHDR chunk of ${body.length} bytes, not 13`);
      const ihdr = new DataView(body.buffer, body.byteOffset, body.byteLength);
      const [width, height] = [ihdr.getUint32(0), ihdr.getUint32(4)];
      const [depth, colour, , , interlace] = body.subarray(8, 13);
      if (!(colour in SAMPLES)) fail(`has colour type ${colour}, which PNG does not define`);
      if (depth === 16) fail('has 16 bits a sample: save it with 8');
      if (depth !== 8 && !((colour === 0 || colour === 3) && [1, 2, 4].includes(depth)))
        fail(`has ${depth} bits a sample with colour type ${colour}, which PNG does not define`);
      if (interlace) fail('is interlaced (Adam7): save it without interlacing');
      if (width < 1 || height < 1 || width > MAX_IMAGE_SIDE || height > MAX_IMAGE_SIDE)
        fail(`is ${width}×${height}: an image is 1 to ${MAX_IMAGE_SIDE} pixels each way`);
      header = { width, height, depth, type: colour };
    } else if (type === 'PLTE') palette = body.slice();
    else if (type === 'IDAT') data.push(body);
    else if (type === 'IEND') break;
  }
  if (!header) return fail('has no IHDR chunk');
  const { width, height, depth, type } = header;
  if (type === 3 && !palette) fail('is a palette image without a PLTE chunk');
  const bitsPerPixel = SAMPLES[type] * depth;
  const stride = Math.ceil((width * bitsPerPixel) / 8);
  /** bytes to the pixel before, for the filters: at least 1 */
  const step = Math.max(1, bitsPerPixel / 8);
  let raw: Uint8Array;
  try {
    raw = inflateSync(Buffer.concat(data));
  } catch (e) {
    return fail(`its image data does not inflate: ${(e as Error).message}`);
  }
  if (raw.length < height * (stride + 1))
    fail(`its image data holds ${raw.length} bytes, not the ${height * (stride + 1)} of ${width}×${height}`);
  const lines = new Uint8Array(height * stride);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const out = lines.subarray(y * stride, (y + 1) * stride);
    const up = y > 0 ? lines.subarray((y - 1) * stride, y * stride) : new Uint8Array(stride);
    for (let x = 0; x < stride; x++) {
      const a = x >= step ? out[x - step] : 0;
      const b = up[x];
      const c = x >= step ? up[x - step] : 0;
      let predicted: number;
      if (filter === 0) predicted = 0;
      else if (filter === 1) predicted = a;
      else if (filter === 2) predicted = b;
      else if (filter === 3) predicted = (a + b) >> 1;
      else if (filter === 4) {
        const p = a + b - c;
        const [pa, pb, pc] = [Math.abs(p - a), Math.abs(p - b), Math.abs(p - c)];
        predicted = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      } else return fail(`line ${y} has filter ${filter}, which PNG does not define`);
      out[x] = (line[x] + predicted) & 0xff;
    }
  }
  const rgba = new Uint8ClampedArray(4 * width * height);
  const sample = (y: number, i: number) =>
    depth === 8
      ? lines[y * stride + i]
      : (lines[y * stride + ((i * depth) >> 3)] >> (8 - depth - ((i * depth) & 7))) & ((1 << depth) - 1);
  for (let y = 0; y < height; y++)
    for (let x = 0; x < width; x++) {
      const p = 4 * (y * width + x);
      if (type === 3) {
        const index = sample(y, x);
        if (!palette || 3 * index + 2 >= palette.length)
          return fail(`pixel (${x}, ${y}) names no colour of its palette`);
        rgba.set([palette[3 * index], palette[3 * index + 1], palette[3 * index + 2], 255], p);
      } else if (type === 0 || type === 4) {
        const grey = type === 0 ? (sample(y, x) * 255) / ((1 << depth) - 1) : sample(y, 2 * x);
        rgba.set([grey, grey, grey, type === 4 ? sample(y, 2 * x + 1) : 255], p);
      } else {
        const n = SAMPLES[type];
        rgba.set(
          [sample(y, n * x), sample(y, n * x + 1), sample(y, n * x + 2), n === 4 ? sample(y, n * x + 3) : 255],
          p,
        );
      }
    }
  return { data: rgba, width, height };
}

/** An RGBA image as an 8-bit RGBA PNG (no filtering): for tests and tools that hand an image on as a file. */
export function encodePng({ data, width, height }: RgbaImage): Uint8Array {
  const chunk = (type: string, body: Uint8Array): Uint8Array => {
    const out = new Uint8Array(12 + body.length);
    const view = new DataView(out.buffer);
    view.setUint32(0, body.length);
    out.set(new TextEncoder().encode(type), 4);
    out.set(body, 8);
    view.setUint32(8 + body.length, crc32(out.subarray(4, 8 + body.length)));
    return out;
  };
  const header = new Uint8Array(13);
  const view = new DataView(header.buffer);
  view.setUint32(0, width);
  view.setUint32(4, height);
  header.set([8, 6, 0, 0, 0], 8); // 8 bits, RGBA, deflate, no filter method beyond 0, not interlaced
  const rows = new Uint8Array(height * (1 + 4 * width));
  for (let y = 0; y < height; y++) rows.set(data.subarray(4 * width * y, 4 * width * (y + 1)), y * (1 + 4 * width) + 1);
  const parts = [
    Uint8Array.from(SIGNATURE),
    chunk('IHDR', header),
    chunk('IDAT', deflateSync(rows)),
    chunk('IEND', new Uint8Array(0)),
  ];
  const png = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    png.set(part, at);
    at += part.length;
  }
  return png;
}
