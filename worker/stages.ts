import { attention } from '../core/model/ops.ts';
import { embedConditions, embedPatches, head, postAttention, preAttention, type WanModel } from '../core/model/reference.ts';

/**
 * What a rank computes between exchanges, one call per stage graph. Matrices are row-major with
 * their row count implied by the length: x and o [Sl, D], q/k/v after the exchange [S, (H/P)·d].
 */
export interface Embedded {
  x: Float32Array; // [Sl, D]
  temb: Float32Array; // [1, D]
  tproj: Float32Array; // [6, D]
  context: Float32Array; // [L, D]
}

export interface QKV {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
}

export interface StageRunner {
  embed(patches: Float32Array, timestep: number, text: Float32Array): Promise<Embedded>;
  preAttention(block: number, x: Float32Array, tproj: Float32Array, cos: Float32Array, sin: Float32Array): Promise<QKV>;
  attention(qkv: QKV, keyBias: Float32Array): Promise<Float32Array>;
  postAttention(block: number, x: Float32Array, o: Float32Array, tproj: Float32Array, context: Float32Array): Promise<Float32Array>;
  head(x: Float32Array, temb: Float32Array): Promise<Float32Array>;
}

/** The plain TypeScript reference behind the same interface (the `reference` backend). */
export function referenceStages(m: WanModel): StageRunner {
  const { headDim } = m.config;
  return {
    async embed(patches, timestep, text) {
      return { x: embedPatches(m, patches), ...embedConditions(m, timestep, text) };
    },
    async preAttention(block, x, tproj, cos, sin) {
      return preAttention(m, block, x, tproj, cos, sin);
    },
    async attention({ q, k, v }, keyBias) {
      const valid = keyBias.findIndex((b) => b !== 0);
      const width = (q.length / keyBias.length) | 0;
      return attention(q, k, v, headDim, width, valid < 0 ? undefined : valid);
    },
    async postAttention(block, x, o, tproj, context) {
      return postAttention(m, block, x, o, { temb: new Float32Array(0), tproj, context });
    },
    async head(x, temb) {
      return head(m, x, temb);
    },
  };
}
