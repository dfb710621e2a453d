"""Pixel losses with BasicSR's arguments (``loss_weight``, ``reduction``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.registry import LOSS_REGISTRY

_REDUCTIONS = ("mean", "sum", "none")


class _PixelLoss(nn.Module):
    """Shared by the pixel losses: ``loss_weight`` and ``reduction`` as BasicSR's."""

    role = "pixel"  # which train.*_opt accepts it (the options read this)

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got '{reduction}'")
        self.loss_weight = float(loss_weight)
        self.reduction = reduction

    def _reduce(self, loss: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if weight is not None:
            loss = loss * weight
        if self.reduction == "mean":
            return loss.mean()
        if self.reduction == "sum":
            return loss.sum()
        return loss


@LOSS_REGISTRY.register()
class L1Loss(_PixelLoss):
    """Mean absolute error times ``loss_weight``."""

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss_weight * self._reduce(F.l1_loss(pred, target, reduction="none"), weight)


@LOSS_REGISTRY.register()
class MSELoss(_PixelLoss):
    """Mean squared error times ``loss_weight``."""

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss_weight * self._reduce(F.mse_loss(pred, target, reduction="none"), weight)


@LOSS_REGISTRY.register()
class CharbonnierLoss(_PixelLoss):
    """sqrt((x - y)^2 + eps) times ``loss_weight`` (a differentiable L1)."""

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", eps: float = 1e-12) -> None:
        super().__init__(loss_weight, reduction)
        self.eps = float(eps)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss_weight * self._reduce(torch.sqrt((pred - target) ** 2 + self.eps), weight)
