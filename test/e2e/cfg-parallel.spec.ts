import { expect, test } from '@playwright/test';
import { CI, maxAbsDiff, runJob, SMALL_WASM_JOB, suiteSwarm, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// CFG parallel over worker tabs: the conditional pass on one tab, the unconditional on another,
// both at once over WebRTC, equals one worker running both passes. wasm EP: the parity is about the split.
test.describe.serial('CFG parallel over worker tabs', CI, () => {
  const swarm = suiteSwarm(2);

  test('two groups of one tab equal one worker within 1e-4; a job without guidance falls back to one group and says why', async () => {
    test.setTimeout(300_000);
    const job = SMALL_WASM_JOB;
    const single = await runJob(swarm.dashboard, { ...job, workers: 1, cfgParallel: false });
    expect(single.report.placement.layout).toMatchObject({ world: 1, ulyssesDegree: 1, cfgGroups: 1 });

    const cfg = await runJob(swarm.dashboard, { ...job, workers: 1, cfgParallel: true });
    expect(cfg.report.placement.layout).toMatchObject({ world: 2, ulyssesDegree: 1, cfgGroups: 2 });
    expect(new Set(cfg.report.workers.map((w: { id: string }) => w.id)).size).toBe(2);
    const diff = maxAbsDiff(cfg.latent, single.latent);
    console.log(
      `CFG parallel 2×1: max-abs vs 1 worker ${diff.toExponential(2)}, step ms ${cfg.report.steps.map((s) => s.ms.toFixed(0)).join('/')} (1 worker ${single.report.steps.map((s) => s.ms.toFixed(0)).join('/')})`,
    );
    expect(diff).toBeLessThanOrEqual(1e-4);
    for (const step of cfg.report.steps) expect(step.ranks.map((r: { rank: number }) => r.rank)).toEqual([0, 1]);

    const unguided = await runJob(swarm.dashboard, { ...job, guidance: 1, workers: 1, cfgParallel: true });
    expect(unguided.report.placement.layout).toMatchObject({ world: 1, cfgGroups: 1 });
    expect(unguided.report.placement.cfgFallback).toMatch(/guidance 1 means one forward pass per step/);
  });
});
