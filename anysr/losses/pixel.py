"""Pixel losses with BasicSR's arguments (``loss_weight``, ``reduction``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.registry import LOSS_REGISTRY

_REDUCTIONS = ("mean", "sum", "none")


CRITERIA = ("l1", "l2", "charbonnier")


def check_criterion(criterion: str, allowed: tuple[str, ...] = CRITERIA) -> str:
    """``criterion`` if it is one of ``allowed``, else a ValueError listing them."""
    if criterion not in allowed:
        raise ValueError(f"criterion '{criterion}' is not supported; use one of {', '.join(allowed)}")
    return criterion


def elementwise(criterion: str, a: torch.Tensor, b: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Unreduced distance: ``l1`` |a - b|, ``l2`` (a - b)^2, ``charbonnier`` sqrt((a - b)^2 + eps)."""
    if criterion == "l1":
        return (a - b).abs()
    if criterion == "l2":
        return (a - b) ** 2
    return torch.sqrt((a - b) ** 2 + eps)


def huber(a: torch.Tensor, b: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    """Unreduced ``F.huber_loss(a, b, delta=delta)`` written out (aten's huber_loss falls back to the CPU on XLA):
    ``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - delta / 2)``, with ``d = a - b``."""
    d = a - b
    ad = d.abs()
    return torch.where(ad < delta, 0.5 * d * d, delta * (ad - 0.5 * delta))


class _PixelLoss(nn.Module):
    """Shared by the pixel losses: ``loss_weight`` and ``reduction`` as BasicSR's."""

    role = "pixel"  # which train.*_opt accepts it (the options read this)

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got '{reduction}'")
        self.loss_weight = float(loss_weight)
        self.reduction = reduction

    def _reduce(self, loss: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Element-wise ``loss`` (times ``weight``) reduced as BasicSR does: with a weight, ``mean`` is the mean
        over the weighted region (sum of loss / sum of weight, a one-channel weight counting once per channel)."""
        if weight is not None:
            if loss.dim() == 1:  # per-image losses take per-image weights
                ok = tuple(weight.shape) == tuple(loss.shape)
            else:
                ok = weight.dim() == loss.dim() and weight.shape[1] in (1, loss.shape[1])
            if not ok:
                raise ValueError(f"weight of shape {tuple(weight.shape)} does not fit a loss of shape "
                                 f"{tuple(loss.shape)}; give one of the same rank with 1 or all channels "
                                 "(per-image losses: one weight per image)")
            loss = loss * weight
            if self.reduction == "mean":
                per = loss.shape[1] if loss.dim() > 1 and weight.shape[1] == 1 else 1
                return loss.sum() / (weight.sum() * per)
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


@LOSS_REGISTRY.register()
class HuberLoss(_PixelLoss):
    """Huber (smooth L1 with threshold ``delta``): quadratic below ``delta``, linear above; times ``loss_weight``."""

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(loss_weight, reduction)
        if not delta > 0:
            raise ValueError(f"delta must be > 0, got {delta}")
        self.delta = float(delta)

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        loss = huber(pred, target, self.delta)
        return self.loss_weight * self._reduce(loss, weight)


@LOSS_REGISTRY.register()
class WeightedTVLoss(_PixelLoss):
    """BasicSR's total variation of ``pred``: the (weighted) L1 of vertical plus horizontal neighbour differences.

    ``target`` is accepted for the common ``loss(pred, target)`` call and ignored; ``weight`` (N, 1 or C, H, W)
    weighs each difference by the weight of its upper / left pixel. ``reduction`` is ``mean`` or ``sum``.
    """

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean") -> None:
        if reduction not in ("mean", "sum"):
            raise ValueError(f"WeightedTVLoss reduction must be 'mean' or 'sum', got '{reduction}'")
        super().__init__(loss_weight, reduction)

    def forward(self, pred: torch.Tensor, target: torch.Tensor | None = None,
                weight: torch.Tensor | None = None) -> torch.Tensor:
        y_w = None if weight is None else weight[:, :, :-1, :]
        x_w = None if weight is None else weight[:, :, :, :-1]
        dy = self._reduce((pred[:, :, :-1, :] - pred[:, :, 1:, :]).abs(), y_w)
        dx = self._reduce((pred[:, :, :, :-1] - pred[:, :, :, 1:]).abs(), x_w)
        return self.loss_weight * (dx + dy)
