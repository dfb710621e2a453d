"""Structural losses: 1 - SSIM, 1 - MS-SSIM and the MS-SSIM + L1 mix (Zhao et al., "Loss Functions for Image
Restoration with Neural Networks"). SSIM is the Gaussian-window form of Wang et al. (window 11, sigma 1.5,
K = (0.01, 0.03), 'valid' filtering), the same numbers as ``pytorch-msssim``. Computed in fp32 under autocast."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import functional as F

from anysr.losses.pixel import _PixelLoss
from anysr.ops.autocast import autocast_off
from anysr.registry import LOSS_REGISTRY

MS_SSIM_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)  # Wang et al. 2003, five scales


def gaussian_window(size: int, sigma: float) -> torch.Tensor:
    """A normalised 1-D Gaussian of ``size`` (odd) taps."""
    coords = torch.arange(size, dtype=torch.float32) - size // 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    return g / g.sum()


def _blur(x: torch.Tensor, win: torch.Tensor) -> torch.Tensor:
    """Separable 'valid' Gaussian filtering of every channel of NCHW ``x``."""
    c = x.shape[1]
    k = win.to(x.dtype)
    x = F.conv2d(x, k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
    return F.conv2d(x, k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)


def ssim_parts(x: torch.Tensor, y: torch.Tensor, win: torch.Tensor, data_range: float = 1.0,
               k: tuple[float, float] = (0.01, 0.03)) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image, per-channel (N, C) SSIM and contrast-structure term, each the mean of its map."""
    c1 = (k[0] * data_range) ** 2
    c2 = (k[1] * data_range) ** 2
    mu_x, mu_y = _blur(x, win), _blur(y, win)
    var_x = _blur(x * x, win) - mu_x**2
    var_y = _blur(y * y, win) - mu_y**2
    cov = _blur(x * y, win) - mu_x * mu_y
    cs_map = (2 * cov + c2) / (var_x + var_y + c2)
    ssim_map = (2 * mu_x * mu_y + c1) / (mu_x**2 + mu_y**2 + c1) * cs_map
    return ssim_map.flatten(2).mean(-1), cs_map.flatten(2).mean(-1)


def _check_pair(pred: torch.Tensor, target: torch.Tensor, min_side: int, name: str) -> None:
    if pred.dim() != 4 or pred.shape != target.shape:
        raise ValueError(f"{name}: pred and target must be NCHW of one shape, got {tuple(pred.shape)} and "
                         f"{tuple(target.shape)}")
    if min(pred.shape[-2:]) < min_side:
        raise ValueError(f"{name}: images of {pred.shape[-2]}x{pred.shape[-1]} are too small; this setting needs "
                         f"both sides >= {min_side} (use a smaller win_size or fewer weights/scales)")


class _SSIMBase(_PixelLoss):
    """``loss_weight``, ``reduction`` over the per-image values, and the window."""

    def __init__(self, loss_weight: float, reduction: str, win_size: int, win_sigma: float,
                 data_range: float) -> None:
        super().__init__(loss_weight, reduction)
        if win_size < 1 or win_size % 2 == 0:
            raise ValueError(f"win_size must be a positive odd number, got {win_size}")
        if not win_sigma > 0 or not data_range > 0:
            raise ValueError(f"win_sigma and data_range must be > 0, got {win_sigma} and {data_range}")
        self.win_size = int(win_size)
        self.data_range = float(data_range)
        self.register_buffer("win", gaussian_window(self.win_size, float(win_sigma)), persistent=False)


@LOSS_REGISTRY.register()
class SSIMLoss(_SSIMBase):
    """``loss_weight * (1 - SSIM)`` per image (the mean over channels), reduced over the batch."""

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", win_size: int = 11,
                 win_sigma: float = 1.5, data_range: float = 1.0) -> None:
        super().__init__(loss_weight, reduction, win_size, win_sigma, data_range)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """``weight``: optional per-image (N,) weights."""
        _check_pair(pred, target, self.win_size, "SSIMLoss")
        with autocast_off(pred):
            ssim, _ = ssim_parts(pred.float(), target.float(), self.win, self.data_range)
        return self.loss_weight * self._reduce(1 - ssim.mean(1), weight)


def ms_ssim(x: torch.Tensor, y: torch.Tensor, win: torch.Tensor, weights: torch.Tensor,
            data_range: float = 1.0) -> torch.Tensor:
    """Per-image (N,) multi-scale SSIM: contrast-structure at the coarser-to-be scales, SSIM at the last, each
    clamped at 0 and raised to its weight; 2x2 average pooling (padding odd sides) between scales."""
    levels = weights.shape[0]
    terms = []
    for level in range(levels):
        ssim, cs = ssim_parts(x, y, win, data_range)
        if level < levels - 1:
            terms.append(torch.relu(cs))
            pad = [s % 2 for s in x.shape[2:]]
            x = F.avg_pool2d(x, kernel_size=2, padding=pad)
            y = F.avg_pool2d(y, kernel_size=2, padding=pad)
    terms.append(torch.relu(ssim))
    stacked = torch.stack(terms, dim=0)  # (levels, N, C)
    return torch.prod(stacked ** weights.view(-1, 1, 1), dim=0).mean(1)


@LOSS_REGISTRY.register()
class MSSSIMLoss(_SSIMBase):
    """``loss_weight * (1 - MS-SSIM)`` per image, reduced over the batch.

    ``weights``: one exponent per scale (Wang et al.'s five by default, which need sides >= 161 with an
    11-tap window; give fewer weights or a smaller ``win_size`` for small crops).
    """

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", win_size: int = 11,
                 win_sigma: float = 1.5, data_range: float = 1.0,
                 weights: Sequence[float] = MS_SSIM_WEIGHTS) -> None:
        super().__init__(loss_weight, reduction, win_size, win_sigma, data_range)
        if len(weights) < 1:
            raise ValueError("weights is empty; give one exponent per scale, e.g. [0.0448, 0.2856, 0.3001]")
        self.register_buffer("scale_weights", torch.tensor([float(w) for w in weights]), persistent=False)
        self.min_side = (self.win_size - 1) * 2 ** (len(weights) - 1) + 1

    def _ms_ssim(self, pred: torch.Tensor, target: torch.Tensor, name: str) -> torch.Tensor:
        _check_pair(pred, target, self.min_side, name)
        with autocast_off(pred):
            return ms_ssim(pred.float(), target.float(), self.win, self.scale_weights, self.data_range)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """``weight``: optional per-image (N,) weights."""
        return self.loss_weight * self._reduce(1 - self._ms_ssim(pred, target, "MSSSIMLoss"), weight)


@LOSS_REGISTRY.register()
class MSSSIML1Loss(MSSSIMLoss):
    """``loss_weight * (alpha * (1 - MS-SSIM) + (1 - alpha) * L1)`` per image, reduced over the batch.

    Zhao et al. mix with ``alpha = 0.84``; the L1 term here is the plain per-image mean absolute error.
    """

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", alpha: float = 0.84, win_size: int = 11,
                 win_sigma: float = 1.5, data_range: float = 1.0,
                 weights: Sequence[float] = MS_SSIM_WEIGHTS) -> None:
        super().__init__(loss_weight, reduction, win_size, win_sigma, data_range, weights)
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.alpha = float(alpha)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """``weight``: optional per-image (N,) weights."""
        structure = 1 - self._ms_ssim(pred, target, "MSSSIML1Loss")
        with autocast_off(pred):
            l1 = (pred.float() - target.float()).abs().flatten(1).mean(1)
        return self.loss_weight * self._reduce(self.alpha * structure + (1 - self.alpha) * l1, weight)
