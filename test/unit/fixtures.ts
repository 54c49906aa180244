import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import * as ort from 'onnxruntime-web';
import type { ModelFiles } from '../../core/model/files.ts';

export const TINY_MODEL_DIR = join(import.meta.dirname, '../../public/models/tiny-wan');

export const tinyModelFiles: ModelFiles = async (path) => new Uint8Array(await readFile(join(TINY_MODEL_DIR, path)));

ort.env.wasm.numThreads = 1;
