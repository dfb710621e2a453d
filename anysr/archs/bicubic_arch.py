"""Bicubic: the parameter-free MATLAB-bicubic baseline, usable wherever a network is (``type: Bicubic``)."""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.ops.imresize import imresize_torch
from anysr.registry import ARCH_REGISTRY


@ARCH_REGISTRY.register()
class Bicubic(nn.Module):
    """Upscale by ``upscale`` with MATLAB ``imresize`` (bicubic, a = -0.5); no parameters, no state."""

    def __init__(self, upscale: int = 4) -> None:
        super().__init__()
        if not isinstance(upscale, int) or isinstance(upscale, bool) or upscale < 1:
            raise ArchArgumentError("upscale", f"Bicubic needs an integer upscale >= 1, got {upscale!r}")
        self.upscale = upscale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.upscale == 1 else imresize_torch(x, self.upscale)

    def extra_repr(self) -> str:
        return f"upscale={self.upscale}"
