#!/usr/bin/env python3
# transformers' UMT5EncoderModel (src/transformers/models/umt5/modeling_umt5.py), the encoder path
# WanPipeline runs (_get_t5_prompt_embeds: text_encoder(ids, mask).last_hidden_state), transcribed
# to numpy float64 for checking core/model/umt5.ts against the upstream Python rather than against
# a reading of it. torch is not installed here: each torch call the upstream makes has a numpy
# stand-in; the classes keep transformers' names and structure (UMT5LayerNorm, UMT5DenseGatedActDense
# with its wi_0 / wi_1 / wo, UMT5Attention with a relative_attention_bias in every layer,
# UMT5LayerSelfAttention, UMT5LayerFF, UMT5Block, UMT5Stack), so they read side by side with the
# upstream file. Dropout is the identity (eval), the mask all ones (a prompt without padding), and
# the float16 clamps do not apply (float64).
#
#   python3 umt5_numpy.py --encoder DIR --ids 5,42,7 --out FILE
#
# DIR holds config.json and model.safetensors (or its .index.json and shards). FILE gets
# last_hidden_state [T, d_model] as raw little-endian float64. A JSON summary goes to stdout.

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wan_transformer_numpy import read_checkpoint  # noqa: E402

F64 = np.float64


def gelu_new(x):
    """transformers' NewGELUActivation: the tanh approximation (ACT2FN["gelu_new"])."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * np.power(x, 3.0))))


class Linear:
    """nn.Linear(bias=False): x @ weight.T."""

    def __init__(self, weight):
        self.weight = weight

    def __call__(self, x):
        return x @ self.weight.T


class UMT5LayerNorm:
    """T5's RMS norm: no mean subtracted, no bias; the variance in float32 upstream (float64 here)."""

    def __init__(self, weight, eps):
        self.weight = weight
        self.variance_epsilon = eps

    def __call__(self, hidden_states):
        variance = np.mean(np.power(hidden_states, 2), axis=-1, keepdims=True)
        hidden_states = hidden_states / np.sqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


class UMT5DenseGatedActDense:
    def __init__(self, sd, prefix, config):
        self.wi_0 = Linear(sd[f"{prefix}.wi_0.weight"])
        self.wi_1 = Linear(sd[f"{prefix}.wi_1.weight"])
        self.wo = Linear(sd[f"{prefix}.wo.weight"])
        assert config["dense_act_fn"] == "gelu_new", config["dense_act_fn"]
        self.act = gelu_new

    def __call__(self, hidden_states):
        hidden_gelu = self.act(self.wi_0(hidden_states))
        hidden_linear = self.wi_1(hidden_states)
        hidden_states = hidden_gelu * hidden_linear
        return self.wo(hidden_states)


class UMT5LayerFF:
    def __init__(self, sd, prefix, config):
        self.DenseReluDense = UMT5DenseGatedActDense(sd, f"{prefix}.DenseReluDense", config)
        self.layer_norm = UMT5LayerNorm(sd[f"{prefix}.layer_norm.weight"], config["layer_norm_epsilon"])

    def __call__(self, hidden_states):
        forwarded_states = self.layer_norm(hidden_states)
        forwarded_states = self.DenseReluDense(forwarded_states)
        return hidden_states + forwarded_states


class UMT5Attention:
    """Self-attention of an encoder layer: is_decoder False, has_relative_attention_bias True (every UMT5 layer)."""

    def __init__(self, sd, prefix, config):
        self.relative_attention_num_buckets = config["relative_attention_num_buckets"]
        self.relative_attention_max_distance = config["relative_attention_max_distance"]
        self.n_heads = config["num_heads"]
        self.key_value_proj_dim = config["d_kv"]
        self.q = Linear(sd[f"{prefix}.q.weight"])
        self.k = Linear(sd[f"{prefix}.k.weight"])
        self.v = Linear(sd[f"{prefix}.v.weight"])
        self.o = Linear(sd[f"{prefix}.o.weight"])
        self.relative_attention_bias = sd[f"{prefix}.relative_attention_bias.weight"]  # nn.Embedding

    def _relative_position_bucket(self, relative_position):
        relative_buckets = 0
        num_buckets = self.relative_attention_num_buckets
        max_distance = self.relative_attention_max_distance
        # encoder: bidirectional
        num_buckets //= 2
        relative_buckets += (relative_position > 0).astype(np.int64) * num_buckets
        relative_position = np.abs(relative_position)
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        with np.errstate(divide="ignore"):
            log_ratio = np.log(relative_position.astype(np.float32) / max_exact) / math.log(max_distance / max_exact)
        # torch's .to(torch.long) truncates toward zero; log(0) is -inf, masked by is_small below
        relative_position_if_large = max_exact + np.trunc(
            np.nan_to_num(log_ratio * (num_buckets - max_exact), neginf=-1e9)
        ).astype(np.int64)
        relative_position_if_large = np.minimum(relative_position_if_large, num_buckets - 1)
        relative_buckets += np.where(is_small, relative_position, relative_position_if_large)
        return relative_buckets

    def compute_bias(self, query_length, key_length):
        context_position = np.arange(query_length, dtype=np.int64)[:, None]
        memory_position = np.arange(key_length, dtype=np.int64)[None, :]
        relative_position = memory_position - context_position  # shape (query_length, key_length)
        relative_position_bucket = self._relative_position_bucket(relative_position)
        values = self.relative_attention_bias[relative_position_bucket]  # (query_length, key_length, num_heads)
        values = np.transpose(values, (2, 0, 1))[None]  # (1, num_heads, query_length, key_length)
        return values

    def __call__(self, hidden_states, attention_mask):
        batch_size, seq_length = hidden_states.shape[:2]

        def shape(states):
            return np.transpose(states.reshape(batch_size, -1, self.n_heads, self.key_value_proj_dim), (0, 2, 1, 3))

        query_states = shape(self.q(hidden_states))
        key_states = shape(self.k(hidden_states))
        value_states = shape(self.v(hidden_states))
        # no 1/sqrt(d) scaling: T5 folds it into the weights' initialisation
        scores = query_states @ np.transpose(key_states, (0, 1, 3, 2))
        position_bias = self.compute_bias(seq_length, seq_length)
        # the extended mask: 0 where attended, the dtype's minimum where not
        position_bias = position_bias + attention_mask
        scores = scores + position_bias
        scores = scores - np.max(scores, axis=-1, keepdims=True)
        attn_weights = np.exp(scores)
        attn_weights = attn_weights / np.sum(attn_weights, axis=-1, keepdims=True)
        attn_output = attn_weights @ value_states
        attn_output = np.transpose(attn_output, (0, 2, 1, 3)).reshape(batch_size, seq_length, -1)
        return self.o(attn_output)


class UMT5LayerSelfAttention:
    def __init__(self, sd, prefix, config):
        self.SelfAttention = UMT5Attention(sd, f"{prefix}.SelfAttention", config)
        self.layer_norm = UMT5LayerNorm(sd[f"{prefix}.layer_norm.weight"], config["layer_norm_epsilon"])

    def __call__(self, hidden_states, attention_mask):
        normed_hidden_states = self.layer_norm(hidden_states)
        attention_output = self.SelfAttention(normed_hidden_states, attention_mask)
        return hidden_states + attention_output


class UMT5Block:
    def __init__(self, sd, prefix, config):
        self.layer = [
            UMT5LayerSelfAttention(sd, f"{prefix}.layer.0", config),
            UMT5LayerFF(sd, f"{prefix}.layer.1", config),
        ]

    def __call__(self, hidden_states, attention_mask):
        hidden_states = self.layer[0](hidden_states, attention_mask)
        return self.layer[-1](hidden_states)


class UMT5Stack:
    def __init__(self, sd, config):
        self.embed_tokens = sd["shared.weight"]  # the encoder's embed_tokens is the shared embedding
        self.block = [UMT5Block(sd, f"encoder.block.{i}", config) for i in range(config["num_layers"])]
        self.final_layer_norm = UMT5LayerNorm(sd["encoder.final_layer_norm.weight"], config["layer_norm_epsilon"])

    def __call__(self, input_ids, attention_mask):
        inputs_embeds = self.embed_tokens[input_ids]
        # get_extended_attention_mask: (1 - mask) * finfo.min, broadcast over heads and queries
        extended = (1.0 - attention_mask[:, None, None, :]) * np.finfo(F64).min
        hidden_states = inputs_embeds
        for layer_module in self.block:
            hidden_states = layer_module(hidden_states, extended)
        return self.final_layer_norm(hidden_states)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--encoder", required=True, help="folder with config.json and model.safetensors")
    p.add_argument("--ids", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with open(os.path.join(args.encoder, "config.json")) as f:
        config = json.load(f)
    sd = read_checkpoint(args.encoder, "model")
    ids = np.array([[int(i) for i in args.ids.split(",")]], dtype=np.int64)
    mask = np.ones(ids.shape, dtype=F64)
    last_hidden_state = UMT5Stack(sd, config)(ids, mask)[0]
    last_hidden_state.astype("<f8").tofile(args.out)
    json.dump({"shape": list(last_hidden_state.shape)}, sys.stdout)


if __name__ == "__main__":
    main()
