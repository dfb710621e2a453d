"""CascadedGaze: a NAFNet U-Net whose encoder blocks add global context (Ghasemabadi, Janjua, Salameh & Niu, TMLR
2024, arXiv 2401.15235), as traiNNer-redux trains it.

Module names and constructor arguments follow traiNNer-redux's ``CascadedGaze`` (``cgnet_arch.py``), so its
checkpoints load with ``strict=True`` and give the same output. The encoder blocks are NAFBlocks whose gate and
channel attention act on the depth-wise features concatenated with a *global context extractor*'s outputs: 2 or 3
cascaded stride-2 / 3 / 4 depth-wise separable convs (no padding) with GELU, each nearest-upsampled back to the
block's size. The middle and decoder blocks are plain NAFBlocks; norms, gate and blocks are NAFNet's
(``anysr.archs.nafnet_arch``; traiNNer-redux's hand-written layer-norm backward is the analytic gradient of the
plain layer norm used here).

Size requirement: the input is zero-padded at the bottom / right to a multiple of ``2 ** len(enc_blk_nums)`` (as
the original does), and further to the smallest size whose extractors still see whole kernels at every level
(``min_size``: 64 for the published layout; the original fails below it), then the output is cropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.accelerators.hardware import resamples_by_gathers
from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.nafnet_arch import LayerNorm2d, NAFBlock, SimpleGate, block_counts
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY

# (kernel sizes, strides) of the context extractor with 2 / 3 cascaded convs
GCE_LAYOUTS: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {2: ((3, 3), (2, 3)), 3: ((3, 3, 5), (2, 3, 4))}


def _smallest_side(kernels: Sequence[int], strides: Sequence[int]) -> int:
    """The smallest side on which every conv of the cascade (no padding) still covers its kernel."""
    side = 1
    for k, s in zip(reversed(kernels), reversed(strides), strict=True):
        side = (side - 1) * s + k  # the input side that gives ``side`` outputs
    return side


def resize_nearest(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``F.interpolate(x, size, mode="nearest")``; on devices that resample by gathers (XLA: no lowering of the
    backward) the same rows / columns picked by ``index_select`` (source index ``floor(i * in / out)`` in float32,
    as PyTorch computes it)."""
    if not resamples_by_gathers(x.device):
        return F.interpolate(x, size=size, mode="nearest")
    for dim, n_out in ((2, size[0]), (3, size[1])):
        n_in = x.shape[dim]
        scale = torch.tensor(n_in / n_out, dtype=torch.float32, device=x.device)
        src = (torch.arange(n_out, dtype=torch.float32, device=x.device) * scale).floor().long().clamp(max=n_in - 1)
        x = x.index_select(dim, src)
    return x


class DepthwiseSeparableConv(nn.Module):
    """Depth-wise conv (no bias) then a 1x1 conv (no bias); traiNNer-redux's ``depthwise_separable_conv``."""

    def __init__(self, channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.pointwise = nn.Conv2d(channels, channels, 1, bias=False)
        self.depthwise = nn.Conv2d(channels, channels, kernel_size, stride=stride, groups=channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


class GlobalContextExtractor(nn.Module):
    """Cascaded strided depth-wise separable convs, each followed by GELU; returns every stage's output."""

    def __init__(self, c: int, kernel_sizes: Sequence[int] = (3, 3, 5), strides: Sequence[int] = (2, 3, 4)) -> None:
        super().__init__()
        self.depthwise_separable_convs = nn.ModuleList(
            DepthwiseSeparableConv(c, k, s) for k, s in zip(kernel_sizes, strides, strict=True))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outputs = []
        for conv in self.depthwise_separable_convs:
            x = F.gelu(conv(x))
            outputs.append(x)
        return outputs


class CascadedGazeBlock(nn.Module):
    """Norm, 1x1 expand to ``2c``, 3x3 depth-wise, GELU; the two halves' sum feeds the context extractor, whose
    stages (nearest-upsampled) join the ``2c`` features; channel attention, 1x1 to ``c`` (scaled by ``beta``) +
    input; then NAFNet's gated feed-forward (scaled by ``gamma``). ``beta`` / ``gamma`` start at zero."""

    def __init__(self, c: int, GCE_Conv: int = 2, DW_Expand: int = 2, FFN_Expand: int = 2,  # noqa: N803
                 drop_out_rate: float = 0.0) -> None:
        super().__init__()
        if DW_Expand != 2:
            raise ArchArgumentError("DW_Expand", f"CascadedGaze's context extractor reads half the expanded "
                                    f"channels, so DW_Expand must be 2, got {DW_Expand!r}")
        if GCE_Conv not in GCE_LAYOUTS:
            raise ArchArgumentError("GCE_CONVS_nums", f"CascadedGaze's context extractors have 2 or 3 convs, "
                                    f"got {GCE_Conv!r}")
        dw = c * DW_Expand
        kernels, strides = GCE_LAYOUTS[GCE_Conv]
        cat = dw + c * GCE_Conv  # the expanded features and one c-channel map per extractor stage
        self.dw_channel = dw
        self.GCE_Conv = GCE_Conv
        self.conv1 = nn.Conv2d(c, dw, 1)
        self.conv2 = nn.Conv2d(dw, dw, 3, padding=1, groups=dw)
        self.GCE = GlobalContextExtractor(c, kernels, strides)
        self.project_out = nn.Conv2d(cat, c, 1)
        self.sca = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cat, cat, 1))
        self.sg = SimpleGate()
        ffn = FFN_Expand * c
        self.conv4 = nn.Conv2d(c, ffn, 1)
        self.conv5 = nn.Conv2d(ffn // 2, c, 1)
        self.norm1 = LayerNorm2d(c)
        self.norm2 = LayerNorm2d(c)
        self.dropout1 = nn.Dropout(drop_out_rate) if drop_out_rate > 0 else nn.Identity()
        self.dropout2 = nn.Dropout(drop_out_rate) if drop_out_rate > 0 else nn.Identity()
        self.beta = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.gamma = nn.Parameter(torch.zeros(1, c, 1, 1))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        size = (inp.shape[-2], inp.shape[-1])
        x = F.gelu(self.conv2(self.conv1(self.norm1(inp))))
        a, b = x.chunk(2, dim=1)
        x = torch.cat([x, *(resize_nearest(g, size) for g in self.GCE(a + b))], dim=1)
        x = self.project_out(self.sca(x) * x)
        y = inp + self.dropout1(x) * self.beta
        x = self.conv5(self.sg(self.conv4(self.norm2(y))))
        return y + self.dropout2(x) * self.gamma


@ARCH_REGISTRY.register()
class CascadedGaze(nn.Module):
    """CascadedGaze U-Net: ``intro`` conv, per level (CascadedGaze blocks, 2x2 stride-2 conv doubling the
    channels), NAFBlock ``middle_blks``, per level (1x1 conv + PixelShuffle halving the channels, skip added,
    NAFBlocks), ``ending`` conv, plus the input. Scale 1 (restoration).

    Args (traiNNer-redux's): scale (1 only), img_channel, width (channels of the first level), middle_blk_num,
    enc_blk_nums / dec_blk_nums (blocks per level; as many decoder as encoder levels), GCE_CONVS_nums (2 or 3
    context-extractor convs per encoder level).
    """

    def __init__(self, scale: int = 1, img_channel: int = 3, width: int = 60, middle_blk_num: int = 10,
                 enc_blk_nums: Sequence[int] = (2, 2, 4, 6), dec_blk_nums: Sequence[int] = (2, 2, 2, 2),
                 GCE_CONVS_nums: Sequence[int] = (3, 3, 2, 2)) -> None:  # noqa: N803
        super().__init__()
        if scale != 1:
            raise ArchArgumentError("scale", f"CascadedGaze restores at scale 1 only, got {scale!r}")
        enc = block_counts(enc_blk_nums, "enc_blk_nums", "CascadedGaze")
        dec = block_counts(dec_blk_nums, "dec_blk_nums", "CascadedGaze")
        gce = list(GCE_CONVS_nums)
        if len(dec) != len(enc):
            raise ArchArgumentError("dec_blk_nums", f"CascadedGaze needs one decoder level per encoder level: "
                                    f"enc_blk_nums has {len(enc)} entries, dec_blk_nums {len(dec)}")
        if len(gce) < len(enc):
            raise ArchArgumentError("GCE_CONVS_nums", f"CascadedGaze needs a context-extractor size per encoder "
                                    f"level: {len(enc)} levels, GCE_CONVS_nums has {len(gce)} entries")
        if any(g not in GCE_LAYOUTS for g in gce[: len(enc)]):
            raise ArchArgumentError("GCE_CONVS_nums", f"CascadedGaze's context extractors have 2 or 3 convs, "
                                    f"got {GCE_CONVS_nums!r}")
        self.scale = 1
        self.intro = nn.Conv2d(img_channel, width, 3, padding=1)
        self.ending = nn.Conv2d(width, img_channel, 3, padding=1)
        self.encoders = nn.ModuleList()
        self.downs = nn.ModuleList()
        self.ups = nn.ModuleList()
        self.decoders = nn.ModuleList()
        chan = width
        smallest = 1
        for level, (num, convs) in enumerate(zip(enc, gce, strict=False)):
            self.encoders.append(nn.Sequential(*(CascadedGazeBlock(chan, GCE_Conv=convs) for _ in range(num))))
            self.downs.append(nn.Conv2d(chan, 2 * chan, 2, 2))
            chan *= 2
            if num:
                smallest = max(smallest, _smallest_side(*GCE_LAYOUTS[convs]) * 2**level)
        self.middle_blks = nn.Sequential(*(NAFBlock(chan) for _ in range(middle_blk_num)))
        for num in dec:
            self.ups.append(nn.Sequential(nn.Conv2d(chan, 2 * chan, 1, bias=False), nn.PixelShuffle(2)))
            chan //= 2
            self.decoders.append(nn.Sequential(*(NAFBlock(chan) for _ in range(num))))
        self.padder_size = 2 ** len(enc)
        self.tile_multiple: int = self.padder_size  # input sides are padded to a multiple of this
        self.min_size: int = -(-smallest // self.padder_size) * self.padder_size  # and to at least this

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        h, w = inp.shape[-2:]
        m = self.padder_size
        pad_h = max((-h) % m, self.min_size - h)
        pad_w = max((-w) % m, self.min_size - w)
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


__all__ = ["CascadedGaze", "CascadedGazeBlock", "GlobalContextExtractor", "resize_nearest"]


def _recognise(s: StateShapes) -> dict:
    """CascadedGaze from its tensors: image channels and width from the intro conv, the levels from the down
    convs, the blocks per level from each encoder / decoder and the middle, each encoder level's extractor size
    from its first block (levels without blocks: traiNNer-redux's default there)."""
    levels = s.count("downs.")
    enc = [s.count(f"encoders.{i}.") for i in range(levels)]
    if not any(enc):
        raise NotThisFamily("no CascadedGaze block (a NAFNet)")
    default = (3, 3, 2, 2)
    gce = [s.count(f"encoders.{i}.0.GCE.depthwise_separable_convs.") if n else default[i] if i < 4 else 2
           for i, n in enumerate(enc)]
    if any(g not in GCE_LAYOUTS for g in gce):
        raise NotThisFamily("encoder blocks without a context extractor")
    return {"img_channel": s.dim("intro.weight", 1), "width": s.dim("intro.weight", 0),
            "middle_blk_num": s.count("middle_blks."), "enc_blk_nums": enc,
            "dec_blk_nums": [s.count(f"decoders.{i}.") for i in range(levels)], "GCE_CONVS_nums": gce}


register_recogniser("CascadedGaze", _recognise)
