// The configuration files of the published Wan-AI/Wan2.2-TI2V-5B-Diffusers folder, for writing random checkpoints in
// exactly its layout. Its model_index.json as published; its transformer/config.json as diffusers'
// scripts/convert_wan_to_diffusers.py writes it for "Wan2.2-TI2V-5B" (no official copy was found; where each value
// came from: ../shared/wan2.2-ti2v-5b/SOURCES.md). Weights: transformer/ holds five fp32 shards and their index.
// `expand_timesteps`: the pipeline gives the transformer a timestep per token (core/model/timesteps.ts).
export const WAN22_TI2V_5B = {
  modelIndex: {
    _class_name: 'WanPipeline',
    _diffusers_version: '0.35.0.dev0',
    boundary_ratio: null,
    expand_timesteps: true,
    scheduler: ['diffusers', 'UniPCMultistepScheduler'],
    text_encoder: ['transformers', 'UMT5EncoderModel'],
    tokenizer: ['transformers', 'T5TokenizerFast'],
    transformer: ['diffusers', 'WanTransformer3DModel'],
    transformer_2: [null, null],
    vae: ['diffusers', 'AutoencoderKLWan'],
  },
  transformer: {
    _class_name: 'WanTransformer3DModel',
    _diffusers_version: '0.35.0.dev0',
    added_kv_proj_dim: null,
    attention_head_dim: 128,
    cross_attn_norm: true,
    eps: 1e-6,
    ffn_dim: 14336,
    freq_dim: 256,
    image_dim: null,
    in_channels: 48,
    num_attention_heads: 24,
    num_layers: 30,
    out_channels: 48,
    patch_size: [1, 2, 2],
    pos_embed_seq_len: null,
    qk_norm: 'rms_norm_across_heads',
    rope_max_seq_len: 1024,
    text_dim: 4096,
  },
} as const;
