"""Real-ESRGAN's degradation operators on batched tensors, run by the model on its device.

The numbers are BasicSR 1.4.2's (``basicsr/utils/img_process_util.py``, ``basicsr/data/degradations.py``,
``RealESRGANModel.feed_data``); the code is device-agnostic: any device and float dtype of the input, no
``.item()``, no host synchronisation, autocast switched off where a degradation must be computed exactly.

Randomness is always explicit:

* per-sample values and random fields come from a ``torch.Generator`` (``generator``). Put it on the images'
  device: then nothing leaves the device. A generator on another device (a CPU one for a backend without
  device generators) works too, at the cost of an upload of each drawn field; Poisson noise then also needs
  its rates on the generator's device, a download that waits for the device. Gaussian noise also takes its
  fields as tensors.
* per-batch choices that decide shapes and control flow (resize up/down/keep and its scale, interpolation
  mode, Gaussian or Poisson, second blur, final order) come from a host ``numpy.random.Generator`` (``rng``),
  as BasicSR draws them on the host; reading a device generator there would synchronise.

Save both generators' states with the training state and a resumed run synthesises the same batches.

One deliberate difference: BasicSR draws one gray Gaussian noise field per *batch* (``randn(h, w)``, scaled
per sample); :func:`gaussian_noise` draws one per *sample*. Pass ``gray_field`` of shape (1, 1, H, W) to get
BasicSR's behaviour.

Model option keys (BasicSR's, top level of the options) and where they go:

=====================================================  =========================================================
``scale``                                              ``scale`` of :func:`second_order_degrade`
``resize_prob`` / ``resize_prob2``                     ``DegradeStage.resize_prob`` of ``first`` / ``second``
``resize_range`` / ``resize_range2``                   ``DegradeStage.resize_range``
``gaussian_noise_prob`` / ``gaussian_noise_prob2``     ``DegradeStage.gaussian_noise_prob``
``noise_range`` / ``noise_range2``                     ``DegradeStage.noise_range`` (sigma on the 0-255 scale)
``poisson_scale_range`` / ``poisson_scale_range2``     ``DegradeStage.poisson_scale_range``
``gray_noise_prob`` / ``gray_noise_prob2``             ``DegradeStage.gray_noise_prob``
``jpeg_range`` / ``jpeg_range2``                       ``DegradeStage.jpeg_range``
``second_blur_prob``                                   ``second_blur_prob`` of :func:`second_order_degrade`
=====================================================  =========================================================

The kernels come from the dataset (:func:`anysr.data.degradations.sample_degradation_kernels`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anysr.errors import DataError, OptionError
from anysr.ops.autocast import autocast_off
from anysr.ops.diffjpeg import DiffJPEG

__all__ = [
    "RESIZE_MODES", "DegradeStage", "StageDraw", "SecondOrderDraw", "filter2d", "gaussian_kernel1d", "USMSharp",
    "gaussian_noise", "poisson_noise", "add_noise", "random_add_gaussian_noise", "random_add_poisson_noise",
    "resize", "clamp_round", "draw_second_order", "apply_second_order", "second_order_degrade",
]

RESIZE_MODES = ("area", "bilinear", "bicubic")
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


def _rand(n: int, generator: torch.Generator, x: Tensor) -> Tensor:
    """``n`` uniforms in [0, 1) from ``generator``, float32 (float64 for float64 ``x``), on ``x``'s device."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.rand(n, generator=generator, device=generator.device, dtype=dtype).to(x.device)


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


def clamp_round(x: Tensor) -> Tensor:
    """Round to the nearest of the 256 levels ``k / 255`` and clamp to [0, 1] (what an 8-bit image can hold)."""
    return torch.clamp((x * 255.0).round(), 0, 255) / 255.0


# -------------------------------------------------------------------------------------- second-order pipeline
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

    def __post_init__(self) -> None:
        fn = "DegradeStage"
        probs = tuple(float(p) for p in self.resize_prob)
        if len(probs) != 3 or any(not math.isfinite(p) or p < 0 for p in probs) or sum(probs) <= 0:
            raise OptionError(f"{fn}: resize_prob must be three non-negative weights (up, down, keep), "
                              f"got {list(self.resize_prob)}")
        object.__setattr__(self, "resize_prob", probs)
        for name in ("resize_range", "noise_range", "poisson_scale_range", "jpeg_range"):
            value = getattr(self, name)
            try:
                lo, hi = (float(v) for v in value)
            except (TypeError, ValueError):
                raise OptionError(f"{fn}: {name} must be a pair [low, high], got {value!r}") from None
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                raise OptionError(f"{fn}: {name} must be a finite range with low <= high, got {[lo, hi]}")
            object.__setattr__(self, name, (lo, hi))
        if not 0 < self.resize_range[0] <= 1 <= self.resize_range[1]:
            raise OptionError(f"{fn}: resize_range must satisfy 0 < low <= 1 <= high, got {list(self.resize_range)}")
        if not (0 < self.jpeg_range[0] and self.jpeg_range[1] < 100):
            raise OptionError(f"{fn}: jpeg_range must lie in (0, 100), got {list(self.jpeg_range)}")
        for name in ("gaussian_noise_prob", "gray_noise_prob"):
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
        return cls(*(opt[k + suffix] for k in keys))  # type: ignore[arg-type]


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


def _choice(rng: np.random.Generator, weights: Sequence[float]) -> int:
    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    return min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(cum) - 1)


def _draw_stage(rng: np.random.Generator, generator: torch.Generator, batch: int, stage: DegradeStage,
                like: Tensor) -> StageDraw:
    updown = ("up", "down", "keep")[_choice(rng, stage.resize_prob)]
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
