import { describe, expect, it } from 'vitest';
import { checkWeights, expectedWeightShapes, parseWanConfig } from '../../core/model/config.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { tinyModelFiles } from './fixtures.ts';

describe('diffusers WanTransformer3DModel config and weights', () => {
  it('parses the bundled tiny model with 12 heads, 16 channels and patch (1,2,2), every key present', async () => {
    const m = await loadTransformer(tinyModelFiles);
    expect(m.config.numHeads).toBe(12);
    expect(m.config.inChannels).toBe(16);
    expect(m.config.patchSize).toEqual([1, 2, 2]);
    const families = [
      'patch_embedding',
      'condition_embedder.time_embedder',
      'condition_embedder.time_proj',
      'condition_embedder.text_embedder',
      'blocks.0.attn1',
      'blocks.0.attn2',
      'blocks.0.norm2',
      'blocks.0.ffn',
      'blocks.0.scale_shift_table',
      'proj_out',
      'scale_shift_table',
    ];
    for (const family of families)
      expect(
        [...m.weights.keys()].some((k) => k.startsWith(family)),
        family,
      ).toBe(true);
  });

  it('reads the real Wan2.1-T2V-1.3B config and knows its weight shapes', () => {
    const cfg = parseWanConfig(
      {
        _class_name: 'WanTransformer3DModel',
        num_attention_heads: 12,
        attention_head_dim: 128,
        ffn_dim: 8960,
        num_layers: 30,
        text_dim: 4096,
        freq_dim: 256,
        in_channels: 16,
        out_channels: 16,
        patch_size: [1, 2, 2],
        cross_attn_norm: true,
        qk_norm: 'rms_norm_across_heads',
        eps: 1e-6,
        rope_max_seq_len: 1024,
        image_dim: null,
        added_kv_proj_dim: null,
      },
      'wan-1.3b',
    );
    expect(cfg.dim).toBe(1536);
    const shapes = expectedWeightShapes(cfg);
    expect(shapes.get('blocks.29.ffn.net.0.proj.weight')).toEqual([8960, 1536]);
    expect(shapes.get('patch_embedding.weight')).toEqual([1536, 16, 1, 2, 2]);
    expect(shapes.get('scale_shift_table')).toEqual([1, 2, 1536]);
    expect(shapes.size).toBe(12 + 30 * 27 + 3); // 825 tensors, as in the published checkpoint
  });

  it('refuses configs it cannot run, saying why', () => {
    expect(() => parseWanConfig({ attention_head_dim: 16 }, 'c.json')).toThrow(
      /c\.json: attention_head_dim 16 makes diffusers' RoPE tables and splits disagree/,
    );
    expect(() => parseWanConfig({ image_dim: 1280 }, 'c.json')).toThrow(/image_dim is set: image-to-video/);
    expect(() => parseWanConfig({ _class_name: 'UNet' }, 'c.json')).toThrow(/expected "WanTransformer3DModel"/);
    expect(() => parseWanConfig({ num_layers: -1 }, 'c.json')).toThrow(/num_layers must be a positive integer/);
  });

  it('lists every missing, unexpected and misshapen weight in one error', async () => {
    const m = await loadTransformer(tinyModelFiles);
    const weights = new Map(m.weights);
    weights.delete('proj_out.bias');
    weights.delete('blocks.1.attn2.norm_k.weight');
    weights.set('blocks.0.attn2.norm_added_q.weight', { shape: [1], data: new Float32Array(1) });
    weights.set('scale_shift_table', { shape: [1, 6, m.config.dim], data: new Float32Array(6 * m.config.dim) });
    let message = '';
    try {
      checkWeights(m.config, weights, 'w.safetensors');
    } catch (e) {
      message = (e as Error).message;
    }
    expect(message).toContain('missing keys: blocks.1.attn2.norm_k.weight, proj_out.bias');
    expect(message).toContain('unexpected keys: blocks.0.attn2.norm_added_q.weight');
    expect(message).toContain(`scale_shift_table is [1,6,${m.config.dim}], expected [1,2,${m.config.dim}]`);
  });
});
