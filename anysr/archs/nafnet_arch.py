"""NAFNet: simple baselines for image restoration (Chen, Chu, Zhang & Sun, ECCV 2022).

Module names and constructor arguments follow megvii-research/NAFNet (as spandrel 0.4.2 reproduces it), so the
released NAFNet checkpoints (SIDD denoising, GoPro / REDS deblurring) load with ``strict=True``.

A U-Net of NAFBlocks: blocks are nonlinear-activation-free (a gate that multiplies two channel halves replaces
the activation; a global-average "simplified channel attention"). The input is zero-padded at the bottom/right
to a multiple of ``2 ** len(enc_blk_nums)`` (one halving per encoder level) and the output cropped back, as the
original ``check_image_size`` does.

Published configurations (``NAFNET_CONFIGS``): SIDD width 32/64 (enc [2, 2, 4, 8], middle 12, dec [2, 2, 2, 2])
and GoPro width 32/64 (enc [1, 1, 1, 28], middle 1, dec [1, 1, 1, 1]); the width is the only difference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

_SIDD = {"enc_blk_nums": [2, 2, 4, 8], "middle_blk_num": 12, "dec_blk_nums": [2, 2, 2, 2]}
_GOPRO = {"enc_blk_nums": [1, 1, 1, 28], "middle_blk_num": 1, "dec_blk_nums": [1, 1, 1, 1]}
NAFNET_CONFIGS: dict[str, dict] = {
    "NAFNet-SIDD-width32": {"width": 32, **_SIDD},
    "NAFNet-SIDD-width64": {"width": 64, **_SIDD},
    "NAFNet-GoPro-width32": {"width": 32, **_GOPRO},
    "NAFNet-GoPro-width64": {"width": 64, **_GOPRO},
}
"""Constructor arguments of the published NAFNet models (RGB, ``img_channel`` 3)."""


class LayerNorm2d(nn.Module):
    """Layer norm over the channels of each pixel of a (b, c, h, w) map (biased variance, ``eps`` 1e-6)."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps
        self.shape = (channels,)  # a constant (not the input's traced size): ONNX export needs it so

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.permute(0, 2, 3, 1), self.shape, self.weight, self.bias, self.eps)
        return y.permute(0, 3, 1, 2)


class SimpleGate(nn.Module):
    """Split the channels in two halves and multiply them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=1)
        return a * b


class NAFBlock(nn.Module):
    """Norm, 1x1 expand, 3x3 depthwise, gate, channel attention, 1x1 (scaled by ``beta``) + input; then norm,
    1x1 expand, gate, 1x1 (scaled by ``gamma``) + that. ``beta``/``gamma`` start at zero (identity block)."""

    def __init__(self, c: int, DW_Expand: int = 2, FFN_Expand: int = 2, drop_out_rate: float = 0.0) -> None:  # noqa: N803
        super().__init__()
        dw = c * DW_Expand
        ffn = c * FFN_Expand
        self.conv1 = nn.Conv2d(c, dw, 1)
        self.conv2 = nn.Conv2d(dw, dw, 3, padding=1, groups=dw)
        self.conv3 = nn.Conv2d(dw // 2, c, 1)
        self.sca = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(dw // 2, dw // 2, 1))
        self.sg = SimpleGate()
        self.conv4 = nn.Conv2d(c, ffn, 1)
        self.conv5 = nn.Conv2d(ffn // 2, c, 1)
        self.norm1 = LayerNorm2d(c)
        self.norm2 = LayerNorm2d(c)
        self.dropout1 = nn.Dropout(drop_out_rate) if drop_out_rate > 0 else nn.Identity()
        self.dropout2 = nn.Dropout(drop_out_rate) if drop_out_rate > 0 else nn.Identity()
        self.beta = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.gamma = nn.Parameter(torch.zeros(1, c, 1, 1))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.sg(self.conv2(self.conv1(self.norm1(inp))))
        x = self.conv3(x * self.sca(x))
        y = inp + self.dropout1(x) * self.beta
        x = self.conv5(self.sg(self.conv4(self.norm2(y))))
        return y + self.dropout2(x) * self.gamma


def block_counts(value: Sequence[int], arg: str, family: str = "NAFNet") -> list[int]:
    """A U-Net's per-level block counts (``enc_blk_nums`` / ``dec_blk_nums``): ints >= 0, else a one-line error."""
    counts = list(value)
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in counts):
        raise ArchArgumentError(arg, f"{family} needs a list of block counts >= 0, got {value!r}")
    return counts


@ARCH_REGISTRY.register()
class NAFNet(nn.Module):
    """NAFNet U-Net: ``intro`` conv, per level (encoder blocks, 2x2 stride-2 conv doubling the channels),
    ``middle_blks``, per level (1x1 conv + PixelShuffle halving the channels, skip added, decoder blocks),
    ``ending`` conv, plus the input. Scale 1 (restoration).

    Args (megvii's): img_channel, width (channels of the first level), middle_blk_num, enc_blk_nums and
    dec_blk_nums (blocks per level; as many decoder as encoder levels). See ``NAFNET_CONFIGS``.
    """

    def __init__(self, img_channel: int = 3, width: int = 16, middle_blk_num: int = 1,
                 enc_blk_nums: Sequence[int] = (), dec_blk_nums: Sequence[int] = ()) -> None:
        super().__init__()
        enc = block_counts(enc_blk_nums, "enc_blk_nums")
        dec = block_counts(dec_blk_nums, "dec_blk_nums")
        if len(enc) != len(dec):
            raise ArchArgumentError("dec_blk_nums", f"NAFNet needs one decoder level per encoder level: "
                                    f"enc_blk_nums has {len(enc)} entries, dec_blk_nums {len(dec)}")
        self.intro = nn.Conv2d(img_channel, width, 3, padding=1)
        self.ending = nn.Conv2d(width, img_channel, 3, padding=1)
        self.encoders = nn.ModuleList()
        self.downs = nn.ModuleList()
        self.ups = nn.ModuleList()
        self.decoders = nn.ModuleList()
        chan = width
        for num in enc:
            self.encoders.append(nn.Sequential(*(NAFBlock(chan) for _ in range(num))))
            self.downs.append(nn.Conv2d(chan, 2 * chan, 2, 2))
            chan *= 2
        self.middle_blks = nn.Sequential(*(NAFBlock(chan) for _ in range(middle_blk_num)))
        for num in dec:
            self.ups.append(nn.Sequential(nn.Conv2d(chan, 2 * chan, 1, bias=False), nn.PixelShuffle(2)))
            chan //= 2
            self.decoders.append(nn.Sequential(*(NAFBlock(chan) for _ in range(num))))
        self.padder_size = 2 ** len(enc)
        self.tile_multiple: int = self.padder_size  # input sides are padded to a multiple of this

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        h, w = inp.shape[-2:]
        m = self.padder_size
        pad_h, pad_w = (-h) % m, (-w) % m
        if pad_h or pad_w:
            inp = F.pad(inp, (0, pad_w, 0, pad_h))
        x = self.intro(inp)
        skips = []
        for encoder, down in zip(self.encoders, self.downs):
            x = encoder(x)
            skips.append(x)
            x = down(x)
        x = self.middle_blks(x)
        for decoder, up, skip in zip(self.decoders, self.ups, reversed(skips)):
            x = decoder(up(x) + skip)
        x = self.ending(x) + inp
        return x[..., :h, :w] if (pad_h or pad_w) else x


__all__ = ["NAFBlock", "NAFNET_CONFIGS", "NAFNet", "LayerNorm2d", "SimpleGate"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("NAFNet", scale_arg=None, fixed={"scale": 1}, presets={
    # 29.16 M parameters at x4
    "nafnet32": {"width": 32, "enc_blk_nums": (2, 2, 4, 8), "middle_blk_num": 12, "dec_blk_nums": (2,) * 4},
    # 115.98 M parameters at x4
    "nafnet64": {"width": 64, "enc_blk_nums": (2, 2, 4, 8), "middle_blk_num": 12, "dec_blk_nums": (2,) * 4},
})


def _recognise(s: StateShapes) -> dict:
    """NAFNet from its tensors: image channels and width from the intro conv, the levels from the down convs,
    the blocks per level from each encoder / decoder and the middle."""
    levels = s.count("downs.")
    return {"img_channel": s.dim("intro.weight", 1), "width": s.dim("intro.weight", 0),
            "middle_blk_num": s.count("middle_blks."),
            "enc_blk_nums": [s.count(f"encoders.{i}.") for i in range(levels)],
            "dec_blk_nums": [s.count(f"decoders.{i}.") for i in range(levels)]}


register_recogniser("NAFNet", _recognise)
