"""Sebica: "Lightweight Spatial and Efficient Bidirectional Channel Attention Super Resolution Network" (Liu et
al., 2024, arXiv:2410.20546), as traiNNer-redux trains it.

Module names and constructor arguments follow traiNNer-redux's ``Sebica`` so its checkpoints load with
``strict=True`` and give the same output. A 3x3 stem (batch norm, ReLU) feeds six attention blocks; each mixes
with 1x1 / 3x3 convs (batch norm, ReLU), normalises, applies a spatial attention map (7x7 conv over the channel
mean and max) and a "bidirectional" channel weight, then a batch-normalised feed-forward, with a residual around
the block. A 1x1 conv and a pixel shuffle give the residual added to the bilinearly upscaled input.

As the reference computes it, the channel weight is one number per image: the mean of the feature map over all
channels and pixels, times the centre tap of each of the two 1-D convs, through a sigmoid, averaged (its 2-D
pooling of a (B, 1, C) tensor pools over the channels). That is what this module computes, directly.

Size requirement: none; ``tile_multiple`` is 1.
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.lkfmixer_arch import bilinear_resize
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

N_BLOCKS = 6  # fixed in the reference (its "mini" comment says 4; its code builds 6 for every size)


def _channel_branch(kernel_size: int) -> nn.Sequential:
    # parameter holder with the reference's layout (the ``.1.weight`` key); forward reads the centre tap
    return nn.Sequential(nn.AdaptiveAvgPool2d(1),
                         nn.Conv1d(1, 1, kernel_size, padding=(kernel_size - 1) // 2, bias=False), nn.Sigmoid())


class CSA(nn.Module):
    """Spatial attention (7x7 conv over [channel mean, channel max], sigmoid) times the bidirectional channel
    weight (see the module docstring)."""

    def __init__(self, _channel: int, kernel_size: int = 3, reduction: int = 16) -> None:
        super().__init__()
        self.spatial_attention = nn.Sequential(nn.Conv2d(2, 1, 7, padding=3, bias=False), nn.Sigmoid())
        self.channel_attention_forward = _channel_branch(kernel_size)
        self.channel_attention_backward = _channel_branch(kernel_size)
        self.centre = (kernel_size - 1) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stats = torch.cat((x.mean(1, keepdim=True), x.amax(1, keepdim=True)), dim=1)
        spatial = self.spatial_attention(stats)
        m = x.mean((1, 2, 3), keepdim=True)
        fwd = self.channel_attention_forward[1].weight[0, 0, self.centre]
        bwd = self.channel_attention_backward[1].weight[0, 0, self.centre]
        channel = (torch.sigmoid(fwd * m) + torch.sigmoid(bwd * m)) / 2
        return x * spatial * channel


class Conv(nn.Module):
    """1x1 conv to 2N, BN, ReLU, 3x3 conv back to N, BN, ReLU."""

    def __init__(self, N: int) -> None:  # noqa: N803
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(N, N * 2, 1), nn.BatchNorm2d(N * 2), nn.ReLU(inplace=True),
                                  nn.Conv2d(N * 2, N, 3, padding=1), nn.BatchNorm2d(N), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class FFN(nn.Module):
    """Residual 1x1 / BN / GELU / 1x1 / BN feed-forward."""

    def __init__(self, N: int) -> None:  # noqa: N803
        super().__init__()
        self.ffn = nn.Sequential(nn.Conv2d(N, N * 2, 1), nn.BatchNorm2d(N * 2), nn.GELU(),
                                 nn.Conv2d(N * 2, N, 1), nn.BatchNorm2d(N))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(x)


class Attn(nn.Module):
    """``x + norm2(post_mixer(attn(norm1(pre_mixer(x)))))``."""

    def __init__(self, N: int) -> None:  # noqa: N803
        super().__init__()
        self.pre_mixer = Conv(N)
        self.post_mixer = FFN(N)
        self.attn = CSA(N, reduction=16)
        self.norm1 = nn.BatchNorm2d(N)
        self.norm2 = nn.BatchNorm2d(N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm2(self.post_mixer(self.attn(self.norm1(self.pre_mixer(x)))))


@ARCH_REGISTRY.register()
class Sebica(nn.Module):
    """Sebica (``N`` = 16; traiNNer-redux's ``sebica_mini`` preset has N = 8). RGB in and out."""

    tile_multiple: int = 1

    def __init__(self, scale: int = 4, N: int = 16) -> None:  # noqa: N803
        super().__init__()
        if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
            raise ArchArgumentError("scale", f"Sebica needs an integer scale >= 1, got {scale!r}")
        if not isinstance(N, int) or isinstance(N, bool) or N < 1:
            raise ArchArgumentError("N", f"Sebica needs an integer width N >= 1, got {N!r}")
        self.scale = scale
        self.head = nn.Sequential(nn.Conv2d(3, N, 3, padding=1), nn.BatchNorm2d(N), nn.ReLU(inplace=True))
        self.body = nn.Sequential(*(Attn(N) for _ in range(N_BLOCKS)))
        self.tail = nn.Sequential(nn.Conv2d(N, 3 * scale * scale, 1), nn.PixelShuffle(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        return self.tail(self.body(self.head(x))) + bilinear_resize(x, h * self.scale, w * self.scale)


# traiNNer-redux's builder (tests/test_presets.py checks it against the network traiNNer-redux builds)
register_presets("Sebica", scale_arg="scale", presets={"sebica_mini": {"N": 8}})


def _recognise(s: StateShapes) -> list[dict]:
    """Sebica from its tensors: the width N from the head conv, the scale from the tail's PixelShuffle width
    (RGB; the depth is fixed)."""
    return [{"scale": sc, "N": s.dim("head.0.weight", 0)}
            for _, sc in shuffle_splits(s.dim("tail.0.weight", 0), (s.dim("head.0.weight", 1),))]


register_recogniser("Sebica", _recognise)
