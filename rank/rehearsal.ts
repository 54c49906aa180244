// A job's forward passes timed before the job: the cost model's FLOP rates miss what small shapes,
// stage calls, the page↔engine hop and tabs computing side by side cost (the default job: predicted
// 48 ms a step from the probes, measured 227), so the planner asks each worker to run its share of
// a forward on the job's own model and shapes, through the same stage calls, and plans with that.
import type { WanConfig } from '../core/model/config.ts';
import { tokenGrid } from '../core/model/tokens.ts';
import { checkDegree, partFloats, planUlysses, type UlyssesPlan } from '../core/parallel.ts';
import { SeededRandom } from '../core/random.ts';
import type { DeviceStageRunner } from './stages.ts';
import { medianSample } from './throughput-probe.ts';
import { ExchangePhase, forwardRank, noStats, type Exchange } from './ulysses.ts';

/**
 * forwards timed per degree at most (after a warm-up), within BUDGET_MS: a step's time varies by a
 * third between steps on a busy 2-core machine, and the median of five short forwards is what
 * keeps the default job's prediction within 25% (three were seen 28% off)
 */
const RUNS = 5;
const BUDGET_MS = 1_000;
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
  allToAll: async (tag, parts) => parts.map((part, j) => (j === 0 ? part : new Float32Array(partFloats(plan, tag.phase === ExchangePhase.QKV ? 'qkv' : 'output', j, 0, tag.group)))),
});

/** ms of one rank's compute in one forward under each Ulysses degree: the median of a few where one is quick, else blocks × one block. */
export async function rehearseForwards(cfg: WanConfig, stages: DeviceStageRunner, latentShape: number[], textTokens: number, degrees: number[]): Promise<number[]> {
  if (latentShape[0] !== cfg.inChannels) throw new Error(`rehearse needs a latent shape [${cfg.inChannels}, T, H, W], got ${JSON.stringify(latentShape)}`);
  const grid = tokenGrid(cfg, latentShape);
  if (grid.count > MAX_TOKENS) throw new Error(`rehearse of ${grid.count} tokens: at most ${MAX_TOKENS} (720p × 129 frames)`);
  const random = new SeededRandom(7);
  const text = random.normals(textTokens * cfg.textDim);
  const patchWidth = cfg.inChannels * cfg.patchSize.reduce((a, b) => a * b, 1);
  const forwardMs: number[] = [];
  for (const degree of degrees) {
    checkDegree(cfg.numHeads, degree);
    const plan = planUlysses(cfg, grid.count, degree);
    const input = { patches: random.normals(plan.rows[0] * patchWidth), timestep: 500, text, grid, tag: { job: 0, step: 0, pass: 0 } };
    const forward = async (numLayers: number) => {
      const stats = noStats();
      await forwardRank({ ...cfg, numLayers }, plan, stages, echoExchange(plan), input, stats);
      return stats.computeMs;
    };
    // A forward of one block first (it also warms up): where the whole forward would take long (a
    // real model's 30 blocks at 480p), a second one-block forward × the blocks is the rehearsal
    // (embedding and head counted once per block: a fraction of a per cent of a block there).
    const oneBlockMs = await forward(1);
    forwardMs.push(oneBlockMs * cfg.numLayers > LONG_MS ? cfg.numLayers * (await forward(1)) : await medianSample(() => forward(cfg.numLayers), RUNS, BUDGET_MS));
  }
  return forwardMs;
}
