"""MSRResNet: SRResNet without batch norm (the BasicSR baseline), x1/x2/x3/x4."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, ResidualBlockNoBN, default_init_weights, make_layer
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


@ARCH_REGISTRY.register()
class MSRResNet(nn.Module):
    """Modified SRResNet: residual blocks without BN, sub-pixel upsampling, bilinear global skip.

    Args:
        num_in_ch: input channels. num_out_ch: output channels. num_feat: feature channels.
        num_block: residual blocks in the body. upscale: 1, 2, 3 or 4.
    """

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, num_feat: int = 64, num_block: int = 16,
                 upscale: int = 4) -> None:
        super().__init__()
        if upscale not in (1, 2, 3, 4):
            raise ArchArgumentError("upscale", f"MSRResNet supports upscale 1, 2, 3 or 4, got {upscale!r}")
        self.upscale = upscale
        self.conv_first = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1)
        self.body = make_layer(ResidualBlockNoBN, num_block, num_feat=num_feat)
        if upscale in (2, 3):
            self.upconv1 = nn.Conv2d(num_feat, num_feat * upscale * upscale, 3, 1, 1)
            self.pixel_shuffle = nn.PixelShuffle(upscale)
        elif upscale == 4:
            self.upconv1 = nn.Conv2d(num_feat, num_feat * 4, 3, 1, 1)
            self.upconv2 = nn.Conv2d(num_feat, num_feat * 4, 3, 1, 1)
            self.pixel_shuffle = nn.PixelShuffle(2)
        self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.1, inplace=True)

        init = [self.conv_first, self.conv_hr, self.conv_last]
        init += [m for name, m in self.named_children() if name.startswith("upconv")]
        default_init_weights(init, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(self.lrelu(self.conv_first(x)))
        if self.upscale == 4:
            out = self.lrelu(self.pixel_shuffle(self.upconv1(out)))
            out = self.lrelu(self.pixel_shuffle(self.upconv2(out)))
        elif self.upscale in (2, 3):
            out = self.lrelu(self.pixel_shuffle(self.upconv1(out)))
        out = self.conv_last(self.lrelu(self.conv_hr(out)))
        if self.upscale == 1:
            return out + x
        return out + F.interpolate(x, scale_factor=self.upscale, mode="bilinear", align_corners=False)


def _recognise(s: StateShapes) -> dict:
    """MSRResNet from its tensors: image channels and width from the first / last conv, depth from the residual
    blocks, the scale from the upsampling convs (two x2 steps for x4, one x2 / x3 step, none for x1)."""
    cin, feat = s.dim("conv_first.weight", 1), s.dim("conv_first.weight", 0)
    if "upconv2.weight" in s:
        upscale = 4
    elif "upconv1.weight" in s:
        upscale = round((s.dim("upconv1.weight", 0) // feat) ** 0.5)
    else:
        upscale = 1
    return {"num_in_ch": cin, "num_out_ch": s.dim("conv_last.weight", 0), "num_feat": feat,
            "num_block": s.count("body."), "upscale": upscale}


register_recogniser("MSRResNet", _recognise)
