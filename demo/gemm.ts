import * as ort from 'onnxruntime-web';
import { OnnxGraph } from '../core/model/onnx-builder.ts';

/**
 * The three matrix products training needs, row-major float32:
 *   xwT  x [n, k] · wᵀ, w [m, k] → [n, m]   (a linear layer's forward, PyTorch's [out, in] weight)
 *   xw   x [n, m] · w [m, k]      → [n, k]   (its input gradient)
 *   xTy  xᵀ [m, n] · y [n, k]     → [m, k]   (its weight gradient)
 * On onnxruntime-web's wasm backend (SIMD, threads) they run ~15–25× faster than plain JS loops;
 * the JS version is the reference the fast one is checked against.
 */
export interface Gemm {
  xwT(x: Float32Array, w: Float32Array, k: number): Promise<Float32Array>;
  xw(x: Float32Array, w: Float32Array, m: number): Promise<Float32Array>;
  xTy(x: Float32Array, y: Float32Array, n: number): Promise<Float32Array>;
  /** Batched attention when the backend has it (else the tape's JS loops run). */
  attention?: AttentionKernels;
}

/**
 * Softmax attention of G samples: q [G·sq, H·d], k and v [G·sk, H·d]. `forward` also returns the
 * probabilities [G, H, sq, sk] that `backward` needs with the output gradient.
 */
export interface AttentionKernels {
  forward(
    q: Float32Array,
    k: Float32Array,
    v: Float32Array,
    samples: number,
    headDim: number,
  ): Promise<{ o: Float32Array; probs: Float32Array }>;
  backward(
    q: Float32Array,
    k: Float32Array,
    v: Float32Array,
    probs: Float32Array,
    dO: Float32Array,
    samples: number,
    headDim: number,
  ): Promise<{ dq: Float32Array; dk: Float32Array; dv: Float32Array }>;
}

export const jsGemm: Gemm = {
  xwT(x, w, k) {
    const n = x.length / k;
    const m = w.length / k;
    const out = new Float32Array(n * m);
    for (let i = 0; i < n; i++)
      for (let o = 0; o < m; o++) {
        let s = 0;
        for (let j = 0; j < k; j++) s += x[i * k + j] * w[o * k + j];
        out[i * m + o] = s;
      }
    return Promise.resolve(out);
  },
  xw(x, w, m) {
    const n = x.length / m;
    const k = w.length / m;
    const out = new Float32Array(n * k);
    for (let i = 0; i < n; i++)
      for (let j = 0; j < m; j++) {
        const a = x[i * m + j];
        for (let c = 0; c < k; c++) out[i * k + c] += a * w[j * k + c];
      }
    return Promise.resolve(out);
  },
  xTy(x, y, n) {
    const m = x.length / n;
    const k = y.length / n;
    const out = new Float32Array(m * k);
    for (let r = 0; r < n; r++)
      for (let i = 0; i < m; i++) {
        const a = x[r * m + i];
        for (let c = 0; c < k; c++) out[i * k + c] += a * y[r * k + c];
      }
    return Promise.resolve(out);
  },
};

function gemmGraph(transA: number, transB: number): Uint8Array {
  const g = new OnnxGraph(`gemm_${transA}${transB}`);
  const a = g.input('A', ['a0', 'a1']);
  const b = g.input('B', ['b0', 'b1']);
  g.output(g.op('Gemm', [a, b], { transA, transB }), 'Y', ['y0', 'y1']);
  return g.toBytes();
}

/** [G, S, H·d] → per-head [G, H, S, d] and back. */
function splitHeads(g: OnnxGraph, x: string, heads: number, headDim: number): string {
  return g.op('Transpose', [g.op('Reshape', [x, g.ints([0, 0, heads, headDim])])], { perm: [0, 2, 1, 3] });
}
function mergeHeads(g: OnnxGraph, x: string): string {
  return g.op('Reshape', [g.op('Transpose', [x], { perm: [0, 2, 1, 3] }), g.ints([0, 0, -1])]);
}

function attentionForwardGraph(heads: number, headDim: number): Uint8Array {
  const g = new OnnxGraph('attention_forward');
  const W = heads * headDim;
  const [q, k, v] = (['q', 'k', 'v'] as const).map((n) =>
    splitHeads(g, g.input(n, ['G', n === 'q' ? 'sq' : 'sk', W]), heads, headDim),
  );
  const scores = g.op('Mul', [
    g.op('MatMul', [q, g.op('Transpose', [k], { perm: [0, 1, 3, 2] })]),
    g.scalar(1 / Math.sqrt(headDim)),
  ]);
  const probs = g.op('Softmax', [scores], { axis: -1 });
  g.output(mergeHeads(g, g.op('MatMul', [probs, v])), 'o', ['G', 'sq', W]);
  g.output(probs, 'probs', ['G', heads, 'sq', 'sk']);
  return g.toBytes();
}

function attentionBackwardGraph(heads: number, headDim: number): Uint8Array {
  const g = new OnnxGraph('attention_backward');
  const W = heads * headDim;
  const [q, k, v] = (['q', 'k', 'v'] as const).map((n) =>
    splitHeads(g, g.input(n, ['G', n === 'q' ? 'sq' : 'sk', W]), heads, headDim),
  );
  const probs = g.input('probs', ['G', heads, 'sq', 'sk']);
  const dO = splitHeads(g, g.input('dO', ['G', 'sq', W]), heads, headDim);
  const T = (x: string) => g.op('Transpose', [x], { perm: [0, 1, 3, 2] });
  const dV = g.op('MatMul', [T(probs), dO]);
  const dP = g.op('MatMul', [dO, T(v)]);
  const rowDot = g.op('ReduceSum', [g.op('Mul', [dP, probs]), g.ints([-1])], { keepdims: 1 });
  const dS = g.op('Mul', [g.op('Mul', [probs, g.op('Sub', [dP, rowDot])]), g.scalar(1 / Math.sqrt(headDim))]);
  g.output(mergeHeads(g, g.op('MatMul', [dS, k])), 'dq', ['G', 'sq', W]);
  g.output(mergeHeads(g, g.op('MatMul', [T(dS), q])), 'dk', ['G', 'sk', W]);
  g.output(mergeHeads(g, dV), 'dv', ['G', 'sk', W]);
  return g.toBytes();
}

/** Gemm on onnxruntime-web's wasm backend; `threads` must be set before any other session exists. */
export async function onnxGemm(threads: number, attention?: { heads: number; headDim: number }): Promise<Gemm> {
  ort.env.wasm.numThreads = threads;
  const options: ort.InferenceSession.SessionOptions = { executionProviders: ['wasm'], graphOptimizationLevel: 'all' };
  const [nt, nn, tn] = await Promise.all(
    [gemmGraph(0, 1), gemmGraph(0, 0), gemmGraph(1, 0)].map((g) => ort.InferenceSession.create(g, options)),
  );
  const run = async (
    session: ort.InferenceSession,
    a: Float32Array,
    aDims: number[],
    b: Float32Array,
    bDims: number[],
  ) => {
    const r = await session.run({ A: new ort.Tensor('float32', a, aDims), B: new ort.Tensor('float32', b, bDims) });
    return r.Y.data as Float32Array;
  };
  let kernels: AttentionKernels | undefined;
  if (attention) {
    const { heads, headDim } = attention;
    const W = heads * headDim;
    const [fwd, bwd] = await Promise.all(
      [attentionForwardGraph(heads, headDim), attentionBackwardGraph(heads, headDim)].map((g) =>
        ort.InferenceSession.create(g, options),
      ),
    );
    const t3 = (x: Float32Array, samples: number) => new ort.Tensor('float32', x, [samples, x.length / samples / W, W]);
    kernels = {
      async forward(q, k, v, samples, d) {
        if (d !== headDim) throw new Error(`attention kernels were built for head dim ${headDim}, got ${d}`);
        const r = await fwd.run({ q: t3(q, samples), k: t3(k, samples), v: t3(v, samples) });
        return { o: r.o.data as Float32Array, probs: r.probs.data as Float32Array };
      },
      async backward(q, k, v, probs, dO, samples) {
        const sq = q.length / samples / W;
        const sk = k.length / samples / W;
        const r = await bwd.run({
          q: t3(q, samples),
          k: t3(k, samples),
          v: t3(v, samples),
          probs: new ort.Tensor('float32', probs, [samples, heads, sq, sk]),
          dO: t3(dO, samples),
        });
        return { dq: r.dq.data as Float32Array, dk: r.dk.data as Float32Array, dv: r.dv.data as Float32Array };
      },
    };
  }
  return {
    attention: kernels,
    xwT: (x, w, k) => run(nt, x, [x.length / k, k], w, [w.length / k, k]),
    xw: (x, w, m) => run(nn, x, [x.length / m, m], w, [m, w.length / m]),
    xTy: (x, y, n) => run(tn, x, [n, x.length / n], y, [n, y.length / n]),
  };
}
