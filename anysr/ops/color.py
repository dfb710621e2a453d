"""MATLAB-compatible colour conversions (ITU-R BT.601, "studio swing" Y in [16, 235]) in numpy and torch.

numpy functions follow BasicSR's range convention: uint8 in -> uint8 out (rounded); float in [0, 1] in ->
float out on the same [0, 1] scale (so Y lies in [16/255, 235/255]). ``to_y_channel`` is the metrics helper.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from anysr.errors import DataError

__all__ = [
    "rgb2ycbcr", "bgr2ycbcr", "ycbcr2rgb", "ycbcr2bgr", "rgb2ycbcr_torch", "to_y_channel",
    "full_range_luma", "LUMA_RGB", "Y_WEIGHTS_255", "GRAY_RGB_PIL", "gray_pil_torch", "adjust_brightness",
    "adjust_contrast", "adjust_saturation", "adjust_hue", "rgb_to_hsv", "hsv_to_rgb", "srgb_to_linear",
]

# Rows: R, G, B (input on [0, 1]); columns: Y, Cb, Cr (output on [0, 255]) - MATLAB's rgb2ycbcr matrix.
_RGB_TO_YCC = np.array(
    [[65.481, -37.797, 112.0],
     [128.553, -74.203, -93.786],
     [24.966, 112.0, -18.214]],
    dtype=np.float64,
)
_YCC_OFFSET = np.array([16.0, 128.0, 128.0], dtype=np.float64)
_YCC_TO_RGB = np.linalg.inv(_RGB_TO_YCC)
# Full-range (JPEG) BT.601 luma weights for R, G, B; they sum to exactly one. The one place they are written.
LUMA_RGB = (0.299, 0.587, 0.114)
_LUMA_FULL = np.array(LUMA_RGB, dtype=np.float64)
# MATLAB rgb2ycbcr's Y row for R, G, B on 0-255 (Y = 16 + these . RGB), as PSNR/SSIM on Y use it.
Y_WEIGHTS_255 = tuple(float(w) / 255.0 for w in _RGB_TO_YCC[:, 0])
# PIL's "L" conversion weights (ITU-R 601-2 luma, rounded as PIL rounds them), which torchvision's colour jitter uses.
GRAY_RGB_PIL = (0.2989, 0.587, 0.114)


def _as_unit_float(img: np.ndarray, fn: str) -> tuple[np.ndarray, np.dtype]:
    arr = np.asarray(img)
    if arr.dtype == np.uint8:
        return arr.astype(np.float64) / 255.0, arr.dtype
    if np.issubdtype(arr.dtype, np.floating):
        return arr.astype(np.float64), arr.dtype
    raise DataError(
        f"{fn}: expected a uint8 image or a float image in [0, 1], got dtype {arr.dtype}; "
        "convert it to uint8, or to float32 scaled to [0, 1], first"
    )


def _from_255(out: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.uint8:
        return np.clip(np.round(out), 0, 255).astype(np.uint8)
    return (out / 255.0).astype(dtype)


def _check_three(arr: np.ndarray, fn: str) -> None:
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise DataError(f"{fn}: expected an HWC image with 3 channels, got shape {arr.shape}")


def rgb2ycbcr(img: np.ndarray, y_only: bool = False) -> np.ndarray:
    """MATLAB ``rgb2ycbcr`` on an HWC RGB image; ``y_only`` returns the HW Y plane."""
    _check_three(np.asarray(img), "rgb2ycbcr")
    x, dtype = _as_unit_float(img, "rgb2ycbcr")
    if y_only:
        out = x @ _RGB_TO_YCC[:, 0] + _YCC_OFFSET[0]
    else:
        out = x @ _RGB_TO_YCC + _YCC_OFFSET
    return _from_255(out, dtype)


def bgr2ycbcr(img: np.ndarray, y_only: bool = False) -> np.ndarray:
    """``rgb2ycbcr`` for a BGR image (OpenCV order); the output channels are still Y, Cb, Cr."""
    arr = np.asarray(img)
    _check_three(arr, "bgr2ycbcr")
    return rgb2ycbcr(arr[..., ::-1], y_only=y_only)


def ycbcr2rgb(img: np.ndarray) -> np.ndarray:
    """MATLAB ``ycbcr2rgb``: HWC Y, Cb, Cr in -> RGB out, same range convention as the input."""
    _check_three(np.asarray(img), "ycbcr2rgb")
    x, dtype = _as_unit_float(img, "ycbcr2rgb")
    out = (x * 255.0 - _YCC_OFFSET) @ _YCC_TO_RGB * 255.0
    return _from_255(out, dtype)


def ycbcr2bgr(img: np.ndarray) -> np.ndarray:
    """``ycbcr2rgb`` with the result in BGR order."""
    return np.ascontiguousarray(ycbcr2rgb(img)[..., ::-1])


def to_y_channel(img: np.ndarray) -> np.ndarray:
    """The HW float64 Y plane on the 0-255 scale used by the metrics (from a uint8-range BGR image).

    A 2-D (grayscale) image or an HWC image with one channel is its own Y and is returned as is;
    a 3-channel BGR image goes through ``bgr2ycbcr(y_only=True)`` (not rounded).
    """
    arr = np.asarray(img)
    if arr.ndim == 2:
        return arr.astype(np.float64)
    if arr.ndim == 3 and arr.shape[2] == 1:
        return arr[..., 0].astype(np.float64)
    _check_three(arr, "to_y_channel")
    unit = arr.astype(np.float64) / 255.0
    return bgr2ycbcr(unit, y_only=True) * 255.0


def full_range_luma(img: np.ndarray) -> np.ndarray:
    """Full-range BT.601 luma ``0.299 R + 0.587 G + 0.114 B`` of a BGR image, float64 on its own scale.

    For a gray image stored with three equal channels this is the gray value itself.
    """
    arr = np.asarray(img)
    _check_three(arr, "full_range_luma")
    return arr.astype(np.float64) @ _LUMA_FULL[::-1]


def rgb2ycbcr_torch(x: Tensor, y_only: bool = True) -> Tensor:
    """``rgb2ycbcr`` on an NCHW (or CHW) RGB tensor in [0, 1]; the result is on [0, 1] too.

    ``y_only`` gives an N1HW tensor; otherwise N3HW (Y, Cb, Cr). Works on any device and float dtype.
    """
    if x.dim() not in (3, 4) or x.shape[-3] != 3:
        raise DataError(f"rgb2ycbcr_torch: expected an NCHW or CHW RGB tensor, got shape {tuple(x.shape)}")
    cols = slice(0, 1) if y_only else slice(0, 3)
    mat = torch.as_tensor(_RGB_TO_YCC[:, cols].T.copy(), dtype=x.dtype, device=x.device)  # (k, 3)
    off = torch.as_tensor(_YCC_OFFSET[cols].copy(), dtype=x.dtype, device=x.device)
    out = torch.einsum("kc,...chw->...khw", mat, x) + off.view(-1, 1, 1)
    return out / 255.0


# ---------------------------------------------------------------- photometric adjustments (torchvision's meaning)
def _check_rgb_tensor(x: Tensor, fn: str) -> None:
    if x.dim() < 3 or x.shape[-3] != 3 or not x.is_floating_point():
        raise DataError(f"{fn}: expected a float (..., 3, H, W) RGB tensor in [0, 1], got {x.dtype} of shape "
                        f"{tuple(x.shape)}")


def gray_pil_torch(x: Tensor) -> Tensor:
    """The (..., 1, H, W) gray image of an RGB tensor with PIL's weights (:data:`GRAY_RGB_PIL`)."""
    _check_rgb_tensor(x, "gray_pil_torch")
    wr, wg, wb = GRAY_RGB_PIL
    return (wr * x[..., 0, :, :] + wg * x[..., 1, :, :] + wb * x[..., 2, :, :]).unsqueeze(-3)


def _mix(x: Tensor, other: Tensor | float, factor: float) -> Tensor:
    """``factor * x + (1 - factor) * other`` clipped to [0, 1]: a factor above 1 extrapolates away from ``other``."""
    return (factor * x + (1.0 - factor) * other).clamp(0.0, 1.0)


def adjust_brightness(x: Tensor, factor: float) -> Tensor:
    """Scale an RGB tensor in [0, 1] by ``factor`` >= 0 (a mix with black), clipped to [0, 1]."""
    _check_rgb_tensor(x, "adjust_brightness")
    return _mix(x, 0.0, factor)


def adjust_contrast(x: Tensor, factor: float) -> Tensor:
    """Mix each image with the mean of its PIL gray image (``factor`` 0: flat gray, 1: unchanged), clipped."""
    _check_rgb_tensor(x, "adjust_contrast")
    return _mix(x, gray_pil_torch(x).mean(dim=(-3, -2, -1), keepdim=True), factor)


def adjust_saturation(x: Tensor, factor: float) -> Tensor:
    """Mix with the PIL gray image (``factor`` 0: gray, 1: unchanged, 2: twice the saturation), clipped."""
    _check_rgb_tensor(x, "adjust_saturation")
    return _mix(x, gray_pil_torch(x), factor)


def rgb_to_hsv(x: Tensor) -> Tensor:
    """(..., 3, H, W) RGB in [0, 1] -> hue (in turns, [0, 1)), saturation, value (the hexcone model)."""
    _check_rgb_tensor(x, "rgb_to_hsv")
    r, g, b = x.unbind(-3)
    v, _ = x.max(dim=-3)
    chroma = v - x.min(dim=-3).values
    flat = chroma == 0
    safe_c = torch.where(flat, torch.ones_like(chroma), chroma)
    s = chroma / torch.where(v == 0, torch.ones_like(v), v)
    # the sector of the largest channel (red first, then green, on ties), and the offset inside it
    h = torch.where(v == r, (g - b) / safe_c, torch.where(v == g, 2.0 + (b - r) / safe_c, 4.0 + (r - g) / safe_c))
    h = torch.where(flat, torch.zeros_like(h), h)
    h = torch.remainder(h / 6.0, 1.0)
    return torch.stack((h, s, v), dim=-3)


def hsv_to_rgb(x: Tensor) -> Tensor:
    """The inverse of :func:`rgb_to_hsv`: (..., 3, H, W) hue in turns, saturation, value -> RGB in [0, 1]."""
    if x.dim() < 3 or x.shape[-3] != 3:
        raise DataError(f"hsv_to_rgb: expected a (..., 3, H, W) HSV tensor, got shape {tuple(x.shape)}")
    h, s, v = x.unbind(-3)
    h6 = h * 6.0
    sector = torch.floor(h6)
    frac = h6 - sector
    sector = torch.remainder(sector.to(torch.int64), 6)
    p = (v * (1.0 - s)).clamp(0.0, 1.0)
    q = (v * (1.0 - s * frac)).clamp(0.0, 1.0)
    t = (v * (1.0 - s * (1.0 - frac))).clamp(0.0, 1.0)
    # per sector 0..5: which of v, q, p, t each channel takes on the way around the hexagon
    table = {0: (v, t, p), 1: (q, v, p), 2: (p, v, t), 3: (p, q, v), 4: (t, p, v), 5: (v, p, q)}
    out = torch.zeros_like(x)
    for k, (rk, gk, bk) in table.items():
        on = (sector == k).unsqueeze(-3)
        out = torch.where(on, torch.stack((rk, gk, bk), dim=-3), out)
    return out


def adjust_hue(x: Tensor, factor: float) -> Tensor:
    """Rotate the hue of an RGB tensor in [0, 1] by ``factor`` turns (in [-0.5, 0.5]) in HSV space."""
    _check_rgb_tensor(x, "adjust_hue")
    if not -0.5 <= factor <= 0.5:
        raise DataError(f"adjust_hue: factor must be in [-0.5, 0.5] (turns of the hue circle), got {factor}")
    h, s, v = rgb_to_hsv(x).unbind(-3)
    return hsv_to_rgb(torch.stack((torch.remainder(h + factor, 1.0), s, v), dim=-3))


def srgb_to_linear(x: Tensor) -> Tensor:
    """sRGB-encoded values -> linear light (IEC 61966-2-1): ``x / 12.92`` up to 0.04045, else
    ``((x + 0.055) / 1.055) ** 2.4``; the power sees at least 0.04045, so the gradient is finite everywhere."""
    return torch.where(x <= 0.04045, x / 12.92, ((x.clamp_min(0.04045) + 0.055) / 1.055) ** 2.4)
