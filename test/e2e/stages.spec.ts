import { join } from 'node:path';
import { expect, test } from '@playwright/test';
import { holdsTensor, type BlockRange } from '../../core/model/blocks.ts';
import { openCheckpoint } from '../../core/model/checkpoint.ts';
import { parseWanConfig } from '../../core/model/config.ts';
import { readJson } from '../../core/model/files.ts';
import { TRANSFORMER_CONFIG, TRANSFORMER_WEIGHTS_NAME } from '../../core/model/transformer.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { CI, maxAbsDiff, runJob, SMALL_WASM_JOB, suiteSwarm, TEST_MODEL, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// Exact staged mode over worker tabs (issue 35): the tiny model's two blocks cut into two pipeline
// stages, one tab each, each loading only its stage's tensors (the embedders with the first, the
// head with the last); every forward passes from the first tab's stage to the second's as a hidden
// state over their own data channel (issue 65), and the latent is one tab holding everything, to the bit.

/** The bytes of the tiny checkpoint's tensors a stage holding `range` reads (float32: as it holds them). */
async function heldBytes(range: BlockRange): Promise<number> {
  const files = folderFiles(join(import.meta.dirname, '../../public', TEST_MODEL));
  const config = parseWanConfig(await readJson(files, TRANSFORMER_CONFIG), TRANSFORMER_CONFIG);
  const checkpoint = await openCheckpoint(files, 'transformer', TRANSFORMER_WEIGHTS_NAME);
  return [...checkpoint.tensors.values()]
    .filter((t) => holdsTensor(config, range, t.name))
    .reduce((n, t) => n + t.end - t.begin, 0);
}

test.describe.serial('pipeline stages over worker tabs', CI, () => {
  const swarm = suiteSwarm(2);
  const job = SMALL_WASM_JOB;
  let stagedFloat32: Awaited<ReturnType<typeof runJob>>;

  test("two stages on two tabs equal one tab holding the whole model, to the bit; each tab holds only its stage's weights", async () => {
    test.setTimeout(300_000);
    const single = await runJob(swarm.dashboard, { ...job, workers: 1 });
    expect(single.report.placement.stages).toBeNull();
    const whole = await heldBytes({ from: 0, to: 2 });
    expect(single.report.workers.map((w) => w.heldWeightBytes)).toEqual([whole]);

    const staged = await runJob(swarm.dashboard, { ...job, workers: 1, stages: 2 });
    stagedFloat32 = staged;
    const { placement, workers } = staged.report;
    expect(placement.layout).toMatchObject({ world: 2, ulyssesDegree: 1, cfgGroups: 1, stages: 2 });
    const stages = placement.stages ?? [];
    expect(stages.map((s) => s.blocks)).toEqual([
      [0, 1],
      [1, 2],
    ]);
    // a stage each, on two tabs: the report's workers in stage order
    expect(stages.map((s) => s.workers)).toEqual(workers.map((w) => [w.id]));
    expect(new Set(workers.map((w) => w.id)).size).toBe(2);
    const held = workers.map((w) => w.heldWeightBytes);
    expect(held).toEqual([await heldBytes({ from: 0, to: 1 }), await heldBytes({ from: 1, to: 2 })]);
    expect(held[0] + held[1]).toBe(whole);
    // what the planner cut the stages by is what each worker holds
    expect(held).toEqual(stages.map((s) => s.heldBytes));
    console.log(
      `stages: held ${held.map((b) => `${(b / 1e6).toFixed(2)} MB (${((100 * b) / whole).toFixed(0)} %)`).join(' / ')} ` +
        `of ${(whole / 1e6).toFixed(2)} MB`,
    );
    for (const h of held) expect(h).toBeLessThan(0.65 * whole); // the embedders are most of the first stage's excess

    // every forward crossed both stages: each step's two passes on both tabs, handed from the first tab to the second
    // directly (x of every token, the timestep's embedding and its projection, the text's rows: float32)
    const [, frames, height, width] = staged.report.latentShape;
    const tokens = frames * (height / 2) * (width / 2);
    for (const step of staged.report.steps) {
      expect(step.ranks.map((r) => r.rank)).toEqual([0, 1]);
      for (const rank of step.ranks) expect(rank.computeMs).toBeGreaterThan(0);
      const [handOff] = step.handOffs;
      expect(step.handOffs).toHaveLength(1);
      expect(handOff.bytes).toBe(step.ranks[1].handOff?.bytes);
      const textRows = handOff.bytes / (2 * 4 * 288) - 7 - tokens;
      expect(Number.isInteger(textRows) && textRows > 0).toBe(true);
    }
    expect(staged.report.coordinatorActivationBytes).toBe(0);
    const diff = maxAbsDiff(staged.latent, single.latent);
    console.log(
      `stages: S=2 max-abs vs 1 tab ${diff.toExponential(2)}, step ms ${staged.report.steps.map((s) => s.ms.toFixed(0)).join('/')} ` +
        `(1 tab ${single.report.steps.map((s) => s.ms.toFixed(0)).join('/')})`,
    );
    expect(diff).toBe(0);
  });

  test("asked for float16 weights, each stage's tab holds its weights at half their bytes (the embedders' and head's too), as the planner cut them by; the latent within 1e-3 of float32's", async () => {
    test.setTimeout(300_000);
    const halved = await runJob(swarm.dashboard, { ...job, workers: 1, stages: 2, weightType: 'float16' });
    const { placement, workers } = halved.report;
    expect(workers.map((w) => w.weightType)).toEqual(['float16', 'float16']);
    const held = workers.map((w) => w.heldWeightBytes);
    expect(held).toEqual(placement.stages?.map((s) => s.heldBytes));
    const float32Held = stagedFloat32.report.workers.map((w) => w.heldWeightBytes);
    expect(held).toEqual(float32Held.map((bytes) => bytes / 2));
    const scale = Math.max(...stagedFloat32.latent.map(Math.abs));
    const diff = maxAbsDiff(halved.latent, stagedFloat32.latent);
    console.log(
      `stages: float16 weights held ${held.map((b) => `${(b / 1e6).toFixed(2)} MB`).join(' / ')} ` +
        `(float32 ${float32Held.map((b) => `${(b / 1e6).toFixed(2)} MB`).join(' / ')}), ` +
        `max-abs vs float32 ${diff.toExponential(2)} of a latent scale ${scale.toFixed(2)}`,
    );
    expect(diff).toBeGreaterThan(0);
    expect(diff).toBeLessThan(1e-3 * scale);
  });

  test("PipeFusion: after an exact warm-up step, two patches flow through the two stages' tabs at once; the latent near exact staged mode's, not equal to it", async () => {
    test.setTimeout(300_000);
    const asked = { ...job, workers: 1, stages: 2, pipeFusionPatches: 2, warmupSteps: 1 };
    const fused = await runJob(swarm.dashboard, asked);
    const { placement, steps } = fused.report;
    expect([placement.pipeFusion, placement.spotChecks.rate]).toEqual([{ patches: 2 }, 0]);
    for (const step of steps) expect(step.ranks.map((r) => r.rank).sort()).toEqual([0, 1]);
    const scale = Math.max(...stagedFloat32.latent.map(Math.abs));
    const diff = maxAbsDiff(fused.latent, stagedFloat32.latent);
    console.log(
      `stages: PipeFusion, 2 patches after 1 exact step: max-abs vs exact staged ${diff.toExponential(2)} of a latent ` +
        `scale ${scale.toFixed(2)}, step ms ${steps.map((s) => s.ms.toFixed(0)).join('/')}`,
    );
    // the step after the warm-up attends to the step before's keys and values for the later patch
    expect(diff).toBeGreaterThan(0);
    expect(diff).toBeLessThan(2e-3 * scale);
  });

  test("what a worker's user lets the model take, set on its page, caps its stage: a staged job that no longer fits is refused before any weight moves, saying what is missing", async () => {
    test.setTimeout(120_000);
    const job = {
      prompt: 'a red ball',
      frames: 1,
      height: 32,
      width: 32,
      steps: 1,
      backend: 'swarm',
      ep: 'wasm',
    } as const;
    const setMemory = async (gib: string) => {
      for (const page of swarm.workers) {
        await page.fill('#model-memory', gib);
        await page.locator('#model-memory').dispatchEvent('change');
      }
    };
    try {
      await setMemory('0.0009765625'); // 1 MiB each: less than the tiny model's embedders
      await expect(swarm.workers[0].locator('#model-memory-note')).toHaveText(
        /pipeline stage placed here take no more/,
      );
      // each worker's next pulse tells the dashboard, whose swarm view shows it: the job is planned once both have
      await expect(
        swarm.dashboard.locator('#workers tbody tr').filter({ hasText: 'weights ≤ 1.0 MB (set on its page)' }),
      ).toHaveCount(2, { timeout: 10_000 });
      const histories = () =>
        Promise.all(swarm.workers.map((page) => page.evaluate(() => [...window.ditswarmWorkerHistory])));
      const before = await histories();
      await expect(runJob(swarm.dashboard, { ...job, workers: 1, stages: 2 })).rejects.toThrow(
        /cannot be placed in 2 pipeline stages: the model needs .* it needs .* more, one more worker with/,
      );
      // no worker was asked to load anything
      const after = await histories();
      expect(after.map((states, i) => states.slice(before[i].length).filter((s) => s.startsWith('loading')))).toEqual([
        [],
        [],
      ]);
      await swarm.workers[1].fill('#model-memory', '-1');
      await swarm.workers[1].locator('#model-memory').dispatchEvent('change');
      await expect(swarm.workers[1].locator('#model-memory-note')).toHaveText(/a number of GiB from/);
    } finally {
      await setMemory('');
    }
    await expect(swarm.dashboard.locator('#workers tbody')).not.toContainText('set on its page', { timeout: 10_000 });
  });
});
