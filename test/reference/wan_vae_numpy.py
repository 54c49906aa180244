#!/usr/bin/env python3
# diffusers' AutoencoderKLWan (src/diffusers/models/autoencoders/autoencoder_kl_wan.py), transcribed
# line by line to numpy, for checking core/model/wan-vae.ts against the upstream Python rather than
# against a reading of it. torch is not installed here: each torch call the upstream makes has a
# numpy stand-in below (F_pad, F_normalize, conv3d/conv2d with strides, nearest-exact,
# scaled_dot_product_attention, repeat_interleave); the classes keep diffusers' names, structure,
# feat_cache list, feat_idx counter and its "Rep" marker, so they read side by side with the upstream.
# Both variants: Wan2.1's (is_residual False, no patch_size) and Wan2.2's (is_residual: AvgDown3D /
# DupUp3D shortcuts around the down- and up-blocks, patchify / unpatchify by patch_size). What runs:
# _encode (untiled: the first frame alone, then 4 at a time) and the posterior's mode, then
# WanImageToVideoPipeline's normalisation; WanPipeline's un-normalisation, then _decode or
# tiled_decode. Every tensor of the file is taken by the module diffusers would load it into, with
# the shape that module has (strict loading).
#
#   python3 wan_vae_numpy.py --vae DIR --latent FILE --shape Z,T,h,w --out FILE [--tile PX --stride PX] [--float64]
#   python3 wan_vae_numpy.py --vae DIR --video FILE --shape 3,F,H,W --out FILE [--float64]
#
# DIR holds config.json and diffusion_pytorch_model.safetensors (float32). A --latent FILE is raw
# little-endian float32 [z_dim, T, h, w], the transformer's (normalised) latent; the output is the
# video [3, 1 + 4(T-1), H, W] as WanPipeline hands it to postprocess (clamped to [-1, 1]). A --video
# FILE is raw float32 [3, F, H, W] in [-1, 1]; the output is the normalised latent the pipeline
# conditions on, [z_dim, 1 + (F-1)/4, h, w]. Outputs are raw float32, float64 with --float64.
# Without --tile, AutoencoderKLWan's default (use_tiling False: _decode untiled); with it,
# enable_tiling(tile, tile, stride, stride), and _decode tiles when the latent is larger than a tile.
# A JSON summary goes to stdout.

import argparse
import inspect
import json
import math
import os
import sys

import numpy as np

# The float type every array is held in: float32 (Wan2.1's fixture, as torch runs it), or float64
# with --float64 (an exact reading, for fixtures whose tolerance must not be set by rounding).
FLOAT = np.float32

# ---------------------------------------------------------------------------------------------
# numpy stand-ins for the torch operations the upstream calls (NCTHW / NCHW, float32)


def F_pad(x, pad):
    """torch.nn.functional.pad, constant 0: pad = (last_lo, last_hi, 2nd_last_lo, 2nd_last_hi, ...)."""
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return np.pad(x, widths, mode="constant", constant_values=0).astype(FLOAT, copy=False)


def F_normalize(x, dim, eps=1e-12):
    """torch.nn.functional.normalize, p=2: x / max(||x||_2 over dim, eps)."""
    norm = np.sqrt(np.sum(x * x, axis=dim, keepdims=True, dtype=FLOAT))
    return (x / np.maximum(norm, FLOAT(eps))).astype(FLOAT, copy=False)


def silu(x):
    """torch.nn.SiLU (get_activation("silu")): x * sigmoid(x)."""
    with np.errstate(over="ignore"):
        return (x / (FLOAT(1) + np.exp(-x))).astype(FLOAT, copy=False)


def conv3d(x, weight, bias, stride=(1, 1, 1)):
    """nn.Conv3d forward, no padding (WanCausalConv3d pads itself): [B,C,T,H,W] -> [B,O,T',H',W']."""
    kt, kh, kw = weight.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (kt, kh, kw), axis=(2, 3, 4))  # [B,C,T',H',W',kt,kh,kw]
    win = win[:, :, :: stride[0], :: stride[1], :: stride[2]]
    out = np.tensordot(win, weight, axes=([1, 5, 6, 7], [1, 2, 3, 4]))  # [B,T',H',W',O]
    out = out + bias
    return np.ascontiguousarray(out.transpose(0, 4, 1, 2, 3)).astype(FLOAT, copy=False)


def conv2d(x, weight, bias, padding=0, stride=1):
    """nn.Conv2d forward, zero padding: [N,C,H,W] -> [N,O,H',W']."""
    if padding:
        x = F_pad(x, (padding, padding, padding, padding))
    kh, kw = weight.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))  # [N,C,H',W',kh,kw]
    win = win[:, :, ::stride, ::stride]
    out = np.tensordot(win, weight, axes=([1, 4, 5], [1, 2, 3]))  # [N,H',W',O]
    out = out + bias
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2)).astype(FLOAT, copy=False)


def interpolate_nearest_exact(x, scale_factor):
    """F.interpolate(mode="nearest-exact", scale_factor=(sh, sw)) on [N,C,H,W]: source index
    floor((dst + 0.5) / scale), clamped (torch uses 1/scale_factor as the scale when it is given)."""
    sh, sw = scale_factor
    n, c, h, w = x.shape
    oh, ow = int(math.floor(h * sh)), int(math.floor(w * sw))
    iy = np.minimum(np.floor((np.arange(oh) + 0.5) * (1.0 / sh)).astype(np.int64), h - 1)
    ix = np.minimum(np.floor((np.arange(ow) + 0.5) * (1.0 / sw)).astype(np.int64), w - 1)
    return x[:, :, iy, :][:, :, :, ix]


def scaled_dot_product_attention(q, k, v):
    """F.scaled_dot_product_attention, no mask, no dropout, default scale 1/sqrt(E): softmax(q k^T * scale) v."""
    scale = FLOAT(1.0 / math.sqrt(q.shape[-1]))
    attn = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    attn = attn - np.max(attn, axis=-1, keepdims=True)
    attn = np.exp(attn)
    attn = attn / np.sum(attn, axis=-1, keepdims=True)
    return np.matmul(attn, v).astype(FLOAT, copy=False)


def is_rep(cache):
    """`feat_cache[idx] == "Rep"`: with torch, a tensor compared with a str is False (and `!=` True);
    a numpy array would compare elementwise, so the marker is tested by type here."""
    return isinstance(cache, str) and cache == "Rep"


# ---------------------------------------------------------------------------------------------
# Modules. Each takes the state dict and its own prefix (its name in the state dict) and checks
# the shapes of its parameters against the ones diffusers' __init__ would create.

CACHE_T = 2


class Module:
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def _param(sd, name, shape):
    if name not in sd:
        raise KeyError(f"missing tensor {name}")
    t = sd[name]
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {t.shape}, module expects {tuple(shape)}")
    return t


def _triple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


class Identity(Module):
    def forward(self, x):
        return x


class AvgDown3D(Module):
    def __init__(self, in_channels, out_channels, factor_t, factor_s=1):
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.factor_t = factor_t
        self.factor_s = factor_s
        self.factor = self.factor_t * self.factor_s * self.factor_s

        assert in_channels * self.factor % out_channels == 0
        self.group_size = in_channels * self.factor // out_channels

    def forward(self, x):
        pad_t = (self.factor_t - x.shape[2] % self.factor_t) % self.factor_t
        pad = (0, 0, 0, 0, pad_t, 0)
        x = F_pad(x, pad)
        B, C, T, H, W = x.shape
        x = x.reshape(
            B,
            C,
            T // self.factor_t,
            self.factor_t,
            H // self.factor_s,
            self.factor_s,
            W // self.factor_s,
            self.factor_s,
        )
        x = np.ascontiguousarray(x.transpose(0, 1, 3, 5, 7, 2, 4, 6))
        x = x.reshape(
            B,
            C * self.factor,
            T // self.factor_t,
            H // self.factor_s,
            W // self.factor_s,
        )
        x = x.reshape(
            B,
            self.out_channels,
            self.group_size,
            T // self.factor_t,
            H // self.factor_s,
            W // self.factor_s,
        )
        x = x.mean(axis=2, dtype=FLOAT)
        return x


class DupUp3D(Module):
    def __init__(self, in_channels, out_channels, factor_t, factor_s=1):
        self.in_channels = in_channels
        self.out_channels = out_channels

        self.factor_t = factor_t
        self.factor_s = factor_s
        self.factor = self.factor_t * self.factor_s * self.factor_s

        assert out_channels * self.factor % in_channels == 0
        self.repeats = out_channels * self.factor // in_channels

    def forward(self, x, first_chunk=False):
        x = np.repeat(x, self.repeats, axis=1)  # x.repeat_interleave(self.repeats, dim=1)
        x = x.reshape(
            x.shape[0],
            self.out_channels,
            self.factor_t,
            self.factor_s,
            self.factor_s,
            x.shape[2],
            x.shape[3],
            x.shape[4],
        )
        x = np.ascontiguousarray(x.transpose(0, 1, 5, 2, 6, 3, 7, 4))
        x = x.reshape(
            x.shape[0],
            self.out_channels,
            x.shape[2] * self.factor_t,
            x.shape[4] * self.factor_s,
            x.shape[6] * self.factor_s,
        )
        if first_chunk:
            x = x[:, :, self.factor_t - 1 :, :, :]
        return x


class Conv2d(Module):
    def __init__(self, sd, name, in_channels, out_channels, kernel_size, padding=0, stride=1):
        self.weight = _param(sd, name + ".weight", (out_channels, in_channels, kernel_size, kernel_size))
        self.bias = _param(sd, name + ".bias", (out_channels,))
        self.padding = padding
        self.stride = stride

    def forward(self, x):
        return conv2d(x, self.weight, self.bias, self.padding, self.stride)


class WanCausalConv3d(Module):
    count = 0  # instances made, for AutoencoderKLWan's _cached_conv_counts

    def __init__(self, sd, name, in_channels, out_channels, kernel_size, stride=1, padding=0):
        WanCausalConv3d.count += 1
        kernel_size = _triple(kernel_size)
        padding = _triple(padding)
        self.stride = _triple(stride)
        self.weight = _param(sd, name + ".weight", (out_channels, in_channels) + kernel_size)
        self.bias = _param(sd, name + ".bias", (out_channels,))
        self.padding = padding
        # Set up causal padding
        self._padding = (self.padding[2], self.padding[2], self.padding[1], self.padding[1], 2 * self.padding[0], 0)
        self.padding = (0, 0, 0)

    def forward(self, x, cache_x=None):
        padding = list(self._padding)
        if cache_x is not None and self._padding[4] > 0:
            x = np.concatenate([cache_x, x], axis=2)
            padding[4] -= cache_x.shape[2]
        x = F_pad(x, padding)
        return conv3d(x, self.weight, self.bias, self.stride)


class WanRMS_norm(Module):
    def __init__(self, sd, name, dim, channel_first=True, images=True, bias=False):
        broadcastable_dims = (1, 1, 1) if not images else (1, 1)
        shape = (dim, *broadcastable_dims) if channel_first else (dim,)

        self.channel_first = channel_first
        self.scale = dim**0.5
        self.gamma = _param(sd, name + ".gamma", shape)
        self.bias = _param(sd, name + ".bias", shape) if bias else 0.0

    def forward(self, x):
        # x is float32: no fp32 up-cast needed (needs_fp32_normalize is False)
        normalized = F_normalize(x, dim=(1 if self.channel_first else -1))
        return (normalized * self.scale * self.gamma + self.bias).astype(FLOAT, copy=False)


class WanUpsample(Module):
    """nn.Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"); x.float() and type_as are no-ops in float32."""

    def __init__(self, scale_factor, mode):
        assert mode == "nearest-exact"
        self.scale_factor = scale_factor

    def forward(self, x):
        return interpolate_nearest_exact(x, self.scale_factor)


class ZeroPad2d(Module):
    """nn.ZeroPad2d((left, right, top, bottom))."""

    def __init__(self, padding):
        self.padding = padding

    def forward(self, x):
        return F_pad(x, self.padding)


class Sequential(Module):
    def __init__(self, *layers):
        self.layers = layers

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class WanResample(Module):
    def __init__(self, sd, name, dim, mode, upsample_out_dim=None):
        self.dim = dim
        self.mode = mode

        # default to dim //2
        if upsample_out_dim is None:
            upsample_out_dim = dim // 2

        # layers
        if mode == "upsample2d":
            self.resample = Sequential(
                WanUpsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                Conv2d(sd, name + ".resample.1", dim, upsample_out_dim, 3, padding=1),
            )
        elif mode == "upsample3d":
            self.resample = Sequential(
                WanUpsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                Conv2d(sd, name + ".resample.1", dim, upsample_out_dim, 3, padding=1),
            )
            self.time_conv = WanCausalConv3d(sd, name + ".time_conv", dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample2d":
            self.resample = Sequential(ZeroPad2d((0, 1, 0, 1)), Conv2d(sd, name + ".resample.1", dim, dim, 3, stride=2))
        elif mode == "downsample3d":
            self.resample = Sequential(ZeroPad2d((0, 1, 0, 1)), Conv2d(sd, name + ".resample.1", dim, dim, 3, stride=2))
            self.time_conv = WanCausalConv3d(sd, name + ".time_conv", dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=(0, 0, 0))
        else:
            self.resample = Identity()

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        b, c, t, h, w = x.shape
        if self.mode == "upsample3d":
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = "Rep"
                    feat_idx[0] += 1
                else:
                    cache_x = x[:, :, -CACHE_T:, :, :].copy()
                    if cache_x.shape[2] < 2 and feat_cache[idx] is not None and not is_rep(feat_cache[idx]):
                        # cache last frame of last two chunk
                        cache_x = np.concatenate([feat_cache[idx][:, :, -1, :, :][:, :, None], cache_x], axis=2)
                    if cache_x.shape[2] < 2 and feat_cache[idx] is not None and is_rep(feat_cache[idx]):
                        cache_x = np.concatenate([np.zeros_like(cache_x), cache_x], axis=2)
                    if is_rep(feat_cache[idx]):
                        x = self.time_conv(x)
                    else:
                        x = self.time_conv(x, feat_cache[idx])
                    feat_cache[idx] = cache_x
                    feat_idx[0] += 1

                    x = x.reshape(b, 2, c, t, h, w)
                    x = np.stack((x[:, 0, :, :, :, :], x[:, 1, :, :, :, :]), 3)
                    x = x.reshape(b, c, t * 2, h, w)
        t = x.shape[2]
        x = x.transpose(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        x = self.resample(x)
        x = x.reshape(b, t, x.shape[1], x.shape[2], x.shape[3]).transpose(0, 2, 1, 3, 4)

        if self.mode == "downsample3d":
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = x.copy()
                    feat_idx[0] += 1
                else:
                    cache_x = x[:, :, -1:, :, :].copy()
                    x = self.time_conv(np.concatenate([feat_cache[idx][:, :, -1:, :, :], x], 2))
                    feat_cache[idx] = cache_x
                    feat_idx[0] += 1
        return x


class WanResidualBlock(Module):
    def __init__(self, sd, name, in_dim, out_dim, dropout=0.0, non_linearity="silu"):
        assert non_linearity == "silu"
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.nonlinearity = silu

        # layers
        self.norm1 = WanRMS_norm(sd, name + ".norm1", in_dim, images=False)
        self.conv1 = WanCausalConv3d(sd, name + ".conv1", in_dim, out_dim, 3, padding=1)
        self.norm2 = WanRMS_norm(sd, name + ".norm2", out_dim, images=False)
        self.dropout = Identity()  # nn.Dropout in eval mode
        self.conv2 = WanCausalConv3d(sd, name + ".conv2", out_dim, out_dim, 3, padding=1)
        self.conv_shortcut = WanCausalConv3d(sd, name + ".conv_shortcut", in_dim, out_dim, 1) if in_dim != out_dim else Identity()

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        # Apply shortcut connection
        h = self.conv_shortcut(x)

        # First normalization and activation
        x = self.norm1(x)
        x = self.nonlinearity(x)

        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].copy()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                cache_x = np.concatenate([feat_cache[idx][:, :, -1, :, :][:, :, None], cache_x], axis=2)

            x = self.conv1(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv1(x)

        # Second normalization and activation
        x = self.norm2(x)
        x = self.nonlinearity(x)

        # Dropout
        x = self.dropout(x)

        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].copy()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                cache_x = np.concatenate([feat_cache[idx][:, :, -1, :, :][:, :, None], cache_x], axis=2)

            x = self.conv2(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv2(x)

        # Add residual connection
        return x + h


class WanAttentionBlock(Module):
    def __init__(self, sd, name, dim):
        self.dim = dim

        # layers
        self.norm = WanRMS_norm(sd, name + ".norm", dim)
        self.to_qkv = Conv2d(sd, name + ".to_qkv", dim, dim * 3, 1)
        self.proj = Conv2d(sd, name + ".proj", dim, dim, 1)

    def forward(self, x):
        identity = x
        batch_size, channels, time, height, width = x.shape

        x = x.transpose(0, 2, 1, 3, 4).reshape(batch_size * time, channels, height, width)
        x = self.norm(x)

        # compute query, key, value
        qkv = self.to_qkv(x)
        qkv = qkv.reshape(batch_size * time, 1, channels * 3, -1)
        qkv = np.ascontiguousarray(qkv.transpose(0, 1, 3, 2))
        q, k, v = np.split(qkv, 3, axis=-1)  # qkv.chunk(3, dim=-1)

        # apply attention
        x = scaled_dot_product_attention(q, k, v)

        x = x.squeeze(1).transpose(0, 2, 1).reshape(batch_size * time, channels, height, width)

        # output projection
        x = self.proj(x)

        # Reshape back: [(b*t), c, h, w] -> [b, c, t, h, w]
        x = x.reshape(batch_size, time, channels, height, width)
        x = x.transpose(0, 2, 1, 3, 4)

        return x + identity


class WanMidBlock(Module):
    def __init__(self, sd, name, dim, dropout=0.0, non_linearity="silu", num_layers=1):
        self.dim = dim

        # Create the components
        resnets = [WanResidualBlock(sd, f"{name}.resnets.0", dim, dim, dropout, non_linearity)]
        attentions = []
        for i in range(num_layers):
            attentions.append(WanAttentionBlock(sd, f"{name}.attentions.{i}", dim))
            resnets.append(WanResidualBlock(sd, f"{name}.resnets.{i + 1}", dim, dim, dropout, non_linearity))
        self.attentions = attentions
        self.resnets = resnets

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        # First residual block
        x = self.resnets[0](x, feat_cache=feat_cache, feat_idx=feat_idx)

        # Process through attention and residual blocks
        for attn, resnet in zip(self.attentions, self.resnets[1:]):
            if attn is not None:
                x = attn(x)

            x = resnet(x, feat_cache=feat_cache, feat_idx=feat_idx)

        return x


class WanResidualDownBlock(Module):
    def __init__(self, sd, name, in_dim, out_dim, dropout, num_res_blocks, temperal_downsample=False, down_flag=False):
        # Shortcut path with downsample
        self.avg_shortcut = AvgDown3D(
            in_dim,
            out_dim,
            factor_t=2 if temperal_downsample else 1,
            factor_s=2 if down_flag else 1,
        )

        # Main path with residual blocks and downsample
        resnets = []
        for r in range(num_res_blocks):
            resnets.append(WanResidualBlock(sd, f"{name}.resnets.{r}", in_dim, out_dim, dropout))
            in_dim = out_dim
        self.resnets = resnets

        # Add the final downsample block
        if down_flag:
            mode = "downsample3d" if temperal_downsample else "downsample2d"
            self.downsampler = WanResample(sd, f"{name}.downsampler", out_dim, mode=mode)
        else:
            self.downsampler = None

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        x_copy = x.copy()
        for resnet in self.resnets:
            x = resnet(x, feat_cache=feat_cache, feat_idx=feat_idx)
        if self.downsampler is not None:
            x = self.downsampler(x, feat_cache=feat_cache, feat_idx=feat_idx)

        return x + self.avg_shortcut(x_copy)


class WanEncoder3d(Module):
    def __init__(
        self,
        sd,
        name,
        in_channels=3,
        dim=128,
        z_dim=4,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[True, True, False],
        dropout=0.0,
        non_linearity="silu",
        is_residual=False,  # wan 2.2 vae use a residual downblock
    ):
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_downsample = temperal_downsample
        self.nonlinearity = silu

        # dimensions
        dims = [dim * u for u in [1] + dim_mult]
        scale = 1.0

        # init block
        self.conv_in = WanCausalConv3d(sd, name + ".conv_in", in_channels, dims[0], 3, padding=1)

        # downsample blocks
        self.down_blocks = []
        block = lambda: f"{name}.down_blocks.{len(self.down_blocks)}"  # nn.ModuleList's index
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            # residual (+attention) blocks
            if is_residual:
                self.down_blocks.append(
                    WanResidualDownBlock(
                        sd,
                        block(),
                        in_dim,
                        out_dim,
                        dropout,
                        num_res_blocks,
                        temperal_downsample=temperal_downsample[i] if i != len(dim_mult) - 1 else False,
                        down_flag=i != len(dim_mult) - 1,
                    )
                )
            else:
                for _ in range(num_res_blocks):
                    self.down_blocks.append(WanResidualBlock(sd, block(), in_dim, out_dim, dropout))
                    if scale in attn_scales:
                        self.down_blocks.append(WanAttentionBlock(sd, block(), out_dim))
                    in_dim = out_dim

                # downsample block
                if i != len(dim_mult) - 1:
                    mode = "downsample3d" if temperal_downsample[i] else "downsample2d"
                    self.down_blocks.append(WanResample(sd, block(), out_dim, mode=mode))
                    scale /= 2.0

        # middle blocks
        self.mid_block = WanMidBlock(sd, name + ".mid_block", out_dim, dropout, non_linearity, num_layers=1)

        # output blocks
        self.norm_out = WanRMS_norm(sd, name + ".norm_out", out_dim, images=False)
        self.conv_out = WanCausalConv3d(sd, name + ".conv_out", out_dim, z_dim, 3, padding=1)

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].copy()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                # cache last frame of last two chunk
                cache_x = np.concatenate([feat_cache[idx][:, :, -1, :, :][:, :, None], cache_x], axis=2)
            x = self.conv_in(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv_in(x)

        ## downsamples
        for layer in self.down_blocks:
            if feat_cache is not None:
                x = layer(x, feat_cache=feat_cache, feat_idx=feat_idx)
            else:
                x = layer(x)

        ## middle
        x = self.mid_block(x, feat_cache=feat_cache, feat_idx=feat_idx)

        ## head
        x = self.norm_out(x)
        x = self.nonlinearity(x)
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].copy()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                # cache last frame of last two chunk
                cache_x = np.concatenate([feat_cache[idx][:, :, -1, :, :][:, :, None], cache_x], axis=2)
            x = self.conv_out(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv_out(x)

        return x


class WanResidualUpBlock(Module):
    def __init__(
        self,
        sd,
        name,
        in_dim,
        out_dim,
        num_res_blocks,
        dropout=0.0,
        temperal_upsample=False,
        up_flag=False,
        non_linearity="silu",
    ):
        self.in_dim = in_dim
        self.out_dim = out_dim

        if up_flag:
            self.avg_shortcut = DupUp3D(
                in_dim,
                out_dim,
                factor_t=2 if temperal_upsample else 1,
                factor_s=2,
            )
        else:
            self.avg_shortcut = None

        # create residual blocks
        resnets = []
        current_dim = in_dim
        for r in range(num_res_blocks + 1):
            resnets.append(WanResidualBlock(sd, f"{name}.resnets.{r}", current_dim, out_dim, dropout, non_linearity))
            current_dim = out_dim

        self.resnets = resnets

        # Add upsampling layer if needed
        if up_flag:
            upsample_mode = "upsample3d" if temperal_upsample else "upsample2d"
            self.upsampler = WanResample(sd, f"{name}.upsampler", out_dim, mode=upsample_mode, upsample_out_dim=out_dim)
        else:
            self.upsampler = None

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False):
        x_copy = x.copy()

        for resnet in self.resnets:
            if feat_cache is not None:
                x = resnet(x, feat_cache=feat_cache, feat_idx=feat_idx)
            else:
                x = resnet(x)

        if self.upsampler is not None:
            if feat_cache is not None:
                x = self.upsampler(x, feat_cache=feat_cache, feat_idx=feat_idx)
            else:
                x = self.upsampler(x)

        if self.avg_shortcut is not None:
            x = x + self.avg_shortcut(x_copy, first_chunk=first_chunk)

        return x


class WanUpBlock(Module):
    def __init__(self, sd, name, in_dim, out_dim, num_res_blocks, dropout=0.0, upsample_mode=None, non_linearity="silu"):
        self.in_dim = in_dim
        self.out_dim = out_dim

        # Create layers list
        resnets = []
        # Add residual blocks and attention if needed
        current_dim = in_dim
        for r in range(num_res_blocks + 1):
            resnets.append(WanResidualBlock(sd, f"{name}.resnets.{r}", current_dim, out_dim, dropout, non_linearity))
            current_dim = out_dim

        self.resnets = resnets

        # Add upsampling layer if needed
        self.upsamplers = None
        if upsample_mode is not None:
            self.upsamplers = [WanResample(sd, f"{name}.upsamplers.0", out_dim, mode=upsample_mode)]

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=None):
        for resnet in self.resnets:
            if feat_cache is not None:
                x = resnet(x, feat_cache=feat_cache, feat_idx=feat_idx)
            else:
                x = resnet(x)

        if self.upsamplers is not None:
            if feat_cache is not None:
                x = self.upsamplers[0](x, feat_cache=feat_cache, feat_idx=feat_idx)
            else:
                x = self.upsamplers[0](x)
        return x


class WanDecoder3d(Module):
    def __init__(
        self,
        sd,
        name,
        dim=128,
        z_dim=4,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_upsample=[False, True, True],
        dropout=0.0,
        non_linearity="silu",
        out_channels=3,
        is_residual=False,
    ):
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_upsample = temperal_upsample

        self.nonlinearity = silu

        # dimensions
        dims = [dim * u for u in [dim_mult[-1]] + dim_mult[::-1]]

        # init block
        self.conv_in = WanCausalConv3d(sd, name + ".conv_in", z_dim, dims[0], 3, padding=1)

        # middle blocks
        self.mid_block = WanMidBlock(sd, name + ".mid_block", dims[0], dropout, non_linearity, num_layers=1)

        # upsample blocks
        self.up_blocks = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            # residual (+attention) blocks
            if i > 0 and not is_residual:
                # wan vae 2.1
                in_dim = in_dim // 2

            # determine if we need upsampling
            up_flag = i != len(dim_mult) - 1
            # determine upsampling mode, if not upsampling, set to None
            upsample_mode = None
            if up_flag and temperal_upsample[i]:
                upsample_mode = "upsample3d"
            elif up_flag:
                upsample_mode = "upsample2d"
            # Create and add the upsampling block
            if is_residual:
                up_block = WanResidualUpBlock(
                    sd,
                    f"{name}.up_blocks.{i}",
                    in_dim=in_dim,
                    out_dim=out_dim,
                    num_res_blocks=num_res_blocks,
                    dropout=dropout,
                    temperal_upsample=temperal_upsample[i] if up_flag else False,
                    up_flag=up_flag,
                    non_linearity=non_linearity,
                )
            else:
                up_block = WanUpBlock(
                    sd,
                    f"{name}.up_blocks.{i}",
                    in_dim=in_dim,
                    out_dim=out_dim,
                    num_res_blocks=num_res_blocks,
                    dropout=dropout,
                    upsample_mode=upsample_mode,
                    non_linearity=non_linearity,
                )
            self.up_blocks.append(up_block)

        # output blocks
        self.norm_out = WanRMS_norm(sd, name + ".norm_out", out_dim, images=False)
        self.conv_out = WanCausalConv3d(sd, name + ".conv_out", out_dim, out_channels, 3, padding=1)

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False):
        ## conv1
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].copy()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                # cache last frame of last two chunk
                cache_x = np.concatenate([feat_cache[idx][:, :, -1, :, :][:, :, None], cache_x], axis=2)
            x = self.conv_in(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv_in(x)

        ## middle
        x = self.mid_block(x, feat_cache=feat_cache, feat_idx=feat_idx)

        ## upsamples
        for up_block in self.up_blocks:
            x = up_block(x, feat_cache=feat_cache, feat_idx=feat_idx, first_chunk=first_chunk)

        ## head
        x = self.norm_out(x)
        x = self.nonlinearity(x)
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].copy()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                # cache last frame of last two chunk
                cache_x = np.concatenate([feat_cache[idx][:, :, -1, :, :][:, :, None], cache_x], axis=2)
            x = self.conv_out(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv_out(x)
        return x


def patchify(x, patch_size):
    if patch_size == 1:
        return x

    if x.ndim != 5:
        raise ValueError(f"Invalid input shape: {x.shape}")
    # x shape: [batch_size, channels, frames, height, width]
    batch_size, channels, frames, height, width = x.shape

    # Ensure height and width are divisible by patch_size
    if height % patch_size != 0 or width % patch_size != 0:
        raise ValueError(f"Height ({height}) and width ({width}) must be divisible by patch_size ({patch_size})")

    # Reshape to [batch_size, channels, frames, height//patch_size, patch_size, width//patch_size, patch_size]
    x = x.reshape(batch_size, channels, frames, height // patch_size, patch_size, width // patch_size, patch_size)

    # Rearrange to [batch_size, channels * patch_size * patch_size, frames, height//patch_size, width//patch_size]
    x = np.ascontiguousarray(x.transpose(0, 1, 6, 4, 2, 3, 5))
    x = x.reshape(batch_size, channels * patch_size * patch_size, frames, height // patch_size, width // patch_size)

    return x


def unpatchify(x, patch_size):
    if patch_size == 1:
        return x

    if x.ndim != 5:
        raise ValueError(f"Invalid input shape: {x.shape}")
    # x shape: [batch_size, (channels * patch_size * patch_size), frame, height, width]
    batch_size, c_patches, frames, height, width = x.shape
    channels = c_patches // (patch_size * patch_size)

    # Reshape to [b, c, patch_size, patch_size, f, h, w]
    x = x.reshape(batch_size, channels, patch_size, patch_size, frames, height, width)

    # Rearrange to [b, c, f, h * patch_size, w * patch_size]
    x = np.ascontiguousarray(x.transpose(0, 1, 4, 5, 3, 6, 2))
    x = x.reshape(batch_size, channels, frames, height * patch_size, width * patch_size)

    return x


class AutoencoderKLWan(Module):
    """AutoencoderKLWan: every parameter is looked up (and its shape checked) as __init__ makes it;
    _encode (untiled) and _decode / tiled_decode run."""

    def __init__(
        self,
        sd,
        base_dim=96,
        decoder_base_dim=None,
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[False, True, True],
        dropout=0.0,
        latents_mean=None,
        latents_std=None,
        is_residual=False,
        in_channels=3,
        out_channels=3,
        patch_size=None,
        scale_factor_temporal=4,
        scale_factor_spatial=8,
    ):
        self.config = argparse.Namespace(patch_size=patch_size, latents_mean=latents_mean, latents_std=latents_std, z_dim=z_dim)
        self.z_dim = z_dim
        self.temperal_downsample = temperal_downsample
        self.temperal_upsample = temperal_downsample[::-1]

        if decoder_base_dim is None:
            decoder_base_dim = base_dim

        WanCausalConv3d.count = 0
        self.encoder = WanEncoder3d(
            sd,
            "encoder",
            in_channels=in_channels,
            dim=base_dim,
            z_dim=z_dim * 2,
            dim_mult=dim_mult,
            num_res_blocks=num_res_blocks,
            attn_scales=attn_scales,
            temperal_downsample=temperal_downsample,
            dropout=dropout,
            is_residual=is_residual,
        )
        encoder_convs = WanCausalConv3d.count
        self.quant_conv = WanCausalConv3d(sd, "quant_conv", z_dim * 2, z_dim * 2, 1)
        self.post_quant_conv = WanCausalConv3d(sd, "post_quant_conv", z_dim, z_dim, 1)

        WanCausalConv3d.count = 0
        self.decoder = WanDecoder3d(
            sd,
            "decoder",
            dim=decoder_base_dim,
            z_dim=z_dim,
            dim_mult=dim_mult,
            num_res_blocks=num_res_blocks,
            attn_scales=attn_scales,
            temperal_upsample=self.temperal_upsample,
            dropout=dropout,
            out_channels=out_channels,
            is_residual=is_residual,
        )

        self.spatial_compression_ratio = scale_factor_spatial

        self.use_slicing = False
        self.use_tiling = False

        # The minimal tile height and width for spatial tiling to be used
        self.tile_sample_min_height = 256
        self.tile_sample_min_width = 256

        # The minimal distance between two spatial tiles
        self.tile_sample_stride_height = 192
        self.tile_sample_stride_width = 192

        # Precompute and cache conv counts for encoder and decoder for clear_cache speedup
        self._cached_conv_counts = {"decoder": WanCausalConv3d.count, "encoder": encoder_convs}

        self.tiles_decoded = 0  # not upstream: how many tiles tiled_decode decoded, for the summary

    def enable_tiling(self, tile_sample_min_height=None, tile_sample_min_width=None, tile_sample_stride_height=None, tile_sample_stride_width=None):
        self.use_tiling = True
        self.tile_sample_min_height = tile_sample_min_height or self.tile_sample_min_height
        self.tile_sample_min_width = tile_sample_min_width or self.tile_sample_min_width
        self.tile_sample_stride_height = tile_sample_stride_height or self.tile_sample_stride_height
        self.tile_sample_stride_width = tile_sample_stride_width or self.tile_sample_stride_width

    def clear_cache(self):
        # Use cached conv counts for decoder and encoder to avoid re-iterating modules each call
        self._conv_num = self._cached_conv_counts["decoder"]
        self._conv_idx = [0]
        self._feat_map = [None] * self._conv_num
        # cache encode
        self._enc_conv_num = self._cached_conv_counts["encoder"]
        self._enc_conv_idx = [0]
        self._enc_feat_map = [None] * self._enc_conv_num

    def _encode(self, x):
        _, _, num_frame, height, width = x.shape

        self.clear_cache()
        if self.config.patch_size is not None:
            x = patchify(x, patch_size=self.config.patch_size)

        assert not self.use_tiling, "tiled_encode is not transcribed"

        iter_ = 1 + (num_frame - 1) // 4
        for i in range(iter_):
            self._enc_conv_idx = [0]
            if i == 0:
                out = self.encoder(x[:, :, :1, :, :], feat_cache=self._enc_feat_map, feat_idx=self._enc_conv_idx)
            else:
                out_ = self.encoder(
                    x[:, :, 1 + 4 * (i - 1) : 1 + 4 * i, :, :],
                    feat_cache=self._enc_feat_map,
                    feat_idx=self._enc_conv_idx,
                )
                out = np.concatenate([out, out_], 2)

        enc = self.quant_conv(out)
        self.clear_cache()
        return enc

    def encode(self, x, return_dict=True):
        """The posterior (DiagonalGaussianDistribution) as its parameters: mean and logvar, chunk(2, dim=1)."""
        h = self._encode(x)
        mean, logvar = np.split(h, 2, axis=1)
        logvar = np.clip(logvar, -30.0, 20.0)
        return mean, logvar

    def _decode(self, z, return_dict=True):
        _, _, num_frame, height, width = z.shape
        tile_latent_min_height = self.tile_sample_min_height // self.spatial_compression_ratio
        tile_latent_min_width = self.tile_sample_min_width // self.spatial_compression_ratio

        if self.use_tiling and (width > tile_latent_min_width or height > tile_latent_min_height):
            return self.tiled_decode(z, return_dict=return_dict)

        self.clear_cache()
        x = self.post_quant_conv(z)
        for i in range(num_frame):
            self._conv_idx = [0]
            if i == 0:
                out = self.decoder(x[:, :, i : i + 1, :, :], feat_cache=self._feat_map, feat_idx=self._conv_idx, first_chunk=True)
            else:
                out_ = self.decoder(x[:, :, i : i + 1, :, :], feat_cache=self._feat_map, feat_idx=self._conv_idx)
                out = np.concatenate([out, out_], 2)

        if self.config.patch_size is not None:
            out = unpatchify(out, patch_size=self.config.patch_size)

        out = np.clip(out, -1.0, 1.0)

        self.clear_cache()
        return (out,)

    def decode(self, z, return_dict=True):
        return self._decode(z)[0]

    def blend_v(self, a, b, blend_extent):
        blend_extent = min(a.shape[-2], b.shape[-2], blend_extent)
        for y in range(blend_extent):
            b[:, :, :, y, :] = a[:, :, :, -blend_extent + y, :] * (1 - y / blend_extent) + b[:, :, :, y, :] * (y / blend_extent)
        return b

    def blend_h(self, a, b, blend_extent):
        blend_extent = min(a.shape[-1], b.shape[-1], blend_extent)
        for x in range(blend_extent):
            b[:, :, :, :, x] = a[:, :, :, :, -blend_extent + x] * (1 - x / blend_extent) + b[:, :, :, :, x] * (x / blend_extent)
        return b

    def tiled_decode(self, z, return_dict=True):
        _, _, num_frames, height, width = z.shape
        sample_height = height * self.spatial_compression_ratio
        sample_width = width * self.spatial_compression_ratio

        tile_latent_min_height = self.tile_sample_min_height // self.spatial_compression_ratio
        tile_latent_min_width = self.tile_sample_min_width // self.spatial_compression_ratio
        tile_latent_stride_height = self.tile_sample_stride_height // self.spatial_compression_ratio
        tile_latent_stride_width = self.tile_sample_stride_width // self.spatial_compression_ratio
        tile_sample_stride_height = self.tile_sample_stride_height
        tile_sample_stride_width = self.tile_sample_stride_width
        if self.config.patch_size is not None:
            sample_height = sample_height // self.config.patch_size
            sample_width = sample_width // self.config.patch_size
            tile_sample_stride_height = tile_sample_stride_height // self.config.patch_size
            tile_sample_stride_width = tile_sample_stride_width // self.config.patch_size
            blend_height = self.tile_sample_min_height // self.config.patch_size - tile_sample_stride_height
            blend_width = self.tile_sample_min_width // self.config.patch_size - tile_sample_stride_width
        else:
            blend_height = self.tile_sample_min_height - tile_sample_stride_height
            blend_width = self.tile_sample_min_width - tile_sample_stride_width

        # Split z into overlapping tiles and decode them separately.
        # The tiles have an overlap to avoid seams between tiles.
        rows = []
        for i in range(0, height, tile_latent_stride_height):
            row = []
            for j in range(0, width, tile_latent_stride_width):
                self.clear_cache()
                time = []
                for k in range(num_frames):
                    self._conv_idx = [0]
                    tile = z[:, :, k : k + 1, i : i + tile_latent_min_height, j : j + tile_latent_min_width]
                    tile = self.post_quant_conv(tile)
                    decoded = self.decoder(tile, feat_cache=self._feat_map, feat_idx=self._conv_idx, first_chunk=(k == 0))
                    time.append(decoded)
                row.append(np.concatenate(time, axis=2))
                self.tiles_decoded += 1
            rows.append(row)
        self.clear_cache()

        result_rows = []
        for i, row in enumerate(rows):
            result_row = []
            for j, tile in enumerate(row):
                # blend the above tile and the left tile
                # to the current tile and add the current tile to the result row
                if i > 0:
                    tile = self.blend_v(rows[i - 1][j], tile, blend_height)
                if j > 0:
                    tile = self.blend_h(row[j - 1], tile, blend_width)
                result_row.append(tile[:, :, :, :tile_sample_stride_height, :tile_sample_stride_width])
            result_rows.append(np.concatenate(result_row, axis=-1))
        dec = np.concatenate(result_rows, axis=3)[:, :, :, :sample_height, :sample_width]

        if self.config.patch_size is not None:
            dec = unpatchify(dec, patch_size=self.config.patch_size)

        dec = np.clip(dec, -1.0, 1.0)

        return (dec,)


# ---------------------------------------------------------------------------------------------
# Files


class StateDict(dict):
    """A state dict that remembers which tensors the modules took (load_state_dict's strictness)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.taken = set()

    def __getitem__(self, name):
        self.taken.add(name)
        return super().__getitem__(name)


def read_safetensors(path):
    """A safetensors file: u64 little-endian header length, JSON header, raw little-endian data."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {entry['dtype']}; this reader takes F32 only")
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        assert end - begin == 4 * int(np.prod(shape, dtype=np.int64)), name
        tensors[name] = np.frombuffer(data[begin:end], dtype="<f4").astype(FLOAT).reshape(shape)
    return tensors


def unnormalise_latents(latents, vae):
    """pipeline_wan.py, before vae.decode: latents / (1 / std) + mean, in float32 per channel."""
    latents_mean = np.asarray(vae.config.latents_mean, dtype=FLOAT).reshape(1, vae.config.z_dim, 1, 1, 1)
    latents_std = FLOAT(1.0) / np.asarray(vae.config.latents_std, dtype=FLOAT).reshape(1, vae.config.z_dim, 1, 1, 1)
    return (latents / latents_std + latents_mean).astype(FLOAT, copy=False)


def normalise_latents(latents, vae):
    """pipeline_wan_i2v.py's prepare_latents, after vae.encode: (mode() - mean) * (1 / std), per channel."""
    latents_mean = np.asarray(vae.config.latents_mean, dtype=FLOAT).reshape(1, vae.config.z_dim, 1, 1, 1)
    latents_std = FLOAT(1.0) / np.asarray(vae.config.latents_std, dtype=FLOAT).reshape(1, vae.config.z_dim, 1, 1, 1)
    return ((latents - latents_mean) * latents_std).astype(FLOAT, copy=False)


def main():
    global FLOAT
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vae", required=True, help="folder with config.json and diffusion_pytorch_model.safetensors")
    p.add_argument("--latent", help="decode: raw float32 [C, T, h, w]")
    p.add_argument("--video", help="encode: raw float32 [3, F, H, W]")
    p.add_argument("--shape", required=True, help="C,T,h,w or 3,F,H,W")
    p.add_argument("--out", required=True, help="decode: video [3, F, H, W]; encode: latent [z_dim, T, h, w]")
    p.add_argument("--tile", type=int, help="tile_sample_min_height/width in pixels (enables tiling)")
    p.add_argument("--stride", type=int, help="tile_sample_stride_height/width in pixels")
    p.add_argument("--float64", action="store_true", help="compute in float64 and write float64 (else float32)")
    args = p.parse_args()
    if (args.latent is None) == (args.video is None):
        p.error("give --latent (decode) or --video (encode)")
    if args.float64:
        FLOAT = np.float64

    with open(os.path.join(args.vae, "config.json")) as f:
        config = json.load(f)
    sd = StateDict(read_safetensors(os.path.join(args.vae, "diffusion_pytorch_model.safetensors")))
    # ConfigMixin passes __init__ its own arguments only (Wan2.2's clip_output is not one: ignored)
    accepted = inspect.signature(AutoencoderKLWan.__init__).parameters
    kwargs = {k: v for k, v in config.items() if k in accepted and k != "sd"}
    vae = AutoencoderKLWan(sd, **kwargs)
    unexpected = sorted(set(sd) - sd.taken)
    if unexpected:  # load_state_dict(strict=True) refuses these; missing ones already raised in _param
        raise KeyError(f"unexpected tensors in the file: {unexpected}")
    if args.tile:
        vae.enable_tiling(args.tile, args.tile, args.stride, args.stride)

    shape = tuple(int(s) for s in args.shape.split(","))
    if args.latent:
        latents = np.fromfile(args.latent, dtype="<f4").astype(FLOAT).reshape((1,) + shape)
        latents = unnormalise_latents(latents, vae)
        out = vae.decode(latents)[0]  # [3, F, H, W]
    else:
        video = np.fromfile(args.video, dtype="<f4").astype(FLOAT).reshape((1,) + shape)
        mean, _ = vae.encode(video)  # retrieve_latents(..., sample_mode="argmax"): the posterior's mode, its mean
        out = normalise_latents(mean, vae)[0]  # [z_dim, T, h, w]
    np.ascontiguousarray(out, dtype="<f8" if args.float64 else "<f4").tofile(args.out)
    json.dump({"shape": list(out.shape), "tiles": vae.tiles_decoded, "tensors": len(sd)}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
