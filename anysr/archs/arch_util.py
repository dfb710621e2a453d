"""Building blocks shared by several architectures (names and parameter layout as in BasicSR)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from anysr.errors import OptionError
from anysr.ops.dcn import ModulatedDeformConv2dPack, warp


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


def flow_warp(x: torch.Tensor, flow: torch.Tensor, interp_mode: str = "bilinear", padding_mode: str = "zeros",
              align_corners: bool = True) -> torch.Tensor:
    """Warp ``x`` (n, c, h, w) with optical flow ``flow`` (n, h, w, 2), in pixels, x displacement first.

    BasicSR's ``flow_warp`` (same arguments and result); built from gathers (``anysr.ops.dcn.warp``) instead of
    ``F.grid_sample``, which has no XLA lowering. ``padding_mode`` is 'zeros' or 'border'.
    """
    return warp(x, flow, interp_mode, padding_mode, align_corners)


class DCNv2Pack(ModulatedDeformConv2dPack):
    """DCNv2 whose offsets and mask come from a second feature map: ``forward(x, feat)`` deforms ``x`` with
    ``conv_offset(feat)`` (the alignment block of EDVR; "Delving Deep into Deformable Alignment in Video
    Super-Resolution"). Parameters ``weight``, ``bias``, ``conv_offset.{weight,bias}`` as in BasicSR.

    BasicSR logs a warning when the mean absolute offset exceeds 50; that needs a host sync per call, so it is
    left to the training loop here.
    """

    def forward(self, x: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        offset, mask = self.offset_and_mask(self.conv_offset(feat))
        return self.deform(x, offset, mask)


def refuse_weights_path(arg: str, path: object, what: str) -> None:
    """Raise ArchArgumentError when a pretrained-weights file is given to an architecture.

    Architectures do no file I/O (BasicSR's ``load_path`` / ``spynet_path`` / ``edvr_path`` opened files in the
    constructor); the argument is accepted for option-file compatibility and must be None / empty.
    """
    if path:
        raise ArchArgumentError(
            arg, f"{what} weights are not read by the architecture (got {path!r}); remove {arg} and load "
                 f"pretrained weights through path.pretrain_network_g (the engine reads weight files)")


def to_2tuple(x: int | Iterable[int]) -> tuple[int, int]:
    """``x`` as a pair: an int is repeated, an iterable of two is returned as a tuple."""
    if isinstance(x, Iterable):
        a, b = tuple(x)
        return int(a), int(b)
    return int(x), int(x)


__all__ = [
    "ArchArgumentError",
    "DCNv2Pack",
    "ResidualBlockNoBN",
    "Upsample",
    "check_upscale",
    "default_init_weights",
    "flow_warp",
    "make_layer",
    "pixel_unshuffle",
    "refuse_weights_path",
    "to_2tuple",
]
