"""RealBasicVSR's degradation of video clips (mmagic's ``random_degradations`` stages as its REDS config orders them).

A GT clip (after cropping and flips) is unsharp-masked, then degraded in two orders and a shuffled final step:

1. first order: ``blur`` (a random kernel), ``resize`` (up / down / keep), ``noise`` (Gaussian or Poisson),
   ``jpeg`` and ``video`` (a real codec on the whole clip);
2. second order: ``blur2`` (chance 0.8), ``resize2``, ``noise2``, ``jpeg2``;
3. shuffled: ``video2`` and the group (``final_resize`` to the LQ size, ``final_blur``: a sinc filter, chance 0.8)
   in a random order;

then clipped to [0, 255]. Every stage keeps mmagic's parameter names (``kernel_list``, ``resize_mode_prob``,
``gaussian_sigma``, ``quality``, ``codec`` ...) and RealBasicVSR's values as defaults; ``*_step`` parameters let a
stage's parameters drift from frame to frame (a random walk clipped to the stage's range), so each frame of a clip
is degraded a little differently, as in RealBasicVSR. The frames are float32 on 0..255 (uint8 after JPEG and after
stages on uint8 input, as OpenCV returns them), in RGB order as mmagic loads them.

Randomness is split, as the other degradation models: :meth:`RealBasicVSRDegradation.draw` draws every scalar
(whether each stage runs, kernel kinds, sizes, per-frame parameters, codecs, the shuffled order) from one generator;
the application takes those draws and an array-noise source (Gaussian and Poisson samples). Both generators are
keyed by the sample seed (:func:`clip_rngs`), so a clip's degradation depends on ``(seed, epoch, index)`` only.

Where anysr differs from mmagic: noise is added in float32 for every frame (NumPy 2 makes mmagic's frames after the
first float64: its drifting level is a NumPy scalar); values outside 0..255 are clipped before a codec truncates them
to uint8 (NumPy's cast of such values is undefined); resizes never go below 2 pixels (mmagic's fail there); frames
of a clip whose sizes drifted apart are resized to the first frame's size by OpenCV before the codec (mmagic lets
FFmpeg's scaler do it, which in PyAV 18's build gives other pixels from call to call).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import cv2
import numpy as np

from anysr.data.degradation.draws import categorical, check_range
from anysr.data.degradation.jpeg import jpeg_cv2
from anysr.data.degradation.kernels import (
    bivariate_gaussian,
    bivariate_generalized_gaussian,
    bivariate_plateau,
    circular_lowpass_kernel,
)
from anysr.data.degradation.video_codec import VideoCompressionSettings, compress_clip
from anysr.errors import OptionError
from anysr.registry import DEGRADATION_REGISTRY

__all__ = ["DEFAULTS", "STAGES", "BlurDraw", "ResizeDraw", "NoiseDraw", "JPEGDraw", "ClipDraws", "NoiseSource",
           "GeneratorNoise", "RealBasicVSRSettings", "RealBasicVSRDegradation", "clip_rngs", "blur_kernel",
           "apply_blur", "apply_resize", "apply_noise", "apply_jpeg", "apply_video", "unsharp_mask"]

PI = 3.1416  # RealBasicVSR's config writes pi so
KERNELS = ("iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso", "sinc")
RESIZE_OPTS = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC, "area": cv2.INTER_AREA,
               "lanczos": cv2.INTER_LANCZOS4}
NOISE_TYPES = ("gaussian", "poisson")
_SIZES = [7, 9, 11, 13, 15, 17, 19, 21]
_KINDS = list(KERNELS)
_KPROB = [0.405, 0.225, 0.108, 0.027, 0.108, 0.027, 0.1]
_OPTS = ["bilinear", "area", "bicubic"]
_THIRDS = [1 / 3.0, 1 / 3.0, 1 / 3.0]
_DRIFT = {"sigma_x_step": 0.02, "sigma_y_step": 0.02, "rotate_angle_step": 0.31416, "beta_gaussian_step": 0.05,
          "beta_plateau_step": 0.1, "omega_step": 0.0628}
_VIDEO = {"codec": ["libx264", "h264", "mpeg4"], "codec_prob": _THIRDS, "bitrate": [1e4, 1e5]}

# RealBasicVSR's REDS training pipeline (realbasicvsr_wogan-c64b20-2x30x8_8xb2-lr1e-4-300k_reds), stage by stage.
DEFAULTS: dict[str, dict[str, Any]] = {
    "unsharp": {"kernel_size": 51, "sigma": 0, "weight": 0.5, "threshold": 10},
    "blur": {"kernel_size": _SIZES, "kernel_list": _KINDS, "kernel_prob": _KPROB, "sigma_x": [0.2, 3],
             "sigma_y": [0.2, 3], "rotate_angle": [-PI, PI], "beta_gaussian": [0.5, 4], "beta_plateau": [1, 2],
             **_DRIFT},
    "resize": {"resize_mode_prob": [0.2, 0.7, 0.1], "resize_scale": [0.15, 1.5], "resize_opt": _OPTS,
               "resize_prob": _THIRDS, "resize_step": 0.015, "is_size_even": True},
    "noise": {"noise_type": ["gaussian", "poisson"], "noise_prob": [0.5, 0.5], "gaussian_sigma": [1, 30],
              "gaussian_gray_noise_prob": 0.4, "poisson_scale": [0.05, 3], "poisson_gray_noise_prob": 0.4,
              "gaussian_sigma_step": 0.1, "poisson_scale_step": 0.005},
    "jpeg": {"quality": [30, 95], "quality_step": 3},
    "video": dict(_VIDEO),
    "blur2": {"prob": 0.8, "kernel_size": _SIZES, "kernel_list": _KINDS, "kernel_prob": _KPROB,
              "sigma_x": [0.2, 1.5], "sigma_y": [0.2, 1.5], "rotate_angle": [-PI, PI], "beta_gaussian": [0.5, 4],
              "beta_plateau": [1, 2], **_DRIFT},
    "resize2": {"resize_mode_prob": [0.3, 0.4, 0.3], "resize_scale": [0.3, 1.2], "resize_opt": _OPTS,
                "resize_prob": _THIRDS, "resize_step": 0.03, "is_size_even": True},
    "noise2": {"noise_type": ["gaussian", "poisson"], "noise_prob": [0.5, 0.5], "gaussian_sigma": [1, 25],
               "gaussian_gray_noise_prob": 0.4, "poisson_scale": [0.05, 2.5], "poisson_gray_noise_prob": 0.4,
               "gaussian_sigma_step": 0.1, "poisson_scale_step": 0.005},
    "jpeg2": {"quality": [30, 95], "quality_step": 3},
    "video2": dict(_VIDEO),
    "final_resize": {"target_size": None, "resize_opt": _OPTS, "resize_prob": _THIRDS},
    "final_blur": {"prob": 0.8, "kernel_size": _SIZES, "kernel_list": ["sinc"], "kernel_prob": [1],
                   "omega": [PI / 3, PI], "omega_step": 0.0628},
}
STAGES = tuple(DEFAULTS)  # the stage keys of the overrides mapping (anysr.options.video keeps a copy)
_KIND = {"blur": "blur", "blur2": "blur", "final_blur": "blur", "resize": "resize", "resize2": "resize",
         "final_resize": "resize", "noise": "noise", "noise2": "noise", "jpeg": "jpeg", "jpeg2": "jpeg",
         "video": "video", "video2": "video"}
_FIXED = ("blur", "resize", "noise", "jpeg", "video", "blur2", "resize2", "noise2", "jpeg2")
_SHUFFLED = (("video2",), ("final_resize", "final_blur"))  # mmagic's DegradationsWithShuffle groups
_PARAMS = {
    "blur": ("prob", "kernel_size", "kernel_list", "kernel_prob", "sigma_x", "sigma_y", "rotate_angle",
             "beta_gaussian", "beta_plateau", "omega", "sigma_x_step", "sigma_y_step", "rotate_angle_step",
             "beta_gaussian_step", "beta_plateau_step", "omega_step"),
    "resize": ("prob", "resize_mode_prob", "resize_scale", "resize_opt", "resize_prob", "resize_step",
               "is_size_even", "target_size"),
    "noise": ("prob", "noise_type", "noise_prob", "gaussian_sigma", "gaussian_gray_noise_prob", "poisson_scale",
              "poisson_gray_noise_prob", "gaussian_sigma_step", "poisson_scale_step"),
    "jpeg": ("prob", "quality", "quality_step"),
    "video": ("prob", "codec", "codec_prob", "bitrate"),
    "unsharp": ("kernel_size", "sigma", "weight", "threshold"),
}
_TAG_DRAWS, _TAG_NOISE = 7301, 7302


def clip_rngs(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """The generators of a clip's degradation, keyed by the sample seed: (scalar draws, noise arrays)."""
    return np.random.default_rng([_TAG_DRAWS, int(seed)]), np.random.default_rng([_TAG_NOISE, int(seed)])


# ------------------------------------------------------------------------------------------ settings
def _probs(values: Any, n: int, where: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise OptionError(f"{where}: must be a list of probabilities, got {values!r}") from None
    if len(out) != n or any(not math.isfinite(p) or p < 0 for p in out) or abs(sum(out) - 1.0) > 1e-6:
        raise OptionError(f"{where}: must be {n} probabilities >= 0 summing to 1 (as numpy's choice wants), got "
                          f"{list(values)}")
    return out


def _prob(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise OptionError(f"{where}: must be a probability in [0, 1], got {value!r}")
    return float(value)


def _step(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise OptionError(f"{where}: must be a number >= 0, got {value!r}")
    return float(value)


def _names(values: Any, allowed: Sequence[str], where: str) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise OptionError(f"{where}: must be a non-empty list, got {values!r}")
    bad = [v for v in values if str(v).lower() not in allowed]
    if bad:
        raise OptionError(f"{where}: unknown {', '.join(map(repr, bad))}; choose from {', '.join(allowed)}")
    return tuple(str(v).lower() for v in values)


@dataclass(frozen=True)
class _Stage:
    name: str
    kind: str
    params: Mapping[str, Any]


def _check_stage(name: str, p: dict[str, Any], where: str) -> dict[str, Any]:
    """The stage's parameters checked and normalised (lists to tuples of floats, probabilities summing to 1)."""
    kind = _KIND.get(name, name)
    out: dict[str, Any] = {"prob": _prob(p.get("prob", 1), f"{where}.prob")} if kind != "unsharp" else {}
    for key in p:
        if key.endswith("_step") and key in _PARAMS[kind]:
            out[key] = _step(p[key], f"{where}.{key}")
    if kind == "blur":
        out["kernel_list"] = _names(p["kernel_list"], KERNELS, f"{where}.kernel_list")
        out["kernel_prob"] = _probs(p["kernel_prob"], len(out["kernel_list"]), f"{where}.kernel_prob")
        sizes = p["kernel_size"]
        if isinstance(sizes, Sequence) and not sizes or not isinstance(sizes, Sequence) or any(
                isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0 for k in sizes):
            raise OptionError(f"{where}.kernel_size: must be a list of odd sizes, got {sizes!r}")
        out["kernel_size"] = tuple(int(k) for k in sizes)
        for key, default in (("sigma_x", (0, 0)), ("sigma_y", (0, 0)), ("rotate_angle", (-math.pi, math.pi)),
                             ("beta_gaussian", (0.5, 4)), ("beta_plateau", (1, 2))):
            out[key] = check_range(p.get(key, default), where, key)
        out["omega"] = None if p.get("omega") is None else check_range(p["omega"], where, "omega")
        gauss = [k for k in out["kernel_list"] if k != "sinc"]
        if gauss and (out["sigma_x"][0] <= 0 or ("aniso" in " ".join(gauss) and out["sigma_y"][0] <= 0)):
            raise OptionError(f"{where}: {', '.join(gauss)} kernels need sigma_x (and sigma_y) ranges above 0")
    elif kind == "resize":
        out["resize_opt"] = _names(p["resize_opt"], tuple(RESIZE_OPTS), f"{where}.resize_opt")
        out["resize_prob"] = _probs(p["resize_prob"], len(out["resize_opt"]), f"{where}.resize_prob")
        out["is_size_even"] = bool(p.get("is_size_even", False))
        target = p.get("target_size")
        if target is not None:
            if not isinstance(target, Sequence) or len(target) != 2 or any(
                    isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in target):
                raise OptionError(f"{where}.target_size: must be [height, width] in pixels, got {target!r}")
            out["target_size"] = (int(target[0]), int(target[1]))
        elif name == "final_resize":
            out["target_size"] = None  # the LQ size, set by the dataset
        else:
            out["target_size"] = None
            out["resize_mode_prob"] = _probs(p["resize_mode_prob"], 3, f"{where}.resize_mode_prob")
            lo, hi = check_range(p["resize_scale"], where, "resize_scale")
            if not 0 < lo <= 1 <= hi:
                raise OptionError(f"{where}.resize_scale: must be [down, up] with 0 < down <= 1 <= up, got "
                                  f"{[lo, hi]}")
            out["resize_scale"] = (lo, hi)
    elif kind == "noise":
        out["noise_type"] = _names(p["noise_type"], NOISE_TYPES, f"{where}.noise_type")
        out["noise_prob"] = _probs(p["noise_prob"], len(out["noise_type"]), f"{where}.noise_prob")
        for key in ("gaussian_sigma", "poisson_scale"):
            out[key] = check_range(p.get(key, (0, 0)), where, key)
        for key in ("gaussian_gray_noise_prob", "poisson_gray_noise_prob"):
            out[key] = _prob(p.get(key, 0), f"{where}.{key}")
    elif kind == "jpeg":
        lo, hi = check_range(p["quality"], where, "quality")
        if not 0 <= lo <= hi <= 100:
            raise OptionError(f"{where}.quality: must be [low, high] within [0, 100], got {[lo, hi]}")
        out["quality"] = (lo, hi)
    elif kind == "video":
        out["codec"] = tuple(p["codec"])
        out["codec_prob"] = None if p.get("codec_prob") is None else tuple(p["codec_prob"])
        out["bitrate"] = tuple(p["bitrate"])
        out["settings"] = VideoCompressionSettings(codec=out["codec"], codec_prob=out["codec_prob"],
                                                   bitrate=out["bitrate"], prob=out["prob"], where=where)
    else:  # unsharp
        k = p["kernel_size"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0:
            raise OptionError(f"{where}.kernel_size: must be a positive odd integer, got {k!r}")
        out.update(kernel_size=k, sigma=float(p["sigma"]), weight=float(p["weight"]),
                   threshold=float(p["threshold"]))
    for key in _PARAMS[kind]:
        out.setdefault(key, p.get(key, 0 if key.endswith("_step") else None))
    return out


class RealBasicVSRSettings:
    """RealBasicVSR's stages with ``overrides`` (``{stage: {param: value}}``, mmagic's parameter names; a stage's
    mapping replaces the given parameters of its defaults) merged into :data:`DEFAULTS`, checked.

    ``lq_size``: the (height, width) of the LQ clip, the final resize's target when ``final_resize.target_size``
    is not given. ``gt_usm``: the GT the model trains towards is the unsharp-masked one (RealBasicVSR's
    ``is_use_sharpened_gt_in_pixel``); the LQ is always made from the unsharp-masked GT, as in RealBasicVSR.
    """

    def __init__(self, overrides: Mapping[str, Any] | None = None, *, lq_size: tuple[int, int] | None = None,
                 gt_size: int | None = None, where: str = "degradation_params") -> None:
        overrides = dict(overrides or {})
        self.gt_usm = bool(overrides.pop("gt_usm", True))
        unknown = [k for k in overrides if k not in STAGES]
        if unknown:
            raise OptionError(f"{where}: unknown stage(s) {', '.join(map(repr, unknown))}; choose from "
                              f"{', '.join(STAGES)}, gt_usm")
        self.stages: dict[str, _Stage] = {}
        for name in STAGES:
            params = copy.deepcopy(DEFAULTS[name])
            given = overrides.get(name) or {}
            if not isinstance(given, Mapping):
                raise OptionError(f"{where}.{name}: must be a mapping of {name}'s parameters, got {given!r}")
            kind = _KIND.get(name, name)
            bad = [k for k in given if k not in _PARAMS[kind]]
            if bad:
                raise OptionError(f"{where}.{name}: unknown parameter(s) {', '.join(map(repr, bad))}; {name} takes "
                                  f"{', '.join(_PARAMS[kind])}")
            params.update(given)
            self.stages[name] = _Stage(name, kind, _check_stage(name, params, f"{where}.{name}"))
        final = self.stages["final_resize"].params
        target = final["target_size"] or lq_size
        if target is None:
            raise OptionError(f"{where}.final_resize.target_size: give the LQ size [h, w] (the dataset sets it from "
                              "gt_size / scale)")
        self.lq_size = (int(target[0]), int(target[1]))
        final["target_size"] = self.lq_size
        self._check_even(gt_size, where)

    def _check_even(self, gt_size: int | None, where: str) -> None:
        """yuv420p needs even frames: every size a codec may see must be even."""
        videos = [n for n in ("video", "video2") if self.stages[n].params["prob"] > 0]
        if not videos:
            return
        if gt_size is not None and gt_size % 2:
            raise OptionError(f"{where}: yuv420p video needs even frame sizes, but gt_size {gt_size} is odd")
        for name in ("resize", "resize2"):
            p = self.stages[name].params
            if p["prob"] > 0 and p["target_size"] is None and not p["is_size_even"]:
                raise OptionError(f"{where}.{name}.is_size_even: must be true while a video stage runs (yuv420p "
                                  "needs even frame sizes)")
        if self.lq_size[0] % 2 or self.lq_size[1] % 2:
            raise OptionError(f"{where}: yuv420p video needs even frame sizes, but the LQ size {list(self.lq_size)} "
                              "(gt_size / scale, or final_resize.target_size) is odd")

    def params(self, name: str) -> Mapping[str, Any]:
        return self.stages[name].params


# ------------------------------------------------------------------------------------------ draws
@dataclass(frozen=True)
class BlurDraw:
    """One clip's blur: whether it runs, the kernel kind and size, and every frame's parameters (``beta`` is the
    shape the frame's kernel uses; NaN where the kind has none)."""

    applied: bool
    kind: str
    size: int
    sigma_x: tuple[float, ...]
    sigma_y: tuple[float, ...]
    rotation: tuple[float, ...]
    beta: tuple[float, ...]
    omega: tuple[float, ...]


@dataclass(frozen=True)
class ResizeDraw:
    """One clip's resize: whether it runs, the interpolation and every frame's scale factor (None: the stage's
    fixed target size)."""

    applied: bool
    interp: str
    factors: tuple[float, ...] | None


@dataclass(frozen=True)
class NoiseDraw:
    """One clip's noise: whether it runs, Gaussian or Poisson, gray (one channel for all) or not, and every
    frame's level (Gaussian sigma or Poisson scale, on 0..255)."""

    applied: bool
    kind: str
    gray: bool
    levels: tuple[float, ...]


@dataclass(frozen=True)
class JPEGDraw:
    """One clip's JPEG: whether it runs and every frame's quality."""

    applied: bool
    quality: tuple[int, ...]


@dataclass(frozen=True)
class VideoDraw:
    """One clip's video compression: the codec (None: not compressed) and its bitrate."""

    codec: str | None
    bitrate: int | None


StageDraw = BlurDraw | ResizeDraw | NoiseDraw | JPEGDraw | VideoDraw


@dataclass(frozen=True)
class ClipDraws:
    """Every scalar draw of one clip: the stages in the order they run, each with its draw."""

    order: tuple[str, ...]
    stages: Mapping[str, StageDraw]

    def as_dict(self) -> dict[str, Any]:
        return {"order": list(self.order), "stages": {k: asdict(v) for k, v in self.stages.items()}}


def _walk(rng: np.random.Generator, start: float, step: float, lo: float, hi: float, n: int) -> tuple[float, ...]:
    """``n`` values of a random walk from ``start``: uniform steps in [-step, step], clipped to [lo, hi] (always
    ``n - 1`` draws)."""
    out, x = [float(start)], float(start)
    for _ in range(n - 1):
        x = min(max(x + float(rng.uniform(-step, step)), lo), hi)
        out.append(x)
    return tuple(out)


def draw_blur(rng: np.random.Generator, p: Mapping[str, Any], n: int) -> BlurDraw:
    """The draws of a blur stage (always the same count for a given ``n``)."""
    applied = float(rng.random()) <= p["prob"]
    kind = p["kernel_list"][categorical(rng, p["kernel_prob"])]
    size = p["kernel_size"][int(rng.integers(len(p["kernel_size"])))]
    omega = p["omega"] or ((math.pi / 3.0, math.pi) if size < 13 else (math.pi / 5.0, math.pi))
    walks = {}
    for key, rng_range in (("sigma_x", p["sigma_x"]), ("sigma_y", p["sigma_y"]), ("rotate_angle", p["rotate_angle"]),
                           ("beta_gaussian", p["beta_gaussian"]), ("beta_plateau", p["beta_plateau"]),
                           ("omega", omega)):
        start = float(rng.uniform(*rng_range))
        walks[key] = _walk(rng, start, p[f"{key}_step"], rng_range[0], rng_range[1], n)
    # mmagic's kernel draw takes the frame's beta as both ends of its range, then draws between that end and 1
    u = rng.random(n)
    base = walks["beta_gaussian"] if kind.startswith("generalized") else walks["beta_plateau"]
    beta = tuple(b + (1.0 - b) * float(v) for b, v in zip(base, u)) if kind.startswith(("generalized", "plateau")) \
        else (math.nan,) * n
    return BlurDraw(applied, kind, int(size), walks["sigma_x"], walks["sigma_y"], walks["rotate_angle"], beta,
                    walks["omega"])


def draw_resize(rng: np.random.Generator, p: Mapping[str, Any], n: int) -> ResizeDraw:
    """The draws of a resize stage."""
    applied = float(rng.random()) <= p["prob"]
    interp = p["resize_opt"][categorical(rng, p["resize_prob"])]
    if p["target_size"] is not None:
        return ResizeDraw(applied, interp, None)
    mode = categorical(rng, p["resize_mode_prob"])  # up, down, keep
    lo, hi = p["resize_scale"]
    u = float(rng.random())
    factor = 1.0 + (hi - 1.0) * u if mode == 0 else lo + (1.0 - lo) * u if mode == 1 else 1.0
    factors = _walk(rng, factor, p["resize_step"], lo, hi, n)
    return ResizeDraw(applied, interp, factors if p["resize_step"] else (factor,) * n)


def draw_noise(rng: np.random.Generator, p: Mapping[str, Any], n: int) -> NoiseDraw:
    """The draws of a noise stage."""
    applied = float(rng.random()) <= p["prob"]
    kind = p["noise_type"][categorical(rng, p["noise_prob"])]
    key = "gaussian_sigma" if kind == "gaussian" else "poisson_scale"
    level = float(rng.uniform(*p[key]))
    gray = float(rng.random()) < p[f"{kind}_gray_noise_prob"]
    return NoiseDraw(applied, kind, gray, _walk(rng, level, p[f"{key}_step"], *p[key], n))


def draw_jpeg(rng: np.random.Generator, p: Mapping[str, Any], n: int) -> JPEGDraw:
    """The draws of a JPEG stage: a quality rounded (half to even) from a uniform, then a rounded walk."""
    applied = float(rng.random()) <= p["prob"]
    lo, hi = p["quality"]
    q = round(float(rng.uniform(lo, hi)))
    out = [q]
    for _ in range(n - 1):
        q = round(min(max(q + float(rng.uniform(-p["quality_step"], p["quality_step"])), lo), hi))
        out.append(q)
    return JPEGDraw(applied, tuple(int(v) for v in out))


def draw_video(rng: np.random.Generator, p: Mapping[str, Any]) -> VideoDraw:
    """The draws of a video stage (:func:`~anysr.data.degradation.video_codec.draw_video_compression`'s)."""
    from anysr.data.degradation.video_codec import draw_video_compression  # noqa: PLC0415

    d = draw_video_compression(rng, p["settings"])
    return VideoDraw(d.codec, d.bitrate)


_DRAWERS = {"blur": draw_blur, "resize": draw_resize, "noise": draw_noise, "jpeg": draw_jpeg}


# ------------------------------------------------------------------------------------------ application
class NoiseSource(Protocol):
    """Where the noise arrays come from: standard normal samples and Poisson counts."""

    def normal(self, shape: tuple[int, ...]) -> np.ndarray: ...

    def poisson(self, lam: np.ndarray) -> np.ndarray: ...


class GeneratorNoise:
    """A :class:`NoiseSource` drawing from a ``numpy`` generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def normal(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.rng.standard_normal(shape)

    def poisson(self, lam: np.ndarray) -> np.ndarray:
        return self.rng.poisson(lam)


def blur_kernel(kind: str, size: int, sigma_x: float, sigma_y: float, rotation: float, beta: float,
                omega: float) -> np.ndarray:
    """The float64 kernel of one frame. The Gaussian-family covariance is built in float32, as RealBasicVSR's
    kernels are (so the same parameters give the same kernel); isotropic kinds use ``sigma_x`` only."""
    if kind == "sinc":
        return circular_lowpass_kernel(omega, size)
    iso = not kind.endswith("aniso")
    if kind in ("iso", "aniso"):
        return bivariate_gaussian(size, sigma_x, sigma_y, rotation, iso, cov_dtype=np.float32)
    if kind.startswith("generalized"):
        return bivariate_generalized_gaussian(size, sigma_x, sigma_y, rotation, beta, iso, cov_dtype=np.float32)
    return bivariate_plateau(size, sigma_x, sigma_y, rotation, beta, iso, cov_dtype=np.float32)


def apply_blur(frames: list[np.ndarray], d: BlurDraw) -> list[np.ndarray]:
    """Filter each frame with its own kernel (OpenCV's filter2D, reflect-101 borders, the frame's dtype kept)."""
    if not d.applied:
        return frames
    return [cv2.filter2D(f, -1, blur_kernel(d.kind, d.size, d.sigma_x[t], d.sigma_y[t], d.rotation[t], d.beta[t],
                                            d.omega[t])) for t, f in enumerate(frames)]


def _size(h: int, w: int, factor: float, even: bool) -> tuple[int, int]:
    ho, wo = h * factor, w * factor
    if even:
        ho, wo = 2 * (ho // 2), 2 * (wo // 2)
    return max(int(ho), 2 if even else 1), max(int(wo), 2 if even else 1)


def apply_resize(frames: list[np.ndarray], d: ResizeDraw, p: Mapping[str, Any],
                 target: tuple[int, int] | None = None) -> list[np.ndarray]:
    """Resize every frame (OpenCV): to ``target`` / the stage's ``target_size``, or by the frame's factor times
    the first frame's size (``is_size_even``: rounded down to even sizes)."""
    if not d.applied:
        return frames
    interp = RESIZE_OPTS[d.interp]
    fixed = p["target_size"] or target
    if d.factors is None:
        assert fixed is not None
        return [cv2.resize(f, (fixed[1], fixed[0]), interpolation=interp) for f in frames]
    h, w = frames[0].shape[:2]
    out = []
    for f, factor in zip(frames, d.factors):
        ho, wo = _size(h, w, factor, p["is_size_even"])
        out.append(cv2.resize(f, (wo, ho), interpolation=interp))
    return out


def apply_noise(frames: list[np.ndarray], d: NoiseDraw, source: NoiseSource) -> list[np.ndarray]:
    """Add Gaussian noise (sigma on 0..255) or Poisson noise (counts at the image's number of distinct levels,
    rounded up to a power of two, times the scale) to every frame; gray: one noise channel for all three."""
    if not d.applied:
        return frames
    out = []
    for f, level in zip(frames, d.levels):
        if d.kind == "gaussian":
            noise = source.normal(f.shape).astype(np.float32) * np.float32(level)
            if d.gray:
                noise = noise[:, :, :1]
        else:
            x = f.astype(np.float32)
            if d.gray:  # the frames are RGB: luma from the BGR view
                x = cv2.cvtColor(np.ascontiguousarray(x[..., ::-1]), cv2.COLOR_BGR2GRAY)[..., None]
            x = np.clip(np.round(x), 0, 255)
            vals = 2.0 ** math.ceil(math.log2(len(np.unique(x))))
            noise = ((source.poisson(x.astype(np.float64) * vals) / vals - x) * level).astype(np.float32)
        out.append(f + noise)
    return out


def _to_uint8(f: np.ndarray) -> np.ndarray:
    """What OpenCV's encoder makes of a frame: saturated, rounded half to even."""
    return f if f.dtype == np.uint8 else np.clip(np.rint(f), 0, 255).astype(np.uint8)


def apply_jpeg(frames: list[np.ndarray], d: JPEGDraw) -> list[np.ndarray]:
    """JPEG-compress each frame at its quality (OpenCV; uint8 out). As in RealBasicVSR, the RGB frames are handed to
    OpenCV as they are, so its colour conversion reads them as BGR."""
    if not d.applied:
        return frames
    return [jpeg_cv2(_to_uint8(f), q) for f, q in zip(frames, d.quality)]


def apply_video(frames: list[np.ndarray], d: VideoDraw) -> list[np.ndarray]:
    """Compress the clip with a real codec (float32 out). Frames are truncated to uint8 (after clipping to 0..255);
    frames of another size than the first are scaled to it by FFmpeg when encoded, as in RealBasicVSR."""
    if d.codec is None:
        return frames
    clip = [np.clip(f, 0, 255).astype(np.uint8)[..., ::-1] for f in frames]  # compress_clip takes BGR
    out = compress_clip(clip, d.codec, bitrate=d.bitrate, rescale=True)
    return [np.ascontiguousarray(f[..., ::-1]).astype(np.float32) for f in out]


def unsharp_mask(frames: list[np.ndarray], p: Mapping[str, Any]) -> list[np.ndarray]:
    """mmagic's ``UnsharpMasking`` (float32 on 0..255): add ``weight`` times the detail (frame minus its Gaussian
    blur) where it exceeds ``threshold``, with a blurred mask as the blend weight."""
    g = cv2.getGaussianKernel(p["kernel_size"], p["sigma"])
    kernel = g @ g.T
    out = []
    for f in frames:
        x = f.astype(np.float32)
        detail = x - cv2.filter2D(x, -1, kernel)
        soft = cv2.filter2D(np.float32(np.abs(detail) > p["threshold"]), -1, kernel)
        sharp = np.clip(x + np.float32(p["weight"]) * detail, 0, 255)
        out.append(soft * sharp + (1 - soft) * x)
    return out


# ------------------------------------------------------------------------------------------ the model
@DEGRADATION_REGISTRY.register(name="realbasicvsr")
class RealBasicVSRDegradation:
    """RealBasicVSR's clip degradation (registered as ``realbasicvsr``): :meth:`draw` then :meth:`apply`, or both
    from a sample seed by calling it."""

    name = "realbasicvsr"
    clips = True  # degrades clips (video datasets), not images

    def __init__(self, settings: RealBasicVSRSettings) -> None:
        self.settings = settings

    def draw(self, rng: np.random.Generator, n: int) -> ClipDraws:
        """Every scalar draw for a clip of ``n`` frames: each stage's (a fixed count per stage), then the order of
        the shuffled groups."""
        stages: dict[str, StageDraw] = {}
        for name, stage in self.settings.stages.items():
            if stage.kind == "video":
                stages[name] = draw_video(rng, stage.params)
            elif stage.kind in _DRAWERS:
                stages[name] = _DRAWERS[stage.kind](rng, stage.params, n)
        groups = [_SHUFFLED[i] for i in rng.permutation(len(_SHUFFLED))]
        return ClipDraws(_FIXED + tuple(s for g in groups for s in g), stages)

    def apply(self, frames: Sequence[np.ndarray], draws: ClipDraws,
              source: NoiseSource) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The LQ clip and the unsharp-masked GT clip (float32 RGB on 0..255) of ``frames`` (uint8 RGB)."""
        usm = unsharp_mask(list(frames), self.settings.params("unsharp"))
        x = list(usm)
        for name in draws.order:
            x = self.apply_stage(name, x, draws.stages[name], source)
        return [np.clip(f, 0, 255).astype(np.float32) for f in x], usm

    def apply_stage(self, name: str, frames: list[np.ndarray], d: StageDraw, source: NoiseSource) -> list[np.ndarray]:
        """One stage on the clip ``frames`` with its draw."""
        p = self.settings.params(name)
        if isinstance(d, BlurDraw):
            return apply_blur(frames, d)
        if isinstance(d, ResizeDraw):
            return apply_resize(frames, d, p, self.settings.lq_size)
        if isinstance(d, NoiseDraw):
            return apply_noise(frames, d, source)
        if isinstance(d, JPEGDraw):
            return apply_jpeg(frames, d)
        return apply_video(frames, d)

    def __call__(self, frames: Sequence[np.ndarray], seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """:meth:`apply` with the draws and noise of sample ``seed`` (:func:`clip_rngs`)."""
        draw_rng, noise_rng = clip_rngs(seed)
        return self.apply(frames, self.draw(draw_rng, len(frames)), GeneratorNoise(noise_rng))
