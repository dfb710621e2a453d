"""Building blocks shared by several architectures (names and parameter layout as in BasicSR)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from anysr.errors import OptionError


class ArchArgumentError(OptionError):
    """A constructor argument of an architecture has a value it cannot build with.

    ``arg`` is the argument's name, so ``build_network`` can report the full option key path
    (``network_g.<arg>``).
    """

    def __init__(self, arg: str, message: str) -> None:
        super().__init__(f"{arg}: {message}")
        self.arg = arg
        self.detail = message


@torch.no_grad()
def default_init_weights(
    module_list: nn.Module | Iterable[nn.Module], scale: float = 1.0, bias_fill: float = 0.0, **kwargs
) -> None:
    """Kaiming-normal init of every Conv2d / Linear in ``module_list``, scaled by ``scale``.

    Biases are filled with ``bias_fill``; batch-norm layers get weight 1. ``kwargs`` go to
    ``nn.init.kaiming_normal_`` (for example ``a`` or ``mode``).
    """
    modules = [module_list] if isinstance(module_list, nn.Module) else list(module_list)
    for module in modules:
        for m in module.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, **kwargs)
                m.weight.mul_(scale)
                if m.bias is not None:
                    m.bias.fill_(bias_fill)
            elif isinstance(m, _BatchNorm):
                nn.init.constant_(m.weight, 1.0)
                if m.bias is not None:
                    m.bias.fill_(bias_fill)


def make_layer(basic_block: type[nn.Module], num_basic_block: int, **kwargs) -> nn.Sequential:
    """``num_basic_block`` instances of ``basic_block(**kwargs)`` chained in an ``nn.Sequential``."""
    return nn.Sequential(*(basic_block(**kwargs) for _ in range(num_basic_block)))


class ResidualBlockNoBN(nn.Module):
    """conv-ReLU-conv with an identity shortcut and no batch norm: ``x + res_scale * body(x)``.

    With ``pytorch_init=False`` the convolutions get Kaiming init scaled by 0.1 (as BasicSR does).
    """

    def __init__(self, num_feat: int = 64, res_scale: float = 1, pytorch_init: bool = False) -> None:
        super().__init__()
        self.res_scale = res_scale
        self.conv1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1, bias=True)
        self.conv2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1, bias=True)
        self.relu = nn.ReLU(inplace=True)
        if not pytorch_init:
            default_init_weights([self.conv1, self.conv2], 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.relu(self.conv1(x))) * self.res_scale


def check_upscale(scale: int, arg: str = "upscale") -> None:
    """Raise ArchArgumentError unless ``scale`` is a power of two (1, 2, 4, 8, ...) or 3."""
    if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1 or (
        scale & (scale - 1) and scale != 3
    ):
        raise ArchArgumentError(
            arg, f"scale {scale!r} is not supported; use a power of two (1, 2, 4, 8) or 3"
        )


class Upsample(nn.Sequential):
    """Sub-pixel upsampling: (conv to 4x channels, PixelShuffle(2)) per factor 2, or one x3 step.

    Supports scale = 2**n and 3; the layer layout (and hence the state-dict keys) is BasicSR's.
    """

    def __init__(self, scale: int, num_feat: int) -> None:
        check_upscale(scale, "upscale")
        layers: list[nn.Module] = []
        if scale == 3:
            layers += [nn.Conv2d(num_feat, 9 * num_feat, 3, 1, 1), nn.PixelShuffle(3)]
        else:
            for _ in range(int(math.log2(scale))):
                layers += [nn.Conv2d(num_feat, 4 * num_feat, 3, 1, 1), nn.PixelShuffle(2)]
        super().__init__(*layers)


def pixel_unshuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """Fold each ``scale x scale`` patch into channels: (b, c, h*s, w*s) -> (b, c*s*s, h, w).

    Same channel order as BasicSR's ``pixel_unshuffle`` (channel, row offset, column offset).
    """
    return F.pixel_unshuffle(x, scale)


def to_2tuple(x: int | Iterable[int]) -> tuple[int, int]:
    """``x`` as a pair: an int is repeated, an iterable of two is returned as a tuple."""
    if isinstance(x, Iterable):
        a, b = tuple(x)
        return int(a), int(b)
    return int(x), int(x)


class LayerNorm2d(nn.Module):
    """Layer norm over the channels of an NCHW map: per pixel, ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Parameters ``weight`` / ``bias`` of shape (C,), as the channel-first layer norms of OmniSR, SAFMN and
    RealPLKSR. Statistics are taken in float32 (bf16 under autocast loses too much in the variance); the
    result has the input's dtype. Works for any memory format.
    """

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        centred = xf - xf.mean(1, keepdim=True)
        normed = centred / torch.sqrt(centred.square().mean(1, keepdim=True) + self.eps)
        out = normed * self.weight.to(xf.dtype).view(-1, 1, 1) + self.bias.to(xf.dtype).view(-1, 1, 1)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def pad_to_min_size(x: torch.Tensor, min_size: int) -> torch.Tensor:
    """Grow the bottom / right of an NCHW tensor to at least ``min_size`` per side (unchanged if large enough).

    Reflect padding as far as it goes (at most side - 1 pixels), then edge replication for the rest: what
    spandrel's call API does for a model's minimum size, so small tiles give the same output as there.
    """
    h, w = x.shape[-2:]
    pad_h, pad_w = max(min_size - h, 0), max(min_size - w, 0)
    if not (pad_h or pad_w):
        return x
    ref_h, ref_w = min(pad_h, h - 1), min(pad_w, w - 1)
    if ref_h or ref_w:
        x = F.pad(x, (0, ref_w, 0, ref_h), mode="reflect")
    if pad_h - ref_h or pad_w - ref_w:
        x = F.pad(x, (0, pad_w - ref_w, 0, pad_h - ref_h), mode="replicate")
    return x


__all__ = [
    "ArchArgumentError",
    "LayerNorm2d",
    "ResidualBlockNoBN",
    "Upsample",
    "check_upscale",
    "default_init_weights",
    "make_layer",
    "pad_to_min_size",
    "pixel_unshuffle",
    "to_2tuple",
]
