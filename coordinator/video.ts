// Decoded frames → playable WebM, in the dashboard page.
//
// mediabunny's VideoSampleSource drives WebCodecs' VideoEncoder for us (with
// backpressure) and its Matroska muxer, when not in append-only mode, seeks
// back at finalize to write Segment Duration and Cues. Without those, Chrome
// reports `<video>.duration === Infinity` for a WebM and cannot seek it.

import {
  BlobSource,
  BufferTarget,
  canEncodeVideo,
  Input,
  Output,
  Quality,
  VideoSample,
  VideoSampleSource,
  WEBM,
  WebMOutputFormat,
} from 'mediabunny';

/** RGB in [0, 1], channel-major like a VAE decoder's output: `rgb` is [3, count, height, width]. */
export interface VideoFrames {
  count: number;
  height: number;
  width: number;
  rgb: Float32Array;
}

export type WebMCodec = 'vp8' | 'vp9';

export interface EncodeWebMOptions {
  /** Frames per second; Wan generates at 16. */
  fps?: number;
  /** Preferred codec; the other WebM codec is tried when the browser cannot encode it. */
  codec?: WebMCodec;
  onProgress?(done: number, total: number): void;
}

export interface WebMProbe {
  codec: string | null;
  frameCount: number;
  durationSeconds: number;
  width: number;
  height: number;
}

export const DEFAULT_FPS = 16;

// mediabunny scales bitrate by pixel count: at 64×64 its default quality would leave a few kbit/s
// and visibly smear small generated frames
const QUALITY = new Quality('high');

export async function encodeWebM(frames: VideoFrames, opts: EncodeWebMOptions = {}): Promise<Blob> {
  const { count, height, width, rgb } = frames;
  const fps = opts.fps ?? DEFAULT_FPS;
  checkFrames(frames, fps);
  const codec = await pickCodec(opts.codec ?? 'vp8', width, height, fps);

  const target = new BufferTarget();
  const output = new Output({ format: new WebMOutputFormat(), target });
  const source = new VideoSampleSource({ codec, quality: QUALITY });
  output.addVideoTrack(source, { frameRate: fps });
  await output.start();

  const plane = height * width;
  const rgba = new Uint8Array(plane * 4); // [H, W, 4], reused: VideoSample copies it into its frame
  try {
    for (let t = 0; t < count; t++) {
      packRGBA(rgb, count, plane, t, rgba);
      const sample = new VideoSample(rgba, {
        format: 'RGBA',
        codedWidth: width,
        codedHeight: height,
        timestamp: t / fps,
        // An explicit duration makes the last frame count toward the file's duration.
        duration: 1 / fps,
      });
      try {
        await source.add(sample);
      } finally {
        sample.close();
      }
      opts.onProgress?.(t + 1, count);
    }
    await output.finalize();
  } catch (err) {
    if (output.state !== 'finalized') await output.cancel().catch(() => undefined);
    throw err;
  }
  const buffer = target.buffer;
  if (!buffer) throw new Error('encodeWebM: the muxer finished without producing a file');
  return new Blob([buffer], { type: output.format.mimeType });
}

/** Reads codec, size, packet count and duration back from a WebM (packets = frames for VP8/VP9). */
export async function probeWebM(blob: Blob): Promise<WebMProbe> {
  const input = new Input({ source: new BlobSource(blob), formats: [WEBM] });
  try {
    const track = await input.getPrimaryVideoTrack();
    if (!track) throw new Error('probeWebM: the file has no video track');
    const stats = await track.computePacketStats();
    return {
      codec: await track.getCodec(),
      frameCount: stats.packetCount,
      durationSeconds: await input.computeDuration(),
      width: await track.getCodedWidth(),
      height: await track.getCodedHeight(),
    };
  } finally {
    input.dispose();
  }
}

function checkFrames({ count, height, width, rgb }: VideoFrames, fps: number): void {
  for (const [name, v] of [
    ['count', count],
    ['height', height],
    ['width', width],
  ] as const) {
    if (!Number.isInteger(v) || v <= 0) throw new Error(`encodeWebM: ${name} must be a positive integer, got ${v}`);
  }
  if (!(fps > 0) || !Number.isFinite(fps)) throw new Error(`encodeWebM: fps must be a positive number, got ${fps}`);
  const expected = 3 * count * height * width;
  if (rgb.length !== expected) {
    throw new Error(
      `encodeWebM: rgb has ${rgb.length} values but [3, ${count}, ${height}, ${width}] needs ${expected}; ` +
        'pass the decoder output channel-major as [3, frames, height, width]',
    );
  }
}

async function pickCodec(preferred: WebMCodec, width: number, height: number, fps: number): Promise<WebMCodec> {
  if (typeof VideoEncoder === 'undefined') {
    throw new Error(
      'encodeWebM: this browser has no WebCodecs VideoEncoder (it needs a secure context: https or localhost)',
    );
  }
  const candidates: WebMCodec[] = preferred === 'vp8' ? ['vp8', 'vp9'] : ['vp9', 'vp8'];
  for (const codec of candidates) {
    // canEncodeVideo asks VideoEncoder.isConfigSupported with the real size and rate.
    if (await canEncodeVideo(codec, { width, height, frameRate: fps, quality: QUALITY })) return codec;
  }
  throw new Error(
    `encodeWebM: the browser's VideoEncoder supports neither VP8 nor VP9 at ${width}×${height}@${fps}fps; ` +
      'try a recent Chromium or Firefox',
  );
}

// Channel-major float [3, count, H, W] at frame t → interleaved bytes [H, W, RGBA].
function packRGBA(rgb: Float32Array, count: number, plane: number, t: number, out: Uint8Array): void {
  const r = t * plane;
  const g = (count + t) * plane;
  const b = (2 * count + t) * plane;
  for (let i = 0; i < plane; i++) {
    out[4 * i] = toByte(rgb[r + i]);
    out[4 * i + 1] = toByte(rgb[g + i]);
    out[4 * i + 2] = toByte(rgb[b + i]);
    out[4 * i + 3] = 255;
  }
}

function toByte(v: number): number {
  // NaN from a diverged decode becomes black rather than poisoning the frame.
  return v > 0 ? (v < 1 ? Math.round(v * 255) : 255) : 0;
}
