"""MATLAB ``imresize(img, scale)`` with the default bicubic kernel, in numpy and in torch.

The kernel is Keys' cubic with ``a = -0.5``; when shrinking it is stretched by ``1 / scale`` (antialiasing);
samples outside the image are read back from inside it by mirroring the index (MATLAB's ``symmetric``
padding); each output row is normalised to sum to one; the output length is ``ceil(length * scale)``.
Per axis the taps (mirrored source indices and normalised weights) are computed once per size and
cached: numpy applies them as an ``out x in`` matrix product, torch as a few gathers and multiply-adds.
Results are not rounded: callers that want uint8 round and clip themselves.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from anysr.errors import DataError, OptionError

__all__ = ["cubic", "output_length", "resize_taps", "resize_weights", "imresize", "imresize_torch"]

KERNEL_WIDTH = 4.0


def cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution kernel with ``a = -0.5`` (MATLAB's bicubic), evaluated element-wise."""
    ax = np.abs(np.asarray(x, dtype=np.float64))
    ax2 = ax * ax
    ax3 = ax2 * ax
    near = (1.5 * ax3 - 2.5 * ax2 + 1.0) * (ax <= 1.0)
    far = (-0.5 * ax3 + 2.5 * ax2 - 4.0 * ax + 2.0) * ((ax > 1.0) & (ax <= 2.0))
    return near + far


def _check_scale(scale: float) -> float:
    s = float(scale)
    if not math.isfinite(s) or s <= 0:
        raise OptionError(f"scale: imresize needs a positive finite scale factor, got {scale!r}")
    return s


def output_length(length: int, scale: float) -> int:
    """MATLAB's output size ``ceil(length * scale)``, immune to float noise such as ``255 * (1/3)``."""
    exact = length * _check_scale(scale)
    nearest_int = round(exact)
    if abs(exact - nearest_int) < 1e-9 * max(1.0, exact):
        return max(1, int(nearest_int))
    return max(1, math.ceil(exact))


@lru_cache(maxsize=64)
def _taps_cached(in_length: int, out_length: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    if scale < 1.0:  # antialiasing: a wider, flatter kernel when shrinking
        width = KERNEL_WIDTH / scale

        def kernel(d: np.ndarray) -> np.ndarray:
            return scale * cubic(scale * d)
    else:
        width = KERNEL_WIDTH
        kernel = cubic
    # 1-based output coordinates mapped to 1-based input coordinates, as MATLAB does.
    out_pos = np.arange(1, out_length + 1, dtype=np.float64)
    centre = out_pos / scale + 0.5 * (1.0 - 1.0 / scale)
    first = np.floor(centre - width / 2.0)
    taps = int(math.ceil(width)) + 2
    idx = first[:, None] + np.arange(taps, dtype=np.float64)[None, :]
    w = kernel(centre[:, None] - idx)
    w = w / w.sum(axis=1, keepdims=True)
    # Symmetric padding: index k (1-based) reads aux[(k - 1) mod 2n] with aux = [1..n, n..1].
    period = 2 * in_length
    m = np.mod(idx.astype(np.int64) - 1, period)
    src = np.where(m < in_length, m, period - 1 - m)
    keep = np.any(w != 0, axis=0)  # drop tap columns that are zero for every output
    src, w = np.ascontiguousarray(src[:, keep]), np.ascontiguousarray(w[:, keep])
    src.setflags(write=False)
    w.setflags(write=False)
    return src, w


@lru_cache(maxsize=64)
def _matrix_cached(in_length: int, out_length: int, scale: float) -> np.ndarray:
    src, w = _taps_cached(in_length, out_length, scale)
    mat = np.zeros((out_length, in_length), dtype=np.float64)
    rows = np.repeat(np.arange(out_length), src.shape[1])
    np.add.at(mat, (rows, src.ravel()), w.ravel())
    mat.setflags(write=False)
    return mat


def _sizes(in_length: int, scale: float, out_length: int | None) -> tuple[int, int, float]:
    if in_length < 1:
        raise DataError(f"imresize: cannot resize an image axis of length {in_length}")
    s = _check_scale(scale)
    n_out = output_length(in_length, s) if out_length is None else int(out_length)
    return int(in_length), n_out, s


def resize_taps(in_length: int, scale: float, out_length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Source indices (int64) and weights (float64), both ``(out_length, taps)``, for one axis.

    Output ``i`` is ``sum_t weights[i, t] * signal[indices[i, t]]``; indices are already mirrored into
    range. ``out_length`` defaults to MATLAB's ``ceil(in_length * scale)``. Cached; read-only.
    """
    return _taps_cached(*_sizes(in_length, scale, out_length))


def resize_weights(in_length: int, scale: float, out_length: int | None = None) -> np.ndarray:
    """The ``(out_length, in_length)`` float64 matrix ``M`` with ``resized = M @ signal`` along one axis.

    Rows sum to one. ``out_length`` defaults to MATLAB's ``ceil(in_length * scale)``. Cached; read-only.
    """
    return _matrix_cached(*_sizes(in_length, scale, out_length))


def imresize(img: np.ndarray, scale: float) -> np.ndarray:
    """Resize an HW or HWC numpy image by ``scale`` exactly like MATLAB ``imresize(img, scale)`` (bicubic).

    uint8 input gives float64 output on the 0-255 scale; float input gives float output (float32 stays
    float32) on the input's own scale, e.g. [0, 1]. Nothing is rounded or clipped.
    """
    arr = np.asarray(img)
    if arr.ndim not in (2, 3):
        raise DataError(f"imresize: expected an HW or HWC image, got shape {arr.shape}")
    out_dtype = arr.dtype if arr.dtype in (np.float32, np.float64) else np.float64
    x = arr.astype(np.float64, copy=False)
    h, w = x.shape[:2]
    wh = resize_weights(h, scale)
    ww = resize_weights(w, scale)
    rest = x.shape[2:]
    # Rows: (out_h, h) @ (h, w*c); columns: contract the width axis with (out_w, w).
    y = (wh @ x.reshape(h, -1)).reshape((wh.shape[0], w, *rest))
    y = np.tensordot(ww, y, axes=([1], [1]))  # (out_w, out_h, *rest)
    y = np.swapaxes(y, 0, 1)
    return np.ascontiguousarray(y, dtype=out_dtype)


def _resample_axis(x: Tensor, dim: int, scale: float) -> Tensor:
    src, w = resize_taps(int(x.shape[dim]), scale)
    idx = torch.from_numpy(np.array(src)).to(x.device)
    wt = torch.from_numpy(np.array(w)).to(device=x.device, dtype=x.dtype)
    shape = [1] * x.dim()
    shape[dim] = wt.shape[0]
    out = None
    for t in range(wt.shape[1]):  # a few gathers and multiply-adds: exact fp32 on every backend
        term = x.index_select(dim, idx[:, t]) * wt[:, t].reshape(shape)
        out = term if out is None else out + term
    assert out is not None
    return out


def imresize_torch(x: Tensor, scale: float) -> Tensor:
    """Resize an NCHW or CHW tensor by ``scale`` like MATLAB ``imresize`` (bicubic, antialiased).

    Differentiable and device-agnostic: per axis, the taps (mirrored source indices and weights) are
    built on the host once per size, moved to ``x``'s device, and applied as gathers and multiply-adds
    (no matmul, so no TF32/bf16 matmul precision modes can change the numbers). Output dtype is ``x``'s
    floating dtype (float32 for integer input). No rounding or clamping.
    """
    if x.dim() not in (3, 4):
        raise DataError(f"imresize_torch: expected an NCHW or CHW tensor, got shape {tuple(x.shape)}")
    y = x if x.is_floating_point() else x.to(torch.float32)
    y = _resample_axis(y, y.dim() - 2, scale)
    return _resample_axis(y, y.dim() - 1, scale)
