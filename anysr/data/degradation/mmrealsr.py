"""MMRealSR's anchored second-order degradation (Mou et al. 2022, the authors' TencentARC/MM-RealSR code).

Real-ESRGAN's pipeline (:mod:`anysr.data.degradation.realesrgan`) run on four copies of each GT at once, so that
the degradation-aware network can be trained to *rank* degradations:

* **origin**: the small first-stage kernel, the small resize, the small noise level, the small JPEG degradation;
* **blur**: the same with the *large* kernels and the large resize (same noise level and JPEG quality as origin);
* **max**: the anchor of the strongest degradation: kernels at the top of the sigma range (sinc: the lowest
  cut-off), the extreme resize, the top noise level, the lowest JPEG quality;
* **noise**: origin's image after the first resize, with the *large* noise level and the *large* JPEG
  degradation in both stages (the small kernels in the second stage).

Results: ``lq`` (B, 3, C, h, w) = (origin, blur, noise), ``anchor`` (B, 2, C, h, w) = (GT bilinearly downscaled,
max), both on 8-bit levels, and the GT, all cropped together. "Small" / "large" are amounts of degradation: a
small JPEG degradation is the higher quality.

Randomness as in realesrgan.py (no global RNG): the dataset's kernels from the sample's seed
(:func:`draw_anchored_kernel_params`); per batch from the host generator ``rng`` (``step_rng`` in the training
step): the resize kinds, scales and modes of both stages, the noise kinds, the two diff-noise coins, the final
order and mode, the crop; per sample from its seed (:func:`draw_anchored_samples`): noise levels and their
differences, gray flags, JPEG qualities and their differences, and the seed of the generator that draws its
noise fields. One rank equals N ranks, and resumes are exact.

The reference's quirks, kept:

* ``second_blur_prob`` is read and never applied: the second blur always runs.
* The second JPEG uses ``jpeg_range`` (not ``jpeg_range2``), with fresh ``jpeg_diff_range`` differences:
  large-degradation quality ``q_l = lo + u (hi - lo - d)``, ``q_s = q_l + d``, max uses ``lo``.
* Noise differences: with the stage's diff coin, ``d`` uniform in ``*_noise_diff_range``, small level
  ``lo + u (hi - d)`` and large ``small + d`` (so the large level may exceed ``hi`` by ``lo``); without it
  small = large uniform in [lo, hi]. Max: ``hi``. The first coin is a fair one; the second stage differs when the
  first did not, or on a 0.2 coin (drawn always here, short-circuited in the reference).
* Each of the four images draws its own noise field (same level for origin and blur); the gray flag is shared.
* Resize up: two scales sorted, the smaller for origin; down: the larger for origin; max: the range end.
* The anchor of the Net model with ``gt_usm``: the GT is sharpened before the degradation and the anchor is
  sharpened again (USM twice); the GAN model sharpens nothing in the synthesis.
* The dataset's ``random_scale`` (Lanczos downscale, grown by 0.1 steps until both sides reach the crop size,
  possibly past 1) and ``crop_pad_size`` 400 (see ``MMRealSRGANDataset``).
* Sinc kernels of the two stages: two cut-offs, sorted (the larger for the small kernel), max at pi/3 (sizes
  below 13) or pi/5; the final sinc as Real-ESRGAN's.

Refused / different: anysr's per-sample noise fields (the reference draws one gray field per batch and uses the
global RNGs); ``blur_kernel_diff_lower_bound`` larger than a sigma range's width is an error (the reference then
draws from an inverted range); traiNNer-redux's keys (``resize_mode_list*``, ``jpeg_prob*``, ``blur_prob``,
``thicklines_prob``, ``lq_usm``) do not apply and are refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from anysr.data.degradation.draws import categorical, check_range
from anysr.data.degradation.kernels import KernelParams, check_odd_size, make_kernel
from anysr.data.degradation.realesrgan import BlurSettings, SynthesisSettings, crop_pair
from anysr.errors import DataError, OptionError
from anysr.ops.autocast import autocast_off
from anysr.ops.degradation import (
    RESIZE_MODES,
    USMSharp,
    clamp_round,
    filter2d,
    gaussian_noise_per_sample,
    poisson_noise_per_sample,
    resize,
)
from anysr.ops.diffjpeg import DiffJPEG
from anysr.ops.image import lq_patch_size

__all__ = [
    "ANCHOR_KERNELS", "draw_anchored_kernel_params", "sample_anchored_kernels", "AnchoredSettings",
    "AnchoredChoices", "AnchoredDraws", "anchored_sample_rng", "draw_anchored_choices", "draw_anchored_samples",
    "degrade_anchored", "synthesise_anchored", "AnchoredLoaderSynthesis",
]

ANCHOR_KERNELS = ("kernel1_small", "kernel1_large", "kernel1_max", "kernel2_small", "kernel2_large", "kernel2_max",
                  "sinc_kernel")
_TAG_SAMPLE, _TAG_SAMPLE_BATCH = 7201, 7202  # apart from realesrgan.py's tags
_SMALLEST_KERNEL = 7
_UPDOWN = ("up", "down", "keep")


# ------------------------------------------------------------------------------------ the dataset's kernels
def _two_sigmas(rng: np.random.Generator, lo: float, hi: float, isotropic: bool,
                bound: float) -> tuple[float, float, float, float]:
    """(sigma_x_small, sigma_y_small, sigma_x_large, sigma_y_large): the pair at least ``bound`` apart (the sum of
    both axes' gaps for anisotropic kernels), each gap's start uniform where it fits."""
    width = hi - lo
    if isotropic:
        gap = float(rng.uniform(bound, width))
        sx = float(rng.uniform(lo, hi - gap))
        return sx, sx, sx + gap, sx + gap
    gap_x = float(rng.uniform(0.0, width))
    gap_y = float(rng.uniform(max(bound - gap_x, 0.0), width))
    sx = float(rng.uniform(lo, hi - gap_x))
    sy = float(rng.uniform(lo, hi - gap_y))
    return sx, sy, sx + gap_x, sy + gap_y


def _beta(rng: np.random.Generator, beta_range: tuple[float, float]) -> float:
    if rng.random() < 0.5:
        return float(rng.uniform(beta_range[0], 1.0))
    return float(rng.uniform(1.0, beta_range[1]))


def _stage_kernels(rng: np.random.Generator, blur: BlurSettings, bound: float, pad: int) -> list[KernelParams]:
    lo_size, hi_size = blur.kernel_range if blur.kernel_range is not None else (_SMALLEST_KERNEL, pad)
    size = 2 * int(rng.integers(lo_size // 2, hi_size // 2 + 1)) + 1
    if rng.random() < blur.sinc_prob:
        low = math.pi / 3 if size < 13 else math.pi / 5
        a = float(rng.uniform(low, math.pi))
        b = float(rng.uniform(low, math.pi))
        while b == a:
            b = float(rng.uniform(low, math.pi))
        return [KernelParams("sinc", size, pad, omega_c=w) for w in (max(a, b), min(a, b), low)]
    kind = blur.kernel_list[categorical(rng, blur.kernel_prob)]
    lo, hi = blur.blur_sigma
    iso = not kind.endswith("aniso")
    sxs, sys_, sxl, syl = _two_sigmas(rng, lo, hi, iso, bound)
    rotation = 0.0 if iso else float(rng.uniform(-math.pi, math.pi))
    beta = math.nan
    if kind.startswith("generalized"):
        beta = _beta(rng, blur.betag_range)
    elif kind.startswith("plateau"):
        beta = _beta(rng, blur.betap_range)
    return [KernelParams(kind, size, pad, sx, sy, rotation, beta) for sx, sy in ((sxs, sys_), (sxl, syl), (hi, hi))]


def draw_anchored_kernel_params(rng: np.random.Generator, *, first: BlurSettings, second: BlurSettings,
                                final_sinc_prob: float, diff_lower_bound: float,
                                max_kernel_size: int = 21) -> dict[str, KernelParams]:
    """The seven kernels of one sample (keys ``ANCHOR_KERNELS``), as parameters, drawn from ``rng``.

    Per stage: a size (odd, 7 to ``max_kernel_size``), a ``sinc_prob`` coin; sinc: two cut-offs uniform in
    [pi/3, pi] (sizes below 13) or [pi/5, pi], the larger for ``small``, the smaller for ``large``, the range's
    low end for ``max``; else a kind by ``kernel_prob``, the sigma pair (:func:`_two_sigmas`, at least
    ``diff_lower_bound`` apart), the rotation (anisotropic), the shape beta (generalized / plateau); ``max`` has
    both sigmas at the top of ``blur_sigma``, with the same kind, rotation and beta. Then the final sinc as
    Real-ESRGAN's (``final_sinc_prob``; else the pulse). Every kernel is zero-padded to ``max_kernel_size``.
    """
    fn = "draw_anchored_kernel_params"
    k = check_odd_size(max_kernel_size, fn, "max_kernel_size")
    if k < _SMALLEST_KERNEL:
        raise OptionError(f"{fn}: max_kernel_size must be at least {_SMALLEST_KERNEL}, got {k}")
    if not 0.0 <= float(final_sinc_prob) <= 1.0:
        raise OptionError(f"{fn}: final_sinc_prob must be a probability in [0, 1], got {final_sinc_prob!r}")
    bound = float(diff_lower_bound)
    for name, blur in (("blur_sigma", first), ("blur_sigma2", second)):
        lo, hi = blur.blur_sigma
        if not 0.0 <= bound <= hi - lo:
            raise OptionError(f"blur_kernel_diff_lower_bound: {bound} must lie in [0, {hi - lo:g}] (the width of "
                              f"{name} {[lo, hi]}); lower it or widen {name}")
    out: dict[str, KernelParams] = {}
    for stage, blur in (("1", first), ("2", second)):
        for which, params in zip(("small", "large", "max"), _stage_kernels(rng, blur, bound, k)):
            out[f"kernel{stage}_{which}"] = params
    if rng.random() < final_sinc_prob:
        size = 2 * int(rng.integers(_SMALLEST_KERNEL // 2, k // 2 + 1)) + 1
        out["sinc_kernel"] = KernelParams("sinc", size, k, omega_c=float(rng.uniform(math.pi / 3, math.pi)))
    else:
        out["sinc_kernel"] = KernelParams("pulse", k, k)
    return out


def sample_anchored_kernels(params: Mapping[str, KernelParams]) -> dict[str, Tensor]:
    """The float32 (k, k) kernels of :func:`draw_anchored_kernel_params`'s parameters (built in float64)."""
    return {name: torch.from_numpy(make_kernel(params[name]).astype(np.float32)) for name in ANCHOR_KERNELS}


# ------------------------------------------------------------------------------------------ the model's draws
_REFUSED = {"resize_mode_list": None, "resize_mode_list2": None, "resize_mode_list3": None, "jpeg_prob": 1.0,
            "jpeg_prob2": 1.0, "blur_prob": 1.0, "thicklines_prob": 0.0, "lq_usm": None}


def _diff_range(opt: Mapping[str, Any], key: str, default: tuple[float, float] | None) -> tuple[float, float]:
    value = opt.get(key)
    if value is None:
        if default is None:
            raise OptionError(f"{key}: required by the MMRealSR models (the authors use [5, 60])")
        return default
    lo, hi = check_range(value, "options", key)
    if lo < 0:
        raise OptionError(f"{key}: must be a range [low, high] with 0 <= low <= high, got {[lo, hi]}")
    return lo, hi


@dataclass(frozen=True)
class AnchoredSettings:
    """MMRealSR's model-side settings: Real-ESRGAN's (``base``; ``jpeg_range2`` and ``second_blur_prob`` unused,
    as in the reference), the three difference ranges, and ``anchor_usm`` (the Net model with ``gt_usm``: the GT
    is USM-sharpened before the degradation and the GT anchor is sharpened once more)."""

    base: SynthesisSettings
    jpeg_diff_range: tuple[float, float]
    gaussian_noise_diff_range: tuple[float, float] = (1.0, 21.0)
    poisson_noise_diff_range: tuple[float, float] = (0.05, 2.05)
    anchor_usm: bool = False

    @classmethod
    def from_options(cls, opt: Mapping[str, Any], *, anchor_usm: bool | None = None) -> AnchoredSettings:
        """From validated top-level options; ``anchor_usm`` None: true for ``MMRealSRNetModel`` with ``gt_usm``."""
        for key, default in _REFUSED.items():
            if opt.get(key, default) != default:
                raise OptionError(f"{key}: traiNNer-redux's key does not apply to MMRealSR's synthesis; remove it")
        if anchor_usm is None:
            anchor_usm = opt.get("model_type") == "MMRealSRNetModel" and opt.get("gt_usm") is True
        return cls(SynthesisSettings.from_options(opt), _diff_range(opt, "jpeg_diff_range", None),
                   _diff_range(opt, "gaussian_noise_diff_range", (1.0, 21.0)),
                   _diff_range(opt, "poisson_noise_diff_range", (0.05, 2.05)), bool(anchor_usm))


@dataclass(frozen=True)
class AnchoredChoices:
    """A batch's host draws: stage 1 resize (``updown1``; ``scales1`` for origin, blur and max; ``mode1``), the
    diff-noise coins (``diff1``, ``diff2``), noise kinds (``gaussian1``, ``gaussian2``), stage 2 resize, the final
    order (``sinc_first``) and mode, and the crop origin (``top``, ``left`` in LQ pixels)."""

    updown1: str
    scales1: tuple[float, float, float]
    mode1: str
    diff1: bool
    gaussian1: bool
    updown2: str
    scale2: float
    mode2: str
    diff2: bool
    gaussian2: bool
    sinc_first: bool
    final_mode: str
    top: int
    left: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class AnchoredDraws:
    """Per-sample values, one entry per sample: raw uniforms of each stage (``u1`` / ``u2``: noise difference,
    noise level, gray, JPEG difference, JPEG level of the first JPEG (``u1``) and the second (``u2``)), made into
    levels by :meth:`levels` / :meth:`qualities`, and the seed of the noise fields' generator."""

    u1: tuple[tuple[float, ...], ...]
    u2: tuple[tuple[float, ...], ...]
    field_seeds: tuple[int, ...]
    gray1: tuple[bool, ...] = field(default=())
    gray2: tuple[bool, ...] = field(default=())

    def levels(self, stage: int, gaussian: bool, diff: bool, settings: AnchoredSettings
               ) -> tuple[list[float], list[float], float]:
        """(small levels, large levels, max level) of a stage's noise (sigma on the 0-255 scale, or scale)."""
        st = settings.base.first if stage == 1 else settings.base.second
        lo, hi = st.noise_range if gaussian else st.poisson_scale_range
        dlo, dhi = settings.gaussian_noise_diff_range if gaussian else settings.poisson_noise_diff_range
        small, large = [], []
        for u in (self.u1 if stage == 1 else self.u2):
            if diff:
                d = dlo + u[0] * (dhi - dlo)
                s = lo + u[1] * (hi - d)
                small.append(s)
                large.append(s + d)
            else:
                s = lo + u[1] * (hi - lo)
                small.append(s)
                large.append(s)
        return small, large, hi

    def qualities(self, stage: int, settings: AnchoredSettings) -> tuple[list[float], list[float], float]:
        """(small-degradation qualities, large-degradation qualities, max quality) of a stage's JPEG; both
        stages use ``jpeg_range`` (the reference's)."""
        lo, hi = settings.base.first.jpeg_range
        dlo, dhi = settings.jpeg_diff_range
        small, large = [], []
        for u in (self.u1 if stage == 1 else self.u2):
            d = dlo + u[3] * (dhi - dlo)
            q = lo + u[4] * (hi - lo - d)
            large.append(q)
            small.append(q + d)
        return small, large, lo


def anchored_sample_rng(sample_seed: int) -> np.random.Generator:
    """The batch choices of a sample synthesised on its own (in the loader workers)."""
    return np.random.default_rng([int(sample_seed), _TAG_SAMPLE_BATCH])


def _resize1(rng: np.random.Generator, settings: AnchoredSettings) -> tuple[str, tuple[float, float, float]]:
    lo, hi = settings.base.first.resize_range
    updown = _UPDOWN[categorical(rng, settings.base.first.resize_prob)]
    if updown == "up":
        a, b = sorted((float(rng.uniform(1.0, hi)), float(rng.uniform(1.0, hi))))
        return updown, (a, b, hi)
    if updown == "down":
        a, b = sorted((float(rng.uniform(lo, 1.0)), float(rng.uniform(lo, 1.0))))
        return updown, (b, a, lo)
    return updown, (1.0, 1.0, 1.0)


def draw_anchored_choices(rng: np.random.Generator, settings: AnchoredSettings,
                          size: tuple[int, int]) -> AnchoredChoices:
    """A batch's choices from ``rng`` in the reference's order; ``size``: the (H, W) of the GT being degraded.

    Stage 1 resize kind (``resize_prob``) and scales, mode (area / bilinear / bicubic), the fair diff coin, the
    Gaussian coin (``gaussian_noise_prob``); stage 2 resize kind, scale, mode; a uniform ``u``: the second stage
    differs when the first did not, or ``u < 0.2``; the Gaussian coin (``gaussian_noise_prob2``); the final order
    (1/2) and mode; the crop origin.
    """
    base = settings.base
    updown1, scales1 = _resize1(rng, settings)
    mode1 = RESIZE_MODES[int(rng.integers(len(RESIZE_MODES)))]
    diff1 = bool(rng.random() < 0.5)
    gaussian1 = bool(rng.random() < base.first.gaussian_noise_prob)
    updown2 = _UPDOWN[categorical(rng, base.second.resize_prob)]
    lo, hi = base.second.resize_range
    scale2 = float(rng.uniform(1.0, hi)) if updown2 == "up" else float(rng.uniform(lo, 1.0)) \
        if updown2 == "down" else 1.0
    mode2 = RESIZE_MODES[int(rng.integers(len(RESIZE_MODES)))]
    diff2 = (not diff1) or bool(rng.random() < 0.2)
    gaussian2 = bool(rng.random() < base.second.gaussian_noise_prob)
    sinc_first = bool(rng.random() < 0.5)
    final_mode = RESIZE_MODES[int(rng.integers(len(RESIZE_MODES)))]
    h, w = (v // base.scale for v in size)
    p = lq_patch_size(base.gt_size, base.scale)
    if h < p or w < p:
        raise DataError(f"the degraded image is {h}x{w} (LQ pixels), smaller than the {p}x{p} LQ crop (gt_size "
                        f"{base.gt_size} / scale {base.scale}); raise crop_pad_size or lower gt_size")
    top, left = int(rng.integers(0, h - p + 1)), int(rng.integers(0, w - p + 1))
    return AnchoredChoices(updown1, scales1, mode1, diff1, gaussian1, updown2, scale2, mode2, diff2, gaussian2,
                           sinc_first, final_mode, top, left)


def draw_anchored_samples(seeds: Sequence[int], settings: AnchoredSettings) -> AnchoredDraws:
    """Each sample's uniforms from its own seed: five per stage (noise difference, noise level, gray, JPEG
    difference, JPEG level) and a field seed; gray flags by ``gray_noise_prob`` / ``gray_noise_prob2``."""
    u1, u2, fields = [], [], []
    for s in seeds:
        rng = np.random.default_rng([int(s), _TAG_SAMPLE])
        u = [float(v) for v in rng.random(10)]
        u1.append(tuple(u[:5]))
        u2.append(tuple(u[5:]))
        fields.append(int(rng.integers(0, 2**62)))
    g1, g2 = settings.base.first.gray_noise_prob, settings.base.second.gray_noise_prob
    return AnchoredDraws(tuple(u1), tuple(u2), tuple(fields), tuple(u[2] < g1 for u in u1),
                         tuple(u[2] < g2 for u in u2))


# ------------------------------------------------------------------------------------------------ the pipeline
def _noise(outs: list[Tensor], stage: int, gaussian: bool, diff: bool, draws: AnchoredDraws,
           settings: AnchoredSettings, gens: Sequence[torch.Generator]) -> list[Tensor]:
    small, large, top = draws.levels(stage, gaussian, diff, settings)
    gray = draws.gray1 if stage == 1 else draws.gray2
    add = gaussian_noise_per_sample if gaussian else poisson_noise_per_sample
    b = outs[0].shape[0]
    # the reference's field order: origin, blur, noise (large), max
    n0 = add(outs[0], small, gray, gens)
    n1 = add(outs[1], small, gray, gens)
    n3 = add(outs[3], large, gray, gens)
    n2 = add(outs[2], [top] * b, gray, gens)
    return [torch.clamp(x + n, 0, 1) for x, n in zip(outs, (n0, n1, n2, n3))]


def _jpeg(outs: list[Tensor], stage: int, draws: AnchoredDraws, settings: AnchoredSettings,
          jpeger: DiffJPEG) -> list[Tensor]:
    small, large, lowest = draws.qualities(stage, settings)
    dev = outs[0].device
    qs = torch.tensor(small, dtype=torch.float32).to(dev)
    ql = torch.tensor(large, dtype=torch.float32).to(dev)
    qm = torch.full((len(small),), float(lowest), dtype=torch.float32).to(dev)
    return [jpeger(x.clamp(0, 1), q) for x, q in zip(outs, (qs, qs, qm, ql))]


def degrade_anchored(src: Tensor, kernels: Mapping[str, Tensor], choices: AnchoredChoices, draws: AnchoredDraws,
                     settings: AnchoredSettings, gens: Sequence[torch.Generator],
                     jpeger: DiffJPEG) -> list[Tensor]:
    """The four degraded batches (origin, blur, max, noise) of ``src`` (B, 3, H, W), on 8-bit levels, ``scale``
    times smaller. ``gens[j]`` draws sample j's noise fields (re-seed them first). Autocast off."""
    b, _, h, w = src.shape
    if len(gens) != b or len(draws.field_seeds) != b:
        raise DataError(f"degrade_anchored: {len(gens)} generators and {len(draws.field_seeds)} draws for a batch "
                        f"of {b}")
    s = settings.base.scale
    with autocast_off(src):
        outs = [filter2d(src, kernels[f"kernel1_{k}"]) for k in ("small", "large", "max")]
        if choices.updown1 != "keep":
            outs = [resize(x, choices.mode1, scale_factor=f) for x, f in zip(outs, choices.scales1)]
        outs.append(outs[0])
        outs = _noise(outs, 1, choices.gaussian1, choices.diff1, draws, settings, gens)
        outs = _jpeg(outs, 1, draws, settings, jpeger)
        outs = [filter2d(x, kernels[f"kernel2_{k}"]) for x, k in zip(outs, ("small", "large", "max", "small"))]
        size = (int(h / s * choices.scale2), int(w / s * choices.scale2))
        outs = [resize(x, choices.mode2, size=size) for x in outs]
        outs = _noise(outs, 2, choices.gaussian2, choices.diff2, draws, settings, gens)
        target = (h // s, w // s)
        sinc = kernels["sinc_kernel"]
        if choices.sinc_first:
            outs = [filter2d(resize(x, choices.final_mode, size=target), sinc) for x in outs]
            outs = _jpeg(outs, 2, draws, settings, jpeger)
        else:
            outs = _jpeg(outs, 2, draws, settings, jpeger)
            outs = [filter2d(resize(x, choices.final_mode, size=target), sinc) for x in outs]
        return [clamp_round(x) for x in outs]


def synthesise_anchored(gt: Tensor, kernels: Mapping[str, Tensor], *, settings: AnchoredSettings,
                        rng: np.random.Generator | None = None, seeds: Sequence[int],
                        gens: list[torch.Generator], usm: USMSharp, jpeger: DiffJPEG,
                        choices: AnchoredChoices | None = None, draws: AnchoredDraws | None = None) -> dict[str, Any]:
    """One MMRealSR training batch from ``gt`` (B, 3, H, W) in [0, 1] and the dataset's kernels (``ANCHOR_KERNELS``,
    each (B, k, k)).

    Returns ``lq`` (B, 3, 3, p, p): origin, blur, noise; ``anchor`` (B, 2, 3, p, p): the bilinearly downscaled GT
    (sharpened twice with ``anchor_usm``) and max; ``gt`` (B, 3, gt_size, gt_size): the GT crop (the sharpened GT
    with ``anchor_usm``, which the Net model trains towards); and ``choices`` / ``draws``. The choices come from
    ``rng`` (the batch's host generator) unless given, the per-sample values from ``seeds`` unless ``draws`` are
    given; the generators are re-seeded from the draws' field seeds here.
    """
    if choices is None:
        if rng is None:
            raise OptionError("synthesise_anchored: give rng (the batch's host generator) or choices")
        choices = draw_anchored_choices(rng, settings, tuple(gt.shape[-2:]))  # type: ignore[arg-type]
    missing = [k for k in ANCHOR_KERNELS if k not in kernels]
    if missing:
        raise DataError(f"synthesise_anchored: the batch lacks kernel(s) {', '.join(missing)} (MMRealSRGANDataset "
                        "gives them)")
    if draws is None:
        draws = draw_anchored_samples(seeds, settings)
    for g, fs in zip(gens, draws.field_seeds):
        g.manual_seed(fs)
    base = settings.base
    with torch.no_grad(), autocast_off(gt):
        src = usm(gt) if settings.anchor_usm else gt
        origin, blur, top, noise = degrade_anchored(src, kernels, choices, draws, settings, gens, jpeger)
        h, w = gt.shape[-2:]
        low = resize(usm(src) if settings.anchor_usm else src, "bilinear", size=(h // base.scale, w // base.scale))
        lq = torch.stack([origin, blur, noise], dim=1)
        anchor = torch.stack([clamp_round(low), top], dim=1)
        lq, (gt_out,) = crop_pair(lq, [src], choices.top, choices.left, base.gt_size, base.scale)
        anchor, _ = crop_pair(anchor, [], choices.top, choices.left, base.gt_size, base.scale)
    return {"lq": lq.contiguous(), "anchor": anchor.contiguous(), "gt": gt_out.contiguous(), "choices": choices,
            "draws": draws}


class AnchoredLoaderSynthesis:
    """MMRealSR's synthesis of one sample at a time in the DataLoader workers (CPU; ``degrade_in: loader``).

    Every sample is a batch of one: its choices from its own seed (:func:`anchored_sample_rng`), its values and
    fields from its seed as in the training step; the outputs have fixed shapes (``lq`` (3, 3, p, p), ``anchor``
    (2, 3, p, p), ``gt`` (3, gt_size, gt_size)). Picklable.
    """

    def __init__(self, settings: AnchoredSettings) -> None:
        self.settings = settings
        self.usm = USMSharp()
        self.jpeger = DiffJPEG(differentiable=False)

    def __call__(self, gt: Tensor, kernels: Mapping[str, Tensor], seed: int) -> dict[str, Any]:
        """``gt`` (3, H, W) and the seven (k, k) kernels of one sample -> its ``lq``, ``anchor`` and ``gt``."""
        out = synthesise_anchored(gt[None], {k: v[None] for k, v in kernels.items()}, settings=self.settings,
                                  rng=anchored_sample_rng(seed), seeds=[seed], gens=[torch.Generator()],
                                  usm=self.usm, jpeger=self.jpeger)
        return {**out, "lq": out["lq"][0], "anchor": out["anchor"][0], "gt": out["gt"][0]}
