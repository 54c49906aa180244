/**
 * diffusers' `transformer/config.json` for `WanTransformer3DModel`, in camelCase, with the
 * derived sizes every stage needs. Only text-to-video is supported: image conditioning
 * (`image_dim`, `added_kv_proj_dim`) is refused rather than silently ignored.
 */
export interface WanConfig {
  patchSize: [number, number, number];
  numHeads: number;
  headDim: number;
  /** heads × headDim, the model width D */
  dim: number;
  inChannels: number;
  outChannels: number;
  textDim: number;
  freqDim: number;
  ffnDim: number;
  numLayers: number;
  crossAttnNorm: boolean;
  eps: number;
  ropeMaxSeqLen: number;
}

export class ModelConfigError extends Error {
  override name = 'ModelConfigError';
}

/** Wan2.1's architecture (12 heads, 16 latent channels, 1×2×2 patches) at a chosen size: make-model's, train-demo's. */
export function wanConfigOfSize(
  size: { headDim: number; textDim: number; ffnDim: number; numLayers: number },
  source: string,
): WanConfig {
  return parseWanConfig(
    {
      _class_name: 'WanTransformer3DModel',
      num_attention_heads: 12,
      attention_head_dim: size.headDim,
      in_channels: 16,
      out_channels: 16,
      text_dim: size.textDim,
      freq_dim: 256,
      ffn_dim: size.ffnDim,
      num_layers: size.numLayers,
      patch_size: [1, 2, 2],
      rope_max_seq_len: 1024,
    },
    source,
  );
}

export function parseWanConfig(json: unknown, source: string): WanConfig {
  const fail = (what: string) => new ModelConfigError(`${source}: ${what}`);
  if (typeof json !== 'object' || json === null) throw fail('config is not a JSON object');
  const c = json as Record<string, unknown>;
  if (c._class_name !== undefined && c._class_name !== 'WanTransformer3DModel') {
    throw fail(`_class_name is ${JSON.stringify(c._class_name)}; expected "WanTransformer3DModel"`);
  }
  const int = (key: string, fallback: number): number => {
    const v = c[key] ?? fallback;
    if (!Number.isInteger(v) || (v as number) <= 0)
      throw fail(`${key} must be a positive integer, got ${JSON.stringify(v)}`);
    return v as number;
  };
  for (const key of ['image_dim', 'added_kv_proj_dim', 'pos_embed_seq_len']) {
    if (c[key] !== undefined && c[key] !== null)
      throw fail(`${key} is set: image-to-video checkpoints are not supported, only text-to-video`);
  }
  if (c.qk_norm !== undefined && c.qk_norm !== 'rms_norm_across_heads') {
    throw fail(`qk_norm ${JSON.stringify(c.qk_norm)} is not supported; expected "rms_norm_across_heads"`);
  }
  const patch = (c.patch_size ?? [1, 2, 2]) as number[];
  if (!Array.isArray(patch) || patch.length !== 3 || !patch.every((p) => Number.isInteger(p) && p > 0)) {
    throw fail(`patch_size must be three positive integers, got ${JSON.stringify(c.patch_size)}`);
  }
  const numHeads = int('num_attention_heads', 40);
  const headDim = int('attention_head_dim', 128);
  // diffusers builds RoPE tables with h = w = 2·(d//6) but splits them with d//3: both must agree.
  if (2 * Math.floor(headDim / 6) !== Math.floor(headDim / 3) || headDim % 2 !== 0) {
    throw fail(
      `attention_head_dim ${headDim} makes diffusers' RoPE tables and splits disagree; use e.g. 24, 32, 48 or 128`,
    );
  }
  const inChannels = int('in_channels', 16);
  return {
    patchSize: patch as [number, number, number],
    numHeads,
    headDim,
    dim: numHeads * headDim,
    inChannels,
    outChannels: c.out_channels == null ? inChannels : int('out_channels', inChannels),
    textDim: int('text_dim', 4096),
    freqDim: int('freq_dim', 256),
    ffnDim: int('ffn_dim', 13824),
    numLayers: int('num_layers', 40),
    crossAttnNorm: c.cross_attn_norm === undefined ? true : Boolean(c.cross_attn_norm),
    eps: typeof c.eps === 'number' ? c.eps : 1e-6,
    ropeMaxSeqLen: int('rope_max_seq_len', 1024),
  };
}

/** Writes the config back in diffusers' own key names. */
export function toDiffusersConfig(cfg: WanConfig): Record<string, unknown> {
  return {
    _class_name: 'WanTransformer3DModel',
    _diffusers_version: '0.35.0',
    patch_size: cfg.patchSize,
    num_attention_heads: cfg.numHeads,
    attention_head_dim: cfg.headDim,
    in_channels: cfg.inChannels,
    out_channels: cfg.outChannels,
    text_dim: cfg.textDim,
    freq_dim: cfg.freqDim,
    ffn_dim: cfg.ffnDim,
    num_layers: cfg.numLayers,
    cross_attn_norm: cfg.crossAttnNorm,
    qk_norm: 'rms_norm_across_heads',
    eps: cfg.eps,
    image_dim: null,
    added_kv_proj_dim: null,
    rope_max_seq_len: cfg.ropeMaxSeqLen,
  };
}

/**
 * Every weight a diffusers Wan2.1 text-to-video transformer has, with its shape, in the order its
 * state dict lists them (a module's own parameters before its children's; in each attention the
 * q/k norms before the projections, as diffusers 0.33's Attention registered them): the order
 * save_pretrained splits shards in. With it the published 1.3B shards come out at exactly their
 * published sizes, 4,998,781,576 and 677,289,072 bytes (test/unit/checkpoint.test.ts).
 */
export function expectedWeightShapes(cfg: WanConfig): Map<string, number[]> {
  const { dim: D, textDim, freqDim, ffnDim, inChannels, outChannels } = cfg;
  const [pt, ph, pw] = cfg.patchSize;
  const shapes = new Map<string, number[]>();
  const linear = (name: string, out: number, inp: number) => {
    shapes.set(`${name}.weight`, [out, inp]);
    shapes.set(`${name}.bias`, [out]);
  };
  shapes.set('scale_shift_table', [1, 2, D]);
  shapes.set('patch_embedding.weight', [D, inChannels, pt, ph, pw]);
  shapes.set('patch_embedding.bias', [D]);
  linear('condition_embedder.time_embedder.linear_1', D, freqDim);
  linear('condition_embedder.time_embedder.linear_2', D, D);
  linear('condition_embedder.time_proj', 6 * D, D);
  linear('condition_embedder.text_embedder.linear_1', D, textDim);
  linear('condition_embedder.text_embedder.linear_2', D, D);
  for (let i = 0; i < cfg.numLayers; i++) {
    const b = `blocks.${i}`;
    shapes.set(`${b}.scale_shift_table`, [1, 6, D]);
    for (const attn of ['attn1', 'attn2']) {
      shapes.set(`${b}.${attn}.norm_q.weight`, [D]);
      shapes.set(`${b}.${attn}.norm_k.weight`, [D]);
      for (const proj of ['to_q', 'to_k', 'to_v', 'to_out.0']) linear(`${b}.${attn}.${proj}`, D, D);
    }
    if (cfg.crossAttnNorm) {
      shapes.set(`${b}.norm2.weight`, [D]);
      shapes.set(`${b}.norm2.bias`, [D]);
    }
    linear(`${b}.ffn.net.0.proj`, ffnDim, D);
    linear(`${b}.ffn.net.2`, D, ffnDim);
  }
  linear('proj_out', outChannels * pt * ph * pw, D);
  return shapes;
}

/** Missing, unexpected or misshapen weights are one error listing all of them (and each misshapen one's file). */
export function checkWeights(
  cfg: WanConfig,
  weights: ReadonlyMap<string, { shape: number[]; file?: string }>,
  source: string,
): void {
  checkShapes(expectedWeightShapes(cfg), weights, source);
}

/** Every expected tensor is there with its shape, and nothing else; else one error naming each key that is not. */
export function checkShapes(
  expected: ReadonlyMap<string, number[]>,
  weights: ReadonlyMap<string, { shape: number[]; file?: string }>,
  source: string,
): void {
  const missing = [...expected.keys()].filter((k) => !weights.has(k));
  const unexpected = [...weights.keys()].filter((k) => !expected.has(k));
  const misshapen = [...expected].flatMap(([k, shape]) => {
    const found = weights.get(k);
    if (!found || found.shape.join() === shape.join()) return [];
    const where = found.file ? ` in ${found.file}` : '';
    return [`${k}${where} is [${found.shape.join(',')}], expected [${shape.join(',')}]`];
  });
  const problems = [
    missing.length ? `missing keys: ${missing.join(', ')}` : '',
    unexpected.length ? `unexpected keys: ${unexpected.join(', ')}` : '',
    misshapen.length ? `wrong shapes: ${misshapen.join('; ')}` : '',
  ].filter(Boolean);
  if (problems.length) throw new ModelConfigError(`${source} does not match its config: ${problems.join('. ')}`);
}
