import { expect, test } from '@playwright/test';
import type { JobOverrides } from '../../app/automation.ts';
import { maxAbsDiff, runJob, suiteSwarm, WASM_ONLY_BROWSER } from './swarm-page.ts';

test.use(WASM_ONLY_BROWSER); // its jobs all compute on WASM

// Fewer forwards over worker tabs (issue 38). The step cache: the coordinator decides which forwards reuse a residual,
// so 1 tab, 2 Ulysses tabs, two CFG groups and a job that loses a tab mid-run all give the same latent, with the same
// forwards skipped; the demo model's own curve (its folder's step_cache.json) decides them. Few-step sampling: the
// dashboard's fast preset samples as a step-distilled LoRA's publisher does.
const DEMO_MODEL = '/models/tiny-wan-demo';
const job = {
  prompt: 'a blue circle moving up',
  frames: 9,
  height: 64,
  width: 64,
  steps: 20,
  guidance: 4,
  seed: 5,
  backend: 'swarm',
  ep: 'wasm',
  model: DEMO_MODEL,
  spotCheckRate: 0,
  shares: 'even',
} satisfies JobOverrides;
const FORWARDS = job.steps * 2;

test.describe.serial('fewer forwards over worker tabs', () => {
  const swarm = suiteSwarm(3);
  let oneTab: Awaited<ReturnType<typeof runJob>>;

  test("1 tab, 2 Ulysses tabs and two CFG groups reuse the same forwards and give the same latent, with ≥ 1.7× fewer forwards than the uncached job's; displaced tabs reuse them too, near it", async () => {
    test.setTimeout(300_000);
    const uncached = await runJob(swarm.dashboard, { ...job, workers: 1, cfgParallel: false });
    expect(uncached.report.cache).toBeNull();
    oneTab = await runJob(swarm.dashboard, { ...job, workers: 1, cfgParallel: false, cache: 'auto' });
    const cache = oneTab.report.cache;
    expect(cache).toMatchObject({ method: 'magcache', threshold: 0.12, replayed: [], recomputed: [] });
    expect(cache?.curve).toMatch(/^step_cache\.json \(calibrated by ditswarm/);
    const computed = cache?.forwardsComputed ?? FORWARDS;
    console.log(
      `step cache: ${computed} of ${FORWARDS} forwards computed (${(FORWARDS / computed).toFixed(2)}× fewer), ` +
        `max-abs vs uncached ${maxAbsDiff(oneTab.latent, uncached.latent).toExponential(2)}, denoising ` +
        `${oneTab.report.phasesMs.denoising.toFixed(0)} ms vs ${uncached.report.phasesMs.denoising.toFixed(0)} ms`,
    );
    expect(computed + (cache?.forwardsReused ?? 0)).toBe(FORWARDS);
    expect(FORWARDS / computed).toBeGreaterThanOrEqual(1.7);
    // reusing moves the latent (a cache that computed everything would not)
    expect(maxAbsDiff(oneTab.latent, uncached.latent)).toBeGreaterThan(1e-3);

    // on 2 Ulysses tabs every forward is checked, reused ones too: their checker computes the kept forward first
    for (const layout of [
      { workers: 2, cfgParallel: false, spotCheckRate: 1 },
      { workers: 1, cfgParallel: true },
    ] as const) {
      const run = await runJob(swarm.dashboard, { ...job, ...layout, cache: 'auto' });
      expect(run.report.placement.layout.world).toBe(2);
      expect(run.report.cache?.reused).toEqual(cache?.reused);
      if ('spotCheckRate' in layout) {
        const checked = run.report.spotChecks.map((c) => `${c.step},${c.pass},${c.verdict === 'agreed'}`);
        for (const [step, pass] of cache?.reused ?? []) expect(checked).toContain(`${step},${pass},true`);
        expect(checked).toHaveLength(FORWARDS);
      }
      const diff = maxAbsDiff(run.latent, oneTab.latent);
      console.log(`step cache on ${JSON.stringify(layout)}: max-abs vs 1 tab ${diff.toExponential(2)}`);
      expect(diff).toBeLessThanOrEqual(1e-4);
    }
    // displaced ranks attend to keys and values of their last computed step: near, not equal
    const displaced = await runJob(swarm.dashboard, { ...job, workers: 2, parallel: 'displaced', cache: 'auto' });
    expect(displaced.report.cache?.reused).toEqual(cache?.reused);
    const scale = Math.max(...oneTab.latent.map(Math.abs));
    const drift = maxAbsDiff(displaced.latent, oneTab.latent);
    console.log(`step cache, displaced on 2 tabs: max-abs vs 1 tab ${drift.toExponential(2)} (latent scale ${scale})`);
    expect(drift).toBeLessThan(0.1 * scale);
  });

  test("a tab closed mid-job: the new placement runs the pass's last kept forward again and the latent is the uninterrupted one", async () => {
    test.setTimeout(300_000);
    const uninterrupted = await runJob(swarm.dashboard, { ...job, workers: 3, cache: 'auto' });
    // the tab of rank 1 closes as the first step that reuses both passes starts: its forwards need the residual
    const reused = uninterrupted.report.cache?.reused ?? [];
    const both = reused.find(([step, pass]) => pass === 0 && reused.some(([s, p]) => s === step && p === 1));
    expect(both).toBeDefined();
    const closeAt = both?.[0] ?? 0;
    const ids = await Promise.all(swarm.workers.map((page) => page.evaluate(() => window.ditswarmWorker?.peerId)));
    let closed = false;
    await swarm.dashboard.exposeFunction('ditswarmProgress', async (p: { step?: number }) => {
      if (p.step !== closeAt || closed) return;
      closed = true;
      const ranks: string[] = await swarm.dashboard.evaluate(() => window.ditswarm.ranks());
      await swarm.workers[ids.indexOf(ranks[1])].close();
    });
    const run = await runJob(swarm.dashboard, { ...job, workers: 3, cache: 'auto' });
    expect(closed).toBe(true);
    expect(run.report.failures).toHaveLength(1);
    const diff = maxAbsDiff(run.latent, uninterrupted.latent);
    console.log(
      `step cache, rank 1 closed as step ${closeAt + 1} starts: replayed ${JSON.stringify(run.report.cache?.replayed)}, ` +
        `max-abs vs uninterrupted ${diff.toExponential(2)}`,
    );
    expect(run.report.cache?.reused).toEqual(reused);
    expect(run.report.cache?.recomputed).toEqual([]);
    expect(diff).toBeLessThanOrEqual(1e-4);
  });

  test("the fast preset: 4 steps without guidance on lightx2v's schedule, one forward a step, the same on 1 and 2 tabs", async () => {
    test.setTimeout(120_000);
    const { dashboard } = swarm;
    await dashboard.locator('#fast-preset').click();
    const form = (name: string) => dashboard.locator(`[name="${name}"]`);
    await expect(form('steps')).toHaveValue('4');
    await expect(form('guidance')).toHaveValue('1');
    await expect(form('flowShift')).toHaveValue('5');
    await expect(form('scheduler')).toHaveValue('step-distill');
    await expect(form('loras')).toBeFocused(); // the distilled LoRA it needs goes there
    const fast = { ...job, steps: 4, guidance: 1, flowShift: 5, scheduler: 'step-distill' } as const;
    const one = await runJob(dashboard, { ...fast, workers: 1 });
    expect(one.report.schedule.scheduler).toBe('WanStepDistillScheduler');
    expect(one.report.schedule.timesteps.map((t) => +t.toFixed(1))).toEqual([1000, 937.5, 833.3, 625]);
    expect(one.report.steps).toHaveLength(4);
    const two = await runJob(dashboard, { ...fast, workers: 2 });
    expect(maxAbsDiff(two.latent, one.latent)).toBeLessThanOrEqual(1e-4);
  });
});
