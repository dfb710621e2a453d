"""Edge losses: the distance of Sobel gradients, and the gradient variance loss (Abrahamyan et al., "Gradient
Variance Loss for Structure-Enhanced Image Super-Resolution", 2022)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from anysr.losses.pixel import _PixelLoss, check_criterion, elementwise
from anysr.registry import LOSS_REGISTRY

_SOBEL_X = ((-1.0, 0.0, 1.0), (-2.0, 0.0, 2.0), (-1.0, 0.0, 1.0))
_GRAY = (0.299, 0.587, 0.114)  # ITU-R BT.601 luma weights


def sobel(x: torch.Tensor, padding: str = "replicate") -> tuple[torch.Tensor, torch.Tensor]:
    """Horizontal and vertical Sobel responses (unnormalised 3x3 kernels) of every channel, same size as ``x``.

    ``padding``: ``replicate`` (edges give no gradient) or ``zeros``."""
    c = x.shape[1]
    kx = torch.tensor(_SOBEL_X, dtype=x.dtype, device=x.device)
    k = torch.stack([kx, kx.t()]).unsqueeze(1).repeat(c, 1, 1, 1)  # (2C, 1, 3, 3): gx, gy per channel
    x = F.pad(x, (1, 1, 1, 1), mode="replicate") if padding == "replicate" else F.pad(x, (1, 1, 1, 1))
    g = F.conv2d(x, k, groups=c)
    return g[:, 0::2], g[:, 1::2]


@LOSS_REGISTRY.register()
class SobelLoss(_PixelLoss):
    """``criterion`` distance of the Sobel gradients of ``pred`` and ``target``: per pixel the sum over the
    horizontal and vertical responses (replicate-padded, so the output has the input's size)."""

    other_names = ("SobelEdgeLoss",)  # traiNNer-redux's name (sobeledgeloss)

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", criterion: str = "l1") -> None:
        super().__init__(loss_weight, reduction)
        self.criterion = check_criterion(criterion)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        px, py = sobel(pred)
        tx, ty = sobel(target)
        loss = elementwise(self.criterion, px, tx) + elementwise(self.criterion, py, ty)
        return self.loss_weight * self._reduce(loss, weight)


def _patch_variance(g: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(N, L) unbiased variance of each non-overlapping ``patch_size`` square of one-channel ``g``."""
    patches = F.unfold(g, kernel_size=patch_size, stride=patch_size)  # (N, p*p, L)
    return patches.var(dim=1)


@LOSS_REGISTRY.register()
class GradientVarianceLoss(_PixelLoss):
    """Gradient variance loss: the grey image's Sobel responses (zero-padded) are cut into ``patch_size`` squares;
    the loss is the squared difference of the per-square variances of ``pred`` and ``target``, horizontal plus
    vertical, reduced over the squares. Sides must be multiples of ``patch_size``; ``weight`` is not supported.
    """

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", patch_size: int = 8) -> None:
        super().__init__(loss_weight, reduction)
        if patch_size < 2:
            raise ValueError(f"patch_size must be >= 2, got {patch_size}")
        self.patch_size = int(patch_size)

    def _gray(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            return x
        if x.shape[1] != 3:
            raise ValueError(f"GradientVarianceLoss takes 1- or 3-channel images, got {x.shape[1]} channels")
        w = torch.tensor(_GRAY, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        return (x * w).sum(1, keepdim=True)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        if weight is not None:
            raise ValueError("GradientVarianceLoss takes no weight")
        h, w = pred.shape[-2:]
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(f"GradientVarianceLoss: {h}x{w} images are not multiples of patch_size "
                             f"{self.patch_size}; crop them or change patch_size")
        px, py = sobel(self._gray(pred), padding="zeros")
        tx, ty = sobel(self._gray(target), padding="zeros")
        p = self.patch_size
        loss = (_patch_variance(px, p) - _patch_variance(tx, p)) ** 2 + \
            (_patch_variance(py, p) - _patch_variance(ty, p)) ** 2
        return self.loss_weight * self._reduce(loss)
