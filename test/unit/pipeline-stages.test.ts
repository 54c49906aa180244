// Pooled memory's foundation: a rank that holds only a pipeline stage's blocks loads only their
// tensors (the embedders with the first stage, the head with the last), and a forward passed stage
// to stage as a hidden state gives the whole model's output to the bit, alone or under Ulysses in
// each stage.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-web';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { BlockRange } from '../../core/model/blocks.ts';
import { parseWanConfig } from '../../core/model/config.ts';
import { randomForwardInputs, readForwardInputs } from '../../core/model/forward-io.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { gatherLatent, planUlysses, scatterLatent } from '../../core/parallel.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { onnxStages, type OnnxStages } from '../../rank/onnx-stages.ts';
import { forwardInProcess, forwardStage, type HiddenState } from '../../rank/ulysses.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';
import { writeCaseFolder, type FixtureCase } from '../reference/make-wan-transformer-fixture.ts';

const FOUR_BLOCKS: FixtureCase = {
  name: 'four blocks of the 1.3B layout',
  config: { ...WAN21_T2V_1_3B.transformer, attention_head_dim: 24, ffn_dim: 768, num_layers: 4, text_dim: 48 },
  dtype: 'F32',
  input: { frames: 2, height: 6, width: 10, textLength: 7, seed: 9 },
};
const STAGES: BlockRange[] = [
  { from: 0, to: 1 },
  { from: 1, to: 3 },
  { from: 3, to: 4 },
];

let dir: string;
let whole: WanModel;
let parts: { model: WanModel; runner: OnnxStages }[];
let inputs: ReturnType<typeof readForwardInputs>;

beforeAll(async () => {
  ort.env.wasm.numThreads = 1;
  dir = await mkdtemp(join(tmpdir(), 'ditswarm-stages-'));
  await writeCaseFolder(FOUR_BLOCKS, dir);
  whole = await loadTransformer(folderFiles(dir));
  parts = await Promise.all(
    STAGES.map(async (blocks) => {
      const model = await loadTransformer(folderFiles(dir), undefined, blocks);
      return { model, runner: await onnxStages(model, 'wasm') };
    }),
  );
  const cfg = parseWanConfig(FOUR_BLOCKS.config, FOUR_BLOCKS.name);
  inputs = readForwardInputs(cfg, randomForwardInputs(cfg, FOUR_BLOCKS.input), FOUR_BLOCKS.name);
});
afterAll(() => rm(dir, { recursive: true, force: true }));

/** The forward passed through the stages in turn, each stage's `degree` ranks at once, rank r to rank r. */
async function stagedForward(degree: number): Promise<Tensor> {
  const cfg = whole.config;
  const { latent, timestep, text } = inputs;
  const grid = tokenGrid(cfg, latent.shape);
  const plan = planUlysses(cfg, grid.count, degree);
  const tag = { job: 1, step: 0, pass: 0 };
  let carried: (Float32Array | HiddenState)[] = scatterLatent(cfg, plan, latent);
  for (const [s, blocks] of STAGES.entries()) {
    const exchanges = memoryExchanges(degree);
    carried = await Promise.all(
      exchanges.map(async (exchange) => {
        const from = carried[exchange.rank];
        const start = from instanceof Float32Array ? { patches: from } : { hidden: from };
        const out = await forwardStage(
          cfg,
          plan,
          parts[s].runner,
          exchange,
          { ...start, timestep, text, grid, tag },
          blocks,
        );
        return 'rows' in out ? out.rows : out.hidden;
      }),
    );
  }
  return gatherLatent(cfg, plan, carried as Float32Array[], latent.shape);
}

describe('pipeline stages', () => {
  it("a stage loads its blocks' tensors only, the embedders with the first and the head with the last", () => {
    const blocksOf = (m: WanModel) =>
      [...new Set([...m.weights.keys()].flatMap((k) => /^blocks\.(\d+)\./.exec(k)?.[1] ?? []))].map(Number);
    expect(parts.map((p) => blocksOf(p.model))).toEqual([[0], [1, 2], [3]]);
    const has = (m: WanModel, name: string) => m.weights.has(name);
    expect(parts.map((p) => has(p.model, 'patch_embedding.weight'))).toEqual([true, false, false]);
    expect(parts.map((p) => has(p.model, 'condition_embedder.time_proj.weight'))).toEqual([true, false, false]);
    expect(parts.map((p) => has(p.model, 'proj_out.weight') && has(p.model, 'scale_shift_table'))).toEqual([
      false,
      false,
      true,
    ]);
    const count = (m: WanModel) => [...m.weights.values()].reduce((n, t) => n + t.data.length, 0);
    expect(parts.reduce((n, p) => n + count(p.model), 0)).toBe(count(whole));
  });

  it.each([1, 2, 3])(
    "three stages of %i Ulysses rank(s) each give the whole model's output to the bit",
    async (degree) => {
      const expected = await forwardInProcess(
        whole.config,
        await onnxStages(whole, 'wasm'),
        memoryExchanges(degree),
        inputs.latent,
        inputs.timestep,
        inputs.text,
        { job: 1, step: 0, pass: 0 },
      );
      const staged = await stagedForward(degree);
      expect(staged.shape).toEqual(expected.shape);
      expect(maxAbsDiff(staged.data, expected.data)).toBe(0);
    },
  );

  it('a stage asked for what another stage holds says which blocks it holds and whose that is', async () => {
    const { latent, text } = inputs;
    await expect(parts[1].runner.embed(latent.data.subarray(0, 64), Float32Array.of(500), text)).rejects.toThrow(
      "this rank holds blocks 1–2 of the transformer: the embedders are the first pipeline stage's",
    );
    const x = new Float32Array(whole.config.dim);
    await expect(parts[0].runner.head(x, x, new Int32Array(1))).rejects.toThrow(
      "the output head is the last pipeline stage's",
    );
    await expect(
      parts[0].runner.preAttention(
        2,
        x,
        new Float32Array(6 * whole.config.dim),
        new Int32Array(1),
        new Float32Array(12),
        new Float32Array(12),
      ),
    ).rejects.toThrow("this rank holds blocks 0–0 of the transformer: block 2 is another stage's");
    await expect(loadTransformer(folderFiles(dir), undefined, { from: 2, to: 5 })).rejects.toThrow(
      'the transformer has blocks 0–3: a stage cannot hold [2, 5)',
    );
  });
});
