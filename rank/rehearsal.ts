// A job's forward passes timed before the job: the cost model's FLOP rates miss what small shapes,
// stage calls, the page↔engine hop and tabs computing side by side cost (for small jobs they are
// most of a step), so the planner asks each worker to run its share of a forward on the job's own
// model and shapes, through the same stage calls, and plans with that.
import type { WanConfig } from '../core/model/config.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { checkDegree, partFloats, planUlysses, type UlyssesPlan } from '../core/parallel.ts';
import { medianSample } from '../core/median.ts';
import { SeededRandom } from '../core/random.ts';
import type { DeviceStageRunner } from './stages.ts';
import { ExchangePhase, forwardRank, noStats, type Exchange } from './ulysses.ts';

/**
 * forwards timed per degree at most (after a warm-up), within BUDGET_MS: a step's time varies from
 * one to the next on a busy machine, and a median of five holds a prediction where three did not
 */
const RUNS = 5;
const BUDGET_MS = 1_000;
/**
 * A fresh engine is cold: the browser optimises onnxruntime's WebAssembly as it runs hot, so its
 * first few dozen forwards speed up severalfold, and a rehearsal timed cold predicts neither the
 * job's first steps nor its last. So a new engine's first rehearsal runs WARM_FORWARDS forwards
 * (one block each where a forward is long), for WARM_MS at most, before it times any: the job after
 * it then runs warm from its first step. A job of fewer forwards is warmed up for its own number of
 * forwards: more would cost it more than its cold steps do. (Forwards stopping getting faster is no
 * sign: they vary from one to the next on a busy machine while they still speed up.)
 */
const WARM_FORWARDS = 24;
const WARM_MS = 6_000;
/** a forward longer than this is rehearsed one block at a time */
const LONG_MS = 2_000;
/** 720p × 129 frames of Wan2.1 is 119,600 tokens; a rehearsal allocates its patches, so a bound */
const MAX_TOKENS = 1 << 17;

/**
 * The mesh of a rehearsal, without peers: rank 0 of the plan is sent parts of the sizes its peers
 * would send it (zeros), so it computes exactly its share.
 */
const echoExchange = (plan: UlyssesPlan): Exchange => ({
  rank: 0,
  world: plan.degree,
  bytesSent: 0,
  dtype: 'f32',
  allToAll: (tag, parts) =>
    Promise.resolve(
      parts.map((part, j) =>
        j === 0
          ? part
          : new Float32Array(partFloats(plan, tag.phase === ExchangePhase.QKV ? 'qkv' : 'output', j, 0, tag.group)),
      ),
    ),
});

/**
 * ms of one rank's forward under each Ulysses degree: the median of a few where one is quick, else
 * blocks × one block; on an engine that has not computed yet (`warmUpFor`: the forwards of the job it
 * warms up for), after warming it up.
 */
export async function rehearseForwards(
  cfg: WanConfig,
  stages: DeviceStageRunner,
  latentShape: number[],
  textTokens: number,
  degrees: number[],
  warmUpFor: { forwards: number } | null,
): Promise<number[]> {
  if (latentShape[0] !== cfg.inChannels)
    throw new Error(`rehearse needs a latent shape [${cfg.inChannels}, T, H, W], got ${JSON.stringify(latentShape)}`);
  const grid = tokenGrid(cfg, latentShape);
  if (grid.count > MAX_TOKENS)
    throw new Error(`rehearse of ${grid.count} tokens: at most ${MAX_TOKENS} (720p × 129 frames)`);
  const random = new SeededRandom(7);
  const text = random.normals(textTokens * cfg.textDim);
  const patchWidth = cfg.inChannels * cfg.patchSize.reduce((a, b) => a * b, 1);
  const forwardMs: number[] = [];
  for (const [i, degree] of degrees.entries()) {
    checkDegree(cfg.numHeads, degree);
    const plan = planUlysses(cfg, grid.count, degree);
    const input = {
      patches: random.normals(plan.rows[0] * patchWidth),
      timestep: 500,
      text,
      grid,
      tag: { job: 0, step: 0, pass: 0 },
    };
    // the forward's wall clock, as a job's step sees it: its stage calls and the page's work between them
    const forward = async (numLayers: number) => {
      const started = performance.now();
      await forwardRank({ ...cfg, numLayers }, plan, stages, echoExchange(plan), input, noStats());
      return performance.now() - started;
    };
    // A forward of one block first: where the whole forward would take long (a real model's 30
    // blocks at 480p), a further one-block forward × the blocks is the rehearsal (embedding and head
    // counted once per block: a fraction of a per cent of a block there).
    const oneBlockMs = await forward(1);
    const long = oneBlockMs * cfg.numLayers > LONG_MS;
    if (warmUpFor && i === 0) await warmUp(() => forward(long ? 1 : cfg.numLayers), warmUpFor.forwards);
    forwardMs.push(
      long ? cfg.numLayers * (await forward(1)) : await medianSample(() => forward(cfg.numLayers), RUNS, BUDGET_MS),
    );
  }
  return forwardMs;
}

/** the latent a preloaded engine warms up on: a small job's (5 frames of 64×64 pixels under Wan's VAE) */
const WARM_LATENT = [2, 8, 8];

/**
 * Warms a cold engine up (WARM_FORWARDS) before any job asks it to: a worker that preloads the model does this once
 * the weights are in, so the first job's rehearsal times warm forwards at once instead of warming up first.
 */
export async function warmUpEngine(cfg: WanConfig, stages: DeviceStageRunner, textTokens: number): Promise<void> {
  await rehearseForwards(cfg, stages, [cfg.inChannels, ...WARM_LATENT], textTokens, [1], { forwards: WARM_FORWARDS });
}

/** Whether a warm-up for a job of `forwards` leaves an engine warm for any job (WARM_FORWARDS). */
export const warmsFully = (forwards: number): boolean => forwards >= WARM_FORWARDS;

async function warmUp(forward: () => Promise<unknown>, jobForwards: number): Promise<void> {
  const started = performance.now();
  const forwards = Math.min(WARM_FORWARDS, jobForwards);
  for (let n = 0; n < forwards && performance.now() - started < WARM_MS; n++) await forward();
}
