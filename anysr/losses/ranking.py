"""Losses on predicted scalars rather than images: MMRealSR's metric learning of degradation degrees."""

from __future__ import annotations

import torch
from torch import nn

from anysr.registry import LOSS_REGISTRY

_REDUCTIONS = ("mean", "sum", "none")


@LOSS_REGISTRY.register()
class MarginRankingLoss(nn.Module):
    """``loss_weight * max(0, -target * (input1 - input2) + margin)``, reduced (torch's ``margin_ranking_loss``,
    written out as element-wise ops). ``target`` 1 asks for ``input1 > input2 + margin``, -1 for the reverse.

    MMRealSR's ``train.rank_opt`` / ``rank_opt_b`` (the authors' class and arguments): the degree estimated for a
    more degraded version of an image must exceed that of the less degraded one by ``margin``.
    """

    role = "ranking"  # MMRealSR's train.rank_opt / rank_opt_b; no image loss list takes it

    def __init__(self, loss_weight: float = 1.0, margin: float = 0.0, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got '{reduction}'")
        self.loss_weight = float(loss_weight)
        self.margin = float(margin)
        self.reduction = reduction

    def forward(self, input1: torch.Tensor, input2: torch.Tensor, target: torch.Tensor | float) -> torch.Tensor:
        loss = (self.margin - target * (input1 - input2)).clamp_min(0)
        if self.reduction == "mean":
            loss = loss.mean()
        elif self.reduction == "sum":
            loss = loss.sum()
        return self.loss_weight * loss
