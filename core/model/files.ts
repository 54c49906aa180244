// Where a model's files come from: `fetch` in a page, the file system in Node
// (server/model-folder.ts). Paths are relative to the model folder, in diffusers' layout
// (`transformer/config.json`, ...). Large files are read by byte ranges, never whole: a published
// shard is 5 GB, more than any ArrayBuffer of a page.
// A folder has optional files (a scheduler's config, a checkpoint's index): the server that serves
// the pages lists its folders (FolderListing), so a page knows one is absent without asking for it
// (a 404 is an error in the browser's console). A folder on another host (the Hugging Face hub, a
// static host) has no listing: there each optional file is asked for, and its 404 says it is absent.
import { readSafetensors, type ByteRanges, type TensorMap } from '../safetensors.ts';

export interface ModelFiles extends ByteRanges {
  /** a whole file: configs, indexes, small weights */
  read(path: string): Promise<Uint8Array>;
}

/** Bytes of the weights read so far, of all a load reads. */
export type LoadProgress = (loaded: number, total: number) => void;

/** The folder has no such file (rather than a file that failed to load). */
export class MissingFile extends Error {
  override name = 'MissingFile';
}

/**
 * A model folder over HTTP. Ranges are asked for with Range requests, past the HTTP cache: tabs of
 * one browser reading ranges of one file at once through it were seen to get empty 206 answers
 * (and a shard of GBs is beyond what that cache keeps anyway). A 206 must say it holds the bytes
 * asked for. A server that ignores Range (it answers 200 with the whole file) has its answer kept,
 * so that a file crosses the network once.
 */
/** the most a whole file may be (configs, tokenizer.json at 17 MB, small weights); larger ones are read by ranges */
export const MAX_WHOLE_FILE_BYTES = 256 * 2 ** 20;

/** A response's body, refused past `max` bytes (by its Content-Length, else as it streams). */
export async function boundedBody(response: Response, max: number, url: string): Promise<Uint8Array> {
  const tooLarge = () =>
    new Error(
      `${url} is larger than ${max} bytes: a model folder's file is read whole only when small ` +
        '(a server that ignores Range requests cannot serve large weights)',
    );
  if (Number(response.headers.get('Content-Length') ?? 0) > max) {
    await response.body?.cancel();
    throw tooLarge();
  }
  if (!response.body) return new Uint8Array(await response.arrayBuffer());
  const parts: Uint8Array[] = [];
  let total = 0;
  const reader = response.body.getReader();
  for (let r = await reader.read(); !r.done; r = await reader.read()) {
    if ((total += r.value.byteLength) > max) {
      await reader.cancel();
      throw tooLarge();
    }
    parts.push(r.value);
  }
  const body = new Uint8Array(total);
  parts.reduce((at, p) => (body.set(p, at), at + p.byteLength), 0);
  return body;
}

/**
 * A range's body, streamed into one buffer of the `expected` bytes asked for (fewer where the file ends first); null
 * where the server sent more. Chromium's `arrayBuffer()` of several large answers at once slowed every read to a
 * third of one alone; streamed, reads in flight add up.
 */
async function rangeBody(response: Response, expected: number): Promise<Uint8Array | null> {
  const body = new Uint8Array(expected);
  if (!response.body) {
    const whole = new Uint8Array(await response.arrayBuffer());
    if (whole.byteLength > expected) return null;
    body.set(whole);
    return body.subarray(0, whole.byteLength);
  }
  const reader = response.body.getReader();
  let at = 0;
  for (let r = await reader.read(); !r.done; r = await reader.read()) {
    if (at + r.value.byteLength > expected) {
      await reader.cancel();
      return null;
    }
    body.set(r.value, at);
    at += r.value.byteLength;
  }
  return at === expected ? body : body.subarray(0, at);
}

/** What the ditswarm server answers to `GET <folder>/`: every file the folder holds, by its path in the folder. */
export interface FolderListing {
  files: { path: string; size: number }[];
}

/**
 * The paths a folder holds, where it is on the page's own server (which lists it); null elsewhere (Node, another
 * host), or where the listing is not one: then files are asked for one by one.
 */
async function listedPaths(base: string): Promise<Set<string> | null> {
  const page = (globalThis as { location?: { origin: string } }).location;
  if (!page || new URL(base).origin !== page.origin) return null;
  try {
    const response = await fetch(`${base}/`, { cache: 'no-cache' });
    const files = response.ok ? ((await response.json()) as { files?: unknown } | null)?.files : null;
    if (!Array.isArray(files)) return null;
    return new Set(files.flatMap((f: { path?: unknown } | null) => (typeof f?.path === 'string' ? [f.path] : [])));
  } catch {
    return null; // a listing that failed costs the probes it would have saved, nothing more
  }
}

export function fetchModelFiles(baseUrl: string): ModelFiles {
  const base = baseUrl.replace(/\/$/, '');
  let listed: Promise<Set<string> | null> | null = null;
  const get = async (path: string, range?: [number, number]): Promise<Response> => {
    const url = `${base}/${path}`;
    const listing = await (listed ??= listedPaths(base));
    if (listing && !listing.has(path)) throw new MissingFile(`${url}: not found`);
    const response = await fetch(
      url,
      range ? { headers: { Range: `bytes=${range[0]}-${range[1] - 1}` }, cache: 'no-store' } : undefined,
    );
    if (response.status === 404) throw new MissingFile(`${url}: not found`);
    // 416: the range starts past the end of the file, which the reader reports as a truncated file
    if (!response.ok && response.status !== 416) throw new Error(`could not load ${url}: HTTP ${response.status}`);
    return response;
  };
  const whole = new Map<string, Promise<Uint8Array>>();
  return {
    read: async (path) => boundedBody(await get(path), MAX_WHOLE_FILE_BYTES, `${base}/${path}`),
    async readRange(path, begin, end) {
      if (end <= begin) return new Uint8Array(0);
      const kept = whole.get(path);
      if (kept) return (await kept).subarray(begin, end);
      const response = await get(path, [begin, end]);
      if (response.status === 416) return new Uint8Array(0);
      if (response.status === 206) {
        const served = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(response.headers.get('Content-Range') ?? '');
        const body = await rangeBody(response, end - begin);
        if (!body || !served || Number(served[1]) !== begin || body.byteLength !== Number(served[2]) - begin + 1) {
          throw new Error(
            `${base}/${path}: asked for bytes ${begin}-${end - 1}, the server sent ` +
              `${body ? `${body.byteLength} bytes` : 'more bytes'} as "${response.headers.get('Content-Range')}"`,
          );
        }
        return body;
      }
      const all = boundedBody(response, MAX_WHOLE_FILE_BYTES, `${base}/${path}`);
      whole.set(path, all);
      return (await all).subarray(begin, end);
    },
  };
}

export async function readJson(files: ModelFiles, path: string): Promise<unknown> {
  const text = new TextDecoder().decode(await files.read(path));
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${path} is not valid JSON: ${(e as Error).message}`, { cause: e });
  }
}

/** A small safetensors file read whole (the tiny models' text encoder and VAE). */
export async function readWeights(files: ModelFiles, path: string): Promise<TensorMap> {
  return readSafetensors(await files.read(path), path);
}
