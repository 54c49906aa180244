// A checkpoint as diffusers and transformers publish it: one `<name>.safetensors`, or shards listed
// by `<name>.safetensors.index.json` (its weight_map names each tensor's file). Opening one reads the
// index and every shard's header, nothing more; its tensors are then read by byte ranges
// (readTensor, readTensors), so no shard is ever whole in memory.
import { readSafetensorsHeader, SafetensorsError, type TensorEntry } from '../safetensors.ts';
import { MissingFile, readJson, type ModelFiles } from './files.ts';

export interface Checkpoint {
  /** what it was opened from: the index, or the single file */
  source: string;
  /** every tensor by name, where its bytes are */
  tensors: Map<string, TensorEntry>;
}

/** Opens `<dir>/<name>.safetensors.index.json` and its shards, or else `<dir>/<name>.safetensors`. */
export async function openCheckpoint(files: ModelFiles, dir: string, name: string): Promise<Checkpoint> {
  const indexPath = `${dir}/${name}.safetensors.index.json`;
  const singlePath = `${dir}/${name}.safetensors`;
  let index: unknown;
  try {
    index = await readJson(files, indexPath);
  } catch (e) {
    if (!(e instanceof MissingFile)) throw e;
    try {
      return {
        source: singlePath,
        tensors: new Map((await readSafetensorsHeader(files, singlePath)).map((t) => [t.name, t])),
      };
    } catch (e) {
      if (e instanceof MissingFile)
        throw new MissingFile(
          `${dir}/ has neither ${name}.safetensors nor ${name}.safetensors.index.json: is it a diffusers model folder?`,
        );
      throw e;
    }
  }
  const weightMap = (index as { weight_map?: unknown } | null)?.weight_map;
  if (typeof weightMap !== 'object' || weightMap === null || Array.isArray(weightMap))
    throw new SafetensorsError(`${indexPath}: has no "weight_map" object naming each tensor's file`);
  const byShard = new Map<string, string[]>();
  for (const [tensor, file] of Object.entries(weightMap)) {
    // a shard is a file of this folder: no other directory, no way out of it
    if (typeof file !== 'string' || !/^[\w.-]+\.safetensors$/.test(file) || file.startsWith('.')) {
      throw new SafetensorsError(
        `${indexPath}: tensor "${tensor}" is mapped to ${JSON.stringify(file)}, not a .safetensors file of ${dir}/`,
      );
    }
    byShard.set(file, [...(byShard.get(file) ?? []), tensor]);
  }
  const tensors = new Map<string, TensorEntry>();
  await Promise.all(
    [...byShard].map(async ([file, names]) => {
      const path = `${dir}/${file}`;
      let header: TensorEntry[];
      try {
        header = await readSafetensorsHeader(files, path);
      } catch (e) {
        if (e instanceof MissingFile)
          throw new MissingFile(
            `${indexPath} names shard ${file} (for ${names.length} tensors, "${names[0]}" first), ` +
              `but ${path} is missing`,
          );
        throw e;
      }
      const inShard = new Map(header.map((t) => [t.name, t]));
      for (const tensor of names) {
        const entry = inShard.get(tensor);
        if (!entry)
          throw new SafetensorsError(`${indexPath} puts tensor "${tensor}" in ${file}, but ${path} has no such tensor`);
        tensors.set(tensor, entry);
      }
    }),
  );
  return { source: indexPath, tensors };
}
