"""MATLAB bicubic downscaling, the degradation of the classic paired setting (numpy, in the loader workers)."""

from __future__ import annotations

import math

import numpy as np

from anysr.errors import DataError, OptionError
from anysr.ops.imresize import imresize, resize_weights

__all__ = ["bicubic_degrade", "bicubic_degrade_window"]

# LQ pixels of context kept around a patch so that degrading the patch equals cropping the degraded image.
_MARGIN_CACHE: dict[int, int] = {}


def bicubic_degrade(gt: np.ndarray, scale: int) -> np.ndarray:
    """MATLAB ``imresize(gt, 1/scale)`` (bicubic, antialiased) rounded and clipped to the GT's own type.

    ``gt`` is a uint8 or uint16 HW or HWC image (the result has its type: a 16-bit GT gives a 16-bit LQ) whose
    height and width should be multiples of ``scale`` (mod-crop it first; otherwise MATLAB's ``ceil`` output size
    no longer pairs with the GT).
    """
    if not isinstance(scale, int) or scale < 1:
        raise OptionError(f"bicubic_degrade: scale must be a positive integer, got {scale!r}")
    if gt.dtype not in (np.uint8, np.uint16):
        raise DataError(f"bicubic_degrade: expected a uint8 or uint16 image, got {gt.dtype}")
    if scale == 1:
        return gt.copy()
    out = imresize(gt, 1.0 / scale)
    return np.clip(np.rint(out), 0, np.iinfo(gt.dtype).max).astype(gt.dtype)


def _context_margin(scale: int) -> int:
    """LQ pixels on each side whose GT footprint covers the bicubic support of a patch's border pixels."""
    if scale not in _MARGIN_CACHE:
        # Measure the reach of the kernel from the actual weight matrix (robust to kernel changes).
        n = 16 * scale
        w = resize_weights(n, 1.0 / scale)
        row = w[n // scale // 2]
        nz = np.nonzero(row)[0]
        centre = (n // scale // 2 + 0.5) * scale - 0.5
        reach = max(centre - nz[0], nz[-1] - centre)
        _MARGIN_CACHE[scale] = int(math.ceil((reach + 1) / scale)) + 1
    return _MARGIN_CACHE[scale]


def bicubic_degrade_window(gt: np.ndarray, scale: int, top: int, left: int, size: int) -> np.ndarray:
    """The ``size`` x ``size`` LQ patch at LQ position (top, left) of ``bicubic_degrade(gt, scale)``.

    Only a window of ``gt`` around the patch (plus the kernel's reach) is resized, so the result is
    exactly that crop of the whole degraded image at a fraction of the cost. ``gt`` must have height and
    width divisible by ``scale``.
    """
    h, w = gt.shape[:2]
    if h % scale or w % scale:
        raise DataError(f"bicubic_degrade_window: GT {h}x{w} is not mod-cropped to scale {scale}")
    h_lq, w_lq = h // scale, w // scale
    if top < 0 or left < 0 or top + size > h_lq or left + size > w_lq:
        raise DataError(f"bicubic_degrade_window: patch ({top}, {left}, {size}) outside the {h_lq}x{w_lq} LQ")
    m = _context_margin(scale)
    t0, l0 = max(0, top - m), max(0, left - m)
    t1, l1 = min(h_lq, top + size + m), min(w_lq, left + size + m)
    window = gt[t0 * scale: t1 * scale, l0 * scale: l1 * scale, ...]
    lq = bicubic_degrade(np.ascontiguousarray(window), scale)
    return np.ascontiguousarray(lq[top - t0: top - t0 + size, left - l0: left - l0 + size, ...])

