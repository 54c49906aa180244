#!/usr/bin/env python3
# diffusers' WanTransformer3DModel.forward (src/diffusers/models/transformers/transformer_wan.py, as
# released: the output head adds scale_shift_table to temb without an activation), transcribed to
# numpy in float64, for holding the TypeScript forward to the upstream Python rather than to a
# reading of it. torch is not installed here: each torch call the upstream makes has a numpy stand-in
# below (Conv3d with kernel = stride, Linear, LayerNorm, RMSNorm, SDPA, get_timestep_embedding,
# get_1d_rotary_pos_embed). Classes and functions keep diffusers' names and order so that they read
# side by side with the upstream file; weights are looked up by diffusers' state-dict keys only.
# Every computation is float64 (weights widened from whatever the checkpoint stores: F32, F16, BF16),
# so the output is the exact function up to float64 rounding.
#
#   python3 wan_transformer_numpy.py --transformer DIR --input FILE --out FILE [--lora FILE:STRENGTH ...]
#
# DIR holds config.json and diffusion_pytorch_model.safetensors, or its .index.json and shards.
# FILE is a safetensors file with hidden_states [1, C, T, H, W], timestep [1] or [1, S] (Wan2.2's per-token
# timesteps, `expand_timesteps`) and
# encoder_hidden_states [1, L, text_dim] (what `npm run forward -- --make-input` writes). The output
# is raw little-endian float64 of sample [1, C_out, T, H, W]; a JSON summary goes to stdout.

import argparse
import json
import math
import os
import struct

import numpy as np

F64 = np.float64


# --- safetensors (the format: 8-byte header length, JSON header, raw little-endian data) ----------

def read_safetensors(path):
    # mapped, not read: a published shard is 5 GB, and only its float64 copy need be in memory
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (n,) = struct.unpack("<Q", data[:8].tobytes())
    header = json.loads(data[8 : 8 + n].tobytes())
    base = 8 + n
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[base + begin : base + end]
        dtype = entry["dtype"]
        if dtype == "F32":
            values = np.frombuffer(raw, dtype="<f4").astype(F64)
        elif dtype == "F16":
            values = np.frombuffer(raw, dtype="<f2").astype(F64)
        elif dtype == "BF16":
            # bfloat16 is the top half of a float32
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view("<f4").astype(F64)
        else:
            raise ValueError(f"{path}: {name} has dtype {dtype}")
        tensors[name] = values.reshape(entry["shape"])
    return tensors


def read_checkpoint(directory, name="diffusion_pytorch_model"):
    index = os.path.join(directory, f"{name}.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(directory, f"{name}.safetensors"))
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(os.path.join(directory, shard)))
    return tensors


# --- torch stand-ins ----------------------------------------------------------------------------

def linear(x, w, b):
    return x @ w.T + b


def layer_norm(x, eps, weight=None, bias=None):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight + bias
    return y


def rms_norm(x, eps, weight):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def silu(x):
    return x / (1 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def scaled_dot_product_attention(q, k, v):
    # [B, S, H, d] as dispatch_attention_fn takes them; softmax over keys with scale 1/sqrt(d)
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p = p / p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3)


def get_timestep_embedding(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1, max_period=10000):
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * np.arange(0, half_dim, dtype=F64)
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = np.exp(exponent)
    emb = timesteps[:, None].astype(F64) * emb[None, :]
    emb = np.concatenate([np.sin(emb), np.cos(emb)], axis=-1)
    if flip_sin_to_cos:
        emb = np.concatenate([emb[:, half_dim:], emb[:, :half_dim]], axis=-1)
    return emb


def get_1d_rotary_pos_embed(dim, pos, theta=10000.0):
    # use_real=True, repeat_interleave_real=True, freqs_dtype=float64
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=F64)[: dim // 2] / dim))
    freqs = np.outer(np.arange(pos, dtype=F64), freqs)
    return np.repeat(np.cos(freqs), 2, axis=1), np.repeat(np.sin(freqs), 2, axis=1)


# --- the model ----------------------------------------------------------------------------------

class WanRotaryPosEmbed:
    def __init__(self, attention_head_dim, patch_size, max_seq_len, theta=10000.0):
        self.attention_head_dim = attention_head_dim
        self.patch_size = patch_size
        h_dim = w_dim = 2 * (attention_head_dim // 6)
        t_dim = attention_head_dim - h_dim - w_dim
        cos, sin = zip(*(get_1d_rotary_pos_embed(d, max_seq_len, theta) for d in [t_dim, h_dim, w_dim]))
        self.freqs_cos = np.concatenate(cos, axis=1)
        self.freqs_sin = np.concatenate(sin, axis=1)

    def forward(self, hidden_states):
        _, _, num_frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.patch_size
        ppf, pph, ppw = num_frames // p_t, height // p_h, width // p_w
        d = self.attention_head_dim
        split_sizes = [d - 2 * (d // 3), d // 3, d // 3]
        bounds = np.cumsum([0] + split_sizes)

        def grid(freqs):
            parts = [freqs[:, bounds[i] : bounds[i + 1]] for i in range(3)]
            f = np.broadcast_to(parts[0][:ppf].reshape(ppf, 1, 1, -1), (ppf, pph, ppw, split_sizes[0]))
            h = np.broadcast_to(parts[1][:pph].reshape(1, pph, 1, -1), (ppf, pph, ppw, split_sizes[1]))
            w = np.broadcast_to(parts[2][:ppw].reshape(1, 1, ppw, -1), (ppf, pph, ppw, split_sizes[2]))
            return np.concatenate([f, h, w], axis=-1).reshape(1, ppf * pph * ppw, 1, -1)

        return grid(self.freqs_cos), grid(self.freqs_sin)


def apply_rotary_emb(hidden_states, freqs_cos, freqs_sin):
    x1 = hidden_states[..., 0::2]
    x2 = hidden_states[..., 1::2]
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = np.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out


class WanAttention:
    def __init__(self, weights, prefix, heads, eps):
        self.w = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        self.heads = heads
        self.eps = eps

    def __call__(self, hidden_states, encoder_hidden_states=None, rotary_emb=None):
        w = self.w
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        query = linear(hidden_states, w["to_q.weight"], w["to_q.bias"])
        key = linear(encoder_hidden_states, w["to_k.weight"], w["to_k.bias"])
        value = linear(encoder_hidden_states, w["to_v.weight"], w["to_v.bias"])
        query = rms_norm(query, self.eps, w["norm_q.weight"])
        key = rms_norm(key, self.eps, w["norm_k.weight"])
        unflatten = lambda t: t.reshape(t.shape[0], t.shape[1], self.heads, -1)  # noqa: E731
        query, key, value = unflatten(query), unflatten(key), unflatten(value)
        if rotary_emb is not None:
            query = apply_rotary_emb(query, *rotary_emb)
            key = apply_rotary_emb(key, *rotary_emb)
        hidden_states = scaled_dot_product_attention(query, key, value)
        hidden_states = hidden_states.reshape(hidden_states.shape[0], hidden_states.shape[1], -1)
        return linear(hidden_states, w["to_out.0.weight"], w["to_out.0.bias"])


class WanTransformerBlock:
    def __init__(self, weights, prefix, num_heads, cross_attn_norm, eps):
        self.w = weights
        self.prefix = prefix
        self.eps = eps
        self.cross_attn_norm = cross_attn_norm
        self.attn1 = WanAttention(weights, prefix + "attn1.", num_heads, eps)
        self.attn2 = WanAttention(weights, prefix + "attn2.", num_heads, eps)

    def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
        w = lambda name: self.w[self.prefix + name]  # noqa: E731
        if temb.ndim == 4:
            # temb: batch_size, seq_len, 6, inner_dim (wan2.2 ti2v): chunk(6, dim=2), each squeezed to [B, S, D]
            table = w("scale_shift_table")[None] + temb
            shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = (table[:, :, i] for i in range(6))
        else:
            table = w("scale_shift_table") + temb  # [1, 6, D]
            shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = (
                table[:, i : i + 1] for i in range(6)
            )

        # 1. Self-attention
        norm_hidden_states = layer_norm(hidden_states, self.eps) * (1 + scale_msa) + shift_msa
        attn_output = self.attn1(norm_hidden_states, None, rotary_emb)
        hidden_states = hidden_states + attn_output * gate_msa

        # 2. Cross-attention
        if self.cross_attn_norm:
            norm_hidden_states = layer_norm(hidden_states, self.eps, w("norm2.weight"), w("norm2.bias"))
        else:
            norm_hidden_states = hidden_states
        attn_output = self.attn2(norm_hidden_states, encoder_hidden_states, None)
        hidden_states = hidden_states + attn_output

        # 3. Feed-forward
        norm_hidden_states = layer_norm(hidden_states, self.eps) * (1 + c_scale_msa) + c_shift_msa
        ff = gelu_tanh(linear(norm_hidden_states, w("ffn.net.0.proj.weight"), w("ffn.net.0.proj.bias")))
        ff_output = linear(ff, w("ffn.net.2.weight"), w("ffn.net.2.bias"))
        return hidden_states + ff_output * c_gate_msa


class WanTransformer3DModel:
    def __init__(self, config, weights):
        self.config = config
        self.w = weights
        inner_dim = config["num_attention_heads"] * config["attention_head_dim"]
        self.inner_dim = inner_dim
        self.rope = WanRotaryPosEmbed(
            config["attention_head_dim"], config["patch_size"], config.get("rope_max_seq_len", 1024)
        )
        self.blocks = [
            WanTransformerBlock(
                weights, f"blocks.{i}.", config["num_attention_heads"], config["cross_attn_norm"], config["eps"]
            )
            for i in range(config["num_layers"])
        ]

    def condition_embedder(self, timestep, encoder_hidden_states, timestep_seq_len=None):
        w = self.w
        timestep = get_timestep_embedding(timestep, self.config["freq_dim"], flip_sin_to_cos=True, downscale_freq_shift=0)
        if timestep_seq_len is not None:
            timestep = timestep.reshape(-1, timestep_seq_len, timestep.shape[-1])  # unflatten(0, (-1, seq_len))
        temb = linear(
            silu(linear(timestep, w["condition_embedder.time_embedder.linear_1.weight"], w["condition_embedder.time_embedder.linear_1.bias"])),
            w["condition_embedder.time_embedder.linear_2.weight"],
            w["condition_embedder.time_embedder.linear_2.bias"],
        )
        timestep_proj = linear(silu(temb), w["condition_embedder.time_proj.weight"], w["condition_embedder.time_proj.bias"])
        text = linear(
            gelu_tanh(linear(encoder_hidden_states, w["condition_embedder.text_embedder.linear_1.weight"], w["condition_embedder.text_embedder.linear_1.bias"])),
            w["condition_embedder.text_embedder.linear_2.weight"],
            w["condition_embedder.text_embedder.linear_2.bias"],
        )
        return temb, timestep_proj, text

    def patch_embedding(self, hidden_states):
        # Conv3d with kernel_size = stride = patch_size: a linear map of each patch
        weight, bias = self.w["patch_embedding.weight"], self.w["patch_embedding.bias"]
        b, c, t, h, wd = hidden_states.shape
        p_t, p_h, p_w = self.config["patch_size"]
        x = hidden_states.reshape(b, c, t // p_t, p_t, h // p_h, p_h, wd // p_w, p_w)
        x = x.transpose(0, 2, 4, 6, 1, 3, 5, 7).reshape(b, (t // p_t) * (h // p_h) * (wd // p_w), -1)
        return x @ weight.reshape(weight.shape[0], -1).T + bias  # [B, F·H·W, D]: flatten(2).transpose(1, 2)

    def forward(self, hidden_states, timestep, encoder_hidden_states):
        batch_size, num_channels, num_frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.config["patch_size"]
        post_patch_num_frames = num_frames // p_t
        post_patch_height = height // p_h
        post_patch_width = width // p_w

        rotary_emb = self.rope.forward(hidden_states)
        hidden_states = self.patch_embedding(hidden_states)

        # timestep shape: batch_size, or batch_size, seq_len (wan 2.2 ti2v)
        if timestep.ndim == 2:
            ts_seq_len = timestep.shape[1]
            timestep = timestep.reshape(-1)
        else:
            ts_seq_len = None
        temb, timestep_proj, encoder_hidden_states = self.condition_embedder(
            timestep, encoder_hidden_states, timestep_seq_len=ts_seq_len
        )
        if ts_seq_len is not None:
            timestep_proj = timestep_proj.reshape(batch_size, ts_seq_len, 6, -1)  # unflatten(2, (6, -1))
        else:
            timestep_proj = timestep_proj.reshape(batch_size, 6, -1)

        for block in self.blocks:
            hidden_states = block.forward(hidden_states, encoder_hidden_states, timestep_proj, rotary_emb)

        # 5. Output norm, projection & unpatchify
        if temb.ndim == 3:
            # batch_size, seq_len, inner_dim (wan 2.2 ti2v)
            shift, scale = np.split(self.w["scale_shift_table"][None] + temb[:, :, None, :], 2, axis=2)
            shift, scale = shift[:, :, 0], scale[:, :, 0]
        else:
            shift, scale = np.split(self.w["scale_shift_table"] + temb[:, None, :], 2, axis=1)
        hidden_states = layer_norm(hidden_states, self.config["eps"]) * (1 + scale) + shift
        hidden_states = linear(hidden_states, self.w["proj_out.weight"], self.w["proj_out.bias"])

        hidden_states = hidden_states.reshape(
            batch_size, post_patch_num_frames, post_patch_height, post_patch_width, p_t, p_h, p_w, -1
        )
        hidden_states = hidden_states.transpose(0, 7, 1, 4, 2, 5, 3, 6)
        c = hidden_states.shape[1]
        return hidden_states.reshape(batch_size, c, num_frames, height, width)


# --- a LoRA in the original Wan / ComfyUI keys, merged as ComfyUI merges it ---------------------------
# Keys: diffusion_model.<original module>.{lora_down.weight, lora_up.weight, alpha, diff, diff_b}.
# Module names go to diffusers' by diffusers' scripts/convert_wan_to_diffusers.py rename table (its
# text-to-video entries, applied in its order, as that script applies them); the merge is
# comfy/weight_adapter/lora.py's (W += strength * alpha / rank * up.flatten(1) @ down.flatten(1)) and
# comfy/lora.py's "diff" patch (W += strength * diff), a bias's diff_b likewise.

TRANSFORMER_KEYS_RENAME_DICT = {
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
    "head.modulation": "scale_shift_table",
    "head.head": "proj_out",
    "modulation": "scale_shift_table",
    "ffn.0": "ffn.net.0.proj",
    "ffn.2": "ffn.net.2",
    "norm2": "norm__placeholder",
    "norm3": "norm2",
    "norm__placeholder": "norm3",
    "self_attn.q": "attn1.to_q",
    "self_attn.k": "attn1.to_k",
    "self_attn.v": "attn1.to_v",
    "self_attn.o": "attn1.to_out.0",
    "self_attn.norm_q": "attn1.norm_q",
    "self_attn.norm_k": "attn1.norm_k",
    "cross_attn.q": "attn2.to_q",
    "cross_attn.k": "attn2.to_k",
    "cross_attn.v": "attn2.to_v",
    "cross_attn.o": "attn2.to_out.0",
    "cross_attn.norm_q": "attn2.norm_q",
    "cross_attn.norm_k": "attn2.norm_k",
}


def diffusers_name(original):
    for old, new in TRANSFORMER_KEYS_RENAME_DICT.items():
        original = original.replace(old, new)
    return original


def merge_wan_lora(weights, path, strength):
    parts = {}
    for key, value in read_safetensors(path).items():
        if not key.startswith("diffusion_model."):
            raise ValueError(f"{path}: {key} is not in the original Wan keys")
        body = key[len("diffusion_model.") :]
        for suffix in (".lora_down.weight", ".lora_up.weight", ".alpha", ".diff_b", ".diff"):
            if body.endswith(suffix):
                parts.setdefault(body[: -len(suffix)], {})[suffix] = value
                break
        else:
            raise ValueError(f"{path}: {key} is no LoRA part")
    for module, p in parts.items():
        name = diffusers_name(module)
        weight_key = name + ".weight" if name + ".weight" in weights else name
        if weight_key not in weights:
            raise ValueError(f"{path}: {module} ({name}) is no module of the model")
        w = weights[weight_key]
        if ".lora_down.weight" in p:
            down, up = p[".lora_down.weight"], p[".lora_up.weight"]
            rank = down.shape[0]
            alpha = float(p[".alpha"].reshape(-1)[0]) / rank if ".alpha" in p else 1.0
            delta = up.reshape(up.shape[0], -1) @ down.reshape(rank, -1)
            w = w + strength * alpha * delta.reshape(w.shape)
        if ".diff" in p:
            w = w + strength * p[".diff"].reshape(w.shape)
        weights[weight_key] = w
        if ".diff_b" in p:
            weights[name + ".bias"] = weights[name + ".bias"] + strength * p[".diff_b"].reshape(-1)
    return weights


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--transformer", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--lora", action="append", default=[], help="FILE:STRENGTH, a LoRA in the original Wan keys")
    args = parser.parse_args()
    with open(os.path.join(args.transformer, "config.json")) as f:
        config = json.load(f)
    weights = read_checkpoint(args.transformer)
    for lora in args.lora:
        path, strength = lora.rsplit(":", 1)
        weights = merge_wan_lora(weights, path, float(strength))
    inputs = read_safetensors(args.input)
    model = WanTransformer3DModel(config, weights)
    sample = model.forward(inputs["hidden_states"], inputs["timestep"], inputs["encoder_hidden_states"])
    sample.astype("<f8").tofile(args.out)
    print(json.dumps({"shape": list(sample.shape), "sum": float(sample.sum()), "maxAbs": float(np.abs(sample).max())}))


if __name__ == "__main__":
    main()
