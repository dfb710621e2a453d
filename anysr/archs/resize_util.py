"""Bilinear resizing that XLA can differentiate.

``F.interpolate(mode="bilinear")`` has an XLA forward lowering but its backward (``upsample_bilinear2d_backward``)
runs on the CPU (the XLA 2.9 backend). On XLA devices ``resize_bilinear`` therefore gathers the two source rows /
columns of every output pixel (indices and weights from the static sizes, built on the input's device) and
blends them: the same values as ``F.interpolate`` (within float rounding), with gathers and their scatter-add
backward, which XLA lowers. Elsewhere it is ``F.interpolate``.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from anysr.accelerators.hardware import resamples_by_gathers


def _taps(n_out: int, n_in: int, align_corners: bool, device: torch.device,
          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Source indices (lower, upper) and the upper weight of each of ``n_out`` outputs, as PyTorch computes them."""
    dst = torch.arange(n_out, device=device, dtype=torch.float32)
    if align_corners:
        src = dst * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
    else:
        src = ((dst + 0.5) * (n_in / n_out) - 0.5).clamp(min=0.0)
    low = src.floor().long().clamp(max=n_in - 1)
    high = (low + 1).clamp(max=n_in - 1)
    return low, high, (src - low.float()).to(dtype)


def _blend(x: torch.Tensor, dim: int, n_out: int, align_corners: bool) -> torch.Tensor:
    low, high, lam = _taps(n_out, x.shape[dim], align_corners, x.device, x.dtype)
    shape = [1] * x.dim()
    shape[dim] = n_out
    lam = lam.view(shape)
    return x.index_select(dim, low) * (1 - lam) + x.index_select(dim, high) * lam


def resize_bilinear_gather(x: torch.Tensor, size: tuple[int, int], align_corners: bool) -> torch.Tensor:
    """Bilinear resize of an NCHW map to ``size`` by gathers and blends (columns first, then rows, as PyTorch's
    kernel weighs them)."""
    return _blend(_blend(x, 3, size[1], align_corners), 2, size[0], align_corners)


def resize_bilinear(x: torch.Tensor, size: tuple[int, int], align_corners: bool) -> torch.Tensor:
    """Bilinear resize of an NCHW map to ``size`` (``F.interpolate`` semantics; gathers on XLA, see above)."""
    if resamples_by_gathers(x.device):
        return resize_bilinear_gather(x, size, align_corners)
    return F.interpolate(x, size=size, mode="bilinear", align_corners=align_corners)


def adaptive_max_gather(x: torch.Tensor, dim: int, n_out: torch.Tensor | int, taps: int) -> torch.Tensor:
    """``adaptive_max_pool1d`` of ``dim`` (size n) to ``n_out`` cells by one gather and a max.

    Cell ``i`` is the max over ``[floor(i n / n_out), ceil((i + 1) n / n_out))``, gathered with ``taps`` indices
    (at least the widest cell; a shorter cell repeats its last index). ``n_out`` may be a traced size (dynamic ONNX
    export). Pooling to ``n // f`` cells needs ``2 f + 1`` taps.
    """
    n = x.shape[dim]
    cells = torch.arange(n_out, device=x.device)
    start = cells * n // n_out
    end = ((cells + 1) * n + n_out - 1) // n_out
    idx = torch.minimum(start[:, None] + torch.arange(taps, device=x.device), end[:, None] - 1)
    picked = x.index_select(dim, idx.flatten())
    shape = list(x.shape)
    shape[dim:dim + 1] = [-1, taps]
    return picked.reshape(shape).amax(dim + 1)


__all__ = ["adaptive_max_gather", "resize_bilinear", "resize_bilinear_gather"]
