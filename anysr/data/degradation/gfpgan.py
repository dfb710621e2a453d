"""GFPGAN's face degradation (Wang et al., CVPR 2021; the LQ of its ``FFHQDegradationDataset``): settings,
counter-based draws and the pipeline, run in the DataLoader workers.

Two halves, so that a test or ``anysr prepare degrade`` can pass or show a recipe:

* **The draws** (:func:`draw_face_degradation`): from a ``numpy.random.Generator`` keyed by the sample's seed, the
  whole recipe as a record (:class:`FaceDegradationDraws`): the flip, one blur kernel of BasicSR's
  ``random_mixed_kernels`` (``kernel_list`` / ``kernel_prob``, both sigmas in ``blur_sigma``, rotation in
  [-pi, pi]), the downsampling factor, the noise level and the seed of its field, the JPEG quality, the colour shift,
  the gray coin and the torchvision colour jitter (its order and factors). The same seed gives the same record.
* **The pipeline** (:func:`degrade_face`): the record applied to a float BGR face in [0, 1], with the calls GFPGAN
  makes: OpenCV ``filter2D`` (reflect-101 borders), ``resize`` (bilinear) to ``floor(side / factor)``, Gaussian noise
  (0-255 scale, one field per channel, clipped), the OpenCV JPEG codec, ``resize`` back; then on the LQ only a shift
  of each channel (``color_jitter_shift`` on the 0-255 scale), gray (the GT too with ``gt_gray``), torchvision's
  brightness / contrast / saturation / hue adjustments (:mod:`anysr.ops.color`) and rounding to 8-bit levels.

A JPEG quality is a uniform draw from ``jpeg_range`` rounded to the nearest integer: GFPGAN passes the float to
OpenCV, whose Python bindings of its time rounded it (``saturate_cast<int>``; OpenCV 5 refuses a float). A range key
set to null skips its step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor

from anysr.data.degradation.draws import check_range
from anysr.data.degradation.jpeg import jpeg_cv2
from anysr.data.degradation.kernels import (
    KernelParams,
    check_kernel_list,
    check_odd_size,
    draw_mixed_kernel_params,
    make_kernel,
)
from anysr.errors import DataError, OptionError
from anysr.ops.color import adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation
from anysr.ops.image import img2tensor

__all__ = ["JITTERS", "FaceDegradationSettings", "FaceDegradationDraws", "draw_face_degradation", "degrade_face",
           "draw_face_finish", "resample_face", "finish_face"]

JITTERS = ("brightness", "contrast", "saturation", "hue")  # torchvision's colour jitter, in its index order
_ADJUST = {"brightness": adjust_brightness, "contrast": adjust_contrast, "saturation": adjust_saturation,
           "hue": adjust_hue}
_Range = tuple[float, float]


def _range(value: Sequence[float] | None, name: str) -> _Range | None:
    return None if value is None else check_range(value, "FaceDegradationSettings", name)


def _prob(value: float | None, name: str) -> float | None:
    if value is not None and not 0.0 <= float(value) <= 1.0:
        raise OptionError(f"FaceDegradationSettings: {name} must be a probability in [0, 1] or null, got {value!r}")
    return None if value is None else float(value)


@dataclass(frozen=True)
class FaceDegradationSettings:
    """GFPGAN's degradation keys; the defaults are those of its ``train_gfpgan_v1.yml`` for the keys its dataset
    requires, and its code's defaults for the others (colour jitter and gray off). A null range skips its step."""

    kernel_list: tuple[str, ...] = ("iso", "aniso")
    kernel_prob: tuple[float, ...] = (0.5, 0.5)
    blur_kernel_size: int = 41
    blur_sigma: _Range = (0.1, 10.0)
    downsample_range: _Range = (0.8, 8.0)
    noise_range: _Range | None = (0.0, 20.0)
    jpeg_range: _Range | None = (60.0, 100.0)
    color_jitter_prob: float | None = None
    color_jitter_shift: float = 20.0
    color_jitter_pt_prob: float | None = None
    brightness: _Range | None = (0.5, 1.5)
    contrast: _Range | None = (0.5, 1.5)
    saturation: _Range | None = (0.0, 1.5)
    hue: _Range | None = (-0.1, 0.1)
    gray_prob: float | None = None
    gt_gray: bool = False

    def __post_init__(self) -> None:
        fn = "FaceDegradationSettings"
        put = object.__setattr__
        put(self, "kernel_list", tuple(str(k) for k in self.kernel_list))
        put(self, "kernel_prob", tuple(float(p) for p in self.kernel_prob))
        check_kernel_list(self.kernel_list, self.kernel_prob, fn)
        put(self, "blur_kernel_size", check_odd_size(self.blur_kernel_size, fn, "blur_kernel_size"))
        for name in ("blur_sigma", "downsample_range", "noise_range", "jpeg_range", *JITTERS):
            put(self, name, _range(getattr(self, name), name))
        if self.blur_sigma[0] <= 0 or self.downsample_range[0] <= 0:
            raise OptionError(f"{fn}: blur_sigma and downsample_range must be positive, got {self.blur_sigma} and "
                              f"{self.downsample_range}")
        if self.noise_range is not None and self.noise_range[0] < 0:
            raise OptionError(f"{fn}: noise_range must be >= 0, got {self.noise_range}")
        if self.jpeg_range is not None and not 0 <= self.jpeg_range[0] <= self.jpeg_range[1] <= 100:
            raise OptionError(f"{fn}: jpeg_range must lie in [0, 100], got {self.jpeg_range}")
        if self.hue is not None and not -0.5 <= self.hue[0] <= self.hue[1] <= 0.5:
            raise OptionError(f"{fn}: hue must lie in [-0.5, 0.5] (turns), got {self.hue}")
        for name in ("brightness", "contrast", "saturation"):
            r = getattr(self, name)
            if r is not None and r[0] < 0:
                raise OptionError(f"{fn}: {name} factors must be >= 0, got {r}")
        for name in ("color_jitter_prob", "color_jitter_pt_prob", "gray_prob"):
            put(self, name, _prob(getattr(self, name), name))
        if not (math.isfinite(self.color_jitter_shift) and self.color_jitter_shift >= 0):
            raise OptionError(f"{fn}: color_jitter_shift must be >= 0 (0-255 scale), got {self.color_jitter_shift}")
        put(self, "color_jitter_shift", float(self.color_jitter_shift))
        put(self, "gt_gray", bool(self.gt_gray))

    @classmethod
    def from_options(cls, opt: Mapping[str, Any]) -> FaceDegradationSettings:
        """The settings of a validated ``FFHQDegradationDataset`` section (``anysr.options``)."""
        return cls(**{name: opt[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class FaceDegradationDraws:
    """A sample's recipe. ``color_shift``: the values added to the B, G, R channels (0-1 scale), None when not
    applied; ``jitter``: the ``(adjustment, factor)`` pairs applied in their order, None when not applied;
    ``noise_sigma`` / ``jpeg_quality``: None when the step is off."""

    hflip: bool
    kernel: KernelParams
    scale: float
    noise_sigma: float | None
    noise_seed: int
    jpeg_quality: int | None
    color_shift: tuple[float, float, float] | None
    gray: bool
    jitter: tuple[tuple[str, float], ...] | None

    def as_dict(self) -> dict[str, Any]:
        """The recipe as plain data (JSON-ready; what ``anysr prepare degrade`` writes)."""
        kernel = {k: v for k, v in vars(self.kernel).items() if not (isinstance(v, float) and math.isnan(v))}
        return {"hflip": self.hflip, "kernel": kernel, "scale": self.scale, "noise_sigma": self.noise_sigma,
                "noise_seed": self.noise_seed, "jpeg_quality": self.jpeg_quality,
                "color_shift": None if self.color_shift is None else list(self.color_shift), "gray": self.gray,
                "jitter": None if self.jitter is None else [[n, f] for n, f in self.jitter]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FaceDegradationDraws:
        """The recipe :meth:`as_dict` wrote (or one written by hand, e.g. a test's fixed draws)."""
        bad = [n for n, _ in d.get("jitter") or () if n not in JITTERS]
        if bad:
            raise OptionError(f"FaceDegradationDraws: unknown jitter(s) {bad}; choose from {list(JITTERS)}")
        shift, jitter = d.get("color_shift"), d.get("jitter")
        if shift is not None and len(shift) != 3:
            raise OptionError(f"FaceDegradationDraws: color_shift needs 3 values (B, G, R), got {shift!r}")
        return cls(hflip=bool(d["hflip"]), kernel=KernelParams(**d["kernel"]), scale=float(d["scale"]),
                   noise_sigma=None if d.get("noise_sigma") is None else float(d["noise_sigma"]),
                   noise_seed=int(d["noise_seed"]),
                   jpeg_quality=None if d.get("jpeg_quality") is None else int(d["jpeg_quality"]),
                   color_shift=None if shift is None else (float(shift[0]), float(shift[1]), float(shift[2])),
                   gray=bool(d["gray"]),
                   jitter=None if jitter is None else tuple((str(n), float(f)) for n, f in jitter))


def draw_face_degradation(rng: np.random.Generator, settings: FaceDegradationSettings, *,
                          use_hflip: bool) -> FaceDegradationDraws:
    """Draw one recipe from ``rng``, in a fixed order: flip coin, kernel (BasicSR's order of draws), factor, noise
    level and field seed, JPEG quality, colour-shift coin and values, gray coin, jitter coin, order and factors.
    Coins and values are drawn whether or not their step is on (only the kernel's count depends on its kind)."""
    s = settings
    flip = bool(rng.random() < 0.5) and use_hflip
    kernel = draw_mixed_kernel_params(rng, s.kernel_list, s.kernel_prob, s.blur_kernel_size, s.blur_sigma,
                                      s.blur_sigma, (-math.pi, math.pi))
    scale = float(rng.uniform(*s.downsample_range))
    sigma = float(rng.uniform(*(s.noise_range or (0.0, 1.0))))
    noise_seed = int(rng.integers(0, 2**63))
    quality = int(np.rint(rng.uniform(*(s.jpeg_range or (0.0, 1.0)))))
    color_shift, gray, jitter = draw_face_finish(rng, s)
    return FaceDegradationDraws(
        hflip=flip, kernel=kernel, scale=scale, noise_sigma=sigma if s.noise_range is not None else None,
        noise_seed=noise_seed, jpeg_quality=quality if s.jpeg_range is not None else None,
        color_shift=color_shift, gray=gray, jitter=jitter)


def draw_face_finish(rng: np.random.Generator, settings: FaceDegradationSettings) -> tuple[
        tuple[float, float, float] | None, bool, tuple[tuple[str, float], ...] | None]:
    """The last steps' draws, in order: colour-shift coin and values, gray coin, jitter coin, order and factors;
    returns ``(color_shift, gray, jitter)`` as :class:`FaceDegradationDraws` holds them."""
    s = settings
    shift_coin = rng.random()
    reach = s.color_jitter_shift / 255.0
    shift = rng.uniform(-reach, reach, 3)
    use_shift = s.color_jitter_prob is not None and shift_coin < s.color_jitter_prob
    gray_coin = rng.random()
    gray = s.gray_prob is not None and s.gray_prob > 0 and bool(gray_coin < s.gray_prob)
    jitter_coin = rng.random()
    order = rng.permutation(len(JITTERS))
    factors = {name: rng.uniform(*(getattr(s, name) or (0.0, 1.0))) for name in JITTERS}
    jitter = None
    if s.color_jitter_pt_prob is not None and jitter_coin < s.color_jitter_pt_prob:
        jitter = tuple((JITTERS[k], float(factors[JITTERS[k]])) for k in order if getattr(s, JITTERS[k]) is not None)
    color_shift = (float(shift[0]), float(shift[1]), float(shift[2])) if use_shift else None
    return color_shift, gray, jitter


def _gray3(img: np.ndarray) -> np.ndarray:
    return np.repeat(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)[:, :, None], 3, axis=2)


def resample_face(lq: np.ndarray, scale: float, noise_sigma: float | None, noise_seed: int,
                  jpeg_quality: int | None) -> np.ndarray:
    """GFPGAN's middle steps on a blurred HWC float32 BGR face: ``resize`` (bilinear) to ``floor(side / scale)``,
    Gaussian noise (0-255 scale, the field of ``noise_seed``, clipped), the OpenCV JPEG codec, ``resize`` back.
    A None level or quality skips its step."""
    h, w = lq.shape[:2]
    size = (max(1, int(w // scale)), max(1, int(h // scale)))
    lq = cv2.resize(lq, size, interpolation=cv2.INTER_LINEAR)
    if noise_sigma is not None:
        field = np.random.default_rng(noise_seed).standard_normal(lq.shape).astype(np.float32)
        lq = np.clip(lq + field * noise_sigma / 255.0, 0, 1)
    if jpeg_quality is not None:
        levels = np.rint(np.clip(lq, 0, 1) * 255.0).astype(np.uint8)  # what OpenCV's encoder does to floats
        lq = jpeg_cv2(levels, jpeg_quality).astype(np.float32) / 255.0
    return cv2.resize(lq, (w, h), interpolation=cv2.INTER_LINEAR)


def finish_face(lq: np.ndarray, gt: np.ndarray, color_shift: Sequence[float] | None, gray: bool, gt_gray: bool,
                jitter: Sequence[tuple[str, float]] | None) -> tuple[Tensor, Tensor]:
    """GFPGAN's last steps on a same-size LQ: the channel shift (0-1 scale, clipped), gray (the GT too with
    ``gt_gray``), to CHW RGB tensors, torchvision's adjustments in their order, rounding the LQ to 8-bit levels."""
    if color_shift is not None:
        lq = np.clip(lq + np.asarray(color_shift, dtype=np.float32), 0, 1)
    if gray:
        lq = _gray3(lq)
        if gt_gray:
            gt = _gray3(gt)
    lq_t, gt_t = img2tensor(lq), img2tensor(gt)
    for name, factor in jitter or ():
        lq_t = _ADJUST[name](lq_t, factor)
    lq_t = torch.clamp((lq_t * 255.0).round(), 0, 255) / 255.0
    return lq_t, gt_t


def degrade_face(gt: np.ndarray, draws: FaceDegradationDraws, settings: FaceDegradationSettings) -> tuple[
        Tensor, Tensor]:
    """Apply ``draws`` to ``gt`` (HWC float32 BGR in [0, 1], already flipped as ``draws.hflip`` says).

    Returns ``(lq, gt)`` as CHW float32 RGB tensors in [0, 1] of ``gt``'s size: the LQ on 8-bit levels, the GT as
    given (or its gray image, with ``gray`` and ``gt_gray``). The flip itself is the caller's (it moves the facial
    component locations too).
    """
    if gt.ndim != 3 or gt.shape[2] != 3 or gt.dtype != np.float32:
        raise DataError(f"degrade_face: expected an HWC float32 BGR image, got {gt.dtype} of shape {gt.shape}")
    lq = cv2.filter2D(gt, -1, make_kernel(draws.kernel))
    lq = resample_face(lq, draws.scale, draws.noise_sigma, draws.noise_seed, draws.jpeg_quality)
    return finish_face(lq, gt, draws.color_shift, draws.gray, settings.gt_gray, draws.jitter)
