"""Tensor operators of the degradation models, run on batches on any device (the model's or the loader's CPU).

Blur with per-sample kernels (:func:`filter2d`), unsharp masking (:class:`USMSharp`), Gaussian and Poisson noise,
resize and rounding to 8-bit levels; JPEG is :mod:`anysr.ops.diffjpeg`. The numbers are BasicSR 1.4.2's
(``basicsr/utils/img_process_util.py``, ``basicsr/data/degradations.py``, ``RealESRGANModel.feed_data``); the
code is device-agnostic: any device and float dtype of the input, no ``.item()``, no host synchronisation,
autocast switched off where a degradation must be computed exactly. What they are called with (the random
draws) is decided in :mod:`anysr.data.degradation`.

Randomness is always explicit: random fields come from a ``torch.Generator`` passed in (or are passed in as
tensors). Put it on the images' device: then nothing leaves the device. A generator on another device (a CPU one
for a backend without device generators) works too, at the cost of an upload of each drawn field; Poisson noise
then also needs its rates on the generator's device, a download that waits for the device.

Two forms of the noise: :func:`gaussian_noise` / :func:`poisson_noise` draw a batch's fields from one generator
(BasicSR's functions, with one gray Gaussian field per *sample* where BasicSR draws one per *batch*: pass
``gray_field`` of shape (1, 1, H, W) to get BasicSR's behaviour); :func:`gaussian_noise_per_sample` /
:func:`poisson_noise_per_sample` draw each sample's fields from its own generator (what Real-ESRGAN's synthesis
uses, so that a sample's noise depends on its seed only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anysr.errors import DataError, OptionError
from anysr.ops.autocast import autocast_off

__all__ = [
    "RESIZE_MODES", "filter2d", "gaussian_kernel1d", "USMSharp", "gaussian_noise", "poisson_noise",
    "gaussian_noise_per_sample", "poisson_noise_per_sample", "add_noise", "resize", "clamp_round",
    "TRAINNER_RESIZE_MODES", "resize_filtered", "lanczos_resize", "thick_lines",
]

RESIZE_MODES = ("area", "bilinear", "bicubic")
# The filters traiNNer-redux's resize_mode_list* choose from (antialiased bilinear / bicubic, see resize_filtered).
TRAINNER_RESIZE_MODES = ("bilinear", "bicubic", "nearest-exact", "lanczos", "area")
_LANCZOS_LOBES = 3
_GRAY = (0.2989, 0.587, 0.114)  # the luma weights BasicSR's Poisson gray noise gets from torchvision


# ------------------------------------------------------------------------------------------------ filtering
def filter2d(x: Tensor, kernel: Tensor) -> Tensor:
    """Filter each image of a (B, C, H, W) batch with its own odd (k, k) kernel (correlation, as cv2.filter2D).

    ``kernel`` is (B, k, k) (one per sample) or (k, k) / (1, k, k) (one for all). Borders are reflected
    (``reflect``, no edge repeat) by ``k // 2``, so H and W must exceed ``k // 2``. Output: same shape.
    """
    if x.dim() != 4:
        raise DataError(f"filter2d: expected a (B, C, H, W) batch, got shape {tuple(x.shape)}")
    b, c, h, w = x.shape
    if kernel.dim() == 2:
        kernel = kernel.unsqueeze(0)
    if kernel.dim() != 3 or kernel.shape[-1] != kernel.shape[-2] or kernel.shape[-1] % 2 == 0:
        raise DataError(f"filter2d: kernel must be (k, k) or (B, k, k) with k odd, got {tuple(kernel.shape)}")
    if kernel.shape[0] not in (1, b):
        raise DataError(f"filter2d: {kernel.shape[0]} kernels for a batch of {b}")
    k = kernel.shape[-1]
    if min(h, w) <= k // 2:
        raise DataError(f"filter2d: a {k}x{k} kernel needs images larger than {k // 2} pixels, got {h}x{w}")
    kernel = kernel.to(device=x.device, dtype=x.dtype)
    # Gaussian tails hold subnormal float32 taps (exp(-90) ~ 1e-39), which slow CPU arithmetic ~50x; they are
    # worth less than 1e-38 of the output, so flush them.
    kernel = torch.where(kernel.abs() < torch.finfo(kernel.dtype).tiny, torch.zeros_like(kernel), kernel)
    # One depthwise convolution over the B*C planes (each plane its sample's kernel): on the CPU this path is
    # several times faster than a batch of single-channel convolutions, even for a shared kernel.
    weight = kernel.reshape(-1, 1, 1, k, k).expand(b, c, 1, k, k)
    with autocast_off(x):
        padded = F.pad(x, (k // 2,) * 4, mode="reflect")
        out = F.conv2d(padded.reshape(1, b * c, *padded.shape[-2:]), weight.reshape(b * c, 1, k, k), groups=b * c)
    return out.reshape(b, c, h, w)


def gaussian_kernel1d(ksize: int, sigma: float = 0.0) -> np.ndarray:
    """OpenCV's ``getGaussianKernel(ksize, sigma)`` as a float64 (ksize,) array, without OpenCV.

    ``sigma <= 0`` means ``0.3 * ((ksize - 1) / 2 - 1) + 0.8``, except that sizes 1, 3, 5, 7 and 9 then get
    OpenCV's fixed binomial-like taps.
    """
    if isinstance(ksize, bool) or int(ksize) != ksize or ksize < 1 or ksize % 2 == 0:
        raise OptionError(f"gaussian_kernel1d: ksize must be a positive odd integer, got {ksize!r}")
    fixed = {1: [1.0], 3: [0.25, 0.5, 0.25], 5: [0.0625, 0.25, 0.375, 0.25, 0.0625],
             7: [0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125],
             9: [v / 256 for v in (4, 13, 30, 51, 60, 51, 30, 13, 4)]}
    if sigma <= 0 and ksize in fixed:
        return np.array(fixed[ksize], dtype=np.float64)
    s = sigma if sigma > 0 else 0.3 * ((ksize - 1) * 0.5 - 1) + 0.8
    t = np.arange(ksize, dtype=np.float64) - (ksize - 1) / 2
    g = np.exp(-(t * t) / (2 * s * s))
    return g / g.sum()


class USMSharp(nn.Module):
    """Unsharp masking as BasicSR's ``USMSharp``: ``radius`` (made odd) and ``sigma`` define a Gaussian blur.

    ``forward(img, weight, threshold)``: residual ``r = img - blur(img)``; a mask where ``|r| * 255 >
    threshold``, blurred into a soft mask ``m``; output ``m * clip(img + weight * r, 0, 1) + (1 - m) * img``.
    The blur is applied as two 1-D passes (the kernel is separable; BasicSR's 2-D pass costs ``k`` times
    more and differs only by float rounding). ``kernel`` holds BasicSR's (1, k, k) float32 2-D kernel.
    """

    def __init__(self, radius: int = 50, sigma: float = 0) -> None:
        super().__init__()
        if isinstance(radius, bool) or int(radius) != radius or radius < 1:
            raise OptionError(f"USMSharp: radius must be a positive integer, got {radius!r}")
        radius = int(radius) + (1 - int(radius) % 2)
        self.radius = radius
        g = gaussian_kernel1d(radius, sigma)
        self.register_buffer("kernel", torch.from_numpy(np.outer(g, g)).float().unsqueeze(0))
        self.register_buffer("kernel1d", torch.from_numpy(g).float(), persistent=False)

    def blur(self, x: Tensor) -> Tensor:
        """The Gaussian blur with reflected borders (same shape out)."""
        b, c, h, w = x.shape
        k = self.radius
        if min(h, w) <= k // 2:
            raise DataError(f"USMSharp: a radius of {k} needs images larger than {k // 2} pixels, got {h}x{w}")
        g = self.kernel1d.to(device=x.device, dtype=x.dtype).reshape(1, 1, k).expand(b * c, 1, k)
        with autocast_off(x):
            padded = F.pad(x.reshape(1, b * c, h, w), (k // 2,) * 4, mode="reflect")
            out = F.conv2d(padded, g.reshape(b * c, 1, k, 1), groups=b * c)  # depthwise: fastest on the CPU
            out = F.conv2d(out, g.reshape(b * c, 1, 1, k), groups=b * c)
        return out.reshape(b, c, h, w)

    def forward(self, img: Tensor, weight: float = 0.5, threshold: float = 10) -> Tensor:
        residual = img - self.blur(img)
        mask = (residual.abs() * 255 > threshold).to(img.dtype)
        soft = self.blur(mask)
        sharp = (img + weight * residual).clamp(0, 1)
        return soft * sharp + (1 - soft) * img


# ---------------------------------------------------------------------------------------------------- noise
def _per_sample(v: float | Tensor, x: Tensor) -> float | Tensor:
    """A number, or B values reshaped to (B, 1, 1, 1) on ``x``'s device."""
    if isinstance(v, Tensor):
        if v.numel() not in (1, x.shape[0]):
            raise DataError(f"noise: {v.numel()} per-sample values for a batch of {x.shape[0]}")
        return v.to(device=x.device, dtype=x.dtype).reshape(-1, 1, 1, 1)
    return float(v)


def _gray_mask(gray: bool | float | Tensor | None, x: Tensor) -> Tensor | None:
    """None when no sample is gray (a Python value), else a (B, 1, 1, 1) bool tensor."""
    if gray is None or (not isinstance(gray, Tensor) and not gray):
        return None
    if not isinstance(gray, Tensor):
        return torch.ones(x.shape[0], 1, 1, 1, dtype=torch.bool, device=x.device)
    if gray.numel() not in (1, x.shape[0]):
        raise DataError(f"noise: {gray.numel()} gray flags for a batch of {x.shape[0]}")
    return (gray.to(x.device).reshape(-1, 1, 1, 1) != 0).expand(x.shape[0], 1, 1, 1)


def _randn(shape: Sequence[int], generator: torch.Generator | None, x: Tensor, what: str) -> Tensor:
    if generator is None:
        raise OptionError(f"{what}: give a torch.Generator (randomness is explicit) or pass the random field")
    field = torch.randn(tuple(shape), generator=generator, device=generator.device, dtype=x.dtype)
    return field.to(x.device)


def gaussian_noise(x: Tensor, sigma: float | Tensor, gray: bool | float | Tensor | None = None, *,
                   generator: torch.Generator | None = None, color_field: Tensor | None = None,
                   gray_field: Tensor | None = None) -> Tensor:
    """Gaussian noise for a (B, C, H, W) batch: ``field * sigma / 255`` (sigma per sample, 0-255 scale).

    Samples flagged ``gray`` get one field for all channels, the others one per channel. The standard
    normal fields are ``color_field`` (B, C, H, W) and ``gray_field`` (B or 1, 1, H, W) if given, else drawn
    from ``generator`` (the gray one first, and only when ``gray`` is not a false Python value).
    """
    b, c, h, w = x.shape
    s = _per_sample(sigma, x)
    mask = _gray_mask(gray, x)
    if mask is not None and gray_field is None:
        gray_field = _randn((b, 1, h, w), generator, x, "gaussian_noise")
    if color_field is None:
        color_field = _randn((b, c, h, w), generator, x, "gaussian_noise")
    noise = color_field.to(x) * s / 255.0
    if mask is None:
        return noise
    return torch.where(mask, gray_field.to(x) * s / 255.0, noise)


def _levels(q: Tensor) -> Tensor:
    """Per sample, the smallest power of two >= the number of distinct uint8 levels in ``q`` (B, ...)."""
    b = q.shape[0]
    idx = q.reshape(b, -1).long()
    hist = torch.zeros(b, 256, dtype=torch.int32, device=q.device)
    hist.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.int32))
    n = (hist > 0).sum(1)
    powers = torch.tensor([2**j for j in range(8)], device=q.device)
    return torch.exp2((n[:, None] > powers).sum(1).to(torch.float32))


def _poisson_part(levels255: Tensor, generator: torch.Generator | None) -> Tensor:
    """Poisson noise of an image quantised to ``levels255`` (integers 0..255), in float32."""
    if generator is None:
        raise OptionError("poisson_noise: give a torch.Generator (randomness is explicit)")
    img = levels255 / 255.0
    vals = _levels(levels255).reshape(-1, *([1] * (img.dim() - 1)))
    rate = (img * vals).to(generator.device)
    return (torch.poisson(rate, generator=generator).to(img.device) / vals) - img


def poisson_noise(x: Tensor, scale: float | Tensor, gray: bool | float | Tensor | None = None, *,
                  generator: torch.Generator | None) -> Tensor:
    """Poisson (shot) noise for an RGB batch in [0, 1], as BasicSR's ``generate_poisson_noise_pt``.

    The image is rounded to 256 levels; with ``v`` the number of distinct levels of a sample rounded up to a
    power of two, the noise is ``Poisson(img * v) / v - img``, times ``scale`` (per sample). Gray samples use
    the luma (0.2989 R + 0.587 G + 0.114 B) for all channels; its draw comes first, and only when ``gray`` is
    not a false Python value (so with one gray sample the stream is BasicSR's). Computed in float32.
    """
    b, c, h, w = x.shape
    mask = _gray_mask(gray, x)
    xf = x.float()
    with autocast_off(x):
        noise_gray = None
        if mask is not None:
            if c != 3:
                raise DataError(f"poisson_noise: gray noise needs RGB images, got {c} channels")
            r, g, bl = xf.unbind(1)
            luma = (_GRAY[0] * r + _GRAY[1] * g + _GRAY[2] * bl).unsqueeze(1)
            noise_gray = _poisson_part(torch.clamp((luma * 255.0).round(), 0, 255), generator)
        noise = _poisson_part(torch.clamp((xf * 255.0).round(), 0, 255), generator)
        if noise_gray is not None:
            noise = torch.where(mask, noise_gray.expand(b, c, h, w), noise)
        return (noise * _per_sample(scale, noise)).to(x.dtype)


def add_noise(x: Tensor, noise: Tensor, clip: bool = True, rounds: bool = False) -> Tensor:
    """``x + noise``, then clamped to [0, 1] (``clip``) and/or rounded to 1/255 steps (``rounds``)."""
    out = x + noise
    if rounds:
        out = (out * 255.0).round()
        return (out.clamp(0, 255) if clip else out) / 255.0
    return out.clamp(0, 1) if clip else out


def gaussian_noise_per_sample(x: Tensor, sigma: Sequence[float], gray: Sequence[bool],
                              gens: Sequence[torch.Generator]) -> Tensor:
    """Gaussian noise for a (B, C, H, W) batch: per sample ``j``, one standard normal field from ``gens[j]`` (one
    plane for gray samples, float32 on the generator's device) times ``sigma[j] / 255``."""
    b, c, h, w = x.shape
    fields = []
    for j in range(b):
        g = gens[j]
        f = torch.randn((1 if gray[j] else c, h, w), generator=g, device=g.device, dtype=torch.float32)
        fields.append(f.to(x.device).expand(c, h, w))
    scale = torch.tensor([s / 255.0 for s in sigma], dtype=torch.float32).reshape(b, 1, 1, 1).to(x.device)
    return torch.stack(fields).to(x.dtype) * scale.to(x.dtype)


def poisson_noise_per_sample(x: Tensor, scale: Sequence[float], gray: Sequence[bool],
                             gens: Sequence[torch.Generator]) -> Tensor:
    """:func:`poisson_noise` of each sample of a (B, C, H, W) RGB batch alone, its draws from ``gens[j]``.

    Per sample: the image (its luma for gray samples) rounded to 8 bits, ``v`` its distinct levels rounded up to a
    power of two, ``Poisson(img * v) / v - img``, times the sample's scale. Computed in float32.
    """
    b, c, h, w = x.shape
    out = []
    for j in range(b):
        img = x[j].float()
        if gray[j]:
            if c != 3:
                raise DataError(f"gray Poisson noise needs RGB images, got {c} channels")
            img = (_GRAY[0] * img[0] + _GRAY[1] * img[1] + _GRAY[2] * img[2]).unsqueeze(0)
        q = torch.clamp((img * 255.0).round(), 0, 255)
        noise = _poisson_part(q.unsqueeze(0), gens[j])[0].to(x.device)
        out.append((noise * scale[j]).expand(c, h, w))
    return torch.stack(out).to(x.dtype)


# ---------------------------------------------------------------------------------------- resize and round
def resize(x: Tensor, mode: str, *, scale_factor: float | None = None,
           size: tuple[int, int] | None = None) -> Tensor:
    """``F.interpolate`` as BasicSR calls it: ``mode`` in area / bilinear / bicubic, no antialiasing, no
    align_corners; either ``scale_factor`` (output ``floor(h * s)``) or ``size``. Bicubic may overshoot [0, 1]."""
    if mode not in RESIZE_MODES:
        raise OptionError(f"resize: mode must be one of {', '.join(RESIZE_MODES)}, got {mode!r}")
    if (scale_factor is None) == (size is None):
        raise OptionError("resize: give exactly one of scale_factor and size")
    if size is not None and min(size) < 1:
        raise DataError(f"resize: output size {tuple(size)} is empty (the input is {tuple(x.shape[-2:])})")
    with autocast_off(x):
        return F.interpolate(x, size=size, scale_factor=scale_factor, mode=mode)


def lanczos_resize(x: Tensor, size: tuple[int, int], lobes: int = _LANCZOS_LOBES) -> Tensor:
    """Lanczos-``lobes`` resampling to ``size``, clamped to [0, 1].

    Every axis that shrinks (ratio ``r = out / in < 1``) is first low-passed with the Lanczos window stretched to
    the output grid: taps at integer offsets ``t`` with ``|t r| < lobes``, weights ``sinc(t r) sinc(t r / lobes)``
    normalised to sum 1, reflected borders; bicubic interpolation then samples the filtered image at ``size``.
    Growing axes are interpolated directly. The taps are built on ``x``'s device.
    """
    b, c, h, w = x.shape
    out = x.reshape(b * c, 1, h, w)
    with autocast_off(x):
        for axis, (n_in, n_out) in enumerate(((h, size[0]), (w, size[1]))):
            if n_out >= n_in:
                continue
            ratio = n_out / n_in
            reach = math.ceil(lobes / ratio) - 1
            t = torch.arange(-reach, reach + 1, device=x.device, dtype=x.dtype) * ratio
            taps = torch.sinc(t) * torch.sinc(t / lobes)
            taps = taps / taps.sum()
            if axis == 0:
                out = F.conv2d(F.pad(out, (0, 0, reach, reach), mode="reflect"), taps.reshape(1, 1, -1, 1))
            else:
                out = F.conv2d(F.pad(out, (reach, reach, 0, 0), mode="reflect"), taps.reshape(1, 1, 1, -1))
        out = F.interpolate(out, size=size, mode="bicubic", align_corners=False)
    return out.reshape(b, c, *size).clamp(0, 1)


def resize_filtered(x: Tensor, mode: str, *, scale_factor: float | None = None,
                    size: tuple[int, int] | None = None) -> Tensor:
    """traiNNer-redux's resize: ``mode`` in :data:`TRAINNER_RESIZE_MODES`; bilinear and bicubic antialiased (they
    low-pass when shrinking), ``lanczos`` by :func:`lanczos_resize`, ``area`` and ``nearest-exact`` as
    ``F.interpolate`` does them; the result clamped to [0, 1]. ``scale_factor`` gives ``round(h * s)`` pixels."""
    if mode not in TRAINNER_RESIZE_MODES:
        raise OptionError(f"resize_filtered: mode must be one of {', '.join(TRAINNER_RESIZE_MODES)}, got {mode!r}")
    if (scale_factor is None) == (size is None):
        raise OptionError("resize_filtered: give exactly one of scale_factor and size")
    if size is None:
        assert scale_factor is not None
        size = (round(x.shape[-2] * scale_factor), round(x.shape[-1] * scale_factor))
    size = (int(size[0]), int(size[1]))
    if min(size) < 1:
        raise DataError(f"resize: output size {tuple(size)} is empty (the input is {tuple(x.shape[-2:])})")
    if mode == "lanczos":
        return lanczos_resize(x, size)
    with autocast_off(x):
        return F.interpolate(x, size=size, mode=mode, antialias=mode in ("bilinear", "bicubic")).clamp(0, 1)


def thick_lines(x: Tensor) -> Tensor:
    """traiNNer-redux's ThickLines filter: ``3/4 x + 1/4 min3x3(x)``, the 3x3 minimum (erosion) taken per channel
    with the border ignored. Dark strokes (line art) grow by about a pixel and bright areas stay."""
    low = -F.max_pool2d(-x, 3, stride=1, padding=1)
    return x * 0.75 + low * 0.25


def clamp_round(x: Tensor) -> Tensor:
    """Round to the nearest of the 256 levels ``k / 255`` and clamp to [0, 1] (what an 8-bit image can hold)."""
    return torch.clamp((x * 255.0).round(), 0, 255) / 255.0

