// Wan2.1's VAE decoder as ONNX graphs, one chunk (one latent frame) per run: the graph for the
// first chunk and the graph for every later one (decoderPlan's layers, as the reference in
// wan-vae-reference.ts runs them). The causal caches are inputs and outputs (`cache.i` → `cache.i.next`),
// so a worker keeps them between runs (in GPU buffers on WebGPU). Height and width are symbolic:
// one pair of sessions decodes tiles of any size.
//   latent [1, z_dim, h, w] (as the transformer made it: the graph un-normalises it)
//   → frames [F, 3, 8h, 8w] (F = 1 for the first chunk, 4 after), before clamping
// A causal 3×3×3 convolution is three 2D convolutions, one per time tap, over the frames of
// [cache, x] (frames are the batch): onnxruntime-web's 2D Conv runs on every EP. Its weight
// [out, in, 3, kh, kw] is fed as three inputs `<name>.weight.t0..t2` of [out, in, kh, kw]
// (vaeWeightFeeds cuts them). Weights are inputs, not initializers: the two graphs share them.

import { OnnxGraph, type Dim } from './onnx-builder.ts';
import type { TensorMap } from '../safetensors.ts';
import {
  CACHE_FRAMES,
  decoderPlan,
  framesOfChunk,
  type CausalConv,
  type VaeLayer,
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
  /** frames it makes: 1 for the first chunk, 4 after */
  frames: number;
}

const cacheName = (slot: number) => `cache.${slot}`;

export function buildVaeChunkGraph(cfg: WanVaeConfig, first: boolean): VaeChunkGraph {
  const g = new OnnxGraph(first ? 'wan_vae_first_chunk' : 'wan_vae_chunk');
  const plan = decoderPlan(cfg);
  const weights = new Map<string, VaeWeightInput>();
  const weight = (tensor: string, dims: number[], tap: number | null = null): string => {
    const input = tap === null ? tensor : `${tensor}.t${tap}`;
    if (!weights.has(input)) weights.set(input, { input: g.input(input, dims), tensor, tap, dims });
    return input;
  };
  const side = (scale: number): [Dim, Dim] => [`h${scale}`, `w${scale}`];
  const caches = plan.caches.map(({ channels, scale }, slot) =>
    g.input(cacheName(slot), [CACHE_FRAMES, channels, ...side(scale)]),
  );
  const nextCaches: string[] = [...caches];

  // a k×k 2D convolution, stride 1, zero-padded to keep the size; every attribute spelled out, as WebGPU's Conv
  // wants them when its weight is an input
  const conv2d = (inputs: string[], k: 1 | 3) =>
    g.op('Conv', inputs, {
      kernel_shape: [k, k],
      pads: Array(4).fill(k >> 1),
      strides: [1, 1],
      dilations: [1, 1],
      group: 1,
    });
  /** a causal convolution on x of `frames` frames: three taps over [cache, x], the cache's next value kept */
  const causalConv = (c: CausalConv, x: string, frames: number, timeConv = false): string => {
    const spatial = c.kernel === 3 && !timeConv ? 3 : 1;
    const bias = weight(`${c.name}.bias`, [c.outDim]);
    if (c.cache === null) return conv2d([x, weight(`${c.name}.weight`, [c.outDim, c.inDim, 1, 1], 0), bias], 1);
    const joined = g.op('Concat', [caches[c.cache], x], { axis: 0 });
    nextCaches[c.cache] = g.op('Slice', [joined, g.ints([frames]), g.ints([frames + CACHE_FRAMES]), g.ints([0])]);
    let sum = '';
    for (let tap = 0; tap < 3; tap++) {
      const frameSlice = g.op('Slice', [joined, g.ints([tap]), g.ints([tap + frames]), g.ints([0])]);
      const w = weight(`${c.name}.weight`, [c.outDim, c.inDim, spatial, spatial], tap);
      const y = conv2d(tap === 0 ? [frameSlice, w, bias] : [frameSlice, w], spatial);
      sum = tap === 0 ? y : g.op('Add', [sum, y]);
    }
    return sum;
  };
  /** F.normalize over channels · √C · γ (γ stored [C, 1, 1, 1] or [C, 1, 1]) */
  const norm = (x: string, gamma: string, dims: number[]): string => {
    const length = g.op('Max', [
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
      case 'head':
        return { x: causalConv(l.conv, silu(norm(x, `${l.name}.norm_out.gamma`, [l.dim, 1, 1, 1])), frames), frames };
      default:
        throw new Error(`the VAE graphs do not build ${l.kind} layers yet`);
    }
  };

  const latent = g.input('latent', [1, cfg.zDim, 'h1', 'w1']);
  const z = g.op('Add', [
    g.op('Mul', [latent, g.weight('latents_std', [1, cfg.zDim, 1, 1], new Float32Array(cfg.latentsStd))]),
    g.weight('latents_mean', [1, cfg.zDim, 1, 1], new Float32Array(cfg.latentsMean)),
  ]);
  let state = {
    x: causalConv({ name: 'post_quant_conv', inDim: cfg.zDim, outDim: cfg.zDim, kernel: 1, cache: null }, z, 1),
    frames: 1,
  };
  for (const l of plan.layers) state = layer(l, state.x, state.frames);
  if (state.frames !== framesOfChunk(cfg, first))
    throw new Error(`the VAE graph makes ${state.frames} frames a chunk, not ${framesOfChunk(cfg, first)}`);
  g.output(state.x, 'frames', [state.frames, 3, 'h8', 'w8']);
  plan.caches.forEach(({ channels, scale }, slot) =>
    g.output(nextCaches[slot], `${cacheName(slot)}.next`, [CACHE_FRAMES, channels, ...side(scale)]),
  );
  return { bytes: g.toBytes(), weights: [...weights.values()], caches, frames: state.frames };
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
