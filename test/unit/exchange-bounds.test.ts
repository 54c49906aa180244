import { beforeAll, describe, expect, it } from 'vitest';
import { expectedWeightShapes, parseWanConfig } from '../../core/model/config.ts';
import { rmsNorm } from '../../core/model/ops.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { tokenGrid } from '../../core/model/tokens.ts';
import type { Link } from '../../core/net/link.ts';
import { quantizedScalesHonest, tensorPayload, type DType } from '../../core/net/protocol.ts';
import { gatherLatent, planUlysses, scatterLatent } from '../../core/parallel.ts';
import { SeededRandom } from '../../core/random.ts';
import { sizeOf, type Tensor } from '../../core/tensor.ts';
import { PeerLost } from '../../core/worker-api.ts';
import { judgeMatrices, modelBounds, ROUNDING_ALLOWANCE, type ModelBounds } from '../../rank/bounds.ts';
import { displacedAttention, KeysValuesHistory } from '../../rank/displaced.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { MeshExchange, UnboundedFromPeers } from '../../rank/exchange/mesh.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import { serialStages, type DeviceStageRunner } from '../../rank/stages.ts';
import { ExchangePhase, forwardRank, type Exchange, type PeerPartJudge } from '../../rank/ulysses.ts';
import { seededRandom } from '../../server/model-folder.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';
import { WorkerRuntime } from '../../rank/runtime.ts';
import { channelPair, stubEngine, tinyModelFiles, describeInProcess } from './fixtures.ts';
import { EXACT_SETTINGS } from './in-process-executor.ts';

// A rank holds what its peers send it to the bounds its model implies (rank/bounds.ts) and blames
// the sender for a finite lie; honest runs stay far inside them, over every step and transport.

/** The published 1.3B transformer's layout (every key family, 12 heads, text_dim 4096) at a small width. */
function narrowWan13(): WanModel {
  const config = parseWanConfig(
    { ...WAN21_T2V_1_3B.transformer, attention_head_dim: 32, ffn_dim: 768, num_layers: 2 },
    'the 1.3B layout at width 384',
  );
  // initialised as server/cli/make-model.ts initialises its seeded models
  const weights = new Map(
    [...expectedWeightShapes(config)].map(([name, shape]) => {
      const n = sizeOf(shape);
      const random = seededRandom('7', name);
      const data = name.endsWith('scale_shift_table')
        ? random.normals(n, 1 / Math.sqrt(config.dim))
        : /norm[_\w]*\.weight$/.test(name)
          ? random.normals(n, 0.05).map((v) => 1 + v)
          : name.endsWith('.bias')
            ? random.normals(n, 0.02)
            : random.normals(n, 1 / Math.sqrt(n / shape[0]));
      return [name, { shape, data }];
    }),
  );
  return { config, weights };
}

interface Loaded {
  m: WanModel;
  stages: DeviceStageRunner;
  bounds: ModelBounds;
  text: Float32Array;
}

const models: Record<string, Loaded> = {};
const random = new SeededRandom(31);
const LATENT_SHAPE = [16, 1, 14, 10]; // 35 tokens: uneven shares at P = 2 and 3
const STEPS = 8;

beforeAll(async () => {
  for (const [name, m] of [
    ['tiny', await loadTransformer(tinyModelFiles)],
    ['1.3B layout', narrowWan13()],
  ] as const)
    models[name] = {
      m,
      stages: serialStages(await onnxStages(m, 'wasm')),
      bounds: modelBounds(m),
      text: random.normals(8 * m.config.textDim),
    };
}, 60_000);

/** How far an honest part is inside its bounds: the largest factor it can be scaled by and still pass. */
function headroom(judge: PeerPartJudge, from: number, part: Float32Array): number {
  if (judge(from, part)) return 0;
  let [lo, hi] = [1, 1e9];
  for (let i = 0; i < 40 && hi / lo > 1.01; i++) {
    const mid = Math.sqrt(lo * hi);
    if (
      judge(
        from,
        part.map((x) => x * mid),
      )
    )
      hi = mid;
    else lo = mid;
  }
  return lo;
}

/** An exchange that records, per phase, the least headroom of every part its peers sent it. */
function measuring(exchange: Exchange, least: Map<ExchangePhase, number>): Exchange {
  return {
    rank: exchange.rank,
    world: exchange.world,
    dtype: exchange.dtype,
    get bytesSent() {
      return exchange.bytesSent;
    },
    allToAll: (tag, parts, judge) =>
      exchange.allToAll(tag, parts, (from, part) => {
        if (!judge) throw new Error(`phase ${tag.phase} was not judged`);
        least.set(tag.phase, Math.min(least.get(tag.phase) ?? Infinity, headroom(judge, from, part)));
        return judge(from, part);
      }),
  };
}

type Mode = 'ulysses' | 'displaced';

/**
 * A flow-matching Euler run of STEPS steps on P ranks, every rank judging what it receives; `lie`
 * rewrites what rank 1 sends. Resolves with each rank's outcome of the step that failed, if any.
 */
async function denoise(
  { m, stages, bounds, text }: Loaded,
  exchanges: Exchange[],
  mode: Mode = 'ulysses',
): Promise<Tensor> {
  const cfg = m.config;
  const grid = tokenGrid(cfg, LATENT_SHAPE);
  const plan = planUlysses(cfg, grid.count, exchanges.length);
  const histories = exchanges.map(() => new KeysValuesHistory());
  let latent: Tensor = { shape: LATENT_SHAPE, data: new SeededRandom(5).normals(sizeOf(LATENT_SHAPE)) };
  for (let step = 0; step < STEPS; step++) {
    const sigma = 1 - step / STEPS;
    const patches = scatterLatent(cfg, plan, latent);
    const rows = await Promise.all(
      exchanges.map((exchange, rank) =>
        forwardRank(
          cfg,
          plan,
          stages,
          exchange,
          { patches: patches[rank], timestep: 1000 * sigma, text, grid, tag: { job: 1, step, pass: 0 }, bounds },
          undefined,
          mode === 'displaced'
            ? displacedAttention(cfg, plan, stages, exchange, histories[rank], { step, pass: 0, stale: step > 0 })
            : undefined,
        ),
      ),
    );
    const velocity = gatherLatent(cfg, plan, rows, LATENT_SHAPE);
    latent = { shape: LATENT_SHAPE, data: latent.data.map((x, i) => x - velocity.data[i] / STEPS) };
  }
  return latent;
}

describe('the bounds a model implies on what ranks exchange', () => {
  it('RMSNorm across D reaches √D·|w| only when one column holds all of a row: the q, k bound is tight', () => {
    const D = 64;
    const w = new SeededRandom(2).normals(D, 0.05).map((v) => 1 + v);
    const oneHot = new Float32Array(D);
    oneHot[10] = 3;
    const normed = rmsNorm(oneHot, D, 1e-6, w);
    const bound = Math.sqrt(D) * Math.max(Math.abs(w[10]), Math.abs(w[11]));
    expect(Math.abs(normed[10])).toBeLessThanOrEqual(bound);
    expect(Math.abs(normed[10]) / (Math.sqrt(D) * Math.abs(w[10]))).toBeGreaterThan(0.999);
    const spread = rmsNorm(new SeededRandom(3).normals(D), D, 1e-6, w);
    expect(Math.max(...spread.map(Math.abs)) / bound).toBeLessThan(0.5);
  });

  it("a judge names the matrix, row and column of the first value beyond its column's limit, and passes what is within", () => {
    const judge = judgeMatrices(
      [
        { name: 'q', limits: Float32Array.of(1, 2) },
        { name: 'v', limits: Float32Array.of(10, 10) },
      ],
      'f32',
    );
    expect(judge(Float32Array.of(1, -2, 0.5, 0, 10, -10, 3, 3))).toBeNull();
    expect(judge(Float32Array.of(1, -2, 0.5, 0, 10, -10, 3, 30))).toBe(
      'sent v 30.0 (row 1, column 1 of its part), beyond the 10.1 its layer can produce',
    );
    expect(judge(Float32Array.of(1, -2, 0.5, NaN, 10, -10, 3, 3))).toMatch(/^sent q NaN \(row 1, column 1/);
    expect(judge(Float32Array.of(1 + 2 * ROUNDING_ALLOWANCE, 0, 0, 0, 0, 0, 0, 0))).toMatch(/^sent q 1\.02/);
    // a quantizing transport rounds by half a scale, a scale at most the largest limit over its levels
    const int8 = judgeMatrices([{ name: 'q', limits: Float32Array.of(1, 254) }], 'i8');
    expect(int8(Float32Array.of(1.99, 0))).toBeNull();
    expect(int8(Float32Array.of(2.02, 0))).toMatch(/^sent q 2\.02/);
  });
});

describe('honest runs stay inside the bounds (all steps, every transport)', () => {
  const runs: [string, Mode, DType, number][] = [
    ['tiny', 'ulysses', 'f32', 2],
    ['tiny', 'ulysses', 'f16', 3],
    ['tiny', 'ulysses', 'i8', 2],
    ['tiny', 'ulysses', 'i4', 3],
    ['tiny', 'displaced', 'i8', 3],
    ['tiny', 'displaced', 'i4', 2],
    ['1.3B layout', 'ulysses', 'f32', 3],
    ['1.3B layout', 'ulysses', 'f16', 2],
    ['1.3B layout', 'ulysses', 'i8', 4],
    ['1.3B layout', 'ulysses', 'i4', 2],
    ['1.3B layout', 'displaced', 'i4', 3],
  ];
  for (const [model, mode, dtype, P] of runs)
    it(`${model}, ${mode}, ${dtype}, P = ${P}: every part judged, each at least 3× inside its bounds`, async () => {
      const least = new Map<ExchangePhase, number>();
      await denoise(
        models[model],
        memoryExchanges(P, dtype).map((e) => measuring(e, least)),
        mode,
      );
      const phases = mode === 'ulysses' ? [ExchangePhase.QKV, ExchangePhase.Output] : [ExchangePhase.KeysValues];
      expect([...least.keys()].sort()).toEqual(phases);
      for (const phase of phases) expect(least.get(phase), `phase ${phase}`).toBeGreaterThan(3);
      console.log(
        `headroom ${model} ${mode} ${dtype} P=${P}: ` +
          phases.map((p) => `phase ${p} ${(least.get(p) ?? 0).toFixed(1)}×`).join(', '),
      );
    });
});

/** P mesh exchanges over in-memory links, every pair connected. */
function mesh(P: number, dtype: DType = 'f32'): MeshExchange[] {
  const ranks = Array.from({ length: P }, (_, rank) => new MeshExchange(rank, P, dtype, 5_000));
  for (let a = 0; a < P; a++)
    for (let b = a + 1; b < P; b++) {
      const [ab, ba] = channelPair();
      ranks[a].addPeer(b, ab);
      ranks[b].addPeer(a, ba);
    }
  return ranks;
}

/**
 * `exchange` with what it sends under `phase` at step 3 (or each step `when` takes) rewritten by `lie` (what it
 * receives as is).
 */
function lying(
  exchange: Exchange,
  phase: ExchangePhase,
  lie: (part: Float32Array, block: number) => Float32Array,
  when: (step: number) => boolean = (step) => step === 2,
): Exchange {
  let lies = 0;
  return {
    rank: exchange.rank,
    world: exchange.world,
    dtype: exchange.dtype,
    get bytesSent() {
      return lies;
    },
    allToAll: (tag, parts, judge) => {
      if (!when(tag.step) || tag.phase !== phase) return exchange.allToAll(tag, parts, judge);
      lies++;
      return exchange.allToAll(
        tag,
        parts.map((part, to) => (to === exchange.rank ? part : lie(part, tag.block))),
        judge,
      );
    },
  };
}

describe('a finite lie is refused, its sender blamed, never the receiver', () => {
  const lies: [string, ExchangePhase, (part: Float32Array) => Float32Array][] = [
    ['q, k, v of 3e38', ExchangePhase.QKV, (part) => part.map(() => 3e38)],
    ['q, k, v 1e4× the honest ones', ExchangePhase.QKV, (part) => part.map((x) => x * 1e4)],
    [
      'v alone 1e4× the honest one',
      ExchangePhase.QKV,
      (part) => part.map((x, i) => (i >= (2 * part.length) / 3 ? x * 1e4 : x)),
    ],
    ['attention output 1e4× the honest one', ExchangePhase.Output, (part) => part.map((x) => x * 1e4)],
  ];
  for (const [model, P, dtype] of [
    ['tiny', 2, 'f32'],
    ['1.3B layout', 3, 'i8'],
  ] as const)
    for (const [what, phase, lie] of lies)
      it(`${model}, P = ${P}, ${dtype}: rank 1 sends ${what} at step 3; every honest rank names rank 1 misbehaving`, async () => {
        const ranks = mesh(P, dtype);
        const liar = lying(ranks[1], phase, lie);
        const exchanges = ranks.map((e, rank) => (rank === 1 ? liar : e));
        const run = denoise(models[model], exchanges);
        const error = await run.catch((e: unknown) => e);
        ranks[1].fail(new Error('the test is over')); // the liar's own waits end
        expect(liar.bytesSent, 'the lie was told').toBeGreaterThan(0);
        expect(error).toBeInstanceOf(PeerLost);
        const { rank, cause, evidence } = (error as PeerLost).detail;
        expect({ rank, cause }).toEqual({ rank: 1, cause: 'misbehaved' });
        expect(evidence).toMatch(
          /^sent (q|k|v|attention output) .* beyond the .* its layer can produce, in step 3, block 0/,
        );
        // each honest rank failed on the liar's account, none on its own
        for (const honest of ranks.filter((_, r) => r !== 1)) {
          const own = await honest
            .allToAll(
              { job: 1, step: 2, pass: 0, block: 1, phase: ExchangePhase.QKV, group: 0 },
              ranks.map(() => new Float32Array(1)),
            )
            .catch((e: unknown) => e);
          expect(own).toBeInstanceOf(PeerLost);
          expect((own as PeerLost).detail.rank).toBe(1);
        }
      });

  it('displaced mode, int4 deltas: a peer whose keys and values jump 1e4× is blamed', async () => {
    const ranks = mesh(2, 'i4');
    const liar = lying(ranks[1], ExchangePhase.KeysValues, (part) => part.map((x) => x * 1e4));
    const error = await denoise(models.tiny, [ranks[0], liar], 'displaced').catch((e: unknown) => e);
    ranks[1].fail(new Error('the test is over'));
    expect(liar.bytesSent).toBeGreaterThan(0);
    expect(error).toBeInstanceOf(PeerLost);
    expect((error as PeerLost).detail).toMatchObject({ rank: 1, cause: 'misbehaved' });
    expect((error as PeerLost).detail.evidence).toMatch(/^sent (k|v) \(rebuilt from its change\) /);
  });

  it('displaced mode, int4 deltas: a peer whose changes each stay in bounds but walk its keys and values out of them is blamed', async () => {
    const ranks = mesh(2, 'i4');
    // each step's change gains 4× the liar's first keys and values: at most 4/3 of the bound (honest ones are 3×
    // inside it), within the 2× a change between two values in bounds may reach, but they pile up step by step
    const first = new Map<number, Float32Array>();
    const liar = lying(
      ranks[1],
      ExchangePhase.KeysValues,
      (part, block) => {
        const drift = first.get(block);
        if (!drift) first.set(block, part);
        return drift ? part.map((x, i) => x + 4 * drift[i]) : part;
      },
      () => true,
    );
    const error = await denoise(models.tiny, [ranks[0], liar], 'displaced').catch((e: unknown) => e);
    ranks[1].fail(new Error('the test is over'));
    expect(liar.bytesSent).toBeGreaterThan(2);
    expect(error).toBeInstanceOf(PeerLost);
    expect((error as PeerLost).detail).toMatchObject({ rank: 1, cause: 'misbehaved' });
    expect((error as PeerLost).detail.evidence).toMatch(/^sent (k|v) \(rebuilt from its change\) /);
  });
});

describe("a rank's own overflow from its peers' tensors convicts nobody", () => {
  it("NaN computed after the first block (from peers' tensors within bounds) is UnboundedFromPeers, blaming no rank", async () => {
    const [rank0] = mesh(2);
    const error = await rank0
      .allToAll({ job: 1, step: 2, pass: 0, block: 1, phase: ExchangePhase.QKV, group: 0 }, [
        new Float32Array(1),
        Float32Array.of(Infinity),
      ])
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(UnboundedFromPeers);
    expect((error as Error).message).toBe(
      "rank 0 computed NaN, infinite activations for step 3, block 1, phase 0 from its peers' tensors, each " +
        'within the bounds its model implies: the bounds do not hold here, so it blames no rank, itself included',
    );
    const output = await mesh(2)[0]
      .allToAll({ job: 1, step: 2, pass: 0, block: 0, phase: ExchangePhase.Output, group: 0 }, [
        new Float32Array(1),
        Float32Array.of(NaN),
      ])
      .catch((e: unknown) => e);
    expect(output).toBeInstanceOf(UnboundedFromPeers);
  });

  it("NaN in the first block's q, k, v, computed from nothing a peer sent, stays the rank's own error", async () => {
    const [rank0] = mesh(2);
    const error = await rank0
      .allToAll({ job: 1, step: 2, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 }, [
        new Float32Array(1),
        Float32Array.of(NaN),
      ])
      .catch((e: unknown) => e);
    expect(error).not.toBeInstanceOf(UnboundedFromPeers);
    expect((error as Error).message).toBe("rank 0's activations in step 3, block 0 are NaN, infinite");
  });
});

describe("a worker's runtime judges its peers with its engine's bounds", () => {
  it("rank 1's runtime sends q, k, v of 3e38 at step 3: rank 0's executeModel fails blaming rank 1, never itself", async () => {
    const { m, stages, bounds, text } = models.tiny;
    const exchanges = memoryExchanges(2);
    const liar = lying(exchanges[1], ExchangePhase.QKV, (part) => part.map(() => 3e38));
    const runtimes = [exchanges[0], liar].map(
      (exchange) =>
        new WorkerRuntime(stubEngine(stages, m.config, bounds), {
          connectMesh: () => Promise.resolve(exchange),
          describe: describeInProcess('in-process'),
        }),
    );
    const plan = planUlysses(m.config, tokenGrid(m.config, LATENT_SHAPE).count, 2);
    const patches = scatterLatent(m.config, plan, { shape: LATENT_SHAPE, data: random.normals(sizeOf(LATENT_SHAPE)) });
    for (const [rank, runtime] of runtimes.entries()) {
      await runtime.initWorker({ ...EXACT_SETTINGS, rank, world: 2, peers: ['a', 'b'], session: 's' });
      await runtime.loadModel({ modelUrl: '/models/tiny-wan', ep: 'wasm' });
      await runtime.prepareJob({ job: 1, texts: [text], latentShape: LATENT_SHAPE });
    }
    const forward = (step: number) =>
      runtimes.map((runtime, rank) =>
        runtime.executeModel({
          job: 1,
          step,
          pass: 0,
          timestep: 900 - 100 * step,
          latentShape: LATENT_SHAPE,
          patches: patches[rank],
        }),
      );
    for (const step of [0, 1]) await Promise.all(forward(step));
    // the liar waits for what its peer will not send it: only the honest rank is awaited
    const [honest] = await Promise.allSettled(forward(2).slice(0, 1));
    expect(liar.bytesSent, 'the lie was told').toBeGreaterThan(0);
    expect(honest.status).toBe('rejected');
    const error = (honest as PromiseRejectedResult).reason as unknown;
    expect(error).toBeInstanceOf(PeerLost);
    expect((error as PeerLost).detail).toMatchObject({ rank: 1, cause: 'misbehaved' });
    expect((error as PeerLost).detail.evidence).toMatch(/^sent q 3\.00e\+38 .* in step 3, block 0/);
  });
});

describe('quantized scales: each one a quantizer could have written', () => {
  const values = new SeededRandom(8).normals(150); // three groups, the last one short
  for (const dtype of ['i8', 'i4'] as const)
    it(`${dtype}: honest payloads pass; a scale negative or infinite, or a value past the levels, does not`, () => {
      expect(quantizedScalesHonest(tensorPayload(values, dtype), dtype)).toBe(true);
      expect(quantizedScalesHonest(tensorPayload(new Float32Array(70), dtype), dtype)).toBe(true);
      const scales = (payload: Uint8Array) => new Float32Array(payload.buffer, 0, 3);
      for (const lie of [-1, Infinity, NaN]) {
        const payload = tensorPayload(values, dtype);
        scales(payload)[1] *= lie;
        expect(quantizedScalesHonest(payload, dtype), `scale × ${lie}`).toBe(false);
      }
      const beyond = tensorPayload(values, dtype);
      if (dtype === 'i8')
        beyond[12 + 5] = 0x80; // q = −128
      else beyond[12 + 5] &= 0xf0; // a low nibble of 0: q = −8
      expect(quantizedScalesHonest(beyond, dtype)).toBe(false);
    });

  /** The same values with scales twice what they reach: integers halved, scales doubled. */
  const overScaled = (): Uint8Array => {
    const payload = tensorPayload(values, 'i8');
    const q = new Int8Array(payload.buffer, 12, values.length);
    q.forEach((v, i) => (q[i] = Math.round(v / 2)));
    new Float32Array(payload.buffer, 0, 3).forEach((v, g, scales) => (scales[g] = 2 * v));
    return payload;
  };

  it('i8: a scale its group never reaches (the same values, each integer halved, each scale doubled) is a lie', () => {
    expect(quantizedScalesHonest(overScaled(), 'i8')).toBe(false);
  });

  it('a peer sending scales its values do not reach is blamed on arrival', async () => {
    const [rank0, rank1] = mesh(2, 'i8');
    const tag = { job: 1, step: 0, pass: 0, block: 0, phase: ExchangePhase.QKV, group: 0 };
    const payload = overScaled();
    // rank 1's link to rank 0 carries the forged payload as a well-formed tensor
    await (rank1 as unknown as { links: Map<number, Link> }).links.get(0)?.send({
      kind: 'tensor',
      from: 1,
      tag,
      dtype: 'i8',
      shape: [values.length],
      data: payload,
    });
    const error = await rank0.allToAll(tag, [values, values]).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PeerLost);
    expect((error as PeerLost).detail).toEqual({
      rank: 1,
      cause: 'misbehaved',
      evidence: 'sent i8 scales its values do not reach in step 1, block 0, phase 0; disconnected',
    });
  });
});
