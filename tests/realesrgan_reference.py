"""The reference of Real-ESRGAN's second-order degradation for tests and benchmarks (not part of the package).

BasicSR's ``RealESRGANModel.feed_data`` step for step with a batch's choices drawn from one host
``numpy.random.Generator`` and its per-sample values and noise fields from one ``torch.Generator``:
``tests/test_degradations.py`` checks it against BasicSR's recorded draws, ``tests/test_realesrgan.py`` checks the
package's synthesis (:func:`anysr.data.degradation.realesrgan.degrade`) against it, and
``benchmarks/bench_degradations.py`` times it. BasicSR's ``random_add_*_noise`` are here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from anysr.data.degradation.draws import categorical
from anysr.data.degradation.realesrgan import DegradeStage
from anysr.errors import OptionError
from anysr.ops.autocast import autocast_off
from anysr.ops.degradation import (
    RESIZE_MODES,
    add_noise,
    clamp_round,
    filter2d,
    gaussian_noise,
    poisson_noise,
    resize,
)
from anysr.ops.diffjpeg import DiffJPEG

__all__ = [
    "StageDraw", "SecondOrderDraw", "random_add_gaussian_noise", "random_add_poisson_noise", "draw_second_order",
    "apply_second_order", "second_order_degrade",
]


def _rand(n: int, generator: torch.Generator, x: Tensor) -> Tensor:
    """``n`` uniforms in [0, 1) from ``generator``, float32 (float64 for float64 ``x``), on ``x``'s device."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.rand(n, generator=generator, device=generator.device, dtype=dtype).to(x.device)



def _uniform(n: int, lo_hi: Sequence[float], generator: torch.Generator, x: Tensor) -> Tensor:
    lo, hi = lo_hi
    return _rand(n, generator, x) * (hi - lo) + lo


def random_add_gaussian_noise(x: Tensor, sigma_range: Sequence[float], gray_prob: float,
                              generator: torch.Generator, clip: bool = True, rounds: bool = False) -> Tensor:
    """Gaussian noise with sigma uniform in ``sigma_range`` and gray with probability ``gray_prob``, per sample."""
    b = x.shape[0]
    sigma = _uniform(b, sigma_range, generator, x)
    gray = _rand(b, generator, x) < gray_prob
    return add_noise(x, gaussian_noise(x, sigma, gray, generator=generator), clip, rounds)


def random_add_poisson_noise(x: Tensor, scale_range: Sequence[float], gray_prob: float,
                             generator: torch.Generator, clip: bool = True, rounds: bool = False) -> Tensor:
    """Poisson noise with scale uniform in ``scale_range`` and gray with probability ``gray_prob``, per sample."""
    b = x.shape[0]
    scale = _uniform(b, scale_range, generator, x)
    gray = _rand(b, generator, x) < gray_prob
    return add_noise(x, poisson_noise(x, scale, gray, generator=generator), clip, rounds)


@dataclass(frozen=True)
class StageDraw:
    """What one stage drew: host choices (``updown`` in up/down/keep, ``resize_scale``, ``resize_mode``,
    ``gaussian`` or Poisson) and per-sample (B,) tensors: ``noise_level`` (sigma or Poisson scale), ``gray``
    (bool) and ``jpeg_quality``."""

    updown: str
    resize_scale: float
    resize_mode: str
    gaussian: bool
    noise_level: Tensor
    gray: Tensor
    jpeg_quality: Tensor


@dataclass(frozen=True)
class SecondOrderDraw:
    """All random choices of one batch: two stages, whether the second blur runs, the final order
    (``sinc_first``: resize back + sinc filter before the last JPEG) and the final resize mode."""

    first: StageDraw
    second: StageDraw
    second_blur: bool
    sinc_first: bool
    final_mode: str




def _draw_stage(rng: np.random.Generator, generator: torch.Generator, batch: int, stage: DegradeStage,
                like: Tensor) -> StageDraw:
    updown = ("up", "down", "keep")[categorical(rng, stage.resize_prob)]
    if updown == "up":
        s = float(rng.uniform(1.0, stage.resize_range[1]))
    elif updown == "down":
        s = float(rng.uniform(stage.resize_range[0], 1.0))
    else:
        s = 1.0
    mode = RESIZE_MODES[int(rng.integers(len(RESIZE_MODES)))]
    gaussian = bool(rng.random() < stage.gaussian_noise_prob)
    level = _uniform(batch, stage.noise_range if gaussian else stage.poisson_scale_range, generator, like)
    gray = _rand(batch, generator, like) < stage.gray_noise_prob
    quality = _uniform(batch, stage.jpeg_range, generator, like)
    return StageDraw(updown, s, mode, gaussian, level, gray, quality)


def draw_second_order(rng: np.random.Generator, generator: torch.Generator, batch: int, *, first: DegradeStage,
                      second: DegradeStage, second_blur_prob: float,
                      like: Tensor | None = None) -> SecondOrderDraw:
    """Draw every random choice of :func:`second_order_degrade` for a batch (no images needed).

    Host draws from ``rng`` in this order: stage 1 (resize kind by ``resize_prob``, its scale uniform in
    [low, 1] or [1, high], mode uniform over area/bilinear/bicubic, Gaussian with ``gaussian_noise_prob``),
    second blur with ``second_blur_prob``, stage 2 likewise, final order (sinc first with 1/2), final mode.
    Per sample from ``generator``: noise level, gray flag (``gray_noise_prob``), JPEG quality, stage 1 then 2.
    Tensors are float32 (``like``'s dtype and device if given).
    """
    if not 0.0 <= float(second_blur_prob) <= 1.0:
        raise OptionError(f"second_blur_prob must be a probability in [0, 1], got {second_blur_prob!r}")
    like = torch.empty(0, device=generator.device) if like is None else like
    s1 = _draw_stage(rng, generator, batch, first, like)
    blur2 = bool(rng.random() < second_blur_prob)
    s2 = _draw_stage(rng, generator, batch, second, like)
    sinc_first = bool(rng.random() < 0.5)
    final_mode = RESIZE_MODES[int(rng.integers(len(RESIZE_MODES)))]
    return SecondOrderDraw(s1, s2, blur2, sinc_first, final_mode)


def _noise(out: Tensor, draw: StageDraw, generator: torch.Generator) -> Tensor:
    if draw.gaussian:
        noise = gaussian_noise(out, draw.noise_level, draw.gray, generator=generator)
    else:
        noise = poisson_noise(out, draw.noise_level, draw.gray, generator=generator)
    return add_noise(out, noise, clip=True, rounds=False)


def apply_second_order(img: Tensor, kernel1: Tensor, kernel2: Tensor, sinc_kernel: Tensor, draw: SecondOrderDraw,
                       *, scale: int, generator: torch.Generator, jpeger: DiffJPEG | None = None) -> Tensor:
    """Run the pipeline of :func:`second_order_degrade` with the choices in ``draw`` (fields from ``generator``)."""
    if isinstance(scale, bool) or int(scale) != scale or scale < 1:
        raise OptionError(f"scale must be a positive integer, got {scale!r}")
    jpeger = DiffJPEG(differentiable=False) if jpeger is None else jpeger
    h, w = img.shape[-2:]
    with autocast_off(img):
        # first stage: blur, resize, noise, JPEG
        out = filter2d(img, kernel1)
        s1 = draw.first
        if s1.updown != "keep":
            out = resize(out, s1.resize_mode, scale_factor=s1.resize_scale)
        out = _noise(out, s1, generator)
        out = jpeger(out.clamp(0, 1), s1.jpeg_quality)
        # second stage: maybe blur, resize relative to the target size, noise
        if draw.second_blur:
            out = filter2d(out, kernel2)
        s2 = draw.second
        size = (int(h / scale * s2.resize_scale), int(w / scale * s2.resize_scale))
        out = resize(out, s2.resize_mode, size=size)
        out = _noise(out, s2, generator)
        # resize back + sinc filter, and JPEG, in either order
        target = (h // scale, w // scale)
        if draw.sinc_first:
            out = filter2d(resize(out, draw.final_mode, size=target), sinc_kernel)
            out = jpeger(out.clamp(0, 1), s2.jpeg_quality)
        else:
            out = jpeger(out.clamp(0, 1), s2.jpeg_quality)
            out = filter2d(resize(out, draw.final_mode, size=target), sinc_kernel)
        return clamp_round(out)


def second_order_degrade(img: Tensor, kernel1: Tensor, kernel2: Tensor, sinc_kernel: Tensor, *, scale: int,
                         first: DegradeStage, second: DegradeStage, second_blur_prob: float,
                         rng: np.random.Generator, generator: torch.Generator,
                         jpeger: DiffJPEG | None = None) -> Tensor:
    """Real-ESRGAN's second-order degradation of a batch; returns the LQ batch (``scale`` times smaller).

    ``img``: (B, 3, H, W) RGB in [0, 1], H and W multiples of ``scale`` (Real-ESRGAN passes the USM-sharpened
    GT, ``USMSharp()(gt)``); ``kernel1`` / ``kernel2`` / ``sinc_kernel``: (B, k, k) from the dataset.
    Steps (BasicSR's ``feed_data``): blur with kernel1, random resize, Gaussian or Poisson noise (clipped),
    DiffJPEG; blur with kernel2 (``second_blur_prob``), random resize to ``scale``-relative size, noise; then
    [resize to (H / scale, W / scale) + sinc filter] and JPEG in random order; round to 8-bit levels.
    Choices come from ``rng`` (host) and ``generator`` (device), see :func:`draw_second_order`. Autocast is
    off inside. The random crop and the training pair pool of BasicSR are left to the caller.

    Sizes: the first resize may shrink to ``resize_range[0]`` of H, W, and the second blur reflects by
    ``k // 2``, so ``floor(H * resize_range[0])`` must exceed it (x4plus: 0.15 * H > 10, i.e. H >= 74; BasicSR
    degrades 400x400 crops). The intermediate sizes follow the drawn scales, so on XLA each new size compiles.
    """
    draw = draw_second_order(rng, generator, img.shape[0], first=first, second=second,
                             second_blur_prob=second_blur_prob, like=img)
    return apply_second_order(img, kernel1, kernel2, sinc_kernel, draw, scale=scale, generator=generator,
                              jpeger=jpeger)
