"""RRDBNet: the ESRGAN / Real-ESRGAN generator (Wang et al., 2018), with x1/x2 via pixel-unshuffle (BasicSR's) or
with as many nearest+conv steps as the scale needs (the original ESRGAN code's, ``num_upsample``); ``plus``: ESRGAN+'s
extra residual paths in the dense blocks (Rakotonirina and Rasoanaivo, ICASSP 2020).

Weights in the original ESRGAN layout (``model.0``, ``model.1.sub.N.RDBk.convj.0``, ``model.3``, ...: most community
ESRGAN models, as chaiNNer and spandrel load them) are renamed to BasicSR's names on reading (``register_layout``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, default_init_weights, make_layer, nearest_upsample, pixel_unshuffle
from anysr.archs.recognition.layouts import register_layout
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class ResidualDenseBlock(nn.Module):
    """Five densely connected convs; the output is scaled by 0.2 and added to the input. ``plus`` (ESRGAN+): a
    bias-free 1x1 conv of the input is added to the second conv's features, and those to the fourth's."""

    def __init__(self, num_feat: int = 64, num_grow_ch: int = 32, plus: bool = False) -> None:
        super().__init__()
        self.conv1x1 = nn.Conv2d(num_feat, num_grow_ch, 1, bias=False) if plus else None
        for i in range(1, 5):
            setattr(self, f"conv{i}", nn.Conv2d(num_feat + (i - 1) * num_grow_ch, num_grow_ch, 3, 1, 1))
        self.conv5 = nn.Conv2d(num_feat + 4 * num_grow_ch, num_feat, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)
        default_init_weights([self.conv1, self.conv2, self.conv3, self.conv4, self.conv5], 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [x]
        for i, conv in enumerate((self.conv1, self.conv2, self.conv3, self.conv4), 1):
            f = self.lrelu(conv(torch.cat(feats, 1)))
            if self.conv1x1 is not None and i in (2, 4):
                f = f + (self.conv1x1(x) if i == 2 else feats[2])
            feats.append(f)
        return self.conv5(torch.cat(feats, 1)) * 0.2 + x


class RRDB(nn.Module):
    """Residual-in-residual dense block: three ResidualDenseBlocks, scaled by 0.2, plus identity."""

    def __init__(self, num_feat: int, num_grow_ch: int = 32, plus: bool = False) -> None:
        super().__init__()
        self.rdb1 = ResidualDenseBlock(num_feat, num_grow_ch, plus)
        self.rdb2 = ResidualDenseBlock(num_feat, num_grow_ch, plus)
        self.rdb3 = ResidualDenseBlock(num_feat, num_grow_ch, plus)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


@ARCH_REGISTRY.register()
class RRDBNet(nn.Module):
    """ESRGAN generator. BasicSR's layout (``num_upsample`` None): the trunk always upsamples x4 (two nearest+conv
    steps); for ``scale`` 2 and 1 the input is first pixel-unshuffled by 2 or 4 (so input height/width must be
    divisible by it). The original ESRGAN layout (``num_upsample`` n): n nearest+conv x2 steps (``conv_up1`` ...
    ``conv_upn``), no unshuffle, ``scale`` = 2**n (x1 to x8 community models).

    Args:
        num_in_ch, num_out_ch: image channels. scale: 1, 2 or 4 (BasicSR's layout), 2**num_upsample otherwise.
        num_feat: trunk channels. num_block: RRDB blocks. num_grow_ch: growth channels of the dense blocks.
        num_upsample: None (BasicSR's layout) or 0-3 upsampling steps.
        plus: ESRGAN+'s dense blocks (``conv1x1`` in each; ESRGAN+'s training-time noise is not part of it).
    """

    def __init__(self, num_in_ch: int, num_out_ch: int, scale: int = 4, num_feat: int = 64,
                 num_block: int = 23, num_grow_ch: int = 32, num_upsample: int | None = None,
                 plus: bool = False) -> None:
        super().__init__()
        if num_upsample is None:
            unshuffle = {4: 1, 2: 2, 1: 4}
            if scale not in unshuffle:
                raise ArchArgumentError("scale", f"RRDBNet supports scale 1, 2 or 4, got {scale!r} (x8: set "
                                                 "num_upsample 3, the original ESRGAN layout)")
            self.unshuffle, steps = unshuffle[scale], 2
        else:
            if num_upsample not in (0, 1, 2, 3):
                raise ArchArgumentError("num_upsample", f"RRDBNet takes 0 to 3 upsampling steps, got {num_upsample!r}")
            if scale != 2**num_upsample:
                raise ArchArgumentError("scale", f"RRDBNet with num_upsample {num_upsample} is x{2**num_upsample}, "
                                                 f"got scale {scale!r}; set scale {2**num_upsample}")
            self.unshuffle, steps = 1, num_upsample
        self.scale = scale
        self.num_in_ch = num_in_ch  # the image's channels (input_channels reads it)
        self.conv_first = nn.Conv2d(num_in_ch * self.unshuffle**2, num_feat, 3, 1, 1)
        self.body = make_layer(RRDB, num_block, num_feat=num_feat, num_grow_ch=num_grow_ch, plus=bool(plus))
        self.conv_body = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.up_names = [f"conv_up{i}" for i in range(1, steps + 1)]
        for name in self.up_names:
            setattr(self, name, nn.Conv2d(num_feat, num_feat, 3, 1, 1))
        self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = pixel_unshuffle(x, self.unshuffle) if self.unshuffle > 1 else x
        feat = self.conv_first(feat)
        feat = feat + self.conv_body(self.body(feat))
        for name in self.up_names:
            feat = self.lrelu(getattr(self, name)(nearest_upsample(feat, 2)))
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


_UP_WEIGHT = re.compile(r"conv_up\d+\.weight")


def _recognise(s: StateShapes) -> list[dict]:
    """RRDBNet from its tensors: width and image channels from the first / last conv, depth from the blocks; in
    BasicSR's layout (two upsampling convs) the scale from how many channels the first conv takes (x2 / x1 fold the
    input by pixel-unshuffle), else from the number of upsampling convs (the original layout's x1 / x2 / x8)."""
    feat, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    out = s.dim("conv_last.weight", 0)
    common = {"num_out_ch": out, "num_feat": feat, "num_block": s.count("body."),
              "num_grow_ch": s.dim("body.0.rdb1.conv1.weight", 0)}
    if "body.0.rdb1.conv1x1.weight" in s.keys():
        common["plus"] = True
    steps = sum(1 for k in s.keys() if _UP_WEIGHT.fullmatch(k))
    if steps != 2:
        return [{"num_in_ch": cin, "scale": 2**steps, "num_upsample": steps, **common}]
    proposals = [{"num_in_ch": cin // fold**2, "scale": scale, **common}
                 for scale, fold in ((4, 1), (2, 2), (1, 4)) if cin % fold**2 == 0]
    return sorted(proposals, key=lambda p: p["num_in_ch"] != out)  # input channels = output channels first


register_recogniser("RRDBNet", _recognise)


# ------------------------------------------------------------- the original ESRGAN layout (model.N names)
_OLD_BLOCK = re.compile(r"model\.1\.sub\.(\d+)\.RDB(\d)\.(conv\d\.0|conv1x1)\.(weight|bias)")
_OLD_TOP = re.compile(r"model\.(\d+)\.(weight|bias)")


def _is_original_esrgan(sd: Mapping[str, Any]) -> bool:
    """The original ESRGAN code's names (ESRGAN+'s ``conv1x1`` too)."""
    return "model.0.weight" in sd and "model.1.sub.0.RDB1.conv1.0.weight" in sd


def _from_original_esrgan(sd: Mapping[str, Any]) -> dict[str, Any]:
    """Rename ``model.N`` names to BasicSR's: ``model.0`` conv_first, ``model.1.sub.i.RDBk.convj.0`` (and ESRGAN+'s
    ``RDBk.conv1x1``) the dense blocks, ``model.1.sub.<blocks>`` conv_body, ``model.{3k}`` the k-th upsampling
    conv, then the two HR convs (``model.{3n+2}``, ``model.{3n+4}``: conv_hr, conv_last). A name that fits none is
    kept (the strict load then names it)."""
    tops = sorted({int(m.group(1)) for k in sd if (m := _OLD_TOP.fullmatch(k))})
    last = max(tops)
    steps = (last + 1 - 5) // 3
    blocks = {int(m.group(1)) for k in sd if (m := _OLD_BLOCK.fullmatch(k))}
    top_names = {0: "conv_first", **{3 * k: f"conv_up{k}" for k in range(1, steps + 1)},
                 3 * steps + 2: "conv_hr", 3 * steps + 4: "conv_last"}
    out: dict[str, Any] = {}
    for k, v in sd.items():
        if m := _OLD_BLOCK.fullmatch(k):
            out[f"body.{m.group(1)}.rdb{m.group(2)}.{m.group(3).removesuffix('.0')}.{m.group(4)}"] = v
        elif (m := _OLD_TOP.fullmatch(k)) and int(m.group(1)) in top_names:
            out[f"{top_names[int(m.group(1))]}.{m.group(2)}"] = v
        elif blocks and k in (f"model.1.sub.{max(blocks) + 1}.weight", f"model.1.sub.{max(blocks) + 1}.bias"):
            out["conv_body." + k.rsplit(".", 1)[1]] = v
        else:
            out[k] = v
    return out


register_layout("RRDBNet", "the original ESRGAN layout (model.N names)", _is_original_esrgan, _from_original_esrgan)
