"""MoSR: MambaOut Super-Resolution (umzi2, 2024; no paper, code in traiNNer-redux / neosr): the gated CNN blocks
of MambaOut (Yu & Wang, "MambaOut: Do We Really Need Mamba for Vision?", CVPR 2025) for efficient SR.

Module names and constructor arguments follow spandrel 0.4.2's ``MoSR``, so released checkpoints load with
``strict=True`` and give the same output. A 3x3 stem feeds ``n_block`` gated CNN blocks (channel layer norm,
a 3x3 conv to two gated halves, a depth-wise ``kernel_size`` conv on part of one half, Mish) and a conv
tail; a two-conv shortcut of the input is added (both branches offset by -0.5, as the original), then one of
three heads upsamples: ``"ps"`` (conv + PixelShuffle), ``"gps"`` (eight predictions averaged, then
PixelShuffle) or ``"dys"`` (DySample).

Fully convolutional: any input size works without padding (``tile_multiple = 1``).
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, DropPath, LayerNorm2d, drop_path_rates
from anysr.archs.plksr_arch import DySample, dysample_scale
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits, width_ratio
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

UPSAMPLERS = ("ps", "gps", "dys")
# traiNNer-redux's builders take these spellings and pass the short ones on
LONG_UPSAMPLERS = {"pixelshuffle": "ps", "geoensemblepixelshuffle": "gps", "dysample": "dys"}


class GPS(nn.Module):
    """Geometric-ensemble PixelShuffle: one conv predicts eight candidate sub-pixel maps, their mean is shuffled."""

    def __init__(self, dim: int, scale: int, out_ch: int = 3, kernel_size: int = 3) -> None:
        super().__init__()
        self.in_to_k = nn.Conv2d(dim, scale * scale * out_ch * 8, kernel_size, 1, kernel_size // 2)
        self.ps = nn.PixelShuffle(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.in_to_k(x)
        b, _, h, w = y.shape
        return self.ps(y.reshape(b, 8, -1, h, w).mean(dim=1))


class ConvBlock(nn.Module):
    """Two 3x3 convs with Mish, plus a 1x1 conv of the input (the network's long shortcut)."""

    def __init__(self, in_channel: int, out_channel: int, strides: int = 1) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(in_channel, out_channel, 3, strides, 1), nn.Mish(),
            nn.Conv2d(out_channel, out_channel, 3, strides, 1), nn.Mish(),
        )
        self.conv11 = nn.Conv2d(in_channel, out_channel, 1, strides, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) + self.conv11(x)


class GatedCNNBlock(nn.Module):
    """MambaOut's gated CNN unit on NCHW maps: ``fc1`` (3x3) makes a gate ``g`` and a value split into an
    identity part and ``int(conv_ratio * dim)`` channels filtered depth-wise; ``fc2(mish(g) * value)``, Mish,
    stochastic depth, then ``+ (input - 0.5)``."""

    def __init__(self, dim: int, expansion_ratio: float = 8 / 3, conv_ratio: float = 1.0, kernel_size: int = 7,
                 drop_path: float = 0.5) -> None:
        super().__init__()
        hidden = int(expansion_ratio * dim)
        conv_channels = int(conv_ratio * dim)
        self.norm = LayerNorm2d(dim)
        self.fc1 = nn.Conv2d(dim, hidden * 2, 3, 1, 1)
        self.act = nn.Mish()
        self.split_indices = [hidden, hidden - conv_channels, conv_channels]
        self.conv = nn.Conv2d(conv_channels, conv_channels, kernel_size, 1, kernel_size // 2, groups=conv_channels)
        self.fc2 = nn.Conv2d(hidden, dim, 3, 1, 1)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        for m in (self.fc1, self.conv, self.fc2):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, ident, conv = torch.split(self.fc1(self.norm(x)), self.split_indices, dim=1)
        y = self.act(self.fc2(self.act(gate) * torch.cat((ident, self.conv(conv)), dim=1)))
        return self.drop_path(y) + (x - 0.5)


@ARCH_REGISTRY.register()
class MoSR(nn.Module):
    """MoSR: stem conv, ``n_block`` gated CNN blocks, conv tail; plus a ConvBlock shortcut; then the upsampler.

    Args:
        in_ch / out_ch: image channels (``out_ch`` is ``in_ch`` for the "ps" and "gps" heads, as in the original).
        upscale: integer scale >= 1. n_block: gated blocks. dim: width.
        upsampler: "ps", "gps" or "dys" (DySample; needs ``dim`` to be a multiple of 4); traiNNer-redux's
            "pixelshuffle", "geoensemblepixelshuffle" and "dysample" name the same.
        drop_path: stochastic-depth rate of the last block (rising linearly from 0).
        kernel_size: depth-wise kernel of the blocks. expansion_ratio: hidden width factor of ``fc1``.
        conv_ratio: share of ``dim`` that the depth-wise conv filters (at most ``expansion_ratio``).
    """

    tile_multiple: int = 1

    def __init__(self, in_ch: int = 3, out_ch: int = 3, upscale: int = 4, n_block: int = 24, dim: int = 64,
                 upsampler: str = "ps", drop_path: float = 0.0, kernel_size: int = 7, expansion_ratio: float = 1.5,
                 conv_ratio: float = 1.0) -> None:
        super().__init__()
        if isinstance(upscale, bool) or not isinstance(upscale, int) or upscale < 1:
            raise ArchArgumentError("upscale", f"MoSR needs an integer upscale >= 1, got {upscale!r}")
        upsampler = LONG_UPSAMPLERS.get(upsampler, upsampler) if isinstance(upsampler, str) else upsampler
        if upsampler not in UPSAMPLERS:
            raise ArchArgumentError("upsampler", f"MoSR knows the upsamplers {list(UPSAMPLERS)} (traiNNer-redux's "
                                    f"{list(LONG_UPSAMPLERS)}), got {upsampler!r}")
        if int(conv_ratio * dim) > int(expansion_ratio * dim) or int(conv_ratio * dim) < 1:
            raise ArchArgumentError("conv_ratio", f"MoSR: int(conv_ratio * dim) = {int(conv_ratio * dim)} must be "
                                    f"between 1 and the hidden width int(expansion_ratio * dim) = "
                                    f"{int(expansion_ratio * dim)}")
        if upsampler == "dys" and dim % 4:
            raise ArchArgumentError("dim", f"MoSR's DySample head needs dim to be a multiple of 4, got {dim}")
        if upsampler in ("ps", "gps"):
            out_ch = in_ch
        self.upscale = upscale
        self.in_ch = in_ch
        rates = drop_path_rates(drop_path, n_block)
        self.gblocks = nn.Sequential(
            nn.Conv2d(in_ch, dim, 3, 1, 1),
            *[GatedCNNBlock(dim, expansion_ratio, conv_ratio, kernel_size, rates[i]) for i in range(n_block)],
            nn.Conv2d(dim, dim * 2, 3, 1, 1), nn.Mish(),
            nn.Conv2d(dim * 2, dim, 3, 1, 1), nn.Mish(),
            nn.Conv2d(dim, dim, 1, 1),
        )
        self.shortcut = ConvBlock(in_ch, dim)
        self.upsampler: nn.Module
        if upsampler == "ps":
            self.upsampler = nn.Sequential(nn.Conv2d(dim, out_ch * upscale**2, 3, 1, 1), nn.PixelShuffle(upscale))
        elif upsampler == "gps":
            self.upsampler = GPS(dim, upscale, out_ch)
        else:
            self.upsampler = DySample(dim, out_ch, upscale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.upsampler(self.gblocks(x) + (self.shortcut(x) - 0.5))


__all__ = ["MoSR", "GatedCNNBlock", "GPS"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("MoSR", scale_arg="upscale", presets={
    "mosr": {},  # 4.29 M parameters at x4
    "mosr_t": {"n_block": 5, "dim": 48},  # 0.61 M parameters at x4
})


def _recognise(s: StateShapes) -> list[dict]:
    """MoSR from its tensors: image channels and width from the first conv, the gated blocks (their count,
    depth-wise kernel, hidden and filtered widths) from the body, the head from its names and the scale and
    output channels from its shapes."""
    cin, dim = s.dim("gblocks.0.weight", 1), s.dim("gblocks.0.weight", 0)
    blocks = [i for i in s.indices("gblocks.") if f"gblocks.{i}.fc1.weight" in s]
    common: dict = {"in_ch": cin, "dim": dim, "n_block": len(blocks)}
    if blocks:
        b = f"gblocks.{blocks[0]}."
        common["kernel_size"] = s.dim(f"{b}conv.weight", 2)
        common["expansion_ratio"] = width_ratio(s.dim(f"{b}fc1.weight", 0) // 2, dim, 1.5)
        common["conv_ratio"] = width_ratio(s.dim(f"{b}conv.weight", 0), dim, 1.0)
    s.shape("shortcut.conv11.weight")
    if "upsampler.offset.weight" in s:
        return [{**common, "out_ch": s.dim("upsampler.end_conv.weight", 0), "upsampler": "dys",
                 "upscale": dysample_scale(s, "upsampler.")}]
    if "upsampler.in_to_k.weight" in s:
        return [{**common, "out_ch": cin, "upsampler": "gps", "upscale": sc}
                for _, sc in shuffle_splits(s.dim("upsampler.in_to_k.weight", 0), (8 * cin,))]
    return [{**common, "out_ch": cin, "upsampler": "ps", "upscale": sc}
            for _, sc in shuffle_splits(s.dim("upsampler.0.weight", 0), (cin,))]


register_recogniser("MoSR", _recognise)
