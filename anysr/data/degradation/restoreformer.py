"""RestoreFormer++'s face degradation (Wang et al., TPAMI 2023; its ``FFHQUnevenDegradationDataset``) and the
augmentations of its HQ-dictionary set (``FFHQAugDataset``): settings, counter-based draws and the pipeline.

On top of GFPGAN's degradation (:mod:`anysr.data.degradation.gfpgan`), in the authors' order:

* **exposure** (``exposure_prob``, ``exposure_range``): the GT itself is multiplied by a factor (not clipped), so the
  LQ is made from the exposed face and the target is it too;
* **shift** (``shift_prob``, ``shift_unit``, ``shift_max_num``): the GT is padded symmetrically (edge pixel repeated,
  NumPy's ``symmetric``) by ``shift_unit * shift_max_num`` on every side and cropped back at ``shift_unit`` times two
  integers uniform in ``[0, 2 * shift_max_num]``: a move of up to ``shift_unit * shift_max_num`` pixels each way;
  the facial component boxes move with it;
* **uneven degradation** (``uneven_prob``): two independent GFPGAN branches (each its own kernel size, kernel, haze,
  factor, noise and JPEG quality) and a square of the first pasted into the second. The authors draw the square's
  side in [128, 256] for their 512-pixel faces; here in ``[out_size // 4, out_size // 2]`` (the same at 512, and
  smaller faces work);
* **haze** (``hazy_prob``, ``hazy_alpha``): after the blur of a branch, ``lq * alpha + (1 - alpha)``;
* **blur kernel size**: ``blur_kernel_size`` may be the authors' ``[low, high]``: the size is ``2 k + 1`` with ``k``
  uniform in ``[low, high]`` per branch (their ``[19, 20]``: 39 or 41); an int is one odd size (GFPGAN's).

Every value is drawn from the sample's counter-based seed (:func:`draw_uneven_degradation`), coins and values whether
or not their step is on, so the pairs do not depend on the worker count, the rank split or the resume point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from torch import Tensor

from anysr.data.degradation.draws import check_range
from anysr.data.degradation.gfpgan import (
    JITTERS,
    FaceDegradationSettings,
    draw_face_finish,
    finish_face,
    resample_face,
)
from anysr.data.degradation.kernels import KernelParams, draw_mixed_kernel_params, make_kernel
from anysr.errors import DataError, OptionError

__all__ = ["UnevenDegradationSettings", "BranchDraws", "UnevenDegradationDraws", "FaceAugmentDraws",
           "draw_uneven_degradation", "draw_face_augment", "expose_and_shift", "degrade_uneven", "augment_gray",
           "patch_range"]

_Range = tuple[float, float]
_FN = "UnevenDegradationSettings"


def _prob(value: float | None, name: str) -> float | None:
    if value is not None and not 0.0 <= float(value) <= 1.0:
        raise OptionError(f"{_FN}: {name} must be a probability in [0, 1] or null, got {value!r}")
    return None if value is None else float(value)


def patch_range(out_size: int) -> tuple[int, int]:
    """The side range of the uneven square for ``out_size`` faces (the authors' [128, 256] at 512)."""
    return max(1, out_size // 4), max(1, out_size // 2)


@dataclass(frozen=True)
class UnevenDegradationSettings:
    """RestoreFormer++'s keys beyond GFPGAN's (``face``: GFPGAN's settings; its ``blur_kernel_size`` is unused when
    ``kernel_sizes`` is set). Defaults: the authors' ``RestoreFormerPlusPlus.yaml`` ranges, every step off."""

    face: FaceDegradationSettings = FaceDegradationSettings()
    kernel_sizes: tuple[int, int] | None = None  # blur_kernel_size [low, high]: sizes 2k + 1
    exposure_prob: float | None = None
    exposure_range: _Range = (0.7, 1.1)
    shift_prob: float | None = None
    shift_unit: int = 32
    shift_max_num: int = 3
    uneven_prob: float | None = None
    hazy_prob: float | None = None
    hazy_alpha: _Range = (0.75, 0.95)

    def __post_init__(self) -> None:
        put = object.__setattr__
        if self.kernel_sizes is not None:
            lo, hi = (int(v) for v in self.kernel_sizes)
            if not 0 <= lo <= hi:
                raise OptionError(f"{_FN}: blur_kernel_size [low, high] needs 0 <= low <= high (sizes 2k + 1), got "
                                  f"{list(self.kernel_sizes)}")
            put(self, "kernel_sizes", (lo, hi))
        for name in ("exposure_prob", "shift_prob", "uneven_prob", "hazy_prob"):
            put(self, name, _prob(getattr(self, name), name))
        put(self, "exposure_range", check_range(self.exposure_range, _FN, "exposure_range"))
        put(self, "hazy_alpha", check_range(self.hazy_alpha, _FN, "hazy_alpha"))
        if self.exposure_range[0] < 0:
            raise OptionError(f"{_FN}: exposure_range factors must be >= 0, got {self.exposure_range}")
        if not 0 <= self.hazy_alpha[0] <= self.hazy_alpha[1] <= 1:
            raise OptionError(f"{_FN}: hazy_alpha must lie in [0, 1], got {self.hazy_alpha}")
        for name in ("shift_unit", "shift_max_num"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 0:
                raise OptionError(f"{_FN}: {name} must be an integer >= 0, got {value!r}")
            put(self, name, int(value))

    @classmethod
    def from_options(cls, opt: Mapping[str, Any]) -> UnevenDegradationSettings:
        """The settings of a validated ``FFHQUnevenDegradationDataset`` / ``FFHQAugDataset`` section."""
        size = opt["blur_kernel_size"]  # the options filled it (GFPGAN's 41 unless given)
        ranged = isinstance(size, (list, tuple))
        face = None
        if opt.get("downsample_range") is not None:  # a degradation set (FFHQAugDataset has no GFPGAN keys)
            face_opt = {**opt, "blur_kernel_size": 2 * int(size[1]) + 1 if ranged else size}
            face = FaceDegradationSettings.from_options(face_opt)
        own = {name: opt[name] for name in ("exposure_prob", "shift_prob", "uneven_prob", "hazy_prob") if name in opt}
        own.update({name: opt[name] for name in ("exposure_range", "shift_unit", "shift_max_num", "hazy_alpha")
                    if opt.get(name) is not None})
        return cls(face=face or FaceDegradationSettings(), kernel_sizes=tuple(size) if ranged else None, **own)

    @property
    def shift_pad(self) -> int:
        """The symmetric padding of the shift (the largest move)."""
        return self.shift_unit * self.shift_max_num


@dataclass(frozen=True)
class BranchDraws:
    """One GFPGAN branch: its kernel (size included), haze ``alpha`` (None: no haze), factor, noise level and field
    seed, JPEG quality (None when the step is off)."""

    kernel: KernelParams
    haze: float | None
    scale: float
    noise_sigma: float | None
    noise_seed: int
    jpeg_quality: int | None


@dataclass(frozen=True)
class FaceAugmentDraws:
    """The GT's augmentation: ``exposure`` factor (None: none), ``shift`` (vertical, horizontal) steps of
    ``shift_unit`` in ``[0, 2 * shift_max_num]`` (None: none; ``shift_max_num`` steps is no move)."""

    hflip: bool
    exposure: float | None
    shift: tuple[int, int] | None


@dataclass(frozen=True)
class UnevenDegradationDraws:
    """A sample's recipe: the GT's augmentation, one branch (or two: uneven), the pasted square ``(side, top,
    left)`` of the first branch (None unless uneven), then GFPGAN's colour shift, gray and jitter."""

    augment: FaceAugmentDraws
    branches: tuple[BranchDraws, ...]
    patch: tuple[int, int, int] | None
    color_shift: tuple[float, float, float] | None
    gray: bool
    jitter: tuple[tuple[str, float], ...] | None

    @property
    def hflip(self) -> bool:
        return self.augment.hflip

    def as_dict(self) -> dict[str, Any]:
        """The recipe as plain data (JSON-ready; what ``anysr prepare degrade`` writes)."""
        def kernel(k: KernelParams) -> dict[str, Any]:
            return {n: v for n, v in vars(k).items() if not (isinstance(v, float) and math.isnan(v))}
        a = self.augment
        return {"hflip": a.hflip, "exposure": a.exposure, "shift": None if a.shift is None else list(a.shift),
                "branches": [{"kernel": kernel(b.kernel), "haze": b.haze, "scale": b.scale,
                              "noise_sigma": b.noise_sigma, "noise_seed": b.noise_seed,
                              "jpeg_quality": b.jpeg_quality} for b in self.branches],
                "patch": None if self.patch is None else list(self.patch),
                "color_shift": None if self.color_shift is None else list(self.color_shift), "gray": self.gray,
                "jitter": None if self.jitter is None else [[n, f] for n, f in self.jitter]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> UnevenDegradationDraws:
        """The recipe :meth:`as_dict` wrote (or one written by hand, e.g. a test's fixed draws)."""
        bad = [n for n, _ in d.get("jitter") or () if n not in JITTERS]
        if bad:
            raise OptionError(f"UnevenDegradationDraws: unknown jitter(s) {bad}; choose from {list(JITTERS)}")
        branches = d["branches"]
        if len(branches) not in (1, 2) or (len(branches) == 2) != (d.get("patch") is not None):
            raise OptionError("UnevenDegradationDraws: give one branch, or two with a patch [side, top, left]")
        opt = lambda v, t: None if v is None else t(v)  # noqa: E731
        shift, cs, jitter, patch = d.get("shift"), d.get("color_shift"), d.get("jitter"), d.get("patch")
        return cls(
            augment=FaceAugmentDraws(bool(d["hflip"]), opt(d.get("exposure"), float),
                                     None if shift is None else (int(shift[0]), int(shift[1]))),
            branches=tuple(BranchDraws(KernelParams(**b["kernel"]), opt(b.get("haze"), float), float(b["scale"]),
                                       opt(b.get("noise_sigma"), float), int(b["noise_seed"]),
                                       opt(b.get("jpeg_quality"), int)) for b in branches),
            patch=None if patch is None else (int(patch[0]), int(patch[1]), int(patch[2])),
            color_shift=None if cs is None else (float(cs[0]), float(cs[1]), float(cs[2])),
            gray=bool(d["gray"]),
            jitter=None if jitter is None else tuple((str(n), float(f)) for n, f in jitter))


def draw_face_augment(rng: np.random.Generator, settings: UnevenDegradationSettings, *,
                      use_hflip: bool) -> FaceAugmentDraws:
    """Flip coin, exposure coin and factor, shift coin and its two step counts (vertical first), drawn always."""
    s = settings
    flip = bool(rng.random() < 0.5) and use_hflip
    exposure_coin, exposure = rng.random(), float(rng.uniform(*s.exposure_range))
    shift_coin = rng.random()
    steps = rng.integers(0, 2 * s.shift_max_num + 1, 2)
    return FaceAugmentDraws(
        hflip=flip,
        exposure=exposure if s.exposure_prob is not None and exposure_coin < s.exposure_prob else None,
        shift=(int(steps[0]), int(steps[1])) if s.shift_prob is not None and shift_coin < s.shift_prob else None)


def _draw_branch(rng: np.random.Generator, s: UnevenDegradationSettings) -> BranchDraws:
    f = s.face
    size = f.blur_kernel_size if s.kernel_sizes is None else 2 * int(rng.integers(s.kernel_sizes[0],
                                                                                   s.kernel_sizes[1] + 1)) + 1
    kernel = draw_mixed_kernel_params(rng, f.kernel_list, f.kernel_prob, size, f.blur_sigma, f.blur_sigma,
                                      (-math.pi, math.pi))
    haze_coin, alpha = rng.random(), float(rng.uniform(*s.hazy_alpha))
    scale = float(rng.uniform(*f.downsample_range))
    sigma = float(rng.uniform(*(f.noise_range or (0.0, 1.0))))
    noise_seed = int(rng.integers(0, 2**63))
    quality = int(np.rint(rng.uniform(*(f.jpeg_range or (0.0, 1.0)))))
    return BranchDraws(kernel=kernel, haze=alpha if s.hazy_prob is not None and haze_coin < s.hazy_prob else None,
                       scale=scale, noise_sigma=sigma if f.noise_range is not None else None, noise_seed=noise_seed,
                       jpeg_quality=quality if f.jpeg_range is not None else None)


def draw_uneven_degradation(rng: np.random.Generator, settings: UnevenDegradationSettings, out_size: int, *,
                            use_hflip: bool) -> UnevenDegradationDraws:
    """Draw one recipe from ``rng`` in a fixed order: the GT's augmentation (:func:`draw_face_augment`), the uneven
    coin, two branches (kernel size, kernel, haze coin and alpha, factor, noise level and seed, JPEG quality), the
    square (side in :func:`patch_range`, top, left), then GFPGAN's colour shift, gray and jitter draws."""
    s = settings
    augment = draw_face_augment(rng, s, use_hflip=use_hflip)
    uneven_coin = rng.random()
    uneven = s.uneven_prob is not None and bool(uneven_coin < s.uneven_prob)
    branches = (_draw_branch(rng, s), _draw_branch(rng, s))
    lo, hi = patch_range(out_size)
    side = int(rng.integers(lo, hi + 1))
    top, left = (int(v) for v in rng.integers(0, max(0, out_size - side) + 1, 2))
    color_shift, gray, jitter = draw_face_finish(rng, s.face)
    return UnevenDegradationDraws(augment=augment, branches=branches if uneven else branches[:1],
                                  patch=(side, top, left) if uneven else None, color_shift=color_shift, gray=gray,
                                  jitter=jitter)


def expose_and_shift(gt: np.ndarray, draws: FaceAugmentDraws, settings: UnevenDegradationSettings) -> np.ndarray:
    """The GT's exposure (a factor, not clipped) and shift (symmetric padding, then the crop), on an HWC float32
    image already flipped as ``draws.hflip`` says."""
    if draws.exposure is not None:
        gt = gt * np.float32(draws.exposure)
    if draws.shift is not None:
        h, w = gt.shape[:2]
        pad = settings.shift_pad
        padded = np.pad(gt, ((pad, pad), (pad, pad), (0, 0)), mode="symmetric")
        top, left = (settings.shift_unit * n for n in draws.shift)
        gt = np.ascontiguousarray(padded[top:top + h, left:left + w])
    return gt


def _branch(gt: np.ndarray, b: BranchDraws) -> np.ndarray:
    lq = cv2.filter2D(gt, -1, make_kernel(b.kernel))
    if b.haze is not None:
        lq = lq * np.float32(b.haze) + np.float32(1 - b.haze)
    return resample_face(lq, b.scale, b.noise_sigma, b.noise_seed, b.jpeg_quality)


def degrade_uneven(gt: np.ndarray, draws: UnevenDegradationDraws, settings: UnevenDegradationSettings) -> tuple[
        Tensor, Tensor]:
    """Apply ``draws`` to ``gt`` (HWC float32 BGR, flipped, exposed and shifted: :func:`expose_and_shift`).

    Returns ``(lq, gt)`` as CHW float32 RGB tensors of ``gt``'s size: the LQ on 8-bit levels, the GT as given (or
    its gray image, with ``gray`` and ``gt_gray``)."""
    if gt.ndim != 3 or gt.shape[2] != 3 or gt.dtype != np.float32:
        raise DataError(f"degrade_uneven: expected an HWC float32 BGR image, got {gt.dtype} of shape {gt.shape}")
    lq = _branch(gt, draws.branches[0])
    if draws.patch is not None:
        side, top, left = draws.patch
        rest = _branch(gt, draws.branches[1])
        rest[top:top + side, left:left + side] = lq[top:top + side, left:left + side]
        lq = rest
    return finish_face(lq, gt, draws.color_shift, draws.gray, settings.face.gt_gray, draws.jitter)


def augment_gray(gt: np.ndarray) -> np.ndarray:
    """FFHQAugDataset's gray GT (OpenCV's BGR -> gray, repeated to three channels)."""
    return np.repeat(cv2.cvtColor(gt, cv2.COLOR_BGR2GRAY)[:, :, None], 3, axis=2)

