"""RIDNet: real image denoising with feature attention (Anwar & Barnes, ICCV 2019).

Module names follow BasicSR 1.4.2's ``RIDNet``, so its checkpoints load with ``strict=True``. As there, the
network works on images in ``[0, img_range]`` (BasicSR's RIDNet weights expect 0..255 inputs): ``sub_mean``
and ``add_mean`` are 1x1 convs initialised to ``(x - img_range * mean) / std`` and ``(x + img_range * mean) / std``
(BasicSR's definition: inverses of each other when std is 1), and they are ordinary parameters (BasicSR
trains them too).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, ResidualBlockNoBN
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


class MeanShift(nn.Conv2d):
    """A 1x1 conv on RGB set to ``(x + sign * rgb_range * mean) / std`` per channel."""

    def __init__(self, rgb_range: float, rgb_mean: Sequence[float], rgb_std: Sequence[float], sign: int = -1,
                 requires_grad: bool = True) -> None:
        super().__init__(3, 3, kernel_size=1)
        std = torch.tensor([float(s) for s in rgb_std])
        mean = torch.tensor([float(m) for m in rgb_mean])
        with torch.no_grad():
            self.weight.copy_(torch.diag(1.0 / std).view(3, 3, 1, 1))
            self.bias.copy_(sign * rgb_range * mean / std)
        # BasicSR stores this flag without applying it, so its MeanShift weights train; kept for the same reason.
        self.requires_grad = requires_grad


class EResidualBlockNoBN(nn.Module):
    """conv3x3-ReLU-conv3x3-ReLU-conv1x1, plus the input, then ReLU (the 'enhanced residual block')."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 1, 1, 0),
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + x)


class MergeRun(nn.Module):
    """Two branches of two convs each (dilations 1, 2 and 3, 4), concatenated, merged by a conv, plus the input."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 padding: int = 1) -> None:
        super().__init__()

        def conv(cin: int, pad: int, dilation: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, out_channels, kernel_size, stride, pad, dilation), nn.ReLU(inplace=True)]

        self.dilation1 = nn.Sequential(*conv(in_channels, padding, 1), *conv(out_channels, 2, 2))
        self.dilation2 = nn.Sequential(*conv(in_channels, 3, 3), *conv(out_channels, 4, 4))
        self.aggregation = nn.Sequential(*conv(out_channels * 2, padding, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        merged = torch.cat([self.dilation1(x), self.dilation2(x)], dim=1)
        return self.aggregation(merged) + x


class ChannelAttention(nn.Module):
    """Squeeze-and-excitation: global average, 1x1 down by ``squeeze_factor``, ReLU, 1x1 up, sigmoid, scale."""

    def __init__(self, mid_channels: int, squeeze_factor: int = 16) -> None:
        super().__init__()
        hidden = mid_channels // squeeze_factor
        self.attention = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid_channels, hidden, 1, padding=0), nn.ReLU(inplace=True),
            nn.Conv2d(hidden, mid_channels, 1, padding=0), nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.attention(x)


class EAM(nn.Module):
    """Enhancement attention module: merge-and-run, residual block (+ReLU), enhanced residual block, attention."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int) -> None:
        super().__init__()
        self.merge = MergeRun(in_channels, mid_channels)
        self.block1 = ResidualBlockNoBN(mid_channels)
        self.block2 = EResidualBlockNoBN(mid_channels, out_channels)
        self.ca = ChannelAttention(out_channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.block1(self.merge(x)))
        return self.ca(self.block2(x))


@ARCH_REGISTRY.register()
class RIDNet(nn.Module):
    """RIDNet: mean shift, conv head (+ReLU), ``num_block`` EAMs, conv tail, mean shift back, plus the input.

    Args (BasicSR's): in_channels and out_channels (RGB: 3 and 3), mid_channels (>= 16: the attention squeezes
    by 16), num_block, img_range (the input's value range; 255 for BasicSR's weights), rgb_mean, rgb_std.
    Works at scale 1 on any H x W.
    """

    tile_multiple: int = 1

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, num_block: int = 4,
                 img_range: float = 255.0, rgb_mean: Sequence[float] = (0.4488, 0.4371, 0.4040),
                 rgb_std: Sequence[float] = (1.0, 1.0, 1.0)) -> None:
        super().__init__()
        if in_channels != 3 or out_channels != 3:
            bad = "in_channels" if in_channels != 3 else "out_channels"
            raise ArchArgumentError(bad, f"RIDNet works on RGB images: in_channels and out_channels must be 3, "
                                    f"got {in_channels} and {out_channels}")
        if mid_channels < 16:
            raise ArchArgumentError("mid_channels", f"RIDNet needs mid_channels >= 16 (its channel attention "
                                    f"squeezes by 16), got {mid_channels}")
        for name, values in (("rgb_mean", rgb_mean), ("rgb_std", rgb_std)):
            if len(values) != 3:
                raise ArchArgumentError(name, f"RIDNet needs 3 values (R, G, B), got {len(values)}")
        self.sub_mean = MeanShift(img_range, rgb_mean, rgb_std)
        self.add_mean = MeanShift(img_range, rgb_mean, rgb_std, 1)
        self.head = nn.Conv2d(in_channels, mid_channels, 3, 1, 1)
        self.body = nn.Sequential(*(EAM(mid_channels, mid_channels, mid_channels) for _ in range(num_block)))
        self.tail = nn.Conv2d(mid_channels, out_channels, 3, 1, 1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        res = self.relu(self.head(self.sub_mean(x)))
        res = self.add_mean(self.tail(self.body(res)))
        return x + res


__all__ = ["EAM", "ChannelAttention", "EResidualBlockNoBN", "MeanShift", "MergeRun", "RIDNet"]


def _recognise(s: StateShapes) -> dict:
    """RIDNet from its tensors: the width from the head conv, the depth from the EAM blocks (RGB only)."""
    return {"in_channels": s.dim("head.weight", 1), "mid_channels": s.dim("head.weight", 0),
            "out_channels": s.dim("tail.weight", 0), "num_block": s.count("body.")}


register_recogniser("RIDNet", _recognise)
