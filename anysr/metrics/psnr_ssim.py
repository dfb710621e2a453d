"""PSNR and SSIM as BasicSR computes them (numpy, uint8-range BGR images), plus device-side torch versions.

numpy: ``calculate_psnr`` / ``calculate_ssim`` take HWC (or CHW, or 2-D grayscale) images on the 0-255
scale, shave ``crop_border`` pixels, optionally keep only the MATLAB Y channel (a grayscale image is its own
Y), and work in float64. SSIM is the Wang et al. index with an 11x11 Gaussian window (sigma 1.5), computed
with ``cv2.filter2D`` over the valid region and averaged over channels.

torch: ``psnr_torch`` / ``ssim_torch`` take NCHW RGB tensors on [0, 1] that were quantised to the uint8
grid by the caller and return one value per image as a tensor on the same device, without a host sync.
They agree with the numpy versions to about 1e-6 (PSNR in dB, SSIM).

16-bit images (``peak=65535``, per image or per batch): the values are snapped to the 16-bit grid instead, never
to 8 bits, and scored as the same images on the [0, 255] scale as floats (``x * 255``, not rounded): PSNR's peak
is 255 on that scale (equivalently 65535 on the 16-bit levels), SSIM's constants are ``(0.01 * 255)^2`` and
``(0.03 * 255)^2`` on it, and the Y channel is MATLAB's formula on it. An 8-bit image scores exactly as before.
"""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor

from anysr.errors import DataError, OptionError
from anysr.ops.color import Y_WEIGHTS_255, to_y_channel

__all__ = ["calculate_psnr", "calculate_ssim", "psnr_torch", "ssim_torch", "gaussian_window"]

_C1 = (0.01 * 255.0) ** 2
_C2 = (0.03 * 255.0) ** 2
_WIN = 11
_SIGMA = 1.5
_Y_WEIGHTS = Y_WEIGHTS_255  # Y = 16 + (65.481 R + 128.553 G + 24.966 B) / 255 for R, G, B on 0-255


def gaussian_window(size: int = _WIN, sigma: float = _SIGMA) -> np.ndarray:
    """The normalised 2-D Gaussian window (outer product of ``cv2.getGaussianKernel``), float64."""
    k = cv2.getGaussianKernel(size, sigma).astype(np.float64)
    return k @ k.T


def _reorder(img: np.ndarray, input_order: str, name: str) -> np.ndarray:
    arr = np.asarray(img)
    if input_order not in ("HWC", "CHW"):
        raise OptionError(f"input_order: must be 'HWC' or 'CHW', got {input_order!r}")
    if arr.ndim == 2:
        return arr[..., None]
    if arr.ndim != 3:
        raise DataError(f"{name}: expected an HWC, CHW or 2-D image, got shape {arr.shape}")
    return arr.transpose(1, 2, 0) if input_order == "CHW" else arr


def _prepare(img: np.ndarray, img2: np.ndarray, crop_border: int, input_order: str,
             test_y_channel: bool, fn: str) -> tuple[np.ndarray, np.ndarray]:
    a = _reorder(img, input_order, f"{fn} img")
    b = _reorder(img2, input_order, f"{fn} img2")
    if a.shape != b.shape:
        raise DataError(f"{fn}: image shapes differ: {a.shape} vs {b.shape}; resize or crop them to match")
    cb = int(crop_border)
    if cb < 0:
        raise OptionError(f"crop_border: must be >= 0, got {crop_border}")
    if cb:
        if a.shape[0] <= 2 * cb or a.shape[1] <= 2 * cb:
            raise DataError(f"{fn}: crop_border={cb} leaves nothing of a {a.shape[0]}x{a.shape[1]} image; "
                            "lower crop_border")
        a = a[cb:-cb, cb:-cb, ...]
        b = b[cb:-cb, cb:-cb, ...]
    if test_y_channel:
        a = to_y_channel(a)[..., None]
        b = to_y_channel(b)[..., None]
    return a.astype(np.float64), b.astype(np.float64)


def calculate_psnr(img: np.ndarray, img2: np.ndarray, crop_border: int, input_order: str = "HWC",
                   test_y_channel: bool = False, **kw: Any) -> float:
    """PSNR in dB between two 0-255 images (BGR when ``test_y_channel``); ``inf`` when they are equal."""
    a, b = _prepare(img, img2, crop_border, input_order, test_y_channel, "calculate_psnr")
    mse = float(np.mean((a - b) ** 2))
    if mse == 0:
        return float("inf")
    return 10.0 * math.log10(255.0 * 255.0 / mse)


def _ssim_plane(a: np.ndarray, b: np.ndarray) -> float:
    win = gaussian_window()
    r = _WIN // 2
    mu1 = cv2.filter2D(a, -1, win)[r:-r, r:-r]
    mu2 = cv2.filter2D(b, -1, win)[r:-r, r:-r]
    mu1_sq, mu2_sq, mu12 = mu1 * mu1, mu2 * mu2, mu1 * mu2
    s11 = cv2.filter2D(a * a, -1, win)[r:-r, r:-r] - mu1_sq
    s22 = cv2.filter2D(b * b, -1, win)[r:-r, r:-r] - mu2_sq
    s12 = cv2.filter2D(a * b, -1, win)[r:-r, r:-r] - mu12
    num = (2 * mu12 + _C1) * (2 * s12 + _C2)
    den = (mu1_sq + mu2_sq + _C1) * (s11 + s22 + _C2)
    return float((num / den).mean())


def calculate_ssim(img: np.ndarray, img2: np.ndarray, crop_border: int, input_order: str = "HWC",
                   test_y_channel: bool = False, **kw: Any) -> float:
    """SSIM between two 0-255 images: the mean over channels of the mean SSIM map (valid region)."""
    a, b = _prepare(img, img2, crop_border, input_order, test_y_channel, "calculate_ssim")
    if a.shape[0] < _WIN or a.shape[1] < _WIN:
        raise DataError(f"calculate_ssim: a {a.shape[0]}x{a.shape[1]} image (after crop_border) is smaller "
                        f"than the {_WIN}x{_WIN} window; use a larger image or a smaller crop_border")
    return float(np.mean([_ssim_plane(a[..., c], b[..., c]) for c in range(a.shape[2])]))


# ----------------------------------------------------------------------------------------------- torch
Peak = float | Tensor


def _peak(peak: Peak | None, n: int, like: Tensor) -> Peak:
    """255.0 (8-bit), 65535.0 (16-bit), or one value per image as an (N, 1, 1, 1) tensor on ``like``'s device."""
    if peak is None:
        return 255.0
    if isinstance(peak, int | float):
        if float(peak) not in (255.0, 65535.0):
            raise DataError(f"peak: 255 (8-bit images) or 65535 (16-bit ones), got {peak}")
        return float(peak)
    t = torch.as_tensor(peak, device=like.device, dtype=like.dtype).reshape(-1)
    if t.numel() not in (1, n):
        raise DataError(f"peak: one value, or one per image ({n}), got {t.numel()}")
    return t.expand(n).reshape(n, 1, 1, 1)


def _check_pair(sr: Tensor, gt: Tensor, crop_border: int, fn: str,
                peak: Peak | None = None) -> tuple[Tensor, Tensor, Peak]:
    if sr.dim() == 3:
        sr, gt = sr.unsqueeze(0), gt.unsqueeze(0)
    if sr.dim() != 4 or sr.shape != gt.shape:
        raise DataError(f"{fn}: expected two NCHW tensors of the same shape, got {tuple(sr.shape)} "
                        f"and {tuple(gt.shape)}")
    if not (sr.is_floating_point() and gt.is_floating_point()):
        raise DataError(f"{fn}: expected float tensors on [0, 1], got {sr.dtype} and {gt.dtype}; "
                        "divide uint8 images by 255 first")
    cb = int(crop_border)
    if cb < 0:
        raise OptionError(f"crop_border: must be >= 0, got {crop_border}")
    if cb:
        if sr.shape[-2] <= 2 * cb or sr.shape[-1] <= 2 * cb:
            raise DataError(f"{fn}: crop_border={cb} leaves nothing of a "
                            f"{sr.shape[-2]}x{sr.shape[-1]} image; lower crop_border")
        sr = sr[..., cb:-cb, cb:-cb]
        gt = gt[..., cb:-cb, cb:-cb]
    dtype = torch.float64 if sr.dtype == torch.float64 else torch.float32  # never half precision
    # Snap to the uint8 (uint16) grid (a no-op for quantised input) so the maths runs on exact integers.
    p = _peak(peak, sr.shape[0], sr.to(dtype))
    return (sr.to(dtype) * p).round().contiguous(), (gt.to(dtype) * p).round().contiguous(), p


def _luma(x255: Tensor) -> Tensor:
    """MATLAB Y (0-255, without the +16 offset) of an NCHW RGB tensor on 0-255, as N1HW."""
    wr, wg, wb = _Y_WEIGHTS
    return wr * x255[:, 0:1] + wg * x255[:, 1:2] + wb * x255[:, 2:3]


def _flags(gray: Tensor | None, like: Tensor) -> Tensor | None:
    if gray is None:
        return None
    return torch.as_tensor(gray, device=like.device).to(torch.bool).reshape(-1, 1, 1, 1)


def _y_planes(a: Tensor, b: Tensor, gray: Tensor | None, peak: Peak = 255.0) -> tuple[Tensor, Tensor, Tensor]:
    """Y planes (N1HW, 0-255, or 0-``peak``) of both images and their difference, computed from exact integer
    diffs.

    Images flagged ``gray`` (and 1-channel tensors) use channel 0 as is.
    """
    channels = a.shape[1]
    if channels == 1:
        return a, b, a - b
    if channels != 3:
        raise DataError(f"test_y_channel needs RGB tensors with 3 channels (or 1 for gray), got {channels}")
    offset = 16.0 if isinstance(peak, float) and peak == 255.0 else 16.0 * peak / 255.0
    ya, yb, yd = _luma(a) + offset, _luma(b) + offset, _luma(a - b)
    flags = _flags(gray, a)
    if flags is None:
        return ya, yb, yd
    a0, b0 = a[:, 0:1], b[:, 0:1]
    return torch.where(flags, a0, ya), torch.where(flags, b0, yb), torch.where(flags, a0 - b0, yd)


def _per_image(per_channel: Tensor, gray: Tensor | None) -> Tensor:
    """Per image: the mean over channels, or channel 0 for images flagged ``gray``."""
    value = per_channel.mean(dim=1)
    flags = _flags(gray, per_channel)
    if flags is None:
        return value
    return torch.where(flags.reshape(-1), per_channel[:, 0], value)


def psnr_torch(sr: Tensor, gt: Tensor, crop_border: int = 0, test_y_channel: bool = False,
               gray: Tensor | None = None, peak: Peak | None = None, **kw: Any) -> Tensor:
    """PSNR (dB) per image of NCHW RGB tensors on [0, 1]; a tensor of shape [N] on their device.

    ``gray[i]`` true: image i is grayscale and its channel 0 is used as is (it is its own Y). ``peak``: 255 (the
    default: 8-bit images), 65535 (16-bit images, snapped to 16 bits only), or a value per image.
    """
    a, b, p = _check_pair(sr, gt, crop_border, "psnr_torch", peak)
    if test_y_channel:
        dy = _y_planes(a, b, gray, p)[2]
        mse = (dy * dy).mean(dim=(-3, -2, -1))
    else:
        diff = a - b
        mse = _per_image((diff * diff).mean(dim=(-2, -1)), gray)
    top = (p * p).reshape(-1) if isinstance(p, Tensor) else p * p  # 255 * 255 on 8-bit levels, as BasicSR
    return 10.0 * torch.log10(top / mse)


def _blur_valid(x: Tensor) -> Tensor:
    """The 11x11 Gaussian filter over the valid region of the last two axes, as separable multiply-adds.

    Plain element-wise float arithmetic (no convolution kernel), so TF32 / bf16 matmul or convolution
    precision modes on CUDA or TPU cannot change the result.
    """
    k = [float(v) for v in cv2.getGaussianKernel(_WIN, _SIGMA).ravel()]
    h, w = x.shape[-2] - _WIN + 1, x.shape[-1] - _WIN + 1
    rows = k[0] * x[..., 0:h, :]
    for i in range(1, _WIN):
        rows = rows.add(x[..., i:i + h, :], alpha=k[i])
    out = k[0] * rows[..., 0:w]
    for j in range(1, _WIN):
        out = out.add(rows[..., j:j + w], alpha=k[j])
    return out


def _ssim_planes(a: Tensor, b: Tensor, d: Tensor | None = None, peak: Peak = 255.0) -> Tensor:
    """Mean SSIM of each plane of two N,C,H,W tensors on 0-255; shape N, C.

    ``d`` is ``a - b`` when the caller can compute it more exactly than by subtraction.
    The index is rewritten so float32 keeps about 1e-7 of accuracy: with ``d = a - b``,
    ``(2 m1 m2 + C1) / (m1^2 + m2^2 + C1) = 1 - m_d^2 / (m1^2 + m2^2 + C1)`` and
    ``s11 + s22 = 2 s12 + var(d)``, so the cancellation-prone variances appear only in ratios close to 1.
    ``peak``: the grid of ``a`` and ``b`` (255, or 65535 for 16-bit levels: the constants scale with it).
    """
    c1 = _C1 if isinstance(peak, float) and peak == 255.0 else _C1 * (peak / 255.0) ** 2
    c2 = _C2 if isinstance(peak, float) and peak == 255.0 else _C2 * (peak / 255.0) ** 2
    n, c, h, w = a.shape
    if h < _WIN or w < _WIN:
        raise DataError(f"ssim_torch: a {h}x{w} image (after crop_border) is smaller than the "
                        f"{_WIN}x{_WIN} window; use a larger image or a smaller crop_border")
    if d is None:
        d = a - b
    shift = a.mean(dim=(-2, -1), keepdim=True)  # shifting both images changes no variance, loses less
    a0, b0 = a - shift, b - shift
    stats = _blur_valid(torch.stack([a0, b0, d, d * d, a0 * b0]))
    mu1, mu2, mu_d, e_dd, e_ab = stats.unbind(0)
    var_d = e_dd - mu_d * mu_d
    s12 = e_ab - mu1 * mu2
    m1, m2 = mu1 + shift, mu2 + shift
    lum = 1.0 - mu_d * mu_d / (m1 * m1 + m2 * m2 + c1)
    t = 2.0 * s12 + c2
    return (lum * t / (t + var_d)).mean(dim=(-2, -1))


def ssim_torch(sr: Tensor, gt: Tensor, crop_border: int = 0, test_y_channel: bool = False,
               gray: Tensor | None = None, peak: Peak | None = None, **kw: Any) -> Tensor:
    """SSIM per image of NCHW RGB tensors on [0, 1]; a tensor of shape [N] on their device.

    ``gray[i]`` true: image i is grayscale and its channel 0 is used as is (it is its own Y). ``peak``: 255 (the
    default: 8-bit images), 65535 (16-bit images, snapped to 16 bits only), or a value per image.
    """
    a, b, p = _check_pair(sr, gt, crop_border, "ssim_torch", peak)
    if test_y_channel:
        return _ssim_planes(*_y_planes(a, b, gray, p), peak=p)[:, 0]
    return _per_image(_ssim_planes(a, b, peak=p), gray)
