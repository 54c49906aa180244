// AutoencoderKLWan as ONNX graphs, one chunk per run: for the decoder one latent frame, for the
// encoder the first video frame and then 4 at a time; for each, the graph for the first chunk and
// the graph for every later one (the plans' layers of wan-vae.ts, as the reference in
// wan-vae-reference.ts runs them). The caches are inputs and outputs (`cache.i` → `cache.i.next`),
// so a worker keeps them between runs (in GPU buffers on WebGPU). Height and width are symbolic:
// one pair of sessions runs tiles of any size.
//   decoder: latent [1, z_dim, h, w] (as the transformer made it: the graph un-normalises it)
//     → frames [F, 3·p², 8h, 8w] (F = 1 for the first chunk, 4 after), before unpatchify and clamping
//   encoder: frames [F, 3·p², H, W] (the video patchified, F = 1 for the first chunk, 4 after)
//     → latent [1, z_dim, H/8, W/8], the posterior's mean normalised as the pipeline conditions on it
// A causal 3×3×3 convolution is three 2D convolutions, one per time tap, over the frames of
// [cache, x] (frames are the batch): onnxruntime-web's 2D Conv runs on every EP. Its weight
// [out, in, 3, kh, kw] is fed as three inputs `<name>.weight.t0..t2` of [out, in, kh, kw]
// (vaeWeightFeeds cuts them). Weights are inputs, not initializers: the two graphs share them.
// Wan2.2's shortcuts are index arithmetic: Gathers of channels and frames, DepthToSpace and strided
// Slices, so that no reshape needs the symbolic sizes (and every op has a WebGPU kernel).

import { OnnxGraph, type Dim } from './onnx-builder.ts';
import type { TensorMap } from '../safetensors.ts';
import {
  decoderPlan,
  encoderPlan,
  framesOfChunk,
  postQuantConv,
  quantConv,
  type CausalConv,
  type VaeLayer,
  type VaePlan,
  type WanVaeConfig,
} from './wan-vae.ts';

export interface VaeWeightInput {
  /** the graph's input */
  input: string;
  /** the published tensor it comes from, and for a causal conv's weight, which time tap */
  tensor: string;
  tap: number | null;
  dims: number[];
}

export interface VaeChunkGraph {
  bytes: Uint8Array;
  weights: VaeWeightInput[];
  /** the cache inputs in slot order; each one's next value is the output `${name}.next` */
  caches: string[];
  /** frames it makes (decoder) or takes (encoder): 1 for the first chunk, 4 after */
  frames: number;
}

const cacheName = (slot: number) => `cache.${slot}`;

/** A graph being built over one plan: its weight inputs, its caches, and each layer as ONNX nodes. */
function planGraph(g: OnnxGraph, plan: VaePlan, first: boolean) {
  const weights = new Map<string, VaeWeightInput>();
  const weight = (tensor: string, dims: number[], tap: number | null = null): string => {
    const input = tap === null ? tensor : `${tensor}.t${tap}`;
    if (!weights.has(input)) weights.set(input, { input: g.input(input, dims), tensor, tap, dims });
    return input;
  };
  const side = (scale: number): [Dim, Dim] => [`h${scale}`, `w${scale}`];
  const caches = plan.caches.map(({ frames, channels, scale }, slot) =>
    g.input(cacheName(slot), [frames, channels, ...side(scale)]),
  );
  const nextCaches: string[] = [...caches];
  const frameSlice = (x: string, from: number, to: number, step = 1) =>
    g.op('Slice', [x, g.ints([from]), g.ints([to]), g.ints([0]), g.ints([step])]);

  // a k×k 2D convolution, zero-padded to keep the size (stride 1) or on the right and bottom (stride 2, Wan's
  // ZeroPad2d((0, 1, 0, 1))); every attribute spelled out, as WebGPU's Conv wants them when its weight is an input
  const conv2d = (inputs: string[], k: 1 | 3, stride: 1 | 2 = 1) =>
    g.op('Conv', inputs, {
      kernel_shape: [k, k],
      pads: stride === 1 ? Array(4).fill(k >> 1) : [0, 0, 1, 1],
      strides: [stride, stride],
      dilations: [1, 1],
      group: 1,
    });
  /** a causal convolution on x of `frames` frames: three taps over [cache, x], the cache's next value kept */
  const causalConv = (c: CausalConv, x: string, frames: number, timeConv = false): string => {
    const spatial = c.kernel === 3 && !timeConv ? 3 : 1;
    const bias = weight(`${c.name}.bias`, [c.outDim]);
    if (c.cache === null) return conv2d([x, weight(`${c.name}.weight`, [c.outDim, c.inDim, 1, 1], 0), bias], 1);
    const kept = plan.caches[c.cache].frames;
    const joined = g.op('Concat', [caches[c.cache], x], { axis: 0 });
    nextCaches[c.cache] = frameSlice(joined, frames, frames + kept);
    let sum = '';
    for (let tap = 0; tap < 3; tap++) {
      const w = weight(`${c.name}.weight`, [c.outDim, c.inDim, spatial, spatial], tap);
      const y = conv2d([frameSlice(joined, tap, tap + frames), w, ...(tap === 0 ? [bias] : [])], spatial);
      sum = tap === 0 ? y : g.op('Add', [sum, y]);
    }
    return sum;
  };
  /** F.normalize over channels · √C · γ (γ stored [C, 1, 1, 1] or [C, 1, 1]) */
  const norm = (x: string, gamma: string, dims: number[]): string => {
    // max(‖x‖, ε) as Clip: WebGPU has no kernel for an elementwise Max
    const length = g.op('Clip', [
      g.op('Sqrt', [g.op('ReduceSumSquare', [x], { axes: [1], keepdims: 1 })]),
      g.scalar(1e-12),
    ]);
    const scale = g.op('Mul', [
      g.op('Reshape', [weight(gamma, dims), g.ints([-1, 1, 1])]),
      g.scalar(Math.sqrt(dims[0])),
    ]);
    return g.op('Mul', [g.op('Div', [x, length]), scale]);
  };
  const silu = (x: string) => g.op('Mul', [x, g.op('Sigmoid', [x])]);
  const gather = (x: string, indices: number[], axis: number) => g.op('Gather', [x, g.ints(indices)], { axis });

  /**
   * DupUp3D of x [T, in, h, w]: output channel o at time offset it and pixel offset (iy, ix) reads
   * input channel ⌊(((o·ft + it)·fs + iy)·fs + ix) / repeats⌋. One Gather per time offset puts those
   * channels in DepthToSpace's (DCR) order; the offsets' frames are interleaved by a Gather of frames.
   */
  const dupUp = (l: Extract<VaeLayer, { kind: 'shortcut' }>, x: string, frames: number): string => {
    const { factorT: ft, factorS: fs, inDim, outDim } = l;
    const repeats = (outDim * ft * fs * fs) / inDim;
    const perOffset = Array.from({ length: ft }, (_, it) => {
      const indices: number[] = [];
      for (let iy = 0; iy < fs; iy++)
        for (let ix = 0; ix < fs; ix++)
          for (let o = 0; o < outDim; o++) indices.push(Math.floor((((o * ft + it) * fs + iy) * fs + ix) / repeats));
      return g.op('DepthToSpace', [gather(x, indices, 1)], { blocksize: fs });
    });
    if (ft === 1) return perOffset[0];
    // frame t·ft + it of the output is frame t of offset it
    const order = Array.from({ length: frames * ft }, (_, f) => (f % ft) * frames + Math.floor(f / ft));
    const skip = first ? ft - 1 : 0;
    return gather(g.op('Concat', perOffset, { axis: 0 }), order.slice(skip), 0);
  };
  /**
   * AvgDown3D of x [T, in, H, W]: output channel o is the mean of the view's channels o·group + g,
   * view channel k reading input channel ⌊k / factor⌋ at time offset it and pixel offset (iy, ix)
   * (k mod factor = (it·fs + iy)·fs + ix), time zero-padded in front. Per time offset a Gather of
   * frames, per pixel offset a strided Slice; a Gather of channels puts each group's members in
   * `group` blocks, summed.
   */
  const avgDown = (l: Extract<VaeLayer, { kind: 'shortcut' }>, x: string, frames: number): string => {
    const { factorT: ft, factorS: fs, inDim, outDim } = l;
    const factor = ft * fs * fs;
    const group = (inDim * factor) / outDim;
    const pad = (ft - (frames % ft)) % ft;
    const padded = pad ? g.op('Concat', [g.op('Mul', [frameSlice(x, 0, pad), g.scalar(0)]), x], { axis: 0 }) : x;
    const outFrames = (frames + pad) / ft;
    const offsets = Array.from({ length: ft }, (_, it) => {
      const picked = gather(
        padded,
        Array.from({ length: outFrames }, (_, t) => t * ft + it),
        0,
      );
      // SpaceToDepth's order, by strided slices (WebGPU has no SpaceToDepth): channel (iy·fs + ix)·in + c
      const pixels: string[] = [];
      for (let iy = 0; iy < fs; iy++)
        for (let ix = 0; ix < fs; ix++)
          pixels.push(
            g.op('Slice', [picked, g.ints([iy, ix]), g.ints([2 ** 31, 2 ** 31]), g.ints([2, 3]), g.ints([fs, fs])]),
          );
      return pixels;
    });
    // channel (it·fs² + iy·fs + ix)·in + c
    const joined = g.op('Concat', offsets.flat(), { axis: 1 });
    const indices: number[] = [];
    for (let gi = 0; gi < group; gi++)
      for (let o = 0; o < outDim; o++) {
        const k = o * group + gi;
        const r = k % factor;
        indices.push(Math.floor(r / (fs * fs)) * fs * fs * inDim + (r % (fs * fs)) * inDim + Math.floor(k / factor));
      }
    const blocks = g.opMulti('Split', [gather(joined, indices, 1)], { axis: 1 }, group);
    if (group === 1) return blocks[0];
    return g.op('Mul', [blocks.slice(1).reduce((sum, b) => g.op('Add', [sum, b]), blocks[0]), g.scalar(1 / group)]);
  };

  let kept = { x: '', frames: 0 };
  const layer = (l: VaeLayer, x: string, frames: number): { x: string; frames: number } => {
    switch (l.kind) {
      case 'conv':
        return { x: causalConv(l.conv, x, frames), frames };
      case 'residual': {
        const shortcut = l.shortcut ? causalConv(l.shortcut, x, frames) : x;
        let y = causalConv(l.conv1, silu(norm(x, `${l.name}.norm1.gamma`, [l.inDim, 1, 1, 1])), frames);
        y = causalConv(l.conv2, silu(norm(y, `${l.name}.norm2.gamma`, [l.outDim, 1, 1, 1])), frames);
        return { x: g.op('Add', [y, shortcut]), frames };
      }
      case 'attention': {
        const C = l.dim;
        const normed = norm(x, `${l.name}.norm.gamma`, [C, 1, 1]);
        const qkv = conv2d(
          [normed, weight(`${l.name}.to_qkv.weight`, [3 * C, C, 1, 1]), weight(`${l.name}.to_qkv.bias`, [3 * C])],
          1,
        );
        // each [T, C, hw]
        const [q, k, v] = g.opMulti('Split', [g.op('Reshape', [qkv, g.ints([frames, 3 * C, -1])])], { axis: 1 }, 3);
        const scores = g.op('Mul', [
          g.op('MatMul', [g.op('Transpose', [q], { perm: [0, 2, 1] }), k]),
          g.scalar(1 / Math.sqrt(C)),
        ]); // [T, hw(q), hw(k)]
        const attended = g.op('MatMul', [
          v,
          g.op('Transpose', [g.op('Softmax', [scores], { axis: -1 })], { perm: [0, 2, 1] }),
        ]); // [T, C, hw(q)]
        const out = conv2d(
          [
            g.op('Reshape', [attended, g.op('Shape', [x])]),
            weight(`${l.name}.proj.weight`, [C, C, 1, 1]),
            weight(`${l.name}.proj.bias`, [C]),
          ],
          1,
        );
        return { x: g.op('Add', [out, x]), frames };
      }
      case 'upsample': {
        if (l.timeConv && !first) {
          // dim → 2·dim channels; frame 2t is the first half at t, 2t+1 the second
          x = g.op('Reshape', [causalConv(l.timeConv, x, frames, true), g.ints([2 * frames, l.dim, 0, 0])]);
          frames *= 2;
        }
        // nearest ×2: with half_pixel coordinates and round_prefer_floor (Resize's defaults) pixel i reads ⌊i/2⌋,
        // as nearest-exact
        const big = g.op('Resize', [x, '', g.weight('upsample_scales', [4], new Float32Array([1, 1, 2, 2]))]);
        const out = conv2d(
          [
            big,
            weight(`${l.name}.resample.1.weight`, [l.outDim, l.dim, 3, 3]),
            weight(`${l.name}.resample.1.bias`, [l.outDim]),
          ],
          3,
        );
        return { x: out, frames };
      }
      case 'downsample': {
        x = conv2d(
          [
            x,
            weight(`${l.name}.resample.1.weight`, [l.dim, l.dim, 3, 3]),
            weight(`${l.name}.resample.1.bias`, [l.dim]),
          ],
          3,
          2,
        );
        if (!l.timeConv) return { x, frames };
        const slot = l.timeConv.cache;
        if (first) {
          // the first chunk only fills the cache: its one frame goes on as it is
          nextCaches[slot] = frameSlice(x, frames - 1, frames);
          return { x, frames };
        }
        // frames [cache, x]: output frame j reads frames 2j, 2j + 1, 2j + 2
        const joined = g.op('Concat', [caches[slot], x], { axis: 0 });
        nextCaches[slot] = frameSlice(x, frames - 1, frames);
        const out = frames / 2;
        const t = l.timeConv;
        let sum = '';
        for (let tap = 0; tap < 3; tap++) {
          const w = weight(`${t.name}.weight`, [t.outDim, t.inDim, 1, 1], tap);
          const bias = tap === 0 ? [weight(`${t.name}.bias`, [t.outDim])] : [];
          const y = conv2d([frameSlice(joined, tap, tap + 2 * out - 1, 2), w, ...bias], 1);
          sum = tap === 0 ? y : g.op('Add', [sum, y]);
        }
        return { x: sum, frames: out };
      }
      case 'keep':
        kept = { x, frames };
        return { x, frames };
      case 'shortcut': {
        const s = l.direction === 'up' ? dupUp(l, kept.x, kept.frames) : avgDown(l, kept.x, kept.frames);
        return { x: g.op('Add', [x, s]), frames };
      }
      case 'head':
        return { x: causalConv(l.conv, silu(norm(x, `${l.name}.norm_out.gamma`, [l.dim, 1, 1, 1])), frames), frames };
    }
  };
  const run = (x: string, frames: number) => {
    let state = { x, frames };
    for (const l of plan.layers) state = layer(l, state.x, state.frames);
    return state;
  };
  const outputCaches = () =>
    plan.caches.forEach(({ frames, channels, scale }, slot) =>
      g.output(nextCaches[slot], `${cacheName(slot)}.next`, [frames, channels, ...side(scale)]),
    );
  return { causalConv, run, outputCaches, weights, caches };
}

export function buildVaeChunkGraph(cfg: WanVaeConfig, first: boolean): VaeChunkGraph {
  const g = new OnnxGraph(first ? 'wan_vae_first_chunk' : 'wan_vae_chunk');
  const p = planGraph(g, decoderPlan(cfg), first);
  const latent = g.input('latent', [1, cfg.zDim, 'h1', 'w1']);
  const z = g.op('Add', [
    g.op('Mul', [latent, g.weight('latents_std', [1, cfg.zDim, 1, 1], new Float32Array(cfg.latentsStd))]),
    g.weight('latents_mean', [1, cfg.zDim, 1, 1], new Float32Array(cfg.latentsMean)),
  ]);
  const state = p.run(p.causalConv(postQuantConv(cfg), z, 1), 1);
  if (state.frames !== framesOfChunk(cfg, first))
    throw new Error(`the VAE graph makes ${state.frames} frames a chunk, not ${framesOfChunk(cfg, first)}`);
  g.output(state.x, 'frames', [state.frames, 3 * cfg.patchSize ** 2, 'h8', 'w8']);
  p.outputCaches();
  return { bytes: g.toBytes(), weights: [...p.weights.values()], caches: p.caches, frames: state.frames };
}

/**
 * The encoder's graph for a chunk of patched video frames: the first (one frame) or a later one
 * (framesOfChunk frames), to one latent frame, normalised ((mean − latents_mean) / latents_std).
 */
export function buildVaeEncoderChunkGraph(cfg: WanVaeConfig, first: boolean): VaeChunkGraph {
  const g = new OnnxGraph(first ? 'wan_vae_encoder_first_chunk' : 'wan_vae_encoder_chunk');
  const p = planGraph(g, encoderPlan(cfg), first);
  const frames = framesOfChunk(cfg, first);
  const input = g.input('frames', [frames, 3 * cfg.patchSize ** 2, 'h1', 'w1']);
  const state = p.run(input, frames);
  if (state.frames !== 1) throw new Error(`the VAE encoder's graph makes ${state.frames} latent frames a chunk, not 1`);
  const mean = g.op('Slice', [p.causalConv(quantConv(cfg), state.x, 1), g.ints([0]), g.ints([cfg.zDim]), g.ints([1])]);
  const latent = g.op('Div', [
    g.op('Sub', [mean, g.weight('latents_mean', [1, cfg.zDim, 1, 1], new Float32Array(cfg.latentsMean))]),
    g.weight('latents_std', [1, cfg.zDim, 1, 1], new Float32Array(cfg.latentsStd)),
  ]);
  g.output(latent, 'latent', [1, cfg.zDim, 'h0.125', 'w0.125']);
  p.outputCaches();
  return { bytes: g.toBytes(), weights: [...p.weights.values()], caches: p.caches, frames };
}

/** The graph's weight inputs from the published tensors: a causal conv's [out, in, 3, kh, kw] cut into time taps. */
export function vaeWeightFeeds(inputs: VaeWeightInput[], tensors: TensorMap): Map<string, Float32Array> {
  const feeds = new Map<string, Float32Array>();
  for (const { input, tensor, tap, dims } of inputs) {
    const t = tensors.get(tensor);
    if (!t) throw new Error(`the VAE has no tensor "${tensor}"`);
    if (tap === null) {
      feeds.set(input, t.data);
      continue;
    }
    const [outDim, inDim, taps] = t.shape;
    const plane = t.data.length / (outDim * inDim * taps); // kh·kw
    if (plane !== dims[2] * dims[3])
      throw new Error(`VAE tensor "${tensor}" is [${t.shape.join(',')}]; its taps should be [${dims.join(',')}]`);
    const cut = new Float32Array(outDim * inDim * plane);
    for (let oi = 0; oi < outDim * inDim; oi++)
      cut.set(t.data.subarray((oi * taps + tap) * plane, (oi * taps + tap + 1) * plane), oi * plane);
    feeds.set(input, cut);
  }
  return feeds;
}
