"""Swift-SRGAN: an SRGAN generator built from depth-wise separable convolutions for real-time SR (Krishnan and
Mazumder, "Swift-SRGAN - Rethinking Super-Resolution for Efficient and Real-time Inference", ICICyTA 2021).

A 9x9 separable conv stem, ``num_blocks`` residual blocks (separable conv, batch norm, PReLU, separable conv, batch
norm), a separable conv + batch norm with a long skip, one separable conv + PixelShuffle(2) + PReLU per factor 2,
and a 9x9 separable conv; the output is ``(tanh + 1) / 2``, an image in [0, 1]. Module names follow the authors'
code (as in spandrel 0.4.2), so released checkpoints load with ``strict=True``; as there, convolution blocks
without an activation still hold an (unused) PReLU, which is frozen here (no gradient, not trained: the saved
values never change). Fully convolutional: any input size (``tile_multiple`` 1).
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


class SeperableConv2d(nn.Module):  # the authors' spelling (only module names reach the checkpoints)
    """A depth-wise ``kernel_size`` conv followed by a point-wise 1x1 conv."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 1,
                 bias: bool = True) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(in_channels, in_channels, kernel_size, stride, padding, groups=in_channels,
                                   bias=bias)
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


class ConvBlock(nn.Module):
    """Separable conv, batch norm (or none; then the conv has biases), PReLU unless ``use_act`` is False."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int, use_act: bool = True,
                 use_bn: bool = True) -> None:
        super().__init__()
        self.use_act = use_act
        self.cnn = SeperableConv2d(in_channels, out_channels, kernel_size, 1, padding, bias=not use_bn)
        self.bn = nn.BatchNorm2d(out_channels) if use_bn else nn.Identity()
        self.act = nn.PReLU(num_parameters=out_channels)
        if not use_act:
            self.act.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.cnn(x))
        return self.act(y) if self.use_act else y


class UpsampleBlock(nn.Module):
    """x2 (``scale_factor``): separable conv to ``scale_factor**2`` times the channels, PixelShuffle, PReLU."""

    def __init__(self, in_channels: int, scale_factor: int) -> None:
        super().__init__()
        self.conv = SeperableConv2d(in_channels, in_channels * scale_factor**2, 3, 1, 1)
        self.ps = nn.PixelShuffle(scale_factor)
        self.act = nn.PReLU(num_parameters=in_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.ps(self.conv(x)))


class ResidualBlock(nn.Module):
    """``x + block2(block1(x))`` (block2 without activation)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.block1 = ConvBlock(in_channels, in_channels, 3, 1)
        self.block2 = ConvBlock(in_channels, in_channels, 3, 1, use_act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block2(self.block1(x))


@ARCH_REGISTRY.register()
class SwiftSRGAN(nn.Module):
    """Swift-SRGAN generator (spandrel's ``SwiftSRGAN``, the authors' ``Generator``).

    Args:
        in_channels: image channels (in and out). num_channels: width. num_blocks: residual blocks.
        upscale_factor: 1, 2, 4 or 8 (a power of two: one x2 upsampling block per factor 2).
    """

    tile_multiple: int = 1

    def __init__(self, *, in_channels: int = 3, num_channels: int = 64, num_blocks: int = 16,
                 upscale_factor: int = 4) -> None:
        super().__init__()
        s = upscale_factor
        if isinstance(s, bool) or not isinstance(s, int) or s < 1 or s & (s - 1):
            raise ArchArgumentError("upscale_factor", f"SwiftSRGAN upsamples by factors of 2: use 1, 2, 4 or 8, "
                                    f"got {s!r}")
        self.in_channels = in_channels
        self.upscale = s
        self.initial = ConvBlock(in_channels, num_channels, 9, 4, use_bn=False)
        self.residual = nn.Sequential(*[ResidualBlock(num_channels) for _ in range(num_blocks)])
        self.convblock = ConvBlock(num_channels, num_channels, 3, 1, use_act=False)
        self.upsampler = nn.Sequential(*[UpsampleBlock(num_channels, 2) for _ in range(s.bit_length() - 1)])
        self.final_conv = SeperableConv2d(num_channels, in_channels, 9, 1, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        initial = self.initial(x)
        y = self.upsampler(self.convblock(self.residual(initial)) + initial)
        return (torch.tanh(self.final_conv(y)) + 1) / 2


__all__ = ["SwiftSRGAN"]


def _recognise(s: StateShapes) -> dict:
    """SwiftSRGAN from its tensors: image channels and width from the first separable conv, depth from the
    residual blocks, the scale from the number of x2 upsampling blocks."""
    cin, width = s.dim("initial.cnn.pointwise.weight", 1), s.dim("initial.cnn.pointwise.weight", 0)
    return {"in_channels": cin, "num_channels": width, "num_blocks": s.count("residual."),
            "upscale_factor": 2 ** s.count("upsampler.")}


register_recogniser("SwiftSRGAN", _recognise)
