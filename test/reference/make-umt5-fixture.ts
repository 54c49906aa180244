// Writes test/unit/umt5.fixture.json: what transformers' UMT5EncoderModel gives for a tiny seeded
// encoder, by a line-by-line numpy float64 transcription of the upstream Python (umt5_numpy.py), so
// core/model/umt5.ts is held to transformers' code and not to a reading of it (its reference and
// its ONNX graph read the same name map: a swap of wi_0 and wi_1 would pass a test between them).
//
//   npx tsx test/reference/make-umt5-fixture.ts
//
// It writes text_encoder/ as transformers saves it (config.json, model.safetensors, seeded) to a
// temporary folder, runs the numpy encoder on each case's token ids, and keeps the whole
// last_hidden_state of each (a few hundred values). The test (test/unit/umt5-reference.test.ts)
// makes the same weights with the functions exported here, without Python.

import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseUmt5Config, TEXT_ENCODER_WEIGHTS_NAME, umt5WeightShapes } from '../../core/model/umt5.ts';
import { sizeOf } from '../../core/tensor.ts';
import { seededRandom, writeCheckpoint } from '../../server/model-folder.ts';

export const FIXTURE_PATH = join(import.meta.dirname, '../unit/umt5.fixture.json');
const SCRIPT = join(import.meta.dirname, 'umt5_numpy.py');

/**
 * umT5-XXL's config (google/umt5-xxl as Wan2.1's text_encoder/ publishes it) at a small width. Its
 * layer_norm_epsilon is 1e-2, not the published 1e-6, so that an eps read wrong moves the output far
 * past the test's tolerance; max distance 16 so that 40 tokens reach the last bucket.
 */
export const TINY_UMT5_CONFIG = {
  architectures: ['UMT5EncoderModel'],
  model_type: 'umt5',
  d_model: 32,
  d_kv: 8,
  num_heads: 4,
  d_ff: 48,
  num_layers: 2,
  relative_attention_num_buckets: 32,
  relative_attention_max_distance: 16,
  vocab_size: 64,
  layer_norm_epsilon: 1e-2,
  feed_forward_proj: 'gated-gelu',
  dense_act_fn: 'gelu_new',
  is_encoder_decoder: true,
  tie_word_embeddings: false,
};
export const SEED = 'umt5-fixture';

/** How a tensor's seeded values are made (written into the fixture as text too). */
export const INIT =
  'seededRandom(seed, name).normals(n, std): *norm.weight 1 + N(0, 0.1²); shared.weight N(0, 1); ' +
  'relative_attention_bias N(0, 1); projections N(0, 1/fan_in) with fan_in = shape[1]';

export function seededWeight(seed: string, name: string, shape: number[]): Float32Array {
  const random = seededRandom(seed, name);
  const n = sizeOf(shape);
  if (name.endsWith('norm.weight')) return random.normals(n, 0.1).map((v) => 1 + v);
  if (name === 'shared.weight' || name.includes('relative_attention_bias')) return random.normals(n, 1);
  return random.normals(n, 1 / Math.sqrt(shape[1]));
}

/** text_encoder/ of a model folder in `dir`: the tiny config and its seeded weights in transformers' names. */
export async function writeTinyUmt5(dir: string): Promise<void> {
  const cfg = parseUmt5Config(TINY_UMT5_CONFIG, 'TINY_UMT5_CONFIG');
  const specs = [...umt5WeightShapes(cfg)].map(([name, shape]) => ({ name, shape }));
  await writeCheckpoint(join(dir, 'text_encoder'), TEXT_ENCODER_WEIGHTS_NAME, specs, ({ name, shape }) =>
    seededWeight(SEED, name, shape),
  );
  writeFileSync(join(dir, 'text_encoder/config.json'), JSON.stringify(TINY_UMT5_CONFIG, null, 2) + '\n');
  writeFileSync(join(dir, 'config.json'), '{}');
}

/** Each case's token ids: one token, a short prompt, and one long enough for the far buckets. */
export const CASES = [
  { name: 'one token', ids: [5] },
  { name: 'seven tokens', ids: [3, 17, 42, 8, 8, 61, 1] },
  { name: 'forty tokens', ids: Array.from({ length: 40 }, (_, t) => (t * 37 + 5) % 64) },
];

function main(): void {
  const dir = mkdtempSync(join(tmpdir(), 'umt5-fixture-'));
  void writeTinyUmt5(dir)
    .then(() => {
      const cases = CASES.map((c) => {
        const outFile = join(dir, 'hidden.f64');
        const run = spawnSync(
          'python3',
          [SCRIPT, '--encoder', join(dir, 'text_encoder'), '--ids', c.ids.join(','), '--out', outFile],
          { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' } },
        );
        if (run.status !== 0) throw new Error(`${c.name}: python failed\n${run.stderr}`);
        const { shape } = JSON.parse(run.stdout) as { shape: number[] };
        const bytes = readFileSync(outFile);
        const hidden = [...new Float64Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 8)];
        console.log(`${c.name}: last_hidden_state [${shape.join(',')}]`);
        return { ...c, shape, lastHiddenState: hidden };
      });
      const fixture = {
        about:
          "transformers' UMT5EncoderModel last_hidden_state (modeling_umt5.py) by test/reference/umt5_numpy.py, " +
          'a line-by-line numpy float64 transcription; made by test/reference/make-umt5-fixture.ts',
        config: TINY_UMT5_CONFIG,
        seed: SEED,
        init: INIT,
        cases,
      };
      writeFileSync(FIXTURE_PATH, JSON.stringify(fixture) + '\n');
      console.log(`wrote ${FIXTURE_PATH}`);
    })
    .finally(() => rmSync(dir, { recursive: true, force: true }));
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) main();
