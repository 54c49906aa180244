// `POST /v1/videos` as OpenAI documents it and its SDK sends it: a multipart/form-data body (`curl -F prompt=… -F
// seconds=4 -F size=832x480 -F input_reference=@image.png`). Its fields come as strings; this turns each into the
// value the JSON body has, so that one check (video-request.ts) refuses a bad field either way, by its name. The
// parts are read by Node's own FormData parser (undici's, the one `fetch` uses), from a body the route has bounded.

import { RequestError, type InputReference, type ReferenceType } from './video-request.ts';

/** the largest `input_reference` taken: an image is the first frame of a video, not a whole film */
export const MAX_REFERENCE_BYTES = 8 * 1024 * 1024;
/** what a multipart body may hold in all: the image and the fields beside it */
export const MAX_FORM_BYTES = MAX_REFERENCE_BYTES + 64 * 1024;

/** the image types OpenAI's video API takes as `input_reference`, by the bytes each file starts with */
const IMAGE_TYPES: Record<ReferenceType, (bytes: Uint8Array) => boolean> = {
  'image/png': (b) => startsWith(b, [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
  'image/jpeg': (b) => startsWith(b, [0xff, 0xd8, 0xff]),
  'image/webp': (b) => ascii(b, 0, 4) === 'RIFF' && ascii(b, 8, 12) === 'WEBP',
};
export const REFERENCE_TYPES = Object.keys(IMAGE_TYPES) as ReferenceType[];

/** An image file's type by the bytes it starts with: PNG, JPEG or WebP, else null. */
export const imageTypeOf = (bytes: Uint8Array): ReferenceType | null =>
  REFERENCE_TYPES.find((t) => IMAGE_TYPES[t](bytes)) ?? null;

const startsWith = (bytes: Uint8Array, magic: number[]) => magic.every((m, i) => bytes[i] === m);
const ascii = (bytes: Uint8Array, from: number, to: number) => String.fromCharCode(...bytes.subarray(from, to));

/** Fields whose form value is a number in the JSON body. */
const NUMBERS = new Set([
  'width',
  'height',
  'frames',
  'steps',
  'guidance',
  'seed',
  'flow_shift',
  'workers',
  'stages',
  'warmup_steps',
  'pipefusion',
  'cache_threshold',
]);
/** Fields that may come more than once (`-F lora=… -F lora=…`, or `lora[]` as the SDK sends an array). */
const REPEATED = new Set(['lora']);

/** A form value as the JSON body has it: numbers and booleans where the field is one, what it was where it is not. */
function valueOf(key: string, text: string): unknown {
  if (NUMBERS.has(key) && text.trim() !== '' && Number.isFinite(Number(text))) return Number(text);
  if (key === 'cfg_parallel' && (text === 'true' || text === 'false')) return text === 'true';
  return text;
}

export interface VideoForm {
  /** the fields, as a JSON body has them */
  body: Record<string, unknown>;
  /** the image given as `input_reference`, checked */
  reference: { info: InputReference; bytes: Uint8Array } | null;
}

/** Reads a multipart/form-data body of `POST /v1/videos`: throws a RequestError naming what it refuses. */
export async function readVideoForm(raw: unknown, contentType: string): Promise<VideoForm> {
  const how = 'send each field as a part (-F prompt=… -F size=832x480) and the image as -F input_reference=@image.png';
  if (!Buffer.isBuffer(raw)) throw new RequestError(`the multipart/form-data body is empty: ${how}`, null);
  let form: FormData;
  try {
    form = await new Request('http://form.invalid/', {
      method: 'POST',
      headers: { 'Content-Type': contentType },
      body: new Uint8Array(raw),
    }).formData();
  } catch (e) {
    throw new RequestError(
      `the body is no multipart/form-data that can be read (${(e as Error).message}): ${how}`,
      null,
    );
  }
  const body: Record<string, unknown> = {};
  let reference: VideoForm['reference'] = null;
  for (const [name, value] of form) {
    if (name === 'input_reference') {
      if (reference) throw new RequestError('input_reference is one image; it came twice', name);
      reference = await referenceOf(value);
      continue;
    }
    if (name.startsWith('input_reference['))
      throw new RequestError(
        `input_reference is an image file part (-F input_reference=@image.png); got ${name}: ` +
          'an image URL or file id is not fetched',
        'input_reference',
      );
    const key = name.endsWith('[]') ? name.slice(0, -2) : name;
    if (typeof value !== 'string') throw new RequestError(`${key} is a text field; it came as a file`, key);
    if (REPEATED.has(key)) body[key] = [...((body[key] as unknown[] | undefined) ?? []), value];
    else if (key in body) throw new RequestError(`${key} came twice: give it once`, key);
    else body[key] = valueOf(key, value);
  }
  return { body, reference };
}

async function referenceOf(value: FormDataEntryValue): Promise<NonNullable<VideoForm['reference']>> {
  if (typeof value === 'string')
    throw new RequestError(
      'input_reference is an image file (-F input_reference=@image.png); it came as text',
      'input_reference',
    );
  if (value.size > MAX_REFERENCE_BYTES)
    throw new RequestError(
      `input_reference is an image of at most ${MAX_REFERENCE_BYTES / 1024 / 1024} MiB; ` +
        `got ${(value.size / 1024 / 1024).toFixed(1)} MiB: send it smaller`,
      'input_reference',
    );
  const bytes = new Uint8Array(await value.arrayBuffer());
  const type = imageTypeOf(bytes);
  if (!type)
    throw new RequestError(
      `input_reference is a PNG, JPEG or WebP image; ${value.name || 'the file'} (${value.type || 'no type'}) ` +
        'is none of them by its bytes',
      'input_reference',
    );
  return { info: { type, bytes: bytes.length, name: value.name || null }, bytes };
}
