"""DIS ("Direct Image Supersampling"): a minimal conv SR network for fast inference, from traiNNer-redux (2025).

Module names and constructor arguments follow traiNNer-redux's ``DIS``, so its checkpoints load with
``strict=True`` and give the same output: a 3x3 conv + PReLU head, ``num_blocks`` residual blocks (plain
conv-PReLU-conv, or with ``use_depthwise`` depth-wise separable conv + PReLU), a fusion conv with a shortcut,
PixelShuffle upsampling (two x2 steps for x4) each followed by a PReLU, a 3x3 tail, and the bilinearly upscaled
input added (global residual). Scales 1, 2, 3, 4. Fully convolutional: any input size (``tile_multiple = 1``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

SCALES = (1, 2, 3, 4)


class DepthwiseSeparableConv(nn.Module):
    """Depth-wise ``kernel_size`` conv then a 1x1 conv, both without bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(in_channels, in_channels, kernel_size, padding=kernel_size // 2,
                                   groups=in_channels, bias=False)
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


class FastResBlock(nn.Module):
    """``x + conv2(prelu(conv1(x)))`` with bias-free 3x3 convs."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.act = nn.PReLU(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.conv1(x))) + x


class LightBlock(nn.Module):
    """``x + prelu(depthwise_separable(x))``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.dw_conv = DepthwiseSeparableConv(channels, channels, 3)
        self.act = nn.PReLU(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.dw_conv(x))


class PixelShuffleUpsampler(nn.Module):
    """3x3 conv to ``out_channels * scale**2``, PixelShuffle, PReLU."""

    def __init__(self, in_channels: int, out_channels: int, scale: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels * scale**2, 3, padding=1)
        self.pixel_shuffle = nn.PixelShuffle(scale)
        self.act = nn.PReLU(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.pixel_shuffle(self.conv(x)))


@ARCH_REGISTRY.register()
class DIS(nn.Module):
    """DIS. Args: in_channels, out_channels: image channels. num_features: width. num_blocks: residual blocks.
    scale: 1, 2, 3 or 4. use_depthwise: depth-wise separable blocks (LightBlock) instead of plain ones."""

    tile_multiple: int = 1

    def __init__(self, in_channels: int = 3, out_channels: int = 3, num_features: int = 32, num_blocks: int = 4,
                 scale: int = 4, use_depthwise: bool = False) -> None:
        super().__init__()
        if isinstance(scale, bool) or scale not in SCALES:
            raise ArchArgumentError("scale", f"DIS supports scale 1, 2, 3 or 4, got {scale!r}")
        self.scale = scale
        self.in_channels = in_channels
        self.out_channels = out_channels
        f = num_features
        self.head = nn.Conv2d(in_channels, f, 3, padding=1)
        self.head_act = nn.PReLU(f)
        block = LightBlock if use_depthwise else FastResBlock
        self.body = nn.Sequential(*[block(f) for _ in range(num_blocks)])
        self.fusion = nn.Conv2d(f, f, 3, padding=1)
        if scale == 1:
            self.upsampler: nn.Module = nn.Identity()
        elif scale == 4:
            self.upsampler = nn.Sequential(PixelShuffleUpsampler(f, f, 2), PixelShuffleUpsampler(f, f, 2))
        else:
            self.upsampler = PixelShuffleUpsampler(f, f, scale)
        self.tail = nn.Conv2d(f, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.head_act(self.head(x))
        out = self.tail(self.upsampler(self.fusion(self.body(feat)) + feat))
        if self.scale == 1:
            return out + x
        return out + F.interpolate(x, scale_factor=self.scale, mode="bilinear", align_corners=False)


__all__ = ["DIS"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("DIS", scale_arg="scale", presets={
    "dis_balanced": {"num_blocks": 12},  # 0.31 M parameters at x4
    "dis_fast": {"num_blocks": 8},  # 0.23 M
})


def _recognise(s: StateShapes) -> dict:
    """DIS from its tensors: width and image channels from the head / tail, depth from the blocks, the block kind
    from their layers, the scale from the upsampler (none for x1, two x2 stages for x4)."""
    f, cin = s.dim("head.weight", 0), s.dim("head.weight", 1)
    if "upsampler.conv.weight" in s:
        scale = round((s.dim("upsampler.conv.weight", 0) // f) ** 0.5)
    else:
        scale = 4 if "upsampler.1.conv.weight" in s else 1
    return {"in_channels": cin, "out_channels": s.dim("tail.weight", 0), "num_features": f,
            "num_blocks": s.count("body."), "scale": scale, "use_depthwise": "body.0.dw_conv.depthwise.weight" in s}


register_recogniser("DIS", _recognise)
