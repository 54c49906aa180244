// Writes test/unit/wan-transformer.fixture.json: what diffusers' WanTransformer3DModel.forward gives
// for small seeded transformers in the published layout, by a float64 numpy transcription of the
// upstream Python (wan_transformer_numpy.py), so the forward the workers run is held to diffusers'
// code and not to a reading of it.
//
//   npx tsx test/reference/make-wan-transformer-fixture.ts
//
// Each case is the published config.json of a Wan2.1 or Wan2.2 transformer with its width cut (the heads and
// every other field as published) and a checkpoint of seeded weights stored as the case says (F32 as
// the 1.3B is published, BF16 as 14B checkpoints are shipped). The fixture keeps each case's output
// sample whole. The test (test/unit/wan-transformer-reference.test.ts) makes the same folders and
// inputs with the functions exported here, without Python.

import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { expectedWeightShapes, parseWanConfig } from '../../core/model/config.ts';
import { randomForwardInputs, type RandomInputSize } from '../../core/model/forward-io.ts';
import { TRANSFORMER_CONFIG, TRANSFORMER_WEIGHTS_NAME } from '../../core/model/transformer.ts';
import { writeSafetensors, type SafetensorsDType } from '../../core/safetensors.ts';
import { seededTransformerWeight, writeCheckpoint } from '../../server/model-folder.ts';
import { randomWanLora } from '../../server/cli/make-lora.ts';
import { WAN21_T2V_14B, WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';
import { WAN22_TI2V_5B } from '../../server/wan22-layout.ts';

export const FIXTURE_PATH = join(import.meta.dirname, '../unit/wan-transformer.fixture.json');
const SCRIPT = join(import.meta.dirname, 'wan_transformer_numpy.py');
export const SEED = 'wan-transformer-fixture';

/** How a tensor's seeded values are made (written into the fixture as text too). */
export const INIT =
  'seededRandom(seed, name).normals(n, std): *scale_shift_table N(0, 1/D); norm*.weight 1 + N(0, 0.05²); ' +
  '*.bias N(0, 0.02²); weights N(0, 1/fan_in) with fan_in = n / shape[0]; inputs randomForwardInputs(config, input)';

export const seededWeight = seededTransformerWeight;

export interface FixtureCase {
  name: string;
  /** the published transformer/config.json with these fields changed */
  config: Record<string, unknown>;
  dtype: SafetensorsDType;
  input: RandomInputSize;
  /** a seeded LoRA in the original Wan keys over every module (lora.safetensors), merged at this strength */
  lora?: { rank: number; alpha: number; strength: number };
}

export const LORA_FILE = 'lora.safetensors';

/** 30 tokens (2 × 3 × 5 patches): no Ulysses degree above 1 divides them, so every split pads and masks. */
const INPUT: RandomInputSize = { frames: 2, height: 6, width: 10, textLength: 7, seed: 5 };

export const CASES: FixtureCase[] = [
  {
    name: "1.3B's 12 heads, float32",
    config: { ...WAN21_T2V_1_3B.transformer, attention_head_dim: 24, ffn_dim: 768, num_layers: 2, text_dim: 48 },
    dtype: 'F32',
    input: INPUT,
  },
  {
    name: "1.3B's 12 heads, float32, a LoRA in Wan's own keys at 0.8",
    config: { ...WAN21_T2V_1_3B.transformer, attention_head_dim: 24, ffn_dim: 768, num_layers: 2, text_dim: 48 },
    dtype: 'F32',
    input: { ...INPUT, seed: 7 },
    lora: { rank: 4, alpha: 2, strength: 0.8 },
  },
  {
    // 13824 / 5120 of the width, as published
    name: "14B's 40 heads, bfloat16",
    config: { ...WAN21_T2V_14B.transformer, attention_head_dim: 24, ffn_dim: 2592, num_layers: 2, text_dim: 48 },
    dtype: 'BF16',
    input: { ...INPUT, seed: 6 },
  },
  {
    // 14336 / 3072 of the width, as published; a timestep per token, the first latent frame's 0, as the TI2V pipeline
    // gives an image's (expand_timesteps)
    name: "TI2V-5B's 24 heads and 48 channels, float32, a timestep per token",
    config: { ...WAN22_TI2V_5B.transformer, attention_head_dim: 24, ffn_dim: 2688, num_layers: 2, text_dim: 48 },
    dtype: 'F32',
    input: { ...INPUT, seed: 8, perToken: true },
  },
];

/** Writes a case's transformer folder (transformer/config.json and its checkpoint) into `dir`. */
export async function writeCaseFolder(c: FixtureCase, dir: string): Promise<void> {
  const config = parseWanConfig(c.config, c.name);
  const specs = [...expectedWeightShapes(config)].map(([name, shape]) => ({ name, shape }));
  await writeCheckpoint(
    join(dir, 'transformer'),
    TRANSFORMER_WEIGHTS_NAME,
    specs,
    ({ name, shape }) => seededWeight(SEED, name, shape, config.dim),
    { dtype: c.dtype },
  );
  writeFileSync(join(dir, TRANSFORMER_CONFIG), JSON.stringify(c.config, null, 2) + '\n');
}

/** Writes a case's LoRA (make-lora's, in Wan's own keys) into `dir`/lora.safetensors. */
export function writeCaseLora(c: FixtureCase, dir: string): void {
  if (!c.lora) return;
  const lora = randomWanLora(parseWanConfig(c.config, c.name), { ...c.lora, seed: SEED });
  writeFileSync(join(dir, LORA_FILE), writeSafetensors(lora));
}

async function main(): Promise<void> {
  const cases = [];
  for (const c of CASES) {
    const dir = mkdtempSync(join(tmpdir(), 'wan-transformer-fixture-'));
    try {
      await writeCaseFolder(c, dir);
      const inputs = randomForwardInputs(parseWanConfig(c.config, c.name), c.input);
      writeFileSync(join(dir, 'in.safetensors'), writeSafetensors(inputs));
      writeCaseLora(c, dir);
      const out = join(dir, 'sample.f64');
      const lora = c.lora ? ['--lora', `${join(dir, LORA_FILE)}:${c.lora.strength}`] : [];
      const run = spawnSync(
        'python3',
        [
          SCRIPT,
          '--transformer',
          join(dir, 'transformer'),
          '--input',
          join(dir, 'in.safetensors'),
          '--out',
          out,
          ...lora,
        ],
        { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: '1', OPENBLAS_NUM_THREADS: '1' } },
      );
      if (run.status !== 0) throw new Error(`${c.name}: python failed\n${run.stderr}`);
      const summary = JSON.parse(run.stdout) as { shape: number[]; maxAbs: number };
      const bytes = readFileSync(out);
      const sample = new Float64Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 8);
      console.log(`${c.name}: sample [${summary.shape.join(',')}], max |value| ${summary.maxAbs.toPrecision(4)}`);
      cases.push({ ...c, shape: summary.shape, sample: Array.from(sample, (v) => Number(v.toPrecision(12))) });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
  const fixture = {
    about:
      "diffusers' WanTransformer3DModel.forward (transformer_wan.py) by test/reference/wan_transformer_numpy.py, " +
      'a float64 numpy transcription; made by test/reference/make-wan-transformer-fixture.ts',
    seed: SEED,
    init: INIT,
    cases,
  };
  writeFileSync(FIXTURE_PATH, JSON.stringify(fixture) + '\n');
  console.log(`wrote ${FIXTURE_PATH}`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((e: unknown) => {
    console.error(e);
    process.exit(1);
  });
}
