// Wan2.2 TI2V on ranks (issue 67): a folder of its published layout (a narrower transformer, Wan2.2's VAE config) is
// read as its family; a job holding an image as its first latent frame gives every step's model that frame and its
// tokens timestep 0, on 1, 2 and 3 ranks alike; one timestep for all tokens given per token is the scalar forward.
import { mkdtemp, rm, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { familyErrors, latentShape, stepTimestep, WAN22_TI2V } from '../../core/model/family.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { loadWanPipelineParts } from '../../core/model/wan-pipeline.ts';
import { RankLayout } from '../../core/parallel.ts';
import { SeededRandom } from '../../core/random.ts';
import { sample, withFirstFrame } from '../../core/sampler.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import type { EngineApi } from '../../rank/engine.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { WAN22_TI2V_5B } from '../../server/wan22-layout.ts';
import { CASES, writeCaseFolder } from '../reference/make-wan-transformer-fixture.ts';
import { stubEngine } from './fixtures.ts';
import { InProcessExecutor, type InProcessOptions } from './in-process-executor.ts';

const TI2V = CASES.find((c) => c.config.in_channels === 48);
const random = new SeededRandom(11);
/** 3 latent frames of 4×6: 18 tokens, 6 of them the first frame's */
const SHAPE = [48, 3, 4, 6];
let dir: string;
let model: WanModel;
let engine: EngineApi;
let options: InProcessOptions;
let texts: Float32Array[];

beforeAll(async () => {
  if (!TI2V) throw new Error('the transformer fixture has no TI2V-5B case');
  dir = await mkdtemp(join(tmpdir(), 'ditswarm-ti2v-'));
  await writeCaseFolder(TI2V, dir);
  await writeFile(join(dir, 'model_index.json'), JSON.stringify(WAN22_TI2V_5B.modelIndex));
  await mkdir(join(dir, 'vae'));
  await writeFile(join(dir, 'vae/config.json'), JSON.stringify(WAN22_TI2V_5B.vae));
  await mkdir(join(dir, 'scheduler'));
  await writeFile(join(dir, 'scheduler/scheduler_config.json'), JSON.stringify(WAN22_TI2V_5B.scheduler));
  model = await loadTransformer(folderFiles(dir));
  engine = stubEngine(await onnxStages(model, 'wasm'), model.config);
  options = {
    config: model.config,
    modelUrl: '/models/ti2v',
    rpcTimeoutMs: 30_000,
    layout: new RankLayout(1),
    spotCheckRate: 0,
  };
  texts = [random.normals(7 * model.config.textDim), random.normals(7 * model.config.textDim)];
}, 60_000);
afterAll(() => rm(dir, { recursive: true, force: true }));

async function onRanks(P: number): Promise<InProcessExecutor> {
  const executor = new InProcessExecutor({ ...options, layout: new RankLayout(P) }, engine, 'direct');
  await executor.initialize();
  await executor.prepareJob(1, texts, SHAPE);
  return executor;
}

describe('Wan2.2 TI2V', () => {
  it('a folder of the published layout is Wan2.2 TI2V: 48 channels at 16× in space, 704×1280×121 at 24 fps by default, sides a multiple of 32', async () => {
    const parts = await loadWanPipelineParts(folderFiles(dir));
    expect(parts.family).toMatchObject({ name: WAN22_TI2V.name, expandTimesteps: true, fps: 24 });
    expect(latentShape({ frames: 121, height: 704, width: 1280 }, parts.family.latent)).toEqual([48, 31, 44, 80]);
    expect(parts.flowShift).toBe(5);
    expect(familyErrors(parts.family, { height: 720, width: 1280 })).toEqual({
      height: expect.stringContaining('must be a multiple of 32 on Wan2.2 TI2V') as string,
    });
  });

  it('an image held as the first latent frame: every step gives the model that frame, its tokens at timestep 0, and P = 1, 2, 3 end on the same latent within 1e-5, that frame included', async () => {
    const condition = random.normals(SHAPE[0] * SHAPE[2] * SHAPE[3]);
    const grid = tokenGrid(model.config, SHAPE);
    const latents: Tensor[] = [];
    for (const P of [1, 2, 3]) {
      const executor = await onRanks(P);
      const seen: { frame: Float32Array; timesteps: number[] }[] = [];
      const latent = await sample({
        shape: SHAPE,
        steps: 3,
        flowShift: 5,
        seed: 3,
        firstFrame: condition,
        async velocity(at) {
          const timestep = stepTimestep(grid, at.timestep, true);
          const [C, , H, W] = SHAPE;
          const frame = new Float32Array(C * H * W);
          for (let c = 0; c < C; c++)
            frame.set(at.latent.data.subarray(c * 3 * H * W, c * 3 * H * W + H * W), c * H * W);
          seen.push({ frame, timesteps: [...new Set(timestep as Float32Array)] });
          return (await executor.velocity({ job: 1, ...at, timestep }, 5)).velocity;
        },
      });
      await executor.shutdown({ graceMs: 1_000 });
      expect(seen).toHaveLength(3);
      for (const s of seen) {
        expect(s.frame).toEqual(condition);
        expect(s.timesteps[0]).toBe(0);
        expect(s.timesteps).toHaveLength(2);
      }
      expect(withFirstFrame(latent, condition).data).toEqual(latent.data);
      latents.push(latent);
    }
    for (const latent of latents.slice(1)) expect(maxAbsDiff(latent.data, latents[0].data)).toBeLessThanOrEqual(1e-5);
  });

  it("a job without an image gives every token the step's timestep: one per token, all alike, is the scalar forward to the bit", async () => {
    const executor = await onRanks(2);
    const latent: Tensor = { shape: SHAPE, data: random.normals(SHAPE.reduce((a, b) => a * b, 1)) };
    const grid = tokenGrid(model.config, SHAPE);
    const scalar = stepTimestep(grid, 640, false);
    expect(scalar).toBe(640);
    const [a, b] = [
      await executor.velocity({ job: 1, step: 0, timestep: scalar, latent }, 5),
      await executor.velocity({ job: 1, step: 0, timestep: new Float32Array(grid.count).fill(640), latent }, 5),
    ];
    await executor.shutdown({ graceMs: 1_000 });
    expect(b.velocity).toEqual(a.velocity);
  });
});
