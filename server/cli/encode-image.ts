// An image through a Wan folder's VAE encoder as an image-to-video job's first latent frame, for
// parity checks against diffusers like `npm run encode-prompt`: the image stretched to the video's
// size as WanImageToVideoPipeline's video_processor.preprocess does (PIL's LANCZOS, no crop), then
// the posterior's mode, normalised ((latent − latents_mean) / latents_std), on a worker in this
// process (rank/vae-images.ts on onnxruntime-web's WebAssembly), its reply judged as the
// coordinator judges a worker's (coordinator/image-encoding.ts). Writes "latent" [1, z, 1, H/s, W/s]
// (s = 16 for Wan2.2's VAE, 8 for Wan2.1's) and "video", the VAE's input [1, 3, 1, H, W] in [−1, 1].
//
//   npm run encode-image -- --model DIR --image F.png --height H --width W --output L.safetensors

import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { encodeImageCondition } from '../../coordinator/image-encoding.ts';
import { imageConditionVideo, imageProblem, MAX_IMAGE_SIDE } from '../../core/model/image-condition.ts';
import { openWanVae, spatialScale } from '../../core/model/wan-vae.ts';
import { writeSafetensors } from '../../core/safetensors.ts';
import { vaeImages } from '../../rank/vae-images.ts';
import { unkeptModelFiles } from '../../rank/weight-cache.ts';
import { folderFiles } from '../model-folder.ts';
import { decodePng } from '../png.ts';
import { ENCODE_IMAGE_OPTIONS } from './flags.ts';

const USAGE = `usage: npm run encode-image -- --model DIR --image F.png --height H --width W --output L.safetensors
  --model   a folder with vae/ (AutoencoderKLWan: Wan2.2's z48 VAE, or Wan2.1's)
  --image   a PNG (8 bits a sample, not interlaced); its alpha is dropped, as diffusers' load_image does
  --height, --width   the video's size: the image is stretched to it, multiples of the VAE's 16 (Wan2.1's 8)
  --output  where to write "latent" [1, z, 1, H/16, W/16] and "video" [1, 3, 1, H, W]`;
/** Errors whose message is the whole story; anything else is a bug and keeps its stack. */
const USER_ERRORS = new Set(['UsageError', 'ModelConfigError', 'SafetensorsError', 'MissingFile', 'PngError']);

class UsageError extends Error {
  override name = 'UsageError';
}
function usage(message: string): never {
  throw new UsageError(`${message}\n${USAGE}`);
}

async function run(): Promise<void> {
  let parsed;
  try {
    parsed = parseArgs({ options: ENCODE_IMAGE_OPTIONS });
  } catch (e) {
    return usage((e as Error).message);
  }
  const { values } = parsed;
  if (!values.model) usage('--model is required: a folder with vae/ (AutoencoderKLWan)');
  if (!values.image) usage('--image is required: a PNG');
  if (!values.output) usage('--output is required');
  const side = (flag: 'height' | 'width') => {
    const n = Number(values[flag]);
    if (values[flag] === undefined) usage(`--${flag} is required: the video's ${flag} in pixels`);
    if (!Number.isInteger(n) || n < 1 || n > MAX_IMAGE_SIDE)
      usage(`--${flag} must be a whole number of pixels from 1 to ${MAX_IMAGE_SIDE}, got ${values[flag]}`);
    return n;
  };
  const [height, width] = [side('height'), side('width')];

  // the VAE's terms first: a size it cannot take is refused before the image or any weight is read
  const files = folderFiles(values.model);
  const { config } = await openWanVae(files);
  const scale = spatialScale(config);
  if (height % scale || width % scale)
    usage(
      `--height ${height} --width ${width}: ${values.model}'s VAE encodes ${scale}×${scale} pixels into a latent ` +
        `pixel; give multiples of ${scale}`,
    );
  const image = decodePng(new Uint8Array(await readFile(values.image)), values.image);
  const problem = imageProblem(image, { height, width });
  if (problem) usage(`--image ${values.image}: ${problem}`);

  const ort = await import('onnxruntime-web');
  ort.env.wasm.numThreads = 1; // as each worker engine runs
  const images = vaeImages(() => unkeptModelFiles(folderFiles(values.model ?? '')));
  const started = performance.now();
  const { latent, report } = await encodeImageCondition({
    host: {
      id: 'this process',
      pulse: null,
      api: { encodeImage: (args) => images.encode({ ...args, ep: 'wasm' }) },
    },
    modelUrl: values.model,
    files,
    image,
    height,
    width,
    ep: 'wasm',
    timeoutMs: Infinity,
  });
  const video = imageConditionVideo(image, { height, width });
  const output = new Map([
    ['latent', { shape: [1, ...latent.shape], data: latent.data }],
    ['video', { shape: [1, ...video.shape], data: video.data }],
  ]);
  await mkdir(dirname(values.output), { recursive: true });
  await writeFile(
    values.output,
    writeSafetensors(output, { image: values.image, height: String(height), width: String(width) }),
  );
  console.log(
    `encode-image: ${image.width}×${image.height} → ${width}×${height} → latent [1, ${latent.shape.join(', ')}] ` +
      `in ${(performance.now() - started).toFixed(0)} ms (${report.computeMs.toFixed(0)} ms encoding) ` +
      `→ ${values.output}`,
  );
}

try {
  await run();
} catch (e) {
  const error = e instanceof Error ? e : undefined;
  console.error(`encode-image: ${error && USER_ERRORS.has(error.name) ? error.message : (error?.stack ?? String(e))}`);
  process.exit(1);
}
