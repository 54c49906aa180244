# What diffusers' WanImageToVideoPipeline makes of an image before its VAE, in numpy, written from
# the upstream sources and not from core/model/image-condition.ts (PIL itself is not installed here):
#
#   - diffusers' load_image: image.convert("RGB"), which drops alpha;
#   - VaeImageProcessor.preprocess(image, height, width) with the pipeline's VideoProcessor defaults:
#     resize(image, height, width, resize_mode="default") = image.resize((width, height),
#     resample=PIL.Image.LANCZOS, reducing_gap=None); pil_to_numpy (float32 bytes / 255);
#     numpy_to_pt ([1, 3, H, W]); normalize (2x - 1); the pipeline's unsqueeze(2) → [1, 3, 1, H, W];
#   - PIL's resize of an 8-bit RGB image, Pillow's src/libImaging/Resample.c: precompute_coeffs
#     (lanczos_filter, support 3 × max(scale, 1)), normalize_coeffs_8bpc (22-bit fixed point,
#     rounded away from zero), the horizontal pass then the vertical one (ImagingResampleInner, each
#     only where its side changes), each rounding (+2^21) and clamping (clip8) to a byte. Here each
#     pass is one integer matrix product over a whole axis, where Resample.c loops per pixel.
#
#   python3 image_condition_numpy.py --image FILE --size W,H --height H --width W --out FILE [--resized FILE]
#
# --image: raw RGBA bytes, row by row. --out: float32 [3, 1, H, W]; --resized: the resized RGB bytes.

import argparse
import math

import numpy as np

PRECISION_BITS = 32 - 8 - 2


def sinc_filter(x):
    if x == 0.0:
        return 1.0
    x = x * math.pi
    return math.sin(x) / x


def lanczos_filter(x):
    # truncated sinc
    if -3.0 <= x < 3.0:
        return sinc_filter(x) * sinc_filter(x / 3)
    return 0.0


def c_int(x):
    """C's (int) cast: toward zero"""
    return int(x)


def coefficient_matrix(in_size, out_size):
    """precompute_coeffs + normalize_coeffs_8bpc as a dense [out_size, in_size] int64 matrix"""
    scale = filterscale = float(in_size) / out_size
    if filterscale < 1.0:
        filterscale = 1.0
    support = 3.0 * filterscale
    inv_filterscale = 1.0 / filterscale
    m = np.zeros((out_size, in_size), dtype=np.int64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = c_int(center - support + 0.5)
        if xmin < 0:
            xmin = 0
        xmax = c_int(center + support + 0.5)
        if xmax > in_size:
            xmax = in_size
        xmax -= xmin
        k = [lanczos_filter((x + xmin - center + 0.5) * inv_filterscale) for x in range(xmax)]
        ww = sum(k)  # summed in order, as the C loop does
        if ww != 0.0:
            k = [w / ww for w in k]
        for x, w in enumerate(k):
            m[xx, xmin + x] = c_int(-0.5 + w * (1 << PRECISION_BITS)) if w < 0 else c_int(0.5 + w * (1 << PRECISION_BITS))
    return m


def clip8(sums):
    return np.clip(sums >> PRECISION_BITS, 0, 255).astype(np.uint8)


def pil_resize_lanczos(rgb, width, height):
    """rgb: uint8 [H0, W0, 3] → uint8 [height, width, 3]"""
    h0, w0, _ = rgb.shape
    # Image.resize: `if self.size[1] > self.size[0] * 100 and size[1] < self.size[1]`, two core
    # resizes, the height first; else one, ImagingResampleInner's horizontal pass first
    if h0 > w0 * 100 and height < h0:
        return resample_horizontal(resample_vertical(rgb, height), width)
    return resample_vertical(resample_horizontal(rgb, width), height)


def resample_horizontal(rgb, width):
    if width == rgb.shape[1]:
        return rgb
    m = coefficient_matrix(rgb.shape[1], width)  # [width, W0]
    return clip8(np.einsum("ow,hwc->hoc", m, rgb.astype(np.int64)) + (1 << (PRECISION_BITS - 1)))


def resample_vertical(rgb, height):
    if height == rgb.shape[0]:
        return rgb
    m = coefficient_matrix(rgb.shape[0], height)  # [height, H0]
    return clip8(np.einsum("oh,hwc->owc", m, rgb.astype(np.int64)) + (1 << (PRECISION_BITS - 1)))


def preprocess(rgba, height, width):
    """RGBA uint8 [H0, W0, 4] → the pipeline's video_condition [1, 3, 1, height, width] float32, and the resized bytes"""
    rgb = rgba[..., :3]  # load_image's convert("RGB")
    resized = pil_resize_lanczos(rgb, width, height)
    images = np.stack([resized.astype(np.float32) / np.float32(255.0)], axis=0)  # pil_to_numpy
    images = images.transpose(0, 3, 1, 2)  # numpy_to_pt
    images = np.float32(2.0) * images - np.float32(1.0)  # normalize
    return images[:, :, None], resized  # prepare_latents: image.unsqueeze(2)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--image", required=True)
    p.add_argument("--size", required=True, help="W,H of the image")
    p.add_argument("--height", type=int, required=True)
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resized")
    args = p.parse_args()
    w0, h0 = (int(s) for s in args.size.split(","))
    rgba = np.fromfile(args.image, dtype=np.uint8).reshape(h0, w0, 4)
    video, resized = preprocess(rgba, args.height, args.width)
    np.ascontiguousarray(video[0], dtype="<f4").tofile(args.out)
    if args.resized:
        np.ascontiguousarray(resized).tofile(args.resized)


if __name__ == "__main__":
    main()
