"""Luma and colour losses: distances in YCbCr (BasicSR's BT.601 ``rgb2ycbcr``, on [0, 1]) and in Oklab
(Ottosson 2020, from sRGB in [0, 1]). Inputs are NCHW RGB in [0, 1]; computed in fp32 under autocast."""

from __future__ import annotations

import torch

from anysr.losses.pixel import _PixelLoss, check_criterion, elementwise
from anysr.ops.autocast import autocast_off
from anysr.ops.color import rgb2ycbcr_torch
from anysr.registry import LOSS_REGISTRY

# Ottosson's linear sRGB -> LMS and cube-rooted LMS -> Lab matrices.
_RGB_TO_LMS = ((0.4122214708, 0.5363325363, 0.0514459929),
               (0.2119034982, 0.6806995451, 0.1073969566),
               (0.0883024619, 0.2817188376, 0.6299787005))
_LMS_TO_LAB = ((0.2104542553, 0.7936177850, -0.0040720468),
               (1.9779984951, -2.4285922050, 0.4505937099),
               (0.0259040371, 0.7827717662, -0.8086757660))
_CBRT_KNEE = 1e-6  # below it the cube root is replaced by the line through 0 (finite gradient at black)


def _check_rgb(x: torch.Tensor, name: str) -> None:
    if x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"{name} takes NCHW RGB images, got shape {tuple(x.shape)}")


def srgb_to_oklab(x: torch.Tensor) -> torch.Tensor:
    """NCHW sRGB in [0, 1] -> Oklab (L, a, b) channels; differentiable everywhere (values below 0 are linear)."""
    lin = torch.where(x <= 0.04045, x / 12.92, ((x.clamp_min(0.04045) + 0.055) / 1.055) ** 2.4)
    m1 = torch.tensor(_RGB_TO_LMS, dtype=x.dtype, device=x.device)
    m2 = torch.tensor(_LMS_TO_LAB, dtype=x.dtype, device=x.device)
    lms = torch.einsum("kc,nchw->nkhw", m1, lin)
    knee = _CBRT_KNEE
    root = torch.where(lms > knee, lms.clamp_min(knee) ** (1 / 3), lms * knee ** (-2 / 3))
    return torch.einsum("kc,nchw->nkhw", m2, root)


class _ColorLoss(_PixelLoss):
    def __init__(self, loss_weight: float = 1.0, reduction: str = "mean", criterion: str = "l1") -> None:
        super().__init__(loss_weight, reduction)
        self.criterion = check_criterion(criterion)

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        _check_rgb(pred, type(self).__name__)
        with autocast_off(pred):
            loss = elementwise(self.criterion, self._convert(pred.float()), self._convert(target.float()))
        return self.loss_weight * self._reduce(loss, weight)


@LOSS_REGISTRY.register()
class LumaLoss(_ColorLoss):
    """``criterion`` distance of the Y (luma) channels (BT.601, BasicSR's ``rgb2ycbcr``); ``weight`` one channel."""

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        return rgb2ycbcr_torch(x, y_only=True)


@LOSS_REGISTRY.register()
class ChromaLoss(_ColorLoss):
    """``criterion`` distance of the Cb and Cr (chroma) channels (BT.601, BasicSR's ``rgb2ycbcr``)."""

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        return rgb2ycbcr_torch(x, y_only=False)[:, 1:]


@LOSS_REGISTRY.register()
class OklabLoss(_ColorLoss):
    """``criterion`` distance in Oklab (L, a, b), a perceptually uniform colour space."""

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        return srgb_to_oklab(x)
