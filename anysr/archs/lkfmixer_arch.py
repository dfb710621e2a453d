"""LKFMixer: "Exploring Large Kernel Feature Mixing for Lightweight Image Super-Resolution" (Chen, Li et al.;
IEEE TCSVT 2025), as traiNNer-redux trains it.

Module names and constructor arguments follow traiNNer-redux's ``LKFMixer`` (which follows the authors' code), so
its checkpoints load with ``strict=True`` and give the same output. A 3x3 stem feeds ``num_block`` feature
modulation blocks (FMB); each chains a distillation block (three fusion steps, each a 3x3 depth-wise conv plus a
partial large-kernel block, with 1x1 distilled side outputs), a spatial modulation block (the large-kernel branch
plus a 1/8-resolution max-pooled branch gated by the pooled channel means) and a selective block that blends the
large-kernel and 3x3 branches with a learned sigmoid weight. The partial large-kernel block filters the first
``split_factor`` of the channels with a 1xK then a Kx1 depth-wise conv (K = ``large_kernel``). A depth-wise 3x3 conv,
the long shortcut and a one-step pixel-shuffle head follow.

Size requirement: the input is padded to a multiple of 8 (reflect; edge replication past one side length) for the
1/8-resolution branch, and the output cropped; ``tile_multiple`` is 8.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

POOL = 8  # the spatial modulation branch works at 1/8 resolution


def _linear_resize_matrix(n_out: int, n_in: int, like: torch.Tensor) -> torch.Tensor:
    """(n_out, n_in) weights of 1-D linear resizing with half-pixel centres (``align_corners=False``)."""
    pos = (torch.arange(n_out, device=like.device, dtype=torch.float32) + 0.5) * (n_in / n_out) - 0.5
    pos = pos.clamp(min=0)
    lo = pos.floor().clamp(max=n_in - 1)
    frac = (pos - lo)[:, None]
    hi = (lo + 1).clamp(max=n_in - 1)
    idx = torch.arange(n_in, device=like.device, dtype=torch.float32)[None, :]
    weights = (idx == lo[:, None]) * (1 - frac) + (idx == hi[:, None]) * frac
    return weights.to(like.dtype)


def bilinear_resize(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``F.interpolate(x, (h, w), mode="bilinear", align_corners=False)`` as two small matmuls (XLA lowers
    upsample_bilinear2d's backward to the CPU; the matmuls lower everywhere and export to ONNX)."""
    return _linear_resize_matrix(h, x.shape[-2], x) @ x @ _linear_resize_matrix(w, x.shape[-1], x).T


def _dw(channels: int, kernel: tuple[int, int]) -> nn.Conv2d:
    return nn.Conv2d(channels, channels, kernel, 1, (kernel[0] // 2, kernel[1] // 2), groups=channels)


class PLKB(nn.Module):
    """Partial large kernel: 1xK then Kx1 depth-wise convs on the first ``split_channels`` channels, the rest
    untouched, then a 1x1 conv and GELU over all."""

    def __init__(self, channels: int, large_kernel: int, split_factor: float) -> None:
        super().__init__()
        self.channels = channels
        self.split_channels = int(channels * split_factor)
        self.DWConv_Kx1 = _dw(self.split_channels, (large_kernel, 1))
        self.DWConv_1xK = _dw(self.split_channels, (1, large_kernel))
        self.conv1 = nn.Conv2d(channels, channels, 1)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part, rest = x[:, :self.split_channels], x[:, self.split_channels:]
        part = self.DWConv_Kx1(self.DWConv_1xK(part))
        return self.act(self.conv1(torch.cat((part, rest), dim=1)))


class FFB(nn.Module):
    """Fusion: ``gelu(conv1(dw3x3(x) + PLKB(x)))``."""

    def __init__(self, channels: int, large_kernel: int, split_factor: float) -> None:
        super().__init__()
        self.PLKB = PLKB(channels, large_kernel, split_factor)
        self.DWConv3 = _dw(channels, (3, 3))
        self.conv1 = nn.Conv2d(channels, channels, 1)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv1(self.DWConv3(x) + self.PLKB(x)))


class FDB(nn.Module):
    """Distillation: three FFB steps; after each input / step a 1x1 conv keeps half the channels (GELU); the four
    halves are concatenated and mixed back to ``channels`` by ``c5``."""

    def __init__(self, channels: int, large_kernel: int, split_factor: float) -> None:
        super().__init__()
        half = channels // 2
        self.c1_d = nn.Conv2d(channels, half, 1)
        self.c1_r = FFB(channels, large_kernel, split_factor)
        self.c2_d = nn.Conv2d(channels, half, 1)
        self.c2_r = FFB(channels, large_kernel, split_factor)
        self.c3_d = nn.Conv2d(channels, half, 1)
        self.c3_r = FFB(channels, large_kernel, split_factor)
        self.c4 = nn.Conv2d(channels, half, 1)
        self.act = nn.GELU()
        self.c5 = nn.Conv2d(half * 4, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = []
        for distil, refine in ((self.c1_d, self.c1_r), (self.c2_d, self.c2_r), (self.c3_d, self.c3_r)):
            kept.append(self.act(distil(x)))
            x = refine(x)
        kept.append(self.act(self.c4(x)))
        return self.c5(torch.cat(kept, dim=1))


class SFMB(nn.Module):
    """Spatial modulation: PLKB(x) plus a 1/8-resolution branch (max-pool, dw 3x3, 1x1, GELU, bilinear back)
    scaled by ``sigmoid(mean over the image)``; then 1x1 and GELU."""

    def __init__(self, channels: int, large_kernel: int, split_factor: float) -> None:
        super().__init__()
        self.PLKB = PLKB(channels, large_kernel, split_factor)
        self.DWConv_3 = _dw(channels, (3, 3))
        self.AdaptiveAvgPool = nn.AdaptiveAvgPool2d(1)
        self.conv1_1 = nn.Conv2d(channels, channels, 1)
        self.conv1_2 = nn.Conv2d(channels, channels, 1)
        self.sigmoid = nn.Sigmoid()
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        gate = torch.sigmoid(x.mean((2, 3), keepdim=True))
        small = self.act(self.conv1_1(self.DWConv_3(F.max_pool2d(x, POOL))))
        local = bilinear_resize(small, h, w)
        return self.act(self.conv1_2(self.PLKB(x) + gate * local))


class FSB(nn.Module):
    """Selection: ``w = sigmoid(gelu(1x1([PLKB(x), dw3x3(x)])))``, output ``w * PLKB(x) + (1 - w) * dw3x3(x)``."""

    def __init__(self, channels: int, large_kernel: int, split_factor: float) -> None:
        super().__init__()
        self.PLKB = PLKB(channels, large_kernel, split_factor)
        self.DWConv_3 = _dw(channels, (3, 3))
        self.conv1_1 = nn.Conv2d(channels * 2, channels, 1)
        self.sigmoid = nn.Sigmoid()
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        large, small = self.PLKB(x), self.DWConv_3(x)
        weight = torch.sigmoid(self.act(self.conv1_1(torch.cat((large, small), dim=1))))
        return small + weight * (large - small)


class FMB(nn.Module):
    """FDB, SFMB, FSB with a residual connection around the three."""

    def __init__(self, channels: int, large_kernel: int, split_factor: float) -> None:
        super().__init__()
        self.FDB = FDB(channels, large_kernel, split_factor)
        self.SFMB = SFMB(channels, large_kernel, split_factor)
        self.FSB = FSB(channels, large_kernel, split_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.FSB(self.SFMB(self.FDB(x)))


class Layers(nn.Module):
    """The FMB chain (kept as a module of its own for the ``layers.layers.<i>`` key names)."""

    def __init__(self, channels: int, num_block: int, large_kernel: int, split_factor: float) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(FMB(channels, large_kernel, split_factor) for _ in range(num_block)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class PixelShuffleDirect(nn.Module):
    """3x3 conv to ``out * scale**2`` channels and a pixel shuffle (``upsampleOneStep.{0}`` keys)."""

    def __init__(self, scale: int, num_feat: int, num_out_ch: int) -> None:
        super().__init__()
        self.upsampleOneStep = nn.Sequential(nn.Conv2d(num_feat, scale * scale * num_out_ch, 3, 1, 1),
                                             nn.PixelShuffle(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.upsampleOneStep(x)


@ARCH_REGISTRY.register()
class LKFMixer(nn.Module):
    """LKFMixer (all arguments required, as in traiNNer-redux's class; the presets lkfmixer_t / _b / _l name the
    published sizes)."""

    tile_multiple: int = POOL

    def __init__(self, in_channels: int, channels: int, out_channels: int, upscale: int, num_block: int,
                 large_kernel: int, split_factor: float) -> None:
        super().__init__()
        if not isinstance(upscale, int) or isinstance(upscale, bool) or upscale < 1:
            raise ArchArgumentError("upscale", f"LKFMixer needs an integer upscale >= 1, got {upscale!r}")
        if not isinstance(large_kernel, int) or large_kernel < 1 or large_kernel % 2 == 0:
            raise ArchArgumentError("large_kernel", f"LKFMixer needs an odd large_kernel, got {large_kernel!r}")
        if not 1 <= int(channels * split_factor) <= channels:
            raise ArchArgumentError("split_factor", f"LKFMixer: split_factor {split_factor!r} leaves no channel of "
                                                    f"{channels} for the large kernel")
        if channels % 2:
            raise ArchArgumentError("channels", f"LKFMixer needs an even number of channels, got {channels!r}")
        self.scale = upscale
        self.conv_first = nn.Conv2d(in_channels, channels, 3, 1, 1)
        self.layers = Layers(channels, num_block, large_kernel, split_factor)
        self.conv = _dw(channels, (3, 3))
        self.upsampler = PixelShuffleDirect(upscale, channels, out_channels)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, POOL)
        feat = self.conv_first(x)
        out = self.act(self.conv(self.layers(feat)))
        return self.upsampler(out + feat)[:, :, :h * self.scale, :w * self.scale]


# traiNNer-redux's builders (tests/test_presets.py checks each against the network traiNNer-redux builds)
register_presets("LKFMixer", scale_arg="upscale", presets={
    name: {"in_channels": 3, "out_channels": 3, "channels": ch, "num_block": nb, "large_kernel": 31,
           "split_factor": 0.25, "upscale": 4}
    for name, ch, nb in (("lkfmixer_t", 40, 6), ("lkfmixer_b", 48, 8), ("lkfmixer_l", 64, 12))
})


def _recognise(s: StateShapes) -> list[dict]:
    """LKFMixer from its tensors: channels from the first conv, depth from the layers, the large kernel and the
    split factor from the first block's strip convs, scale and output channels from the upsampler."""
    channels, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    strip = s.shape("layers.layers.0.FDB.c1_r.PLKB.DWConv_Kx1.weight")
    common = {"in_channels": cin, "channels": channels, "num_block": s.count("layers.layers."),
              "large_kernel": strip[2], "split_factor": strip[0] / channels}
    return [{"out_channels": out, "upscale": scale, **common}
            for out, scale in shuffle_splits(s.dim("upsampler.upsampleOneStep.0.weight", 0), (cin, 3, 1))]


register_recogniser("LKFMixer", _recognise)
