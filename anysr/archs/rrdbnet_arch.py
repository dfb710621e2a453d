"""RRDBNet: the ESRGAN / Real-ESRGAN generator (Wang et al., 2018), with x1/x2 via pixel-unshuffle."""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, default_init_weights, make_layer, nearest_upsample, pixel_unshuffle
from anysr.archs.recognise import StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class ResidualDenseBlock(nn.Module):
    """Five densely connected convs; the output is scaled by 0.2 and added to the input."""

    def __init__(self, num_feat: int = 64, num_grow_ch: int = 32) -> None:
        super().__init__()
        for i in range(1, 5):
            setattr(self, f"conv{i}", nn.Conv2d(num_feat + (i - 1) * num_grow_ch, num_grow_ch, 3, 1, 1))
        self.conv5 = nn.Conv2d(num_feat + 4 * num_grow_ch, num_feat, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)
        default_init_weights([self.conv1, self.conv2, self.conv3, self.conv4, self.conv5], 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [x]
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            feats.append(self.lrelu(conv(torch.cat(feats, 1))))
        return self.conv5(torch.cat(feats, 1)) * 0.2 + x


class RRDB(nn.Module):
    """Residual-in-residual dense block: three ResidualDenseBlocks, scaled by 0.2, plus identity."""

    def __init__(self, num_feat: int, num_grow_ch: int = 32) -> None:
        super().__init__()
        self.rdb1 = ResidualDenseBlock(num_feat, num_grow_ch)
        self.rdb2 = ResidualDenseBlock(num_feat, num_grow_ch)
        self.rdb3 = ResidualDenseBlock(num_feat, num_grow_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


@ARCH_REGISTRY.register()
class RRDBNet(nn.Module):
    """ESRGAN generator. The trunk always upsamples x4 (two nearest+conv steps); for ``scale`` 2 and 1
    the input is first pixel-unshuffled by 2 or 4 (so input height/width must be divisible by it).

    Args:
        num_in_ch, num_out_ch: image channels. scale: 1, 2 or 4. num_feat: trunk channels.
        num_block: RRDB blocks. num_grow_ch: growth channels of the dense blocks.
    """

    def __init__(self, num_in_ch: int, num_out_ch: int, scale: int = 4, num_feat: int = 64,
                 num_block: int = 23, num_grow_ch: int = 32) -> None:
        super().__init__()
        unshuffle = {4: 1, 2: 2, 1: 4}
        if scale not in unshuffle:
            raise ArchArgumentError("scale", f"RRDBNet supports scale 1, 2 or 4, got {scale!r}")
        self.scale = scale
        self.num_in_ch = num_in_ch  # the image's channels (input_channels reads it)
        self.unshuffle = unshuffle[scale]
        self.conv_first = nn.Conv2d(num_in_ch * self.unshuffle**2, num_feat, 3, 1, 1)
        self.body = make_layer(RRDB, num_block, num_feat=num_feat, num_grow_ch=num_grow_ch)
        self.conv_body = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_up2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = pixel_unshuffle(x, self.unshuffle) if self.unshuffle > 1 else x
        feat = self.conv_first(feat)
        feat = feat + self.conv_body(self.body(feat))
        feat = self.lrelu(self.conv_up1(nearest_upsample(feat, 2)))
        feat = self.lrelu(self.conv_up2(nearest_upsample(feat, 2)))
        return self.conv_last(self.lrelu(self.conv_hr(feat)))


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds. Its ``use_pixel_unshuffle: true`` is BasicSR's layout for x1 / x2 (the input folded into
# 4 / 16 channels, then the x4 body), the only one anysr builds.
register_presets("RRDBNet", scale_arg="scale",
                 renames={"in_nc": "num_in_ch", "out_nc": "num_out_ch", "num_filters": "num_feat",
                          "num_blocks": "num_block"},
                 fixed={"use_pixel_unshuffle": True},
                 presets={
    "esrgan": {"num_in_ch": 3, "num_out_ch": 3},  # 16.70 M parameters at x4
    "esrgan_lite": {"num_in_ch": 3, "num_out_ch": 3, "num_block": 12, "num_feat": 32},  # 5.02 M parameters at x4
})


def _recognise(s: StateShapes) -> list[dict]:
    """RRDBNet from its tensors: width and image channels from the first / last conv, depth from the blocks, the
    scale from how many channels the first conv takes (x2 / x1 fold the input by pixel-unshuffle)."""
    feat, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    out = s.dim("conv_last.weight", 0)
    common = {"num_out_ch": out, "num_feat": feat, "num_block": s.count("body."),
              "num_grow_ch": s.dim("body.0.rdb1.conv1.weight", 0)}
    proposals = [{"num_in_ch": cin // fold**2, "scale": scale, **common}
                 for scale, fold in ((4, 1), (2, 2), (1, 4)) if cin % fold**2 == 0]
    return sorted(proposals, key=lambda p: p["num_in_ch"] != out)  # input channels = output channels first


register_recogniser("RRDBNet", _recognise)
