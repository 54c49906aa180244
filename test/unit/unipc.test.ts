import { describe, expect, it } from 'vitest';
import {
  UniPCMultistepScheduler,
  unipcSchedule,
  type UniPcState,
} from '../../core/schedulers/unipc-multistep-scheduler.ts';

const WAN = { solverOrder: 2, lowerOrderFinal: true } as const;

// diffusers' step transcribed to numpy, line by line from scheduling_unipc_multistep.py (float32
// tensors, as torch keeps them), on 6 steps with flow shift 3 and a nonlinear stand-in model
// v(x, i) = sin((1 + i)·x) + x/2 from x = [0.3, −1.2, 0.7, 2, −0.4]: the samples after each step.
const DIFFUSERS = {
  timesteps: [999, 937, 856, 749, 599, 374],
  sigmas: [
    0.9996664524078369, 0.9371482133865356, 0.8567752838134766, 0.7496247887611389, 0.5996398329734802,
    0.37471866607666016, 0,
  ],
  samples: [
    [0.27214688062667847, -1.104219675064087, 0.6378432512283325, 1.880634069442749, -0.36315059661865234],
    [0.21256761252880096, -1.0012128353118896, 0.525823175907135, 1.9039807319641113, -0.2865413427352905],
    [0.1343347132205963, -0.9868927597999573, 0.39225736260414124, 1.8516781330108643, -0.18652799725532532],
    [0.06226485222578049, -1.1055335998535156, 0.22051213681697845, 1.4182195663452148, -0.08639232069253922],
    [0.030787434428930283, -1.107113242149353, 0.030313245952129364, 1.175912857055664, -0.03963760286569595],
    [-0.04380763694643974, -0.7678590416908264, -0.043144725263118744, 0.6941238641738892, 0.05606885254383087],
  ],
};
const model = (x: Float32Array, i: number) => x.map((v) => Math.sin(v * (1 + i)) + 0.5 * v);

function run(
  steps: number,
  flowShift: number,
  start: Float32Array,
  velocity: (x: Float32Array, i: number) => Float32Array,
  from = 0,
  state?: UniPcState,
  until = steps,
) {
  const scheduler = new UniPCMultistepScheduler({ ...WAN, flowShift });
  scheduler.setTimesteps(steps);
  scheduler.setBeginIndex(from, state);
  const samples: Float32Array[] = [];
  let x = start;
  for (let i = from; i < until; i++) {
    x = scheduler.step(velocity(x, i), scheduler.timesteps[i], x).prevSample;
    samples.push(x);
  }
  return { samples, state: scheduler.state, x };
}

describe('UniPC as Wan2.1 configures it', () => {
  it("has diffusers' flow sigmas and whole timesteps", () => {
    const schedule = unipcSchedule(6, 3);
    expect(schedule.timesteps).toEqual(DIFFUSERS.timesteps);
    schedule.sigmas.forEach((s, i) => expect(s).toBeCloseTo(DIFFUSERS.sigmas[i], 7));
  });

  it("defaults to diffusers' config: 1000 train timesteps, order 2, lower order at the end, no shift", () => {
    const config = { numTrainTimesteps: 1000, solverOrder: 2, lowerOrderFinal: true, flowShift: 1 };
    expect(new UniPCMultistepScheduler().config).toEqual(config);
  });

  it("ends its sigmas' linspace exactly at 1/1000, as numpy's does: the first timestep is 999 at any step count", () => {
    // start + j·step reaches 1/1000 only to within rounding, at some step counts just below 999 once scaled
    for (let steps = 1; steps <= 60; steps++) {
      const scheduler = new UniPCMultistepScheduler();
      scheduler.setTimesteps(steps);
      expect(scheduler.timesteps[0], `${steps} steps`).toBe(999);
    }
  });

  it("has diffusers' timesteps and sigmas for 50 steps at shift 3.0 (480p) and 5.0 (720p)", () => {
    // numpy's set_timesteps(50) with use_flow_sigmas (scheduling_unipc_multistep.py): every timestep, every 7th sigma
    const expected = {
      3: {
        timesteps: [
          999, 992, 985, 978, 971, 963, 956, 948, 939, 931, 922, 913, 904, 894, 884, 874, 864, 853, 841, 829, 817, 805,
          792, 778, 764, 749, 734, 718, 701, 684, 666, 647, 627, 606, 585, 562, 538, 512, 486, 458, 428, 396, 363, 327,
          290, 249, 206, 160, 111, 57,
        ],
        sigmas: [
          0.9996664524078369, 0.9481804966926575, 0.8848828673362732, 0.8051823973655701, 0.7017540335655212,
          0.5621483325958252, 0.36336082220077515, 0.05763683095574379,
        ],
      },
      5: {
        timesteps: [
          999, 995, 991, 987, 982, 978, 973, 968, 963, 957, 952, 946, 940, 934, 927, 920, 913, 906, 898, 890, 882, 873,
          863, 854, 843, 833, 821, 809, 796, 783, 768, 753, 737, 720, 701, 681, 660, 636, 611, 584, 555, 522, 487, 448,
          405, 356, 302, 241, 172, 92,
        ],
        sigmas: [
          0.9997998476028442, 0.9682501554489136, 0.9275957345962524, 0.8732306957244873, 0.7968124747276306,
          0.6815081238746643, 0.48750731348991394, 0.09250685572624207,
        ],
      },
    };
    for (const [shift, { timesteps, sigmas }] of Object.entries(expected)) {
      const schedule = unipcSchedule(50, Number(shift));
      expect(schedule.timesteps, `shift ${shift}`).toEqual(timesteps);
      expect(
        schedule.sigmas.filter((_, i) => i % 7 === 0),
        `shift ${shift}`,
      ).toEqual(sigmas);
      expect(schedule.sigmas.at(-1)).toBe(0);
    }
  });

  it("steps as diffusers' UniPCMultistepScheduler does (predictor, corrector, lower order at the start and the end)", () => {
    const { samples } = run(6, 3, Float32Array.of(0.3, -1.2, 0.7, 2, -0.4), model);
    samples.forEach((sample, step) =>
      sample.forEach((v, i) =>
        expect(Math.abs(v - DIFFUSERS.samples[step][i]), `step ${step + 1}, value ${i}`).toBeLessThan(2e-6),
      ),
    );
  });

  it('lands on the clean latent of a straight flow, whatever the steps', () => {
    const x0 = Float32Array.of(0.5, -2, 1.25);
    const noise = Float32Array.of(1, 0.3, -0.7);
    for (const steps of [1, 2, 5, 20]) {
      const schedule = unipcSchedule(steps, 5);
      // the exact flow's velocity at σ: x = (1 − σ)·x0 + σ·noise, v = noise − x0
      const { x } = run(
        steps,
        5,
        noise.map((n, i) => (1 - schedule.sigmas[0]) * x0[i] + schedule.sigmas[0] * n),
        () => noise.map((n, i) => n - x0[i]),
      );
      x.forEach((v, i) => expect(v, `${steps} steps`).toBeCloseTo(x0[i], 5));
    }
  });

  it('continues from its state after a reload to the same numbers', () => {
    const start = Float32Array.of(0.3, -1.2, 0.7, 2, -0.4);
    const whole = run(8, 3, start, model);
    const firstHalf = run(8, 3, start, model, 0, undefined, 3);
    const stored = structuredClone(firstHalf.state); // as IndexedDB keeps it
    const rest = run(8, 3, firstHalf.x, model, 3, stored);
    expect(rest.x).toEqual(whole.x);
  });

  it('refuses to resume after step 0 without the state a checkpoint kept, and to step before setTimesteps', () => {
    const scheduler = new UniPCMultistepScheduler(WAN);
    expect(() => scheduler.step(Float32Array.of(1), 999, Float32Array.of(0))).toThrow(
      'UniPCMultistepScheduler.step before setTimesteps: set the number of steps first',
    );
    scheduler.setTimesteps(4);
    // step 1 is the first that needs the history: its corrector uses step 0's output
    for (const step of [1, 2])
      expect(() => scheduler.setBeginIndex(step)).toThrow(
        `resuming UniPC at step ${step} needs its state from the checkpoint, which has none`,
      );
    expect(() => scheduler.setBeginIndex(0)).not.toThrow();
  });

  it("without a begin index, starts at the timestep's step, or at the last for one it does not have (as diffusers)", () => {
    const start: Float32Array = Float32Array.of(0.3, -1.2, 0.7, 2, -0.4);
    const scheduler = new UniPCMultistepScheduler({ ...WAN, flowShift: 3 });
    scheduler.setTimesteps(6);
    let x = start;
    for (const [i, t] of scheduler.timesteps.entries()) x = scheduler.step(model(x, i), t, x).prevSample;
    expect(x).toEqual(run(6, 3, start, model).x);
    // the last step goes to σ = 0: the sample becomes its x0 prediction x − σ·v
    scheduler.setTimesteps(6);
    const v = model(start, 5);
    const last = scheduler.sigmas[5];
    expect(scheduler.step(v, 12345, start).prevSample).toEqual(start.map((xi, i) => xi - last * v[i]));
  });
});

describe('UniPC state, as a checkpoint keeps it', () => {
  const orders = (config: ConstructorParameters<typeof UniPCMultistepScheduler>[0], steps: number) => {
    const scheduler = new UniPCMultistepScheduler(config);
    scheduler.setTimesteps(steps);
    let x: Float32Array = Float32Array.of(0.3, -1.2);
    const seen: [thisOrder: number, lowerOrderNums: number, outputs: number][] = [];
    for (const [i, t] of scheduler.timesteps.entries()) {
      x = scheduler.step(model(x, i), t, x).prevSample;
      const { thisOrder, lowerOrderNums, outputs } = scheduler.state;
      seen.push([thisOrder, lowerOrderNums, outputs.filter(Boolean).length]);
    }
    return seen;
  };

  it('starts empty, and empty again at each setTimesteps', () => {
    const fresh = { outputs: [null, null], lastSample: null, lowerOrderNums: 0, thisOrder: 0 };
    const scheduler = new UniPCMultistepScheduler(WAN);
    expect(scheduler.state).toEqual(fresh);
    expect(new UniPCMultistepScheduler({ solverOrder: 1 }).state.outputs).toEqual([null]);
    scheduler.setTimesteps(4);
    const x = Float32Array.of(0.3, -1.2);
    scheduler.step(model(x, 0), scheduler.timesteps[0], x);
    scheduler.step(model(x, 1), scheduler.timesteps[1], x);
    expect(scheduler.state).toMatchObject({ lowerOrderNums: 2, thisOrder: 2 });
    scheduler.setTimesteps(4);
    expect(scheduler.state).toEqual(fresh);
  });

  it('warms up to its order, drops to first order on the last step where lowerOrderFinal asks it, and keeps solverOrder outputs', () => {
    expect(orders(WAN, 5)).toEqual([
      [1, 1, 1],
      [2, 2, 2],
      [2, 2, 2],
      [2, 2, 2],
      [1, 2, 2],
    ]);
    expect(orders({ solverOrder: 2, lowerOrderFinal: false }, 4)).toEqual([
      [1, 1, 1],
      [2, 2, 2],
      [2, 2, 2],
      [2, 2, 2],
    ]);
    expect(orders({ solverOrder: 1 }, 3)).toEqual([
      [1, 1, 1],
      [1, 1, 1],
      [1, 1, 1],
    ]);
  });
});

describe("a folder's scheduler_config.json", () => {
  it("Wan2.1's is UniPC of order 2 with its flow shift; what ditswarm does not run is refused by name", async () => {
    const { parseSchedulerConfig } = await import('../../core/model/wan-pipeline.ts');
    const { WAN21_T2V_1_3B } = await import('../../server/wan21-layout.ts');
    expect(parseSchedulerConfig(WAN21_T2V_1_3B.scheduler, 's')).toEqual({
      solver: {
        kind: 'UniPCMultistepScheduler',
        config: { numTrainTimesteps: 1000, solverOrder: 2, lowerOrderFinal: true },
      },
      flowShift: 3,
    });
    expect(parseSchedulerConfig({ _class_name: 'FlowMatchEulerDiscreteScheduler', shift: 5 }, 's')).toEqual({
      solver: { kind: 'FlowMatchEulerDiscreteScheduler', config: {} },
      flowShift: 5,
    });
    expect(() => parseSchedulerConfig({ ...WAN21_T2V_1_3B.scheduler, solver_order: 3 }, 's')).toThrow(
      's: solver_order 3 is not supported; ditswarm runs UniPC of order 1 or 2',
    );
    expect(() => parseSchedulerConfig({ ...WAN21_T2V_1_3B.scheduler, prediction_type: 'epsilon' }, 's')).toThrow(
      's: prediction_type is "epsilon"; ditswarm runs UniPC with prediction_type "flow_prediction", as Wan2.1 publishes it',
    );
    expect(() => parseSchedulerConfig({ _class_name: 'DDIMScheduler' }, 's')).toThrow(
      's: _class_name "DDIMScheduler" is not a scheduler ditswarm runs',
    );
  });
});
