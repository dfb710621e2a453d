"""traiNNer-redux's pixel losses that compare shrunken or reduced images, under its names (``colorloss``,
``averageloss``, ``bicubicloss``, ``cosimloss``, ``nccloss`` in its ``train.losses`` lists), computing what
traiNNer-redux computes (checked against its source on fixtures) and times ``loss_weight`` (traiNNer-redux
multiplies in its model; anysr's losses carry their weight). Inputs are NCHW; computed in fp32 under autocast.

* ``ColorLoss``: the ``criterion`` distance of the BT.601 chroma (Cb, Cr; ``ChromaLoss``'s conversion) after
  ``scale`` x ``scale`` average pooling.
* ``AverageLoss``: the ``criterion`` distance of the ``scale`` x ``scale`` average-pooled images.
* ``BicubicLoss``: the ``criterion`` distance of the images shrunk by ``1 / scale`` (antialiased bicubic as
  ``F.interpolate(scale_factor=1 / scale, mode='bicubic', antialias=True)``, done as two small matrix products so
  that XLA has no fallback).
* ``CosimLoss``: ``cosim_lambda * (1 - mean cosine similarity of the pixels' colour vectors)``, inputs clamped to
  ``[1e-12, 1]``.
* ``NCCLoss``: ``(1 - CC) / 2``, CC the mean Pearson correlation of the rows of the images reshaped to ``C`` rows.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from anysr.losses.pixel import _PixelLoss, check_criterion, elementwise
from anysr.ops.augment import bicubic_resize
from anysr.ops.autocast import autocast_off
from anysr.ops.color import rgb2ycbcr_torch
from anysr.registry import LOSS_REGISTRY


def _check_pair(name: str, pred: torch.Tensor, target: torch.Tensor, rgb: bool = False) -> None:
    if pred.dim() != 4 or pred.shape != target.shape or (rgb and pred.shape[1] != 3):
        what = "two NCHW RGB images" if rgb else "two NCHW images"
        raise ValueError(f"{name} takes {what} of one shape, got {tuple(pred.shape)} and {tuple(target.shape)}")


def _check_scale(scale: int) -> int:
    if isinstance(scale, bool) or int(scale) != scale or scale < 1:
        raise ValueError(f"scale must be a positive integer, got {scale!r}")
    return int(scale)


def bicubic_shrink(x: torch.Tensor, scale: int) -> torch.Tensor:
    """``F.interpolate(x, scale_factor=1 / scale, mode='bicubic', antialias=True)``: output ``floor(side / scale)``,
    source coordinates mapped by the factor ``scale`` itself (not by the sides' ratio), in float32."""
    if scale == 1:
        return x.float()
    h, w = x.shape[-2:]
    return bicubic_resize(x, h // scale, w // scale, span=(h / scale, w / scale))


class _ShrinkLoss(_PixelLoss):
    """``loss_weight * mean criterion(shrink(pred), shrink(target))``."""

    criteria: tuple[str, ...] = ("l1", "l2", "charbonnier")
    rgb = False

    def __init__(self, loss_weight: float = 1.0, criterion: str = "l1", scale: int = 4) -> None:
        super().__init__(loss_weight, "mean")
        self.criterion = check_criterion(criterion, self.criteria)
        self.scale = _check_scale(scale)

    def shrink(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        _check_pair(type(self).__name__, pred, target, self.rgb)
        with autocast_off(pred):
            loss = elementwise(self.criterion, self.shrink(pred.float()), self.shrink(target.float()))
            return self.loss_weight * loss.mean()


@LOSS_REGISTRY.register()
class ColorLoss(_ShrinkLoss):
    """traiNNer-redux's ``colorloss``: ``criterion`` (``l1``, ``l2``, ``charbonnier``) distance of the Cb / Cr
    channels (BT.601 on [0, 1], as ``ChromaLoss``) average-pooled by ``scale``; times ``loss_weight``."""

    rgb = True

    def shrink(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(rgb2ycbcr_torch(x, y_only=False)[:, 1:], self.scale)


@LOSS_REGISTRY.register()
class AverageLoss(_ShrinkLoss):
    """traiNNer-redux's ``averageloss``: ``criterion`` (``l1``, ``l2``) distance of the images average-pooled by
    ``scale`` (``scale`` x ``scale`` blocks, a remainder dropped); times ``loss_weight``."""

    criteria = ("l1", "l2")

    def shrink(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, self.scale)


@LOSS_REGISTRY.register()
class BicubicLoss(_ShrinkLoss):
    """traiNNer-redux's ``bicubicloss``: ``criterion`` (``l1``, ``l2``, ``charbonnier``) distance of the images
    shrunk by ``1 / scale`` (antialiased bicubic, :func:`bicubic_shrink`); times ``loss_weight``."""

    def shrink(self, x: torch.Tensor) -> torch.Tensor:
        return bicubic_shrink(x, self.scale)


@LOSS_REGISTRY.register()
class CosimLoss(_PixelLoss):
    """traiNNer-redux's ``cosimloss``: ``loss_weight * cosim_lambda * (1 - mean over pixels of the cosine
    similarity of the channel vectors)``, both images clamped to ``[1e-12, 1]`` first (so no vector is zero)."""

    def __init__(self, loss_weight: float = 1.0, cosim_lambda: float = 5) -> None:
        super().__init__(loss_weight, "mean")
        self.cosim_lambda = float(cosim_lambda)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        _check_pair("CosimLoss", pred, target)
        with autocast_off(pred):
            x, y = pred.float().clamp(1e-12, 1), target.float().clamp(1e-12, 1)
            sim = F.cosine_similarity(x, y, dim=1, eps=1e-20)
            return self.loss_weight * self.cosim_lambda * (1 - sim.mean())


@LOSS_REGISTRY.register()
class NCCLoss(_PixelLoss):
    """traiNNer-redux's ``nccloss``: ``loss_weight * (1 - CC) / 2``, CC the mean Pearson correlation of matching
    rows of the two images reshaped to ``(C, N * H * W / C)``. As traiNNer-redux's, a row is one channel only for
    a batch of one (larger batches are cut into ``C`` equal runs of the NCHW memory order), and a constant row
    gives NaN (its variance is 0)."""

    other_names = ("ncc_loss",)  # neosr's name: the same maths (checked on fixtures from its source)

    def __init__(self, loss_weight: float = 1.0) -> None:
        super().__init__(loss_weight, "mean")

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        _check_pair("NCCLoss", pred, target)
        with autocast_off(pred):
            c = pred.shape[1]
            x, y = pred.float().reshape(c, -1), target.float().reshape(c, -1)
            x = x - x.mean(1, keepdim=True)
            y = y - y.mean(1, keepdim=True)
            cc = (x * y).sum(1) / torch.sqrt((x * x).sum(1) * (y * y).sum(1))
            return self.loss_weight * (1 - cc.mean()) * 0.5


__all__ = ["AverageLoss", "BicubicLoss", "ColorLoss", "CosimLoss", "NCCLoss", "bicubic_shrink"]
