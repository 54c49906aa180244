import { beforeAll, describe, expect, it } from 'vitest';
import { referenceForward, type WanModel } from '../../core/model/reference.ts';
import { patchify, tokenGrid } from '../../core/model/tokens.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { stageCallsPerForward } from '../../core/cost-model.ts';
import { exchangeFloatsPerBlock, planUlysses, type UlyssesPlan } from '../../core/parallel.ts';
import { SeededRandom } from '../../core/random.ts';
import { maxAbsDiff, type Tensor } from '../../core/tensor.ts';
import type { DType } from '../../core/net/protocol.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import {
  hostValues,
  type Activation,
  type DeviceStageRunner,
  type DeviceTensor,
  type StageRunner,
} from '../../rank/stages.ts';
import { forwardInProcess, forwardRank, noStats, ulyssesAttention, type Exchange } from '../../rank/ulysses.ts';
import { tinyModelFiles } from './fixtures.ts';

/** Each rank's block attention in `headGroups` head groups (forwardInProcess' attendOf). */
const grouped =
  (headGroups: number, stages: StageRunner = onnx) =>
  (exchange: Exchange, plan: UlyssesPlan) =>
    ulyssesAttention(m.config, planUlysses(m.config, plan.tokens, plan.heads, headGroups), stages, exchange);

/** Exchanges that count their all-to-alls. */
const countedExchanges = (exchanges: (Exchange & { bytesSent: number })[]) =>
  exchanges.map((e) => {
    const counted = Object.assign(Object.create(e) as Exchange & { bytesSent: number }, { calls: 0 });
    counted.allToAll = (tag, parts) => (counted.calls++, e.allToAll.call(e, tag, parts));
    return counted;
  });

/** Ulysses over the in-memory transport: P ranks give the single-rank result. */
let m: WanModel;
let onnx: StageRunner;
let text: Float32Array;
const random = new SeededRandom(11);
const latents: Record<string, Tensor> = {
  'divisible (72 tokens)': { shape: [16, 3, 8, 12], data: random.normals(16 * 3 * 8 * 12) },
  'padded (35 tokens)': { shape: [16, 1, 14, 10], data: random.normals(16 * 14 * 10) },
};

beforeAll(async () => {
  m = await loadTransformer(tinyModelFiles);
  onnx = await onnxStages(m, 'wasm');
  text = random.normals(32 * m.config.textDim);
});

describe('Ulysses sequence parallelism, in memory', () => {
  for (const [name, latent] of Object.entries(latents)) {
    it(`P = 1, 2, 3, 4, 6 equal the reference forward within 1e-4: ${name}`, async () => {
      const reference = referenceForward(m, latent, 500, text);
      const single = await forwardInProcess(m.config, onnx, memoryExchanges(1), latent, 500, text);
      expect(maxAbsDiff(single.data, reference.data)).toBeLessThan(1e-4);
      for (const P of [2, 3, 4, 6]) {
        const out = await forwardInProcess(m.config, onnx, memoryExchanges(P), latent, 500, text);
        const diff = maxAbsDiff(out.data, single.data);
        console.log(`${name}: P=${P} max-abs vs P=1 ${diff.toExponential(2)}`);
        expect(diff, `P=${P}`).toBeLessThan(1e-4);
      }
    });
  }

  it('uneven shares — any number of ranks up to the heads (5 of 12: 3/3/2/2/2), heads in proportion to speed (6/4/2, 1/1/10), one head each (12) — equal one rank within 1e-4 (issue 18)', async () => {
    const latent = latents['padded (35 tokens)'];
    const single = await forwardInProcess(m.config, onnx, memoryExchanges(1), latent, 500, text);
    for (const heads of [5, 7, [6, 4, 2], [1, 1, 10], 12]) {
      const P = typeof heads === 'number' ? heads : heads.length;
      const exchanges = memoryExchanges(P);
      const out = await forwardInProcess(m.config, onnx, exchanges, latent, 500, text, undefined, heads);
      const plan = planUlysses(m.config, 35, heads);
      const diff = maxAbsDiff(out.data, single.data);
      console.log(
        `uneven heads ${plan.heads.join('/')} (tokens ${plan.rows.join('/')}): max-abs vs P=1 ${diff.toExponential(2)}`,
      );
      expect(diff, plan.heads.join('/')).toBeLessThan(1e-4);
      // each rank sent exactly what the plan gives it (the frame checks judge by the same arithmetic)
      exchanges.forEach((e, r) =>
        expect(e.bytesSent, `rank ${r}`).toBe(4 * exchangeFloatsPerBlock(plan, r) * m.config.numLayers),
      );
    }
  });

  it('each rank sends 4·(S/P)·D·(P−1)/P floats per block with even shares, and no rank pads its tokens', async () => {
    const latent = latents['divisible (72 tokens)'];
    for (const P of [2, 3, 4]) {
      const exchanges = memoryExchanges(P);
      await forwardInProcess(m.config, onnx, exchanges, latent, 500, text);
      const plan = planUlysses(m.config, 72, P);
      expect(plan.rows).toEqual(new Array(P).fill(72 / P));
      for (const e of exchanges)
        expect(e.bytesSent, `P=${P} rank ${e.rank}`).toBe(
          4 * 4 * (72 / P) * m.config.dim * ((P - 1) / P) * m.config.numLayers,
        );
    }
    expect(planUlysses(m.config, 35, 4).rows).toEqual([9, 9, 9, 8]);
  });

  it("a rank makes stageCallsPerForward stage calls per forward, whatever P, an attention call per head group: the number the cost model charges each call's fixed cost for", async () => {
    const latent = latents['padded (35 tokens)'];
    for (const [P, headGroups] of [
      [1, 1],
      [3, 1],
      [3, 3],
    ]) {
      const calls: string[] = [];
      const counting = Object.fromEntries(
        (['embed', 'preAttention', 'attention', 'postAttention', 'head'] as const).map((stage) => [
          stage,
          (...a: never[]) => (calls.push(stage), (onnx[stage] as (...a: never[]) => unknown)(...a)),
        ]),
      ) as unknown as StageRunner;
      await forwardInProcess(
        m.config,
        counting,
        memoryExchanges(P),
        latent,
        500,
        text,
        undefined,
        P,
        grouped(headGroups, counting),
      );
      expect(calls.length / P, `P=${P}, ${headGroups} head groups`).toBe(stageCallsPerForward(m.config, headGroups));
    }
  });

  it('head groups (2 and 3 of 4 heads a rank; 2 of uneven 6/4/2) give what all heads at once give, in as many exchanges per block, the same bytes in all (issue 20)', async () => {
    const latent = latents['padded (35 tokens)'];
    for (const heads of [3, [6, 4, 2]]) {
      const P = typeof heads === 'number' ? heads : heads.length;
      const whole = await forwardInProcess(m.config, onnx, memoryExchanges(P), latent, 500, text, undefined, heads);
      for (const headGroups of [2, 3]) {
        const exchanges = countedExchanges(memoryExchanges(P));
        const out = await forwardInProcess(
          m.config,
          onnx,
          exchanges,
          latent,
          500,
          text,
          undefined,
          heads,
          grouped(headGroups),
        );
        const plan = planUlysses(m.config, 35, heads, headGroups);
        const diff = maxAbsDiff(out.data, whole.data);
        console.log(
          `heads ${plan.heads.join('/')} in ${plan.headGroups} head groups: max-abs vs one group ${diff.toExponential(2)}`,
        );
        // float32 in head groups is the same to the bit as all heads at once (README)
        expect(diff, `${headGroups} groups`).toBe(0);
        expect(plan.headGroups).toBe(typeof heads === 'number' ? headGroups : 2); // rank 2 has two heads
        exchanges.forEach((e, r) => {
          expect(e.calls, `rank ${r}`).toBe(2 * plan.headGroups * m.config.numLayers);
          expect(e.bytesSent, `rank ${r}`).toBe(4 * exchangeFloatsPerBlock(plan, r) * m.config.numLayers);
        });
      }
    }
  });

  it('a rank computes while its head groups are on the wire: overlapMs > 0 in groups, 0 with all heads at once, never more than its compute (issue 20)', async () => {
    const latent = latents['divisible (72 tokens)'];
    const overlapOf = async (headGroups: number) => {
      const grid = tokenGrid(m.config, latent.shape);
      const plan = planUlysses(m.config, grid.count, 2, headGroups);
      const patches = patchify(m.config, latent).data;
      const width = patches.length / grid.count;
      // every exchange takes 30 ms on the wire, as over a slow link
      const slow = memoryExchanges(2).map((e): Exchange => ({
        ...e,
        allToAll: (tag, parts) => new Promise((r) => setTimeout(r, 30)).then(() => e.allToAll(tag, parts)),
      }));
      const stats = [noStats(), noStats()];
      await Promise.all(
        slow.map((e, r) =>
          forwardRank(
            m.config,
            plan,
            onnx,
            e,
            {
              patches: patches.slice(r * 36 * width, (r + 1) * 36 * width),
              timestep: 500,
              text,
              grid,
              tag: { job: 0, step: 0, pass: 0 },
            },
            stats[r],
          ),
        ),
      );
      return stats;
    };
    for (const s of await overlapOf(1)) expect(s.overlapMs).toBe(0);
    for (const s of await overlapOf(3)) {
      expect(s.overlapMs).toBeGreaterThan(0);
      expect(s.overlapMs).toBeLessThanOrEqual(s.computeMs);
    }
  });
});

describe('fp16 and int8 activation transport', () => {
  const latentShape = [16, 3, 8, 8];
  const sample = async (dtype: DType) => {
    const exchanges = memoryExchanges(2, dtype);
    let x = { shape: latentShape, data: new SeededRandom(5).normals(16 * 3 * 8 * 8) };
    const sigmas = [1, 0.9, 0.75, 0.5, 0];
    for (let step = 0; step < 4; step++) {
      const t = sigmas[step] * 1000;
      const cond = await forwardInProcess(m.config, onnx, exchanges, x, t, text, { job: 1, step, pass: 0 });
      const uncond = await forwardInProcess(m.config, onnx, exchanges, x, t, new Float32Array(text.length), {
        job: 1,
        step,
        pass: 1,
      });
      const dt = sigmas[step + 1] - sigmas[step];
      x = {
        shape: latentShape,
        data: x.data.map((v, i) => v + dt * (uncond.data[i] + 5 * (cond.data[i] - uncond.data[i]))),
      };
    }
    return { latent: x.data, bytes: exchanges[0].bytesSent };
  };

  it('fp16 halves the bytes each rank sends, and moves a 4-step guided sample by about 4e-4 (README), at most 4.5e-4', async () => {
    const [full, half] = [await sample('f32'), await sample('f16')];
    const diff = maxAbsDiff(full.latent, half.latent);
    console.log(
      `fp16 transport: bytes ratio ${(half.bytes / full.bytes).toFixed(4)}, final latent max-abs ${diff.toExponential(2)}`,
    );
    expect(half.bytes / full.bytes).toBe(0.5);
    // rounding toward zero instead of to nearest moves it 5.6e-4
    expect(diff).toBeLessThanOrEqual(4.5e-4);
    expect(diff).toBeGreaterThan(0); // the rounding is real
  });

  it('int8 with a scale per 64 values sends a little over a quarter of the bytes, and moves the same sample by about 1e-2 (README), at most that', async () => {
    const [full, quarter] = [await sample('f32'), await sample('i8')];
    const diff = maxAbsDiff(full.latent, quarter.latent);
    console.log(
      `int8 transport: bytes ratio ${(quarter.bytes / full.bytes).toFixed(4)}, final latent max-abs ${diff.toExponential(2)}`,
    );
    expect(quarter.bytes / full.bytes).toBeCloseTo((1 + 4 / 64) / 4, 2);
    // rounding toward zero instead of to nearest moves it 1.4e-2
    expect(diff).toBeLessThanOrEqual(1e-2);
    expect(diff).toBeGreaterThan(0);
  });
});

/**
 * A stand-in for the WebGPU runner: the outputs that stay in a rank (embed's, post-attention's)
 * become device tensors held in a map, as onnxStages holds GPU buffers.
 */
function deviceResident(inner: StageRunner): { runner: Required<DeviceStageRunner>; kept: Map<number, Float32Array> } {
  const kept = new Map<number, Float32Array>();
  let id = 0;
  const keep = (a: Activation): DeviceTensor => {
    const values = hostValues(a);
    kept.set(++id, values);
    return { deviceTensor: id, floats: values.length };
  };
  const read = (a: Activation): Float32Array => {
    if (a instanceof Float32Array) throw new Error('a rank-local activation came as CPU data to a device runner');
    const values = kept.get(a.deviceTensor);
    if (!values) throw new Error(`device tensor ${a.deviceTensor} used after release`);
    return values;
  };
  const runner: Required<DeviceStageRunner> = {
    async embed(patches, timesteps, text) {
      const e = await inner.embed(patches, timesteps, text);
      return { x: keep(e.x), temb: keep(e.temb), tproj: keep(e.tproj), context: keep(e.context) };
    },
    preAttention: (block, x, tproj, levels, cos, sin) =>
      inner.preAttention(block, read(x), read(tproj), levels, cos, sin),
    attention: (qkv, width) => inner.attention(qkv, width),
    postAttention: async (block, x, o, tproj, levels, context) =>
      keep(await inner.postAttention(block, read(x), o, read(tproj), levels, read(context))),
    head: (x, temb, levels) => inner.head(read(x), read(temb), levels),
    read: (tensor) => Promise.resolve(read(tensor).slice()),
    release(tensors) {
      for (const t of tensors)
        if (!kept.delete(t.deviceTensor))
          return Promise.reject(new Error(`device tensor ${t.deviceTensor} released twice`));
      return Promise.resolve(kept.size);
    },
  };
  return { runner, kept };
}

describe('device-resident activations (the WebGPU path, in memory)', () => {
  const latent = latents['padded (35 tokens)'];

  it('give the CPU result exactly, download only what is exchanged or returned, and release every device tensor', async () => {
    const { runner, kept } = deviceResident(onnx);
    const single = await forwardInProcess(m.config, onnx, memoryExchanges(1), latent, 500, text);
    for (const P of [1, 3]) {
      expect(
        maxAbsDiff((await forwardInProcess(m.config, runner, memoryExchanges(P), latent, 500, text)).data, single.data),
        `P=${P}`,
      ).toBeLessThan(1e-4);
      expect(kept.size, `P=${P}: device tensors left`).toBe(0);
    }

    // one rank alone: x, temb, tproj, context and each block's x stay; q/k/v, o and rows come down
    const { dim: D, numLayers, textDim } = m.config;
    const grid = tokenGrid(m.config, latent.shape);
    const plan = planUlysses(m.config, grid.count, 1);
    const patches = patchify(m.config, latent).data;
    const stats = noStats();
    await forwardRank(
      m.config,
      plan,
      runner,
      memoryExchanges(1)[0],
      { patches, timestep: 500, text, grid, tag: { job: 0, step: 0, pass: 0 } },
      stats,
    );
    const L = text.length / textDim;
    expect(stats.bytesKept).toBe(4 * ((1 + numLayers) * 35 * D + D + 6 * D + L * D));
    expect(stats.bytesDownloaded).toBe(4 * (4 * 35 * D * numLayers + patches.length));
    expect(stats.deviceTensorsLeft).toBe(0);
  });

  it('are released when a pass fails between blocks', async () => {
    const { runner, kept } = deviceResident(onnx);
    const [exchange] = memoryExchanges(1);
    const failing: Exchange = {
      ...exchange,
      allToAll(tag, parts) {
        if (tag.block === 1) return Promise.reject(new Error('peer lost'));
        return Promise.resolve(parts);
      },
    };
    const grid = tokenGrid(m.config, latent.shape);
    const input = {
      patches: patchify(m.config, latent).data,
      timestep: 500,
      text,
      grid,
      tag: { job: 0, step: 0, pass: 0 },
    };
    await expect(forwardRank(m.config, planUlysses(m.config, grid.count, 1), runner, failing, input)).rejects.toThrow(
      'peer lost',
    );
    expect(kept.size).toBe(0);
  });
});
