import { readSafetensors, type TensorMap } from '../safetensors.ts';

/**
 * Where a model's files come from: `fetch` in a page, the file system in Node. Paths are relative
 * to the model folder, in diffusers' layout (`transformer/config.json`, ...).
 */
export type ModelFiles = (path: string) => Promise<Uint8Array>;

export function fetchModelFiles(baseUrl: string): ModelFiles {
  const base = baseUrl.replace(/\/$/, '');
  return async (path) => {
    const url = `${base}/${path}`;
    const response = await fetch(url);
    if (!response.ok) throw new Error(`could not load ${url}: HTTP ${response.status}`);
    return new Uint8Array(await response.arrayBuffer());
  };
}

export async function readJson(files: ModelFiles, path: string): Promise<unknown> {
  const text = new TextDecoder().decode(await files(path));
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${path} is not valid JSON: ${(e as Error).message}`);
  }
}

export async function readWeights(files: ModelFiles, path: string): Promise<TensorMap> {
  return readSafetensors(await files(path), path);
}
