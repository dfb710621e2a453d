"""Real-ESRGAN's second-order degradation (Wang et al. 2021, as BasicSR 1.4.2 defines it): settings, draws, pipeline.

Two halves, both with counter-based randomness (no global RNG anywhere):

* **The dataset's draws** (:func:`sample_degradation_kernels`, run by ``RealESRGANDataset`` in the loader workers):
  the per-sample first-order kernel, second-order kernel and final sinc kernel, from the sample's
  ``numpy.random.Generator``; the kernels themselves are :mod:`anysr.data.degradation.kernels`.
* **The synthesis** (:func:`synthesise`): the LQ made from the GT and those kernels by blur, resize, noise and
  JPEG twice. Used by ``RealESRNetModel`` / ``RealESRGANModel`` in the training step (on the accelerator's device,
  one batch at a time, as BasicSR does) or by ``RealESRGANDataset`` in the DataLoader workers
  (:class:`LoaderSynthesis`, one sample at a time, on the CPU), and by ``anysr prepare degrade``. The operators are
  :mod:`anysr.ops.degradation` and :mod:`anysr.ops.diffjpeg`; this module decides what they are called with.

Randomness of the synthesis:

* **Batch choices** (resize up/down/keep and its scale, interpolation modes, Gaussian or Poisson noise, second
  blur, final order, the crop position) are BasicSR's per-batch draws. They come from a host generator keyed by
  ``(manual_seed, iteration, micro-batch)`` in the training step (:func:`step_rng`): the same on every rank, so
  a global batch split over ranks is degraded as one process degrades it. In the loaders every sample is its own
  batch and the key is its sample seed (:func:`sample_batch_rng`).
* **Per-sample values** (noise level, gray or colour noise, the two JPEG qualities) come from the sample's seed
  (the sampler's counter-based ``(seed, epoch, position)`` seed, delivered in the batch as ``seed``), and so do
  the noise fields: each sample draws them from its own ``torch.Generator`` (on the device where one exists),
  re-seeded from the sample seed every time. A sample's degradation thus depends on its seed and its batch's
  choices only: not on the rank split, the worker count or the resume point, and nothing needs saving.
* The training-pair pool (:class:`anysr.data.pair_pool.TrainingPairPool`) picks its entries with a generator
  keyed by ``(manual_seed, iteration, micro-batch)`` (:func:`pool_rng`).

Two deliberate differences from BasicSR, both in distribution-preserving details: every sample draws its own
noise fields (BasicSR draws one gray Gaussian field per batch), and the pool is stratified by batch position.

BasicSR option keys and where they go. Dataset keys (``datasets.train``):

============================================  =================================================================
``kernel_list`` / ``kernel_list2``            ``BlurSettings.kernel_list`` of ``first`` / ``second``
``kernel_prob`` / ``kernel_prob2``            ``BlurSettings.kernel_prob``
``blur_sigma`` / ``blur_sigma2``              ``BlurSettings.blur_sigma`` (sigma_x and sigma_y range)
``betag_range`` / ``betag_range2``            ``BlurSettings.betag_range`` (generalized Gaussian shape)
``betap_range`` / ``betap_range2``            ``BlurSettings.betap_range`` (plateau shape)
``sinc_prob`` / ``sinc_prob2``                ``BlurSettings.sinc_prob``
``final_sinc_prob``                           ``final_sinc_prob`` of ``sample_degradation_kernels``
``blur_kernel_size`` / ``blur_kernel_size2``  read but unused by BasicSR 1.4.2, which hard-codes sizes 7..21
                                              padded to 21: pass ``max_kernel_size=21`` to reproduce it
``kernel_range`` / ``kernel_range2``          ``BlurSettings.kernel_range`` (traiNNer-redux: odd [min, max])
``final_kernel_range``                        ``final_kernel_range`` of ``sample_degradation_kernels``
============================================  =================================================================

Model keys (top level of the options):

=====================================================  =========================================================
``scale``                                              ``SynthesisSettings.scale``
``resize_prob`` / ``resize_prob2``                     ``DegradeStage.resize_prob`` of ``first`` / ``second``
``resize_range`` / ``resize_range2``                   ``DegradeStage.resize_range``
``gaussian_noise_prob`` / ``gaussian_noise_prob2``     ``DegradeStage.gaussian_noise_prob``
``noise_range`` / ``noise_range2``                     ``DegradeStage.noise_range`` (sigma on the 0-255 scale)
``poisson_scale_range`` / ``poisson_scale_range2``     ``DegradeStage.poisson_scale_range``
``gray_noise_prob`` / ``gray_noise_prob2``             ``DegradeStage.gray_noise_prob``
``jpeg_range`` / ``jpeg_range2``                       ``DegradeStage.jpeg_range``
``second_blur_prob``                                   ``SynthesisSettings.second_blur_prob``
traiNNer-redux's: ``resize_mode_list`` / ``_prob``     ``DegradeStage.resize_mode_list`` / ``resize_mode_prob``
(and ``*2``), ``jpeg_prob`` / ``jpeg_prob2``           and ``DegradeStage.jpeg_prob``
``resize_mode_list3`` / ``resize_mode_prob3``          ``SynthesisSettings.resize_mode_list3`` / ``_prob3``
``blur_prob``, ``thicklines_prob``, ``lq_usm``,        ``SynthesisSettings`` fields of the same names
``lq_usm_radius_range``
=====================================================  =========================================================
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from anysr.data.degradation.draws import categorical, check_range
from anysr.data.degradation.kernels import (
    KernelParams,
    check_kernel_list,
    check_odd_size,
    draw_mixed_kernel_params,
    make_kernel,
)
from anysr.errors import DataError, OptionError
from anysr.ops.autocast import autocast_off
from anysr.ops.degradation import (
    RESIZE_MODES,
    TRAINNER_RESIZE_MODES,
    USMSharp,
    clamp_round,
    filter2d,
    gaussian_noise_per_sample,
    poisson_noise_per_sample,
    resize,
    resize_filtered,
    thick_lines,
)
from anysr.ops.diffjpeg import DiffJPEG
from anysr.ops.image import lq_patch_size

__all__ = [
    "BlurSettings", "draw_degradation_kernel_params", "sample_degradation_kernels",
    "DegradeStage", "SynthesisSettings", "BatchChoices", "SampleDraws", "step_rng", "pool_rng", "sample_batch_rng",
    "draw_batch_choices", "draw_samples", "sample_generator", "degrade", "crop_pair", "synthesise", "LoaderSynthesis",
    "check_kernel_range", "check_resize_modes", "lq_usm_sharpener",
]

# Tags that keep the generators of different purposes apart (any distinct constants would do).
_TAG_STEP, _TAG_POOL, _TAG_SAMPLE, _TAG_SAMPLE_BATCH = 7101, 7102, 7103, 7104
_UPDOWN = ("up", "down", "keep")
_SMALLEST_KERNEL = 7  # BasicSR draws kernel sizes 7, 9, ..., 21


# ------------------------------------------------------------------------------------ the dataset's kernels
@dataclass(frozen=True)
class BlurSettings:
    """The kernel distribution of one degradation stage (the BasicSR keys are in the module docstring).

    ``sinc_prob`` is the chance of a sinc kernel instead of a ``kernel_list`` one; ``blur_sigma`` is the range
    of both sigmas; rotations are uniform in [-pi, pi] as in BasicSR.
    """

    kernel_list: tuple[str, ...]
    kernel_prob: tuple[float, ...]
    blur_sigma: tuple[float, float]
    betag_range: tuple[float, float]
    betap_range: tuple[float, float]
    sinc_prob: float
    kernel_range: tuple[int, int] | None = None  # odd [min, max] sizes (traiNNer-redux); None: 7 to the pad size

    def __post_init__(self) -> None:
        fn = "BlurSettings"
        if self.kernel_range is not None:
            object.__setattr__(self, "kernel_range", check_kernel_range(self.kernel_range, fn, "kernel_range"))
        object.__setattr__(self, "kernel_list", tuple(self.kernel_list))
        object.__setattr__(self, "kernel_prob", tuple(float(p) for p in self.kernel_prob))
        check_kernel_list(self.kernel_list, self.kernel_prob, fn)
        for name in ("blur_sigma", "betag_range", "betap_range"):
            object.__setattr__(self, name, check_range(getattr(self, name), fn, name))
        if self.blur_sigma[0] <= 0:
            raise OptionError(f"{fn}: blur_sigma must be positive, got {list(self.blur_sigma)}")
        if not 0.0 <= float(self.sinc_prob) <= 1.0:
            raise OptionError(f"{fn}: sinc_prob must be a probability in [0, 1], got {self.sinc_prob!r}")

    @classmethod
    def from_basicsr(cls, opt: Mapping[str, object], stage: int = 1) -> BlurSettings:
        """Read ``kernel_list``, ``kernel_prob``, ``blur_sigma``, ``betag_range``, ``betap_range``, ``sinc_prob``
        (with suffix ``2`` for ``stage=2``) from a BasicSR ``datasets.train`` section; a missing key is an error."""
        suffix = {1: "", 2: "2"}.get(stage)
        if suffix is None:
            raise OptionError(f"BlurSettings.from_basicsr: stage must be 1 or 2, got {stage!r}")
        keys = ("kernel_list", "kernel_prob", "blur_sigma", "betag_range", "betap_range", "sinc_prob")
        missing = [k + suffix for k in keys if k + suffix not in opt]
        if missing:
            raise OptionError(f"datasets.train: missing Real-ESRGAN key(s) {', '.join(missing)}")
        sizes = opt.get("kernel_range" + suffix)
        return cls(*(opt[k + suffix] for k in keys),  # type: ignore[arg-type]
                   kernel_range=None if sizes is None else tuple(sizes))  # type: ignore[arg-type]


def check_kernel_range(sizes: Sequence[int], fn: str, name: str) -> tuple[int, int]:
    """``sizes`` as an odd ``(min, max)`` kernel size range with ``3 <= min <= max``, else an OptionError."""
    try:
        lo, hi = (int(v) for v in sizes)
        ok = all(int(v) == v and not isinstance(v, bool) for v in sizes)
    except (TypeError, ValueError):
        lo = hi = 0
        ok = False
    if not ok or lo % 2 == 0 or hi % 2 == 0 or not 3 <= lo <= hi:
        raise OptionError(f"{fn}: {name} must be [min, max] odd kernel sizes with 3 <= min <= max, got {sizes!r}")
    return lo, hi


def _size_draw(rng: np.random.Generator, sizes: tuple[int, int] | None, max_kernel_size: int, what: str) -> int:
    lo, hi = sizes if sizes is not None else (_SMALLEST_KERNEL, max_kernel_size)
    if hi > max_kernel_size:
        raise OptionError(f"{what} goes up to {hi}, larger than the {max_kernel_size}x{max_kernel_size} kernels "
                          "every size is padded to")
    return 2 * int(rng.integers(lo // 2, hi // 2 + 1)) + 1


def _draw_kernels(rng: np.random.Generator, settings: BlurSettings, max_kernel_size: int) -> KernelParams:
    size = _size_draw(rng, settings.kernel_range, max_kernel_size, "kernel_range")
    if rng.random() < settings.sinc_prob:
        # BasicSR's cut-off range: small kernels cannot represent the lowest cut-offs.
        low = math.pi / 3 if size < 13 else math.pi / 5
        return KernelParams("sinc", size, max_kernel_size, omega_c=float(rng.uniform(low, math.pi)))
    return draw_mixed_kernel_params(rng, settings.kernel_list, settings.kernel_prob, size, settings.blur_sigma,
                                    settings.blur_sigma, (-math.pi, math.pi), settings.betag_range,
                                    settings.betap_range, pad_to=max_kernel_size)


def draw_degradation_kernel_params(rng: np.random.Generator, *, first: BlurSettings, second: BlurSettings,
                                   final_sinc_prob: float, max_kernel_size: int,
                                   final_kernel_range: Sequence[int] | None = None) -> dict[str, KernelParams]:
    """The parameters behind :func:`sample_degradation_kernels` (same draws from ``rng``, same order).

    Per stage: a kernel size uniform over the odd sizes of the stage's ``kernel_range`` (default 7, 9, ...,
    ``max_kernel_size``); a ``sinc_prob`` coin; then either the sinc cut-off (uniform in [pi/3, pi] for sizes
    below 13, [pi/5, pi] otherwise) or a mixed kernel (:func:`draw_mixed_kernel_params`). Finally a
    ``final_sinc_prob`` coin; on heads a size (``final_kernel_range``, same default) and a cut-off in [pi/3, pi],
    on tails the pulse (identity). Every kernel is zero-padded to ``max_kernel_size``.
    """
    fn = "draw_degradation_kernel_params"
    k = check_odd_size(max_kernel_size, fn, "max_kernel_size")
    if k < _SMALLEST_KERNEL:
        raise OptionError(f"{fn}: max_kernel_size must be at least {_SMALLEST_KERNEL}, got {k}")
    if not 0.0 <= float(final_sinc_prob) <= 1.0:
        raise OptionError(f"{fn}: final_sinc_prob must be a probability in [0, 1], got {final_sinc_prob!r}")
    out = {"kernel1": _draw_kernels(rng, first, k), "kernel2": _draw_kernels(rng, second, k)}
    final_sizes = None if final_kernel_range is None else check_kernel_range(final_kernel_range, fn,
                                                                              "final_kernel_range")
    if rng.random() < final_sinc_prob:
        size = _size_draw(rng, final_sizes, k, "final_kernel_range")
        out["sinc_kernel"] = KernelParams("sinc", size, k, omega_c=float(rng.uniform(math.pi / 3, math.pi)))
    else:
        out["sinc_kernel"] = KernelParams("pulse", k, k)
    return out


def sample_degradation_kernels(rng: np.random.Generator, *, first: BlurSettings, second: BlurSettings,
                               final_sinc_prob: float, max_kernel_size: int,
                               final_kernel_range: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The per-sample kernels of ``RealESRGANDataset``: ``kernel1``, ``kernel2``, ``sinc_kernel``.

    Each is a float32 ``max_kernel_size`` x ``max_kernel_size`` array (computed in float64, then cast, as
    BasicSR does); draws as :func:`draw_degradation_kernel_params` describes. Batch them and hand them to
    :func:`synthesise`.
    """
    params = draw_degradation_kernel_params(rng, first=first, second=second, final_sinc_prob=final_sinc_prob,
                                            max_kernel_size=max_kernel_size, final_kernel_range=final_kernel_range)
    return {name: make_kernel(p).astype(np.float32) for name, p in params.items()}


# ------------------------------------------------------------------------------------- the model's draws
@dataclass(frozen=True)
class DegradeStage:
    """The model-side settings of one degradation stage (BasicSR keys in the module docstring)."""

    resize_prob: tuple[float, float, float]  # up, down, keep
    resize_range: tuple[float, float]
    gaussian_noise_prob: float
    noise_range: tuple[float, float]
    poisson_scale_range: tuple[float, float]
    gray_noise_prob: float
    jpeg_range: tuple[float, float]
    # traiNNer-redux's keys: the resize filters and their weights (None: BasicSR's uniform area / bilinear /
    # bicubic without antialiasing), and the chance of the JPEG step.
    resize_mode_list: tuple[str, ...] | None = None
    resize_mode_prob: tuple[float, ...] | None = None
    jpeg_prob: float = 1.0

    def __post_init__(self) -> None:
        fn = "DegradeStage"
        modes, weights = check_resize_modes(self.resize_mode_list, self.resize_mode_prob, fn, "resize_mode_list")
        object.__setattr__(self, "resize_mode_list", modes)
        object.__setattr__(self, "resize_mode_prob", weights)
        probs = tuple(float(p) for p in self.resize_prob)
        if len(probs) != 3 or any(not math.isfinite(p) or p < 0 for p in probs) or sum(probs) <= 0:
            raise OptionError(f"{fn}: resize_prob must be three non-negative weights (up, down, keep), "
                              f"got {list(self.resize_prob)}")
        object.__setattr__(self, "resize_prob", probs)
        for name in ("resize_range", "noise_range", "poisson_scale_range", "jpeg_range"):
            object.__setattr__(self, name, check_range(getattr(self, name), fn, name))
        if not 0 < self.resize_range[0] <= 1 <= self.resize_range[1]:
            raise OptionError(f"{fn}: resize_range must satisfy 0 < low <= 1 <= high, got {list(self.resize_range)}")
        if not (0 < self.jpeg_range[0] and self.jpeg_range[1] < 100):
            raise OptionError(f"{fn}: jpeg_range must lie in (0, 100), got {list(self.jpeg_range)}")
        for name in ("gaussian_noise_prob", "gray_noise_prob", "jpeg_prob"):
            if not 0.0 <= float(getattr(self, name)) <= 1.0:
                raise OptionError(f"{fn}: {name} must be a probability in [0, 1], got {getattr(self, name)!r}")

    @classmethod
    def from_basicsr(cls, opt: Mapping[str, object], stage: int = 1) -> DegradeStage:
        """Read the keys of the module docstring (suffix ``2`` for ``stage=2``) from BasicSR model options."""
        suffix = {1: "", 2: "2"}.get(stage)
        if suffix is None:
            raise OptionError(f"DegradeStage.from_basicsr: stage must be 1 or 2, got {stage!r}")
        keys = ("resize_prob", "resize_range", "gaussian_noise_prob", "noise_range", "poisson_scale_range",
                "gray_noise_prob", "jpeg_range")
        missing = [k + suffix for k in keys if k + suffix not in opt]
        if missing:
            raise OptionError(f"options: missing Real-ESRGAN key(s) {', '.join(missing)}")
        jpeg_prob = opt.get("jpeg_prob" + suffix)
        return cls(*(opt[k + suffix] for k in keys),  # type: ignore[arg-type]
                   resize_mode_list=opt.get("resize_mode_list" + suffix),  # type: ignore[arg-type]
                   resize_mode_prob=opt.get("resize_mode_prob" + suffix),  # type: ignore[arg-type]
                   jpeg_prob=1.0 if jpeg_prob is None else float(jpeg_prob))  # type: ignore[arg-type]


def check_resize_modes(modes: Sequence[str] | None, weights: Sequence[float] | None, fn: str,
                       name: str) -> tuple[tuple[str, ...] | None, tuple[float, ...] | None]:
    """traiNNer-redux's ``resize_mode_list*`` and ``resize_mode_prob*`` checked (weights default to equal ones);
    ``(None, None)`` when no list is given (BasicSR's modes)."""
    if modes is None:
        if weights is not None:
            raise OptionError(f"{fn}: resize_mode_prob needs the {name} it weighs")
        return None, None
    modes = tuple(str(m) for m in modes)
    bad = [m for m in modes if m not in TRAINNER_RESIZE_MODES]
    if not modes or bad:
        raise OptionError(f"{fn}: {name} must list modes of {', '.join(TRAINNER_RESIZE_MODES)}, got {list(modes)}")
    probs = tuple(1.0 for _ in modes) if weights is None else tuple(float(p) for p in weights)
    if len(probs) != len(modes) or any(not math.isfinite(p) or p < 0 for p in probs) or sum(probs) <= 0:
        raise OptionError(f"{fn}: the weights of {name} must be {len(modes)} non-negative numbers with a "
                          f"positive sum, got {list(probs)}")
    return modes, probs


@dataclass(frozen=True)
class SynthesisSettings:
    """The model-side Real-ESRGAN settings (top-level option keys, BasicSR's names).

    ``first`` / ``second``: the two stages (``resize_prob``, ``resize_range``, ``gaussian_noise_prob``,
    ``noise_range``, ``poisson_scale_range``, ``gray_noise_prob``, ``jpeg_range`` and their ``*2`` twins);
    ``gt_size``: the GT crop taken after the degradation.
    """

    scale: int
    gt_size: int
    first: DegradeStage
    second: DegradeStage
    second_blur_prob: float
    # traiNNer-redux's keys (their defaults keep BasicSR's pipeline): the first blur's chance, the final resize's
    # filters, the ThickLines chance, and lq_usm (None: the model decides whether the degradation starts from the
    # USM-sharpened GT, as BasicSR; true / false: a USM of a radius drawn from lq_usm_radius_range, or none).
    blur_prob: float = 1.0
    resize_mode_list3: tuple[str, ...] | None = None
    resize_mode_prob3: tuple[float, ...] | None = None
    thicklines_prob: float = 0.0
    lq_usm: bool | None = None
    lq_usm_radius_range: tuple[int, int] = (1, 25)

    def __post_init__(self) -> None:
        fn = "SynthesisSettings"
        modes, weights = check_resize_modes(self.resize_mode_list3, self.resize_mode_prob3, fn, "resize_mode_list3")
        object.__setattr__(self, "resize_mode_list3", modes)
        object.__setattr__(self, "resize_mode_prob3", weights)
        for name in ("second_blur_prob", "blur_prob", "thicklines_prob"):
            if not 0.0 <= float(getattr(self, name)) <= 1.0:
                raise OptionError(f"{fn}: {name} must be a probability in [0, 1], got {getattr(self, name)!r}")
        lo, hi = (int(v) for v in self.lq_usm_radius_range)
        if not 1 <= lo <= hi:
            raise OptionError(f"{fn}: lq_usm_radius_range must be [min, max] with 1 <= min <= max, got "
                              f"{list(self.lq_usm_radius_range)}")
        object.__setattr__(self, "lq_usm_radius_range", (lo, hi))

    @classmethod
    def from_options(cls, opt: Mapping[str, Any]) -> SynthesisSettings:
        """From validated options (the schema filled and checked every key for the Real-ESRGAN models)."""
        plain = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in opt.items()
                 if not isinstance(v, Mapping)}
        extra: dict[str, Any] = {}
        for key in ("blur_prob", "thicklines_prob"):
            if plain.get(key) is not None:
                extra[key] = float(plain[key])
        for key in ("resize_mode_list3", "resize_mode_prob3", "lq_usm"):
            if plain.get(key) is not None:
                extra[key] = plain[key]
        if plain.get("lq_usm_radius_range") is not None:
            extra["lq_usm_radius_range"] = tuple(plain["lq_usm_radius_range"])
        return cls(int(opt["scale"]), int(opt["gt_size"]), DegradeStage.from_basicsr(plain, 1),
                   DegradeStage.from_basicsr(plain, 2), float(opt["second_blur_prob"]), **extra)


@dataclass(frozen=True)
class BatchChoices:
    """The per-batch draws: stage resizes (``updown``, ``scale``, ``mode``), noise kind (``gaussian``), the second
    blur, the final order (``sinc_first``) and mode, and the crop origin (``top``, ``left`` in LQ pixels)."""

    updown1: str
    scale1: float
    mode1: str
    gaussian1: bool
    second_blur: bool
    updown2: str
    scale2: float
    mode2: str
    gaussian2: bool
    sinc_first: bool
    final_mode: str
    top: int
    left: int
    # traiNNer-redux's coins (drawn after BasicSR's draws, so that those stay the same): first blur, both JPEG
    # steps, ThickLines, and the LQ USM radius (0: none).
    blur1: bool = True
    jpeg1: bool = True
    jpeg2: bool = True
    thick: bool = False
    usm_radius: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SampleDraws:
    """Per-sample draws (one entry per sample): noise level (sigma on the 0-255 scale, or Poisson scale: which one
    the batch's ``gaussian`` choice decides), gray noise, JPEG quality, for both stages; and the seed of the noise
    fields' generator."""

    level1: tuple[float, ...]
    gray1: tuple[bool, ...]
    quality1: tuple[float, ...]
    level2: tuple[float, ...]
    gray2: tuple[bool, ...]
    quality2: tuple[float, ...]
    field_seeds: tuple[int, ...]


def step_rng(seed: int, iteration: int, micro: int) -> np.random.Generator:
    """The host generator of the batch choices of micro-batch ``micro`` of training iteration ``iteration``."""
    return np.random.default_rng([int(seed), _TAG_STEP, int(iteration), int(micro)])


def pool_rng(seed: int, iteration: int, micro: int) -> np.random.Generator:
    """The host generator of the pool's picks at that micro-batch (the same on every rank)."""
    return np.random.default_rng([int(seed), _TAG_POOL, int(iteration), int(micro)])


def sample_batch_rng(sample_seed: int) -> np.random.Generator:
    """The batch choices of a sample degraded on its own (in the loader workers)."""
    return np.random.default_rng([int(sample_seed), _TAG_SAMPLE_BATCH])


def _resize_draw(rng: np.random.Generator, stage: DegradeStage) -> tuple[str, float, str]:
    updown = _UPDOWN[categorical(rng, stage.resize_prob)]
    if updown == "up":
        s = float(rng.uniform(1.0, stage.resize_range[1]))
    elif updown == "down":
        s = float(rng.uniform(stage.resize_range[0], 1.0))
    else:
        s = 1.0
    return updown, s, _mode_draw(rng, stage.resize_mode_list, stage.resize_mode_prob)


def _mode_draw(rng: np.random.Generator, modes: tuple[str, ...] | None, weights: tuple[float, ...] | None) -> str:
    if modes is None:
        return RESIZE_MODES[int(rng.integers(len(RESIZE_MODES)))]
    assert weights is not None
    return modes[categorical(rng, weights)]


def draw_batch_choices(rng: np.random.Generator, settings: SynthesisSettings,
                       size: tuple[int, int]) -> BatchChoices:
    """Draw a batch's choices from ``rng`` in BasicSR's order; ``size``: the (H, W) of the GT being degraded.

    Stage 1 resize (kind by ``resize_prob``, scale uniform in [low, 1] or [1, high], mode uniform over
    area/bilinear/bicubic, or weighted by ``resize_mode_prob`` over ``resize_mode_list``), Gaussian with
    ``gaussian_noise_prob``; second blur with ``second_blur_prob``; stage 2 likewise; the final order (resize back
    + sinc first with probability 1/2) and mode; the crop origin. Then traiNNer-redux's coins: first blur
    (``blur_prob``), JPEG of each stage (``jpeg_prob``, ``jpeg_prob2``), ThickLines (``thicklines_prob``) and the
    LQ USM radius (uniform in ``lq_usm_radius_range``), always drawn so the sequence does not depend on them.
    """
    u1, s1, m1 = _resize_draw(rng, settings.first)
    g1 = bool(rng.random() < settings.first.gaussian_noise_prob)
    blur2 = bool(rng.random() < settings.second_blur_prob)
    u2, s2, m2 = _resize_draw(rng, settings.second)
    g2 = bool(rng.random() < settings.second.gaussian_noise_prob)
    sinc_first = bool(rng.random() < 0.5)
    final_mode = _mode_draw(rng, settings.resize_mode_list3, settings.resize_mode_prob3)
    h, w = (v // settings.scale for v in size)
    p = lq_patch_size(settings.gt_size, settings.scale)
    if h < p or w < p:
        raise DataError(f"the degraded image is {h}x{w} (LQ pixels), smaller than the {p}x{p} LQ crop (gt_size "
                        f"{settings.gt_size} / scale {settings.scale}); raise crop_pad_size or lower gt_size")
    top, left = int(rng.integers(0, h - p + 1)), int(rng.integers(0, w - p + 1))
    blur1 = bool(rng.random() < settings.blur_prob)
    jpeg1 = bool(rng.random() < settings.first.jpeg_prob)
    jpeg2 = bool(rng.random() < settings.second.jpeg_prob)
    thick = bool(rng.random() < settings.thicklines_prob)
    lo, hi = settings.lq_usm_radius_range
    radius = int(rng.integers(lo, hi + 1))
    return BatchChoices(u1, s1, m1, g1, blur2, u2, s2, m2, g2, sinc_first, final_mode, top, left, blur1, jpeg1,
                        jpeg2, thick, radius if settings.lq_usm else 0)


def draw_samples(seeds: Sequence[int], settings: SynthesisSettings) -> SampleDraws:
    """Each sample's values from its own seed: six uniforms (level, gray, quality of each stage) and a field seed.

    The draws do not depend on the batch's choices: a level is ``low + u * (high - low)`` of the noise range the
    batch picks (``noise_range`` for Gaussian, ``poisson_scale_range`` for Poisson noise).
    """
    cols: list[list[float]] = [[] for _ in range(6)]
    fields: list[int] = []
    for s in seeds:
        rng = np.random.default_rng([int(s), _TAG_SAMPLE])
        for col, u in zip(cols, rng.random(6)):
            col.append(float(u))
        fields.append(int(rng.integers(0, 2**62)))
    st1, st2 = settings.first, settings.second

    def scaled(us: list[float], lo_hi: tuple[float, float]) -> tuple[float, ...]:
        return tuple(lo_hi[0] + u * (lo_hi[1] - lo_hi[0]) for u in us)

    return SampleDraws(tuple(cols[0]), tuple(u < st1.gray_noise_prob for u in cols[1]),
                       scaled(cols[2], st1.jpeg_range), tuple(cols[3]),
                       tuple(u < st2.gray_noise_prob for u in cols[4]), scaled(cols[5], st2.jpeg_range),
                       tuple(fields))


def sample_generator(device: torch.device) -> torch.Generator:
    """A generator on ``device`` where the backend has device generators, else a CPU one (fields are uploaded)."""
    try:
        return torch.Generator(device=device)
    except RuntimeError:
        return torch.Generator()


def _add_noise(x: Tensor, gaussian: bool, level_u: Sequence[float], gray: Sequence[bool], stage: DegradeStage,
               gens: Sequence[torch.Generator]) -> Tensor:
    lo, hi = stage.noise_range if gaussian else stage.poisson_scale_range
    levels = [lo + u * (hi - lo) for u in level_u]
    add = gaussian_noise_per_sample if gaussian else poisson_noise_per_sample
    noise = add(x, levels, gray, gens)
    return torch.clamp(x + noise, 0, 1)


# ------------------------------------------------------------------------------------------------ the pipeline
def degrade(src: Tensor, kernel1: Tensor, kernel2: Tensor, sinc_kernel: Tensor, choices: BatchChoices,
            draws: SampleDraws, settings: SynthesisSettings, gens: Sequence[torch.Generator],
            jpeger: DiffJPEG) -> Tensor:
    """The LQ batch (``scale`` times smaller, rounded to 8-bit levels) of ``src`` (B, 3, H, W) in [0, 1].

    BasicSR's ``feed_data`` steps: blur (kernel1), resize, noise, JPEG; blur (kernel2, if chosen), resize to
    (H / scale, W / scale) times the stage-2 scale, noise; then [resize to (H / scale, W / scale) + sinc filter]
    and JPEG in the chosen order. traiNNer-redux's additions, as the choices say: ThickLines first, the first blur
    and each JPEG step only on their coins, and the resize filters of ``resize_mode_list*`` (by
    :func:`~anysr.ops.degradation.resize_filtered`). ``gens[j]`` draws sample j's noise fields (re-seed them
    first). Autocast off.
    """
    b, _, h, w = src.shape
    if len(gens) != b or len(draws.field_seeds) != b:
        raise DataError(f"degrade: {len(gens)} generators and {len(draws.field_seeds)} draws for a batch of {b}")
    s = settings.scale
    dev = src.device
    q1 = torch.tensor(draws.quality1, dtype=torch.float32).to(dev)
    q2 = torch.tensor(draws.quality2, dtype=torch.float32).to(dev)
    filtered = (settings.first.resize_mode_list is not None, settings.second.resize_mode_list is not None,
                settings.resize_mode_list3 is not None)

    def sized(x: Tensor, stage: int, mode: str, **how: Any) -> Tensor:
        return (resize_filtered if filtered[stage] else resize)(x, mode, **how)

    with autocast_off(src):
        out = thick_lines(src) if choices.thick else src
        if choices.blur1:
            out = filter2d(out, kernel1)
        if choices.updown1 != "keep":
            out = sized(out, 0, choices.mode1, scale_factor=choices.scale1)
        out = _add_noise(out, choices.gaussian1, draws.level1, draws.gray1, settings.first, gens)
        if choices.jpeg1:
            out = jpeger(out.clamp(0, 1), q1)
        if choices.second_blur:
            out = filter2d(out, kernel2)
        size = (int(h / s * choices.scale2), int(w / s * choices.scale2))
        out = sized(out, 1, choices.mode2, size=size)
        out = _add_noise(out, choices.gaussian2, draws.level2, draws.gray2, settings.second, gens)
        target = (h // s, w // s)
        if choices.sinc_first:
            out = filter2d(sized(out, 2, choices.final_mode, size=target), sinc_kernel)
            if choices.jpeg2:
                out = jpeger(out.clamp(0, 1), q2)
        else:
            if choices.jpeg2:
                out = jpeger(out.clamp(0, 1), q2)
            out = filter2d(sized(out, 2, choices.final_mode, size=target), sinc_kernel)
        return clamp_round(out)


@functools.lru_cache(maxsize=32)
def lq_usm_sharpener(radius: int) -> USMSharp:
    """The unsharp mask of ``lq_usm`` for ``radius`` (made odd; sigma from the size, as OpenCV's sigma 0 does).
    Its blur moves its taps to the input's device itself, so one CPU module serves every device."""
    return USMSharp(radius)


def crop_pair(lq: Tensor, gts: Sequence[Tensor], top: int, left: int, gt_size: int,
              scale: int) -> tuple[Tensor, list[Tensor]]:
    """The ``gt_size // scale`` LQ patch at (top, left) and the ``gt_size`` patches of ``gts`` that pair with it."""
    p = lq_patch_size(gt_size, scale)
    t, lft = top * scale, left * scale
    return (lq[..., top: top + p, left: left + p],
            [g[..., t: t + gt_size, lft: lft + gt_size] for g in gts])


def synthesise(gt: Tensor, kernels: Sequence[Tensor], *, settings: SynthesisSettings, choices: BatchChoices,
               seeds: Sequence[int], gens: Sequence[torch.Generator], usm: USMSharp, jpeger: DiffJPEG,
               sharpen_input: bool, keep_sharpened: bool) -> dict[str, Any]:
    """One training pair batch: ``lq`` (B, 3, p, p) and ``gt`` (B, 3, gt_size, gt_size), plus what was drawn.

    ``gt`` (B, 3, H, W) in [0, 1] is degraded as it is, or USM-sharpened first (``sharpen_input``: Real-ESRGAN
    always, RealESRNet with ``gt_usm``); the returned ``gt`` is the crop of the raw image, or of the sharpened one
    with ``keep_sharpened`` (RealESRNet's target). The generators are re-seeded from the samples' seeds here.
    """
    draws = draw_samples(seeds, settings)
    for g, fs in zip(gens, draws.field_seeds):
        g.manual_seed(fs)
    with torch.no_grad(), autocast_off(gt):
        if settings.lq_usm is None:  # BasicSR: the model says whether the degradation starts from the sharpened GT
            src = usm(gt) if sharpen_input else gt
            keep = src if keep_sharpened else gt
        else:  # traiNNer-redux: lq_usm decides (a drawn radius); the target is the GT unless the model sharpens it
            src = lq_usm_sharpener(choices.usm_radius)(gt) if choices.usm_radius else gt
            keep = usm(gt) if keep_sharpened else gt
        lq = degrade(src, *kernels, choices=choices, draws=draws, settings=settings, gens=gens, jpeger=jpeger)
        lq, (gt_out,) = crop_pair(lq, [keep], choices.top, choices.left, settings.gt_size, settings.scale)
    return {"lq": lq.contiguous(), "gt": gt_out.contiguous(), "choices": choices, "draws": draws}


class LoaderSynthesis:
    """Real-ESRGAN synthesis of one sample at a time, in the DataLoader workers (on the CPU).

    Every sample is a batch of one: its choices come from its own seed (:func:`sample_batch_rng`), so batches mix
    degradations as the pool makes them do; its values and fields from its seed as in the training step.
    Picklable (spawned workers get a copy).
    """

    def __init__(self, settings: SynthesisSettings, *, sharpen_input: bool, keep_sharpened: bool) -> None:
        self.settings = settings
        self.sharpen_input = bool(sharpen_input)
        self.keep_sharpened = bool(keep_sharpened)
        self.usm = USMSharp()
        self.jpeger = DiffJPEG(differentiable=False)

    def __call__(self, gt: Tensor, kernels: Sequence[Tensor], seed: int) -> dict[str, Any]:
        """``gt`` (3, H, W) and (k, k) kernels of one sample -> its ``lq`` (3, p, p) and ``gt`` crop, and draws."""
        choices = draw_batch_choices(sample_batch_rng(seed), self.settings, tuple(gt.shape[-2:]))  # type: ignore
        out = synthesise(gt[None], [k[None] for k in kernels], settings=self.settings, choices=choices,
                         seeds=[seed], gens=[torch.Generator()], usm=self.usm, jpeger=self.jpeger,
                         sharpen_input=self.sharpen_input, keep_sharpened=self.keep_sharpened)
        return {**out, "lq": out["lq"][0], "gt": out["gt"][0]}

