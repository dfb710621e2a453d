"""traiNNer-redux's own losses, under its names (``mssimloss``, ``hsluvloss``, ``psnrloss`` in its ``train.losses``
lists), computing what traiNNer-redux computes (checked against its source on fixtures) and times ``loss_weight``
(traiNNer-redux multiplies in its model; anysr's losses carry their weight).

* ``MSSIMLoss``: 1 - MS-SSIM on the luma (YIQ's Y by default) of the clamped images, IQA-PyTorch's form (pyiqa):
  five scales, 11-tap Gaussian (sigma 1.5), 'valid' filtering while the image is at least 11 pixels wide and
  zero-padded 'same' filtering below, the contrast term clamped at 0 at every scale, the luminance term left out
  by default; the batch mean clamped to [0, 1]. It is not anysr's ``MSSSIMLoss`` (RGB channels, luminance at the
  last scale, no clamping of the inputs), hence its own class.
* ``HSLuvLoss``: distances in HSLuv (hue on the circle, with grey / black / white rules; saturation weighted by
  how far the lightness is from black or white; lightness), the three terms summed.
* ``PSNRLoss``: ``10 / ln 10 * mean over images of ln(MSE + 1e-8)`` (negative PSNR up to a constant), optionally
  on BT.601 luma.

All are computed in fp32 under autocast.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.nn import functional as F

from anysr.losses.downscaled import bicubic_shrink
from anysr.losses.pixel import _PixelLoss, check_criterion, elementwise
from anysr.losses.structure import MS_SSIM_WEIGHTS, _blur, gaussian_window
from anysr.ops.autocast import autocast_off
from anysr.registry import LOSS_REGISTRY

# ---------------------------------------------------------------- MS-SSIM (IQA-PyTorch's form)

# Y rows of the colour spaces traiNNer-redux's MSSIMLoss may take the luma of: (r, g, b) weights and offset.
_LUMA = {"yiq": ((0.299, 0.587, 0.114), 0.0),
         "ycbcr": ((65.481 / 255, 128.553 / 255, 24.966 / 255), 16 / 255),
         "lhm": ((0.2989, 0.587, 0.114), 0.0)}
_WIN, _SIGMA = 11, 1.5


def _mix(x: torch.Tensor, weights: tuple[float, float, float], offset: float = 0.0) -> torch.Tensor:
    """``w0 * R + w1 * G + w2 * B + offset`` as a one-channel NCHW map (no constant tensors made)."""
    return x[:, 0:1] * weights[0] + x[:, 1:2] * weights[1] + x[:, 2:3] * weights[2] + offset


def ssim_cs_maps(x: torch.Tensor, y: torch.Tensor, blur: Callable[[torch.Tensor], torch.Tensor], size: int,
                 include_luminance: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale's SSIM and contrast-structure maps in IQA-PyTorch's form (traiNNer-redux's MSSIMLoss and
    StructureTextureLoss): 'valid' filtering by ``blur`` (a window of ``size`` taps), zero-padded 'same' filtering
    on images narrower than the window, the contrast-structure term clamped at 0; the SSIM map is that term alone
    unless ``include_luminance``."""
    c1, c2 = 0.01**2, 0.03**2
    if x.shape[-1] < size:  # narrower than the window: 'same' filtering on zero padding
        pad = (size // 2,) * 4
        x, y = F.pad(x, pad), F.pad(y, pad)
    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x**2
    var_y = blur(y * y) - mu_y**2
    cov = blur(x * y) - mu_x * mu_y
    cs_map = torch.relu((2 * cov + c2) / (var_x + var_y + c2))
    ssim_map = (2 * mu_x * mu_y + c1) / (mu_x**2 + mu_y**2 + c1) * cs_map if include_luminance else cs_map
    return ssim_map, cs_map


def _ssim_level(x: torch.Tensor, y: torch.Tensor, win: torch.Tensor, downsample: bool,
                include_luminance: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image SSIM and contrast-structure means at one scale (contrast-structure clamped at 0)."""
    f = max(1, round(min(x.shape[-2:]) / 256))  # Python's rounding, as the reference
    if f > 1 and downsample:
        x, y = F.avg_pool2d(x, f), F.avg_pool2d(y, f)
    ssim_map, cs_map = ssim_cs_maps(x, y, lambda t: _blur(t, win), _WIN, include_luminance)
    return ssim_map.mean((1, 2, 3)), cs_map.mean((1, 2, 3))


@LOSS_REGISTRY.register()
class MSSIMLoss(_PixelLoss):
    """traiNNer-redux's ``mssimloss``: ``loss_weight * (1 - clamp(mean MS-SSIM, 0, 1))``.

    ``test_y_channel``: compare the luma of ``color_space`` (``yiq``, ``ycbcr``, ``lhm``) of RGB inputs, else every
    channel; ``is_prod``: the weighted product of the scales (else their normalised weighted sum);
    ``include_luminance``: the luminance term in the last scale's SSIM; ``downsample``: average-pool each scale by
    ``round(min side / 256)`` first (the official MATLAB code's step). ``channels`` is accepted (unused, as there).
    """

    def __init__(self, loss_weight: float = 1.0, channels: int = 3, downsample: bool = False,
                 test_y_channel: bool = True, is_prod: bool = True, color_space: str = "yiq",
                 include_luminance: bool = False) -> None:
        super().__init__(loss_weight, "mean")
        if test_y_channel and color_space.lower() not in _LUMA:
            raise ValueError(f"color_space '{color_space}' is not supported; use one of {', '.join(_LUMA)}")
        self.channels = channels
        self.downsample = bool(downsample)
        self.test_y_channel = bool(test_y_channel)
        self.is_prod = bool(is_prod)
        self.color_space = color_space.lower()
        self.include_luminance = bool(include_luminance)
        self.register_buffer("win", gaussian_window(_WIN, _SIGMA), persistent=False)

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().clamp(0, 1)
        if self.test_y_channel and x.shape[1] == 3:
            return _mix(x, *_LUMA[self.color_space])
        return x

    def ms_ssim(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-image (N,) MS-SSIM of the prepared images."""
        x, y = self._prepare(pred), self._prepare(target)
        weights = MS_SSIM_WEIGHTS
        cs_terms = []
        ssim = None
        for _ in weights:
            ssim, cs = _ssim_level(x, y, self.win, self.downsample, self.include_luminance)
            cs_terms.append(cs)
            pad = (x.shape[2] % 2, x.shape[3] % 2)
            x = F.avg_pool2d(x, kernel_size=2, padding=pad)
            y = F.avg_pool2d(y, kernel_size=2, padding=pad)
        assert ssim is not None
        if self.is_prod:
            out = ssim ** weights[-1]
            for cs, w in zip(cs_terms[:-1], weights[:-1]):
                out = out * cs**w
            return out
        total = sum(weights)
        out = ssim * (weights[-1] / total)
        for cs, w in zip(cs_terms[:-1], weights[:-1]):
            out = out + cs * (w / total)
        return out

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.dim() != 4 or pred.shape != target.shape:
            raise ValueError(f"MSSIMLoss: pred and target must be NCHW of one shape, got {tuple(pred.shape)} and "
                             f"{tuple(target.shape)}")
        with autocast_off(pred):
            score = self.ms_ssim(pred, target)
        return self.loss_weight * (1 - score.mean().clamp(0, 1))


# ---------------------------------------------------------------- HSLuv (hsluv-python's conversion, in tensors)

# linear sRGB -> XYZ (rows X, Y, Z) and XYZ -> linear sRGB, hsluv's constants
_RGB_TO_XYZ = ((0.41239079926595, 0.35758433938387, 0.18048078840183),
               (0.21263900587151, 0.71516867876775, 0.072192315360733),
               (0.019330818715591, 0.11919477979462, 0.95053215224966))
_XYZ_TO_RGB = ((3.240969941904521, -1.537383177570093, -0.498610760293),
               (-0.96924363628087, 1.87596750150772, 0.041555057407175),
               (0.055630079696993, -0.20397695888897, 1.056971514242878))
_REF_U, _REF_V = 0.19783000664283, 0.46831999493879
_KAPPA, _EPSILON = 903.2962962, 0.0088564516
_GREY_CHROMA = 0.028972067  # below it the hue is 0 (float32 greys reach 6.7e-5, the least coloured 0.029)


def _safe_divisor(d: torch.Tensor, floor: float = 1e-3) -> torch.Tensor:
    """``d`` with its magnitude at least ``floor``, keeping the sign (0 -> +floor)."""
    return torch.where(d == 0, floor, torch.sign(d) * d.abs().clamp_min(floor))


def _gamut_lines(lum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slopes and intercepts (6, ...) of the sRGB gamut's edges in the chroma plane at lightness ``lum``."""
    cube = (lum + 16) ** 3 / 1560896
    sub = torch.where(cube > _EPSILON, cube, lum / _KAPPA)
    slopes, intercepts = [], []
    for m1, m2, m3 in _XYZ_TO_RGB:
        top1 = (284517 * m1 - 94839 * m3) * sub
        top2_base = (838422 * m3 + 769860 * m2 + 731718 * m1) * lum * sub
        bottom_base = (632260 * m3 - 126452 * m2) * sub
        for t in (0, 1):
            bottom = _safe_divisor(bottom_base + 126452 * t)
            slopes.append(top1 / bottom)
            intercepts.append((top2_base - 769860 * t * lum) / bottom)
    return torch.stack(slopes), torch.stack(intercepts)


def _max_chroma(lum: torch.Tensor, hue: torch.Tensor) -> torch.Tensor:
    """The largest chroma inside sRGB at lightness ``lum`` and hue ``hue`` (degrees): the nearest gamut edge along
    the hue's ray; where every edge lies behind, the largest distance of the whole batch (as the reference)."""
    slopes, intercepts = _gamut_lines(lum)
    theta = torch.deg2rad(hue)
    lengths = intercepts / _safe_divisor(torch.sin(theta) - slopes * torch.cos(theta))
    lengths = torch.where(lengths >= 0, lengths, lengths.max())
    return lengths.min(0).values


def rgb_to_hsluv(rgb: torch.Tensor) -> torch.Tensor:
    """NCHW RGB in [0, 1] -> HSLuv (hue 0..360, saturation 0..100, lightness 0..100) channels, in float32 as
    traiNNer-redux's port of hsluv-python computes them (its float32 thresholds for greys and black)."""
    c = rgb.clamp(1e-12, 1)
    lin = torch.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    x, y, z = (_mix(lin, row)[:, 0] for row in _RGB_TO_XYZ)
    lum = torch.where(y > _EPSILON, 116 * y.pow(1 / 3) - 16, y * _KAPPA)
    div = (x + 15 * y + 3 * z).clamp_min(1e-6)
    u = torch.where(lum < 1e-4, 0.0, 13 * lum * (4 * x / div - _REF_U))
    v = torch.where(lum < 1e-4, 0.0, 13 * lum * (9 * y / div - _REF_V))
    u = torch.where(u == 0, 1e-12, u)
    v = torch.where(v == 0, 1e-12, v)
    chroma = torch.sqrt(u**2 + v**2)
    hue = torch.atan2(v, u) * (180 / math.pi)
    hue = torch.where(hue < 0, hue + 360, hue)
    hue = torch.where(chroma < _GREY_CHROMA, 0.0, hue)
    sat = chroma / _max_chroma(lum, hue).clamp_min(1e-2) * 100
    sat = torch.where((lum > 99.99) | (lum < 0.01), 0.0, sat)
    return torch.stack([hue, sat.clamp(0, 100), lum.clamp(0, 100)], dim=1)


def _gaussian_taps(sigma: int) -> torch.Tensor:
    """torchvision's ``GaussianBlur(4 * sigma + 1, sigma)`` kernel, 1-D (normalised)."""
    size = 4 * sigma + 1
    half = (size - 1) / 2
    taps = [math.exp(-0.5 * ((i - half) / sigma) ** 2) for i in range(size)]
    return torch.tensor([t / sum(taps) for t in taps])


def _gaussian_blur(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Separable blur of every channel of ``x`` by the 1-D kernel ``k`` on reflect padding (torchvision's)."""
    size = k.shape[0]
    k = k.to(x.dtype)
    c = x.shape[1]
    x = F.pad(x, (size // 2,) * 4, mode="reflect")
    x = F.conv2d(x, k.view(1, 1, 1, size).expand(c, 1, 1, size), groups=c)
    return F.conv2d(x, k.view(1, 1, size, 1).expand(c, 1, size, 1), groups=c)


@LOSS_REGISTRY.register()
class HSLuvLoss(_PixelLoss):
    """traiNNer-redux's ``hsluvloss``: ``loss_weight * (hue + saturation + lightness)`` terms in HSLuv.

    Hue (normalised to 0..1): the shorter way round the circle, times 2; 0 between two greys (saturation < 0.1),
    two blacks or two whites (lightness < 0.1, > 0.9); the larger saturation between a grey and a colour; times
    ``hue_weight``. Saturation: ``criterion`` distance (``l1``, ``l2``, ``charbonnier``) weighted per pixel by
    ``min(l, 1 - l)`` of both lightnesses, times ``saturation_weight``. Lightness: ``criterion`` distance, times
    ``lightness_weight``. ``downscale_factor`` > 1: both images are first shrunk by it (antialiased bicubic);
    ``blur_strength`` > 0: both are first blurred (Gaussian, sigma = blur_strength, 4 sigma + 1 taps).
    traiNNer-redux logs the three terms apart; anysr logs their sum.
    """

    def __init__(self, loss_weight: float = 1.0, hue_weight: float = 1 / 3, saturation_weight: float = 1 / 3,
                 lightness_weight: float = 1 / 3, criterion: str = "l1", downscale_factor: int = 1,
                 blur_strength: int = 0) -> None:
        super().__init__(loss_weight, "mean")
        self.criterion = check_criterion(criterion)
        if downscale_factor < 1 or blur_strength < 0:
            raise ValueError(f"downscale_factor must be >= 1 and blur_strength >= 0, got {downscale_factor} and "
                             f"{blur_strength}")
        self.hue_weight, self.saturation_weight = float(hue_weight), float(saturation_weight)
        self.lightness_weight = float(lightness_weight)
        self.downscale_factor, self.blur_strength = int(downscale_factor), int(blur_strength)
        if self.blur_strength:
            self.register_buffer("blur_taps", _gaussian_taps(self.blur_strength), persistent=False)

    def _hsl(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.downscale_factor > 1:
            x = bicubic_shrink(x, self.downscale_factor).clamp(0, 1)  # F.interpolate's antialias: CPU on XLA
        hsl = rgb_to_hsluv(x)
        return hsl[:, 0] / 360, hsl[:, 1] / 100, hsl[:, 2] / 100

    def terms(self, pred: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """The weighted ``hue``, ``saturation`` and ``lightness`` terms (before ``loss_weight``)."""
        x, y = pred.float(), target.float()
        if self.blur_strength:
            x, y = _gaussian_blur(x, self.blur_taps), _gaussian_blur(y, self.blur_taps)
        hx, sx, lx = self._hsl(x)
        hy, sy, ly = self._hsl(y)
        eps = 0.1
        dist = (hx - hy).abs()
        hue = torch.minimum(dist, 1 - dist) * 2
        grey_x, grey_y = sx < eps, sy < eps
        hue = torch.where(grey_x & grey_y, 0.0, hue)
        hue = torch.where((grey_x & (sy > eps)) | ((sx > eps) & grey_y), torch.maximum(sx, sy), hue)
        hue = torch.where((lx < eps) & (ly < eps), 0.0, hue)
        hue = torch.where((lx > 1 - eps) & (ly > 1 - eps), 0.0, hue)
        light_w = torch.minimum(lx, 1 - lx).clamp(0, 0.5) + torch.minimum(ly, 1 - ly).clamp(0, 0.5)
        sat = elementwise(self.criterion, sx, sy) * light_w
        return {"hue": hue.mean() * self.hue_weight, "saturation": sat.mean() * self.saturation_weight,
                "lightness": elementwise(self.criterion, lx, ly).mean() * self.lightness_weight}

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.dim() != 4 or pred.shape[1] != 3 or pred.shape != target.shape:
            raise ValueError(f"HSLuvLoss takes two NCHW RGB images of one shape, got {tuple(pred.shape)} and "
                             f"{tuple(target.shape)}")
        with autocast_off(pred):
            t = self.terms(pred, target)
            return self.loss_weight * (t["hue"] + t["saturation"] + t["lightness"])


# ---------------------------------------------------------------- PSNR


@LOSS_REGISTRY.register()
class PSNRLoss(_PixelLoss):
    """traiNNer-redux's ``psnrloss``: ``loss_weight * 10 / ln(10) * mean over images of ln(MSE + 1e-8)``, i.e. minus
    the PSNR (peak 1) up to a constant; ``to_y``: on BT.601 luma (16..235 scaled to /255) instead of RGB."""

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", to_y: bool = False) -> None:
        if reduction != "mean":
            raise ValueError(f"PSNRLoss reduces by mean only, got reduction '{reduction}'")
        super().__init__(loss_weight, reduction)
        self.to_y = bool(to_y)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.dim() != 4 or pred.shape != target.shape:
            raise ValueError(f"PSNRLoss: pred and target must be NCHW of one shape, got {tuple(pred.shape)} and "
                             f"{tuple(target.shape)}")
        with autocast_off(pred):
            x, y = pred.float(), target.float()
            if self.to_y:
                luma = _LUMA["ycbcr"][0]
                x, y = _mix(x, luma, 16 / 255), _mix(y, luma, 16 / 255)
            mse = ((x - y) ** 2).mean((1, 2, 3))
            return self.loss_weight * (10 / math.log(10)) * torch.log(mse + 1e-8).mean()


__all__ = ["HSLuvLoss", "MSSIMLoss", "PSNRLoss", "rgb_to_hsluv"]
