// The dashboard's image to start a video from (a Wan2.2 TI2V folder's image to video): a file chosen or dropped on
// the field, kept as its bytes (what the automation API and the job's store carry), decoded as the browser decodes
// it, and previewed as the model will see it — stretched to the job's size by diffusers' resize (imageConditionVideo).
import type { Base64Image } from '../automation.ts';
import { defined } from '../../core/defined.ts';
import { imageConditionVideo, imageProblem, type RgbaImage } from '../../core/model/image-condition.ts';
import { $ } from './dom.ts';

/** the types an image may be: what OpenAI's video API takes as input_reference */
const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/webp'];

export const bytesToBase64 = (bytes: Uint8Array): string => {
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
};

/** An image file's pixels as the browser decodes it, RGBA unpremultiplied; an unreadable file says so. */
export async function decodeImageFile({ type, base64 }: Base64Image): Promise<RgbaImage> {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const bitmap = await createImageBitmap(new Blob([bytes], { type }), {
    colorSpaceConversion: 'none',
    premultiplyAlpha: 'none',
  }).catch((e: unknown) => {
    throw new Error(`image: the browser cannot read it as ${type}: ${(e as Error).message}`);
  });
  const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
  const context = defined(canvas.getContext('2d'), 'a 2D canvas');
  context.drawImage(bitmap, 0, 0);
  bitmap.close();
  return context.getImageData(0, 0, canvas.width, canvas.height);
}

export interface ImageField {
  /** the image chosen, as its file's bytes; null: none (a job from text alone) */
  readonly image: Base64Image | null;
  /** draws the preview again at the job's size (the form's height and width changed) */
  preview(size: { height: number; width: number }): void;
}

/**
 * The form's image field (#image, its preview #image-preview and #image-clear): a file chosen or dropped on the form
 * is kept and previewed.
 */
export function imageField(form: HTMLFormElement, size: () => { height: number; width: number }): ImageField {
  const input = $('image', HTMLInputElement);
  const figure = $('image-preview');
  const canvas = $('image-canvas', HTMLCanvasElement);
  const note = $('image-note');
  let image: Base64Image | null = null;
  let pixels: RgbaImage | null = null;

  const preview = ({ height, width }: { height: number; width: number }) => {
    figure.hidden = !pixels;
    if (!pixels) return;
    const problem = imageProblem(pixels, { height, width });
    note.textContent =
      problem ?? `what the model sees: ${pixels.width}×${pixels.height} stretched to ${width}×${height}`;
    if (problem) return;
    const video = imageConditionVideo(pixels, { height, width }).data; // [3, 1, H, W] in [−1, 1]
    const rgba = new Uint8ClampedArray(4 * height * width);
    for (let i = 0; i < height * width; i++) {
      for (let c = 0; c < 3; c++) rgba[4 * i + c] = Math.round(((video[c * height * width + i] + 1) / 2) * 255);
      rgba[4 * i + 3] = 255;
    }
    [canvas.width, canvas.height] = [width, height];
    defined(canvas.getContext('2d'), 'a 2D canvas').putImageData(new ImageData(rgba, width, height), 0, 0);
  };

  const take = async (file: File | null) => {
    if (!file) {
      [image, pixels] = [null, null];
      input.value = '';
      preview(size());
      return;
    }
    if (!IMAGE_TYPES.includes(file.type)) {
      note.textContent = `${file.name} is ${file.type || 'no image'}: give a PNG, JPEG or WebP image`;
      figure.hidden = false;
      return;
    }
    const chosen = { type: file.type, base64: bytesToBase64(new Uint8Array(await file.arrayBuffer())) };
    pixels = await decodeImageFile(chosen);
    image = chosen;
    preview(size());
  };
  const report = (e: unknown) => {
    figure.hidden = false;
    note.textContent = (e as Error).message;
  };

  input.addEventListener('change', () => void take(input.files?.[0] ?? null).catch(report));
  $('image-clear').addEventListener('click', () => void take(null).catch(report));
  form.addEventListener('dragover', (event) => {
    if (event.dataTransfer?.types.includes('Files')) event.preventDefault();
  });
  form.addEventListener('drop', (event) => {
    const file = event.dataTransfer?.files[0];
    if (!file) return;
    event.preventDefault();
    void take(file).catch(report);
  });
  return {
    get image() {
      return image;
    },
    preview,
  };
}
