"""LDL, the locally discriminative learning loss (Liang et al., "Details or Artifacts: A Locally Discriminative
Learning Approach to Realistic Image Super-Resolution", CVPR 2022): a pixel loss weighted by an artifact map that
marks where the trained generator's residual is locally noisy and larger than its EMA copy's."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from anysr.losses.pixel import _PixelLoss, check_criterion, elementwise
from anysr.registry import LOSS_REGISTRY


def local_variance(residual: torch.Tensor, ksize: int) -> torch.Tensor:
    """Unbiased variance of each ``ksize`` x ``ksize`` window (reflect-padded, same size as ``residual``)."""
    pad = (ksize - 1) // 2
    padded = F.pad(residual, [pad, pad, pad, pad], mode="reflect")
    h, w = residual.shape[-2:]
    # the k * k shifted copies as static slices (Tensor.unfold falls back to the CPU on XLA); exact values
    windows = torch.stack([padded[..., i:i + h, j:j + w] for i in range(ksize) for j in range(ksize)], dim=-1)
    return torch.var(windows, dim=-1, unbiased=True)


def artifact_map(gt: torch.Tensor, output: torch.Tensor, output_ema: torch.Tensor, ksize: int = 7) -> torch.Tensor:
    """LDL's refined artifact map (N, 1, H, W): per image the variance of the channel-summed residual
    ``|gt - output|`` to the power 1/5 times its local ``ksize`` window variance, 0 where the EMA output's residual
    is larger. Differentiable in ``output`` as the authors' (no boolean indexing: static shapes)."""
    residual = (gt - output).abs().sum(1, keepdim=True)
    residual_ema = (gt - output_ema).abs().sum(1, keepdim=True)
    patch = torch.var(residual, dim=(-1, -2, -3), keepdim=True) ** (1 / 5)
    weight = patch * local_variance(residual, ksize)
    return torch.where(residual < residual_ema, torch.zeros_like(weight), weight)


@LOSS_REGISTRY.register()
class LDLLoss(_PixelLoss):
    """``loss_weight`` times the ``criterion`` distance (l1, l2, charbonnier with ``eps``) of ``map * output`` and
    ``map * gt``, ``map`` being ``artifact_map`` (window ``ksize``) against the EMA generator's output.

    Role ``artifact``: the model hands over the EMA network's output too, ``forward(output, output_ema, gt)``;
    it needs ``train.ema_decay`` > 0. The map is computed in fp32.
    """

    role = "artifact"  # which models accept it (the options read this)

    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", criterion: str = "l1", ksize: int = 7,
                 eps: float = 1e-12) -> None:
        super().__init__(loss_weight, reduction)
        if ksize < 3 or ksize % 2 == 0:
            raise ValueError(f"ksize must be an odd int >= 3, got {ksize}")
        self.criterion = check_criterion(criterion)
        self.ksize = int(ksize)
        self.eps = float(eps)

    def forward(self, output: torch.Tensor, output_ema: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        """``output``: the trained generator's; ``output_ema``: the EMA generator's (no gradient); ``gt``."""
        output, gt = output.float(), gt.float()
        weight = artifact_map(gt, output, output_ema.detach().float(), self.ksize)
        return self.loss_weight * self._reduce(elementwise(self.criterion, weight * output, weight * gt, self.eps))
