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


__all__ = [
    "ArchArgumentError",
    "ResidualBlockNoBN",
    "Upsample",
    "check_upscale",
    "default_init_weights",
    "make_layer",
    "pixel_unshuffle",
    "to_2tuple",
]


def input_channels(net: nn.Module, default: int | None = 3) -> int | None:
    """The channels a network reads: those of its first ``nn.Conv2d`` (``default`` when it has none)."""
    for module in net.modules():
        if isinstance(module, nn.Conv2d):
            return int(module.in_channels)
    return default
