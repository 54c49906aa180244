// The configuration files of the published Wan-AI/Wan2.1-T2V-1.3B-Diffusers folder, as published
// (its model_index.json and each component's config), for writing random checkpoints in exactly
// its layout (server/cli/make-model.ts). Weights: transformer/ holds
// diffusion_pytorch_model-0000{1,2}-of-00002.safetensors (4,998,781,576 and 677,289,072 bytes,
// 1,418,996,800 fp32 parameters in 825 tensors) and their index.
export const WAN21_T2V_1_3B = {
  modelIndex: {
    "_class_name": "WanPipeline",
    "_diffusers_version": "0.33.0.dev0",
    "scheduler": [
      "diffusers",
      "UniPCMultistepScheduler"
    ],
    "text_encoder": [
      "transformers",
      "UMT5EncoderModel"
    ],
    "tokenizer": [
      "transformers",
      "T5TokenizerFast"
    ],
    "transformer": [
      "diffusers",
      "WanTransformer3DModel"
    ],
    "vae": [
      "diffusers",
      "AutoencoderKLWan"
    ]
  },
  transformer: {
    "_class_name": "WanTransformer3DModel",
    "_diffusers_version": "0.33.0.dev0",
    "added_kv_proj_dim": null,
    "attention_head_dim": 128,
    "cross_attn_norm": true,
    "eps": 1e-06,
    "ffn_dim": 8960,
    "freq_dim": 256,
    "image_dim": null,
    "in_channels": 16,
    "num_attention_heads": 12,
    "num_layers": 30,
    "out_channels": 16,
    "patch_size": [
      1,
      2,
      2
    ],
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 1024,
    "text_dim": 4096
  },
  scheduler: {
    "_class_name": "UniPCMultistepScheduler",
    "_diffusers_version": "0.33.0.dev0",
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "beta_start": 0.0001,
    "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995,
    "final_sigmas_type": "zero",
    "flow_shift": 3.0,
    "lower_order_final": true,
    "num_train_timesteps": 1000,
    "predict_x0": true,
    "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": false,
    "sample_max_value": 1.0,
    "solver_order": 2,
    "solver_p": null,
    "solver_type": "bh2",
    "steps_offset": 0,
    "thresholding": false,
    "timestep_spacing": "linspace",
    "trained_betas": null,
    "use_beta_sigmas": false,
    "use_exponential_sigmas": false,
    "use_flow_sigmas": true,
    "use_karras_sigmas": false
  },
  textEncoder: {
    "_name_or_path": "google/umt5-xxl",
    "architectures": [
      "UMT5EncoderModel"
    ],
    "classifier_dropout": 0.0,
    "d_ff": 10240,
    "d_kv": 64,
    "d_model": 4096,
    "decoder_start_token_id": 0,
    "dense_act_fn": "gelu_new",
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "feed_forward_proj": "gated-gelu",
    "initializer_factor": 1.0,
    "is_encoder_decoder": true,
    "is_gated_act": true,
    "layer_norm_epsilon": 1e-06,
    "model_type": "umt5",
    "num_decoder_layers": 24,
    "num_heads": 64,
    "num_layers": 24,
    "output_past": true,
    "pad_token_id": 0,
    "relative_attention_max_distance": 128,
    "relative_attention_num_buckets": 32,
    "scalable_attention": true,
    "tie_word_embeddings": false,
    "tokenizer_class": "T5Tokenizer",
    "torch_dtype": "float32",
    "transformers_version": "4.49.0.dev0",
    "use_cache": true,
    "vocab_size": 256384
  },
  vae: {
    "_class_name": "AutoencoderKLWan",
    "_diffusers_version": "0.33.0.dev0",
    "attn_scales": [],
    "base_dim": 96,
    "dim_mult": [
      1,
      2,
      4,
      4
    ],
    "dropout": 0.0,
    "latents_mean": [
      -0.7571,
      -0.7089,
      -0.9113,
      0.1075,
      -0.1745,
      0.9653,
      -0.1517,
      1.5508,
      0.4134,
      -0.0715,
      0.5517,
      -0.3632,
      -0.1922,
      -0.9497,
      0.2503,
      -0.2921
    ],
    "latents_std": [
      2.8184,
      1.4541,
      2.3275,
      2.6558,
      1.2196,
      1.7708,
      2.6052,
      2.0743,
      3.2687,
      2.1526,
      2.8652,
      1.5579,
      1.6382,
      1.1253,
      2.8251,
      1.916
    ],
    "num_res_blocks": 2,
    "temperal_downsample": [
      false,
      true,
      true
    ],
    "z_dim": 16
  },
} as const;
