"""HASN: a hybrid attention separable network for lightweight SR (Cao et al., 2024), as neosr trains it.

Module names and constructor arguments follow neosr's ``hasn`` (``hasn_arch.py``), so its checkpoints load with
``strict=True`` and give the same output. A 3x3 conv, six blocks, a 3x3 conv with a long skip and a conv +
PixelShuffle head. A block: depth-wise 7x7, layer norm over the channels, three 1x1 convs to ``3 * width``
(``relu6(f1) * f2 + ESA(f3)``), a 1x1 back, depth-wise 7x7, a shortcut, then RCAN-style channel attention (CAB,
as HAT's: no shortcut around it).

neosr builds every block's ESA (enhanced spatial attention: 16 channels, a stride-2 conv, 7x7 max pooling every
3 pixels, bilinear back) for 156 = 3 * 52 input channels, so its network runs at the published width of 52 only;
here the ESA is built for ``3 * feature_channels`` (the same network at 52). The ESA needs 15 pixels per side:
smaller inputs are grown to 15 by reflect / edge padding (as spandrel does for such networks) and the output is
cropped back; larger ones are not padded.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, pad_to_min_size
from anysr.archs.hat_arch import CAB
from anysr.archs.omnisr_arch import ESA
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

MIN_SIZE = 15  # the ESA's stride-2 conv and 7x7 pooling need 15 pixels per side
N_BLOCKS = 6
MLP_RATIO = 3
ESA_CHANNELS = 16


class ConvWrap(nn.Module):
    """A conv kept under ``conv`` (neosr's ConvBN without its batch norm)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size, padding=kernel_size // 2, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Block(nn.Module):
    """``cab(x + dw7(g(relu6(f1(n)) * f2(n) + esa(f3(n)))))`` with ``n = ln(dw7(x))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        hidden = MLP_RATIO * dim
        self.dwconv = ConvWrap(dim, dim, 7, groups=dim)
        self.ln = LayerNorm2d(dim, eps=1e-5)
        self.f1 = ConvWrap(dim, hidden)
        self.f2 = ConvWrap(dim, hidden)
        self.f3 = ConvWrap(dim, hidden)
        self.g = ConvWrap(hidden, dim)
        self.dwconv2 = ConvWrap(dim, dim, 7, groups=dim)
        self.esa = ESA(ESA_CHANNELS, hidden)
        self.cab = CAB(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.ln(self.dwconv(x))
        # f1, f2 and f3 as one 1x1 conv
        w = torch.cat([self.f1.conv.weight, self.f2.conv.weight, self.f3.conv.weight])
        b = torch.cat([self.f1.conv.bias, self.f2.conv.bias, self.f3.conv.bias])
        x1, x2, x3 = F.conv2d(n, w, b).chunk(3, dim=1)
        y = self.dwconv2(self.g(F.relu6(x1) * x2 + self.esa(x3)))
        return self.cab(x + y)


@ARCH_REGISTRY.register()
class HASN(nn.Module):
    """HASN (neosr's ``hasn``); the defaults are the published network.

    Args (neosr's): in_channels, out_channels (image channels), feature_channels (width; neosr's code runs at 52
    only, see above; at least 30, the channel attention's squeeze factor), upscale (integer >= 1).
    """

    def __init__(self, in_channels: int = 3, out_channels: int = 3, feature_channels: int = 52,
                 upscale: int = 4) -> None:
        super().__init__()
        for name, value, low in (("in_channels", in_channels, 1), ("out_channels", out_channels, 1),
                                 ("feature_channels", feature_channels, 30), ("upscale", upscale, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ArchArgumentError(name, f"HASN needs an integer {name} >= {low}, got {value!r}")
        self.upscale = upscale
        self.in_channels = in_channels
        c = feature_channels
        self.conv_1 = nn.Conv2d(in_channels, c, 3, padding=1)
        for i in range(1, N_BLOCKS + 1):
            self.add_module(f"block_{i}", Block(c))
        self.conv_2 = nn.Conv2d(c, c, 3, padding=1)
        self.upsampler = nn.Sequential(nn.Conv2d(c, out_channels * upscale**2, 3, padding=1),
                                       nn.PixelShuffle(upscale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        feat = self.conv_1(pad_to_min_size(x, MIN_SIZE))
        y = feat
        for i in range(1, N_BLOCKS + 1):
            y = getattr(self, f"block_{i}")(y)
        out = self.upsampler(self.conv_2(y) + feat)
        return out[..., : h * self.upscale, : w * self.upscale]


__all__ = ["HASN"]


def _recognise(s: StateShapes) -> list[dict] | None:
    """HASN from its tensors: width and input channels from ``conv_1``, the six blocks (their ESA on three
    times the width), and the head's channels / scale split."""
    c, c_in = s.shape("conv_1.weight")[:2]
    if s.count("block_") != N_BLOCKS or s.dim(f"block_{N_BLOCKS}.esa.conv1.weight", 1) != MLP_RATIO * c:
        return None
    return [{"in_channels": c_in, "out_channels": out, "feature_channels": c, "upscale": sc}
            for out, sc in shuffle_splits(s.dim("upsampler.0.weight", 0))]


register_recogniser("HASN", _recognise)
# neosr's name: the class defaults (neosr's), the option file's top-level scale
register_presets("HASN", scale_arg="upscale", source="neosr", presets={"hasn": {}})
