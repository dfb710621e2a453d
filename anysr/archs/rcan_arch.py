"""RCAN: Residual Channel Attention Networks (Zhang et al., 2018)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, MeanShiftSR, make_layer
from anysr.archs.edsr_arch import mean_buffer
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, upsample_scale
from anysr.registry import ARCH_REGISTRY


class ChannelAttention(nn.Module):
    """Squeeze-and-excitation: global average pool, 1x1 bottleneck, sigmoid gate on the channels."""

    def __init__(self, num_feat: int, squeeze_factor: int = 16) -> None:
        super().__init__()
        hidden = num_feat // squeeze_factor
        self.attention = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(num_feat, hidden, 1, padding=0),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden, num_feat, 1, padding=0),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.attention(x)


class RCAB(nn.Module):
    """Residual channel attention block: conv-ReLU-conv-attention, scaled, plus identity."""

    def __init__(self, num_feat: int, squeeze_factor: int = 16, res_scale: float = 1) -> None:
        super().__init__()
        self.res_scale = res_scale
        self.rcab = nn.Sequential(
            nn.Conv2d(num_feat, num_feat, 3, 1, 1),
            nn.ReLU(True),
            nn.Conv2d(num_feat, num_feat, 3, 1, 1),
            ChannelAttention(num_feat, squeeze_factor),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rcab(x) * self.res_scale + x


class ResidualGroup(nn.Module):
    """``num_block`` RCABs and a conv, with a shortcut around the group."""

    def __init__(self, num_feat: int, num_block: int, squeeze_factor: int = 16, res_scale: float = 1) -> None:
        super().__init__()
        self.residual_group = make_layer(RCAB, num_block, num_feat=num_feat, squeeze_factor=squeeze_factor,
                                         res_scale=res_scale)
        self.conv = nn.Conv2d(num_feat, num_feat, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.residual_group(x)) + x


@ARCH_REGISTRY.register()
class RCAN(MeanShiftSR):
    """RCAN: residual groups of channel-attention blocks, mean shift, sub-pixel upsampling.

    ``num_feat // squeeze_factor`` is the attention bottleneck width (must be >= 1).
    ``upscale``: a power of two or 3.
    """

    def __init__(self, num_in_ch: int, num_out_ch: int, num_feat: int = 64, num_group: int = 10,
                 num_block: int = 16, squeeze_factor: int = 16, upscale: int = 4, res_scale: float = 1,
                 img_range: float = 255.0, rgb_mean: Sequence[float] = (0.4488, 0.4371, 0.4040)) -> None:
        super().__init__()
        if num_feat // squeeze_factor < 1:
            raise ArchArgumentError(
                "squeeze_factor",
                f"RCAN needs num_feat // squeeze_factor >= 1, got num_feat={num_feat}, "
                f"squeeze_factor={squeeze_factor}; use a squeeze_factor <= num_feat",
            )
        self.init_layers(num_in_ch, num_out_ch, num_feat, upscale, img_range, mean_buffer(rgb_mean, num_in_ch, "RCAN"),
                         lambda: make_layer(ResidualGroup, num_group, num_feat=num_feat, num_block=num_block,
                                            squeeze_factor=squeeze_factor, res_scale=res_scale))


def _recognise(s: StateShapes) -> list[dict]:
    """RCAN from its tensors: image channels and width from the first / last conv, groups and blocks per group
    from the body, the attention's squeeze from its bottleneck width, the scale from the upsampler."""
    cin, feat = s.dim("conv_first.weight", 1), s.dim("conv_first.weight", 0)
    hidden = s.dim("body.0.residual_group.0.rcab.3.attention.1.weight", 0)
    common = {"num_in_ch": cin, "num_out_ch": s.dim("conv_last.weight", 0), "num_feat": feat,
              "num_group": s.count("body."), "num_block": s.count("body.0.residual_group."),
              "upscale": upsample_scale(s, "upsample.", feat)}
    if cin != 3:
        common["rgb_mean"] = (0.5,) * cin
    # num_feat // squeeze_factor == hidden: the default 16 first, else the smallest factor that gives it
    factors = [16] + [f for f in range(feat // (hidden + 1) + 1, feat // hidden + 1) if f != 16]
    return [{**common, "squeeze_factor": f} for f in factors if feat // f == hidden][:2]


register_recogniser("RCAN", _recognise)
