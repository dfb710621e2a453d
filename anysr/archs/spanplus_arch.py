"""SPANPlus: SPAN (Wan et al., "Swift Parameter-free Attention Network for Efficient Super-Resolution", CVPR
workshops / NTIRE 2024) reworked by umzi2 (2024) and trained by traiNNer-redux.

Module names and constructor arguments follow traiNNer-redux's ``SpanPlus``, so its checkpoints load with
``strict=True`` and give the same output. Differences from SPAN: Mish instead of SiLU in the attention blocks,
no input normalisation, a configurable list of block groups (``blocks``: one ``SPABS`` group per entry, each a
first block, ``n`` middle blocks and a last block fused 1x1 with the group's input), and three heads:
``upsampler="dys"`` (DySample, the default), ``"ps"`` (conv + PixelShuffle) or ``"conv"`` (a 3x3 conv, x1 only).

Every 3x3 conv is SPAN's re-parameterisable ``Conv3XC`` (folded into ``eval_conv`` in eval mode;
``reparameterize()`` freezes the fold for export). Fully convolutional: any input size, ``tile_multiple = 1``.
DySample's sampling is built from gathers here (the same values as ``grid_sample``), so it lowers on XLA.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.plksr_arch import DySample, dysample_scale
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.archs.span_arch import Conv3XC, check_int, fold_conv3xc
from anysr.ops.dcn import sample_bilinear
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

UPSAMPLERS = ("dys", "ps", "conv")


class GatherDySample(DySample):
    """DySample (same parameters, buffer and result) whose bilinear border sampling is done by gathers
    (``anysr.ops.dcn.sample_bilinear``) instead of ``F.grid_sample``, which XLA runs on the host."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        s, g = self.scale, self.groups
        work = torch.promote_types(x.dtype, torch.float32)
        offset = (self.offset(x) * self.scope(x).sigmoid() * 0.5 + self.init_pos).to(work)
        # pixel coordinates of every output point: the LR pixel's column / row plus its offset
        cols = torch.arange(w, device=x.device, dtype=work).view(1, 1, 1, w)
        rows = torch.arange(h, device=x.device, dtype=work).view(1, 1, h, 1)
        pos = offset.reshape(b, 2, g * s * s, h, w)
        px = (pos[:, 0] + cols).reshape(b, g * s * s, h, w)
        py = (pos[:, 1] + rows).reshape(b, g * s * s, h, w)

        def spread(p: torch.Tensor) -> torch.Tensor:  # (b, g*s*s, h, w) -> (b, s*h * s*w, g)
            return nn.functional.pixel_shuffle(p, s).reshape(b, g, s * h * s * w).transpose(1, 2)

        out = sample_bilinear(x, spread(px), spread(py), "border")  # (b, n, g, c // g)
        out = out.reshape(b, s * h, s * w, c).permute(0, 3, 1, 2)
        return self.end_conv(out) if self.end_convolution else out


class MishSPAB(nn.Module):
    """Parameter-free attention block: three Conv3XC with Mish between, attention ``sigmoid(y) - 0.5`` applied
    to ``y + x``. With ``end=True`` it also returns the first conv's activated output (the group's skip)."""

    def __init__(self, in_channels: int, end: bool = False) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.end = end
        self.c1_r = Conv3XC(in_channels, in_channels, gain1=2, s=1)
        self.c2_r = Conv3XC(in_channels, in_channels, gain1=2, s=1)
        self.c3_r = Conv3XC(in_channels, in_channels, gain1=2, s=1)
        self.act1 = nn.Mish()
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # The original activates the first output in place, so the skip it returns is the activated one.
        first = self.act1(self.c1_r(x))
        y = self.c3_r(self.act1(self.c2_r(first)))
        out = (y + x) * (self.sigmoid(y) - 0.5)
        return (out, first) if self.end else out


class SPABS(nn.Module):
    """One group: a block, ``n_blocks`` blocks, an end block and a Conv3XC (+ Dropout2d); a 1x1 conv fuses the
    group input, that result, the first block's output and the end block's skip."""

    def __init__(self, feature_channels: int, n_blocks: int = 4, drop: float = 0.0) -> None:
        super().__init__()
        f = feature_channels
        self.block_1 = MishSPAB(f)
        self.block_n = nn.Sequential(*[MishSPAB(f) for _ in range(n_blocks)])
        self.block_end = MishSPAB(f, end=True)
        self.conv_2 = Conv3XC(f, f, gain1=2, s=1)
        self.conv_cat = nn.Conv2d(f * 4, f, 1)
        nn.init.trunc_normal_(self.conv_cat.weight, std=0.02)
        self.dropout = nn.Dropout2d(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.block_1(x)
        last, skip = self.block_end(self.block_n(first))
        return self.conv_cat(torch.cat([x, self.dropout(self.conv_2(last)), first, skip], 1))


@ARCH_REGISTRY.register()
class SpanPlus(nn.Module):
    """SPANPlus: a Conv3XC stem, one SPABS group per entry of ``blocks``, then the chosen upsampler.

    Args:
        num_in_ch, num_out_ch: image channels (the "ps" / "conv" heads output ``num_in_ch`` channels, as the
            original). blocks: middle blocks per group (default ``[4]``: one group).
        feature_channels: body width (a multiple of 4 with DySample). upscale: integer scale >= 1.
        drop_rate: Dropout2d rate after each group's last conv (training only).
        upsampler: "dys" (DySample), "ps" (PixelShuffle) or "conv" (x1 only).
    """

    tile_multiple: int = 1

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, blocks: Sequence[int] | None = None,
                 feature_channels: int = 48, upscale: int = 4, drop_rate: float = 0.0,
                 upsampler: str = "dys") -> None:
        super().__init__()
        blocks = [4] if blocks is None else list(blocks)
        s = upscale
        check_int("SpanPlus", "upscale", s, 1)
        if upsampler not in UPSAMPLERS:
            raise ArchArgumentError("upsampler", f"SpanPlus has no upsampler {upsampler!r}; use one of "
                                    f"{', '.join(UPSAMPLERS)}")
        if upsampler == "conv" and s != 1:
            raise ArchArgumentError("upsampler", f"SpanPlus's 'conv' upsampler is for upscale 1 only, got {s}")
        if upsampler == "dys" and feature_channels % 4:
            raise ArchArgumentError("feature_channels", f"SpanPlus with DySample needs feature_channels to be a "
                                    f"multiple of 4 (its groups), got {feature_channels!r}")
        if not blocks or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in blocks):
            raise ArchArgumentError("blocks", f"SpanPlus needs a non-empty list of block counts >= 0, got {blocks!r}")
        if not 0 <= drop_rate < 1:
            raise ArchArgumentError("drop_rate", f"SpanPlus needs 0 <= drop_rate < 1, got {drop_rate!r}")
        out_ch = num_out_ch if upsampler == "dys" else num_in_ch
        self.upscale = s
        f = feature_channels
        self.feats = nn.Sequential(Conv3XC(num_in_ch, f, gain1=2, s=1), *[SPABS(f, n, drop_rate) for n in blocks])
        if upsampler == "dys":
            self.upsampler: nn.Module = GatherDySample(f, out_ch, s)
        elif upsampler == "ps":
            self.upsampler = nn.Sequential(nn.Conv2d(f, out_ch * s * s, 3, padding=1), nn.PixelShuffle(s))
        else:
            self.upsampler = nn.Conv2d(f, out_ch, 3, padding=1)

    def reparameterize(self) -> SpanPlus:
        """The deployment form: fold every Conv3XC into its ``eval_conv`` once (what export traces). The state
        dict keeps its keys; do not train it further."""
        fold_conv3xc(self)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.upsampler(self.feats(x))


__all__ = ["SpanPlus", "SPABS", "MishSPAB", "GatherDySample"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("SpanPlus", scale_arg="upscale", presets={
    "spanplus": {},  # 2.23 M parameters at x4 (1.83 M trained; the rest are the stored folded convs)
    "spanplus_s": {"blocks": [2], "feature_channels": 32},  # 0.69 M at x4
    "spanplus_st": {"upsampler": "ps"},  # 2.24 M at x4
    "spanplus_sts": {"blocks": [2], "feature_channels": 32, "upsampler": "ps"},  # 0.69 M at x4
})


def _recognise(s: StateShapes) -> list[dict]:
    """SpanPlus from its tensors: input channels and width from the stem, blocks per group from the body, the
    upsampler from its names (DySample: offset convs; "ps": a PixelShuffle conv; "conv": one conv, x1) and the
    scale and output channels from its shapes."""
    cin, feat = s.dim("feats.0.sk.weight", 1), s.dim("feats.0.sk.weight", 0)
    groups = [i for i in s.indices("feats.") if i > 0]
    common = {"num_in_ch": cin, "feature_channels": feat,
              "blocks": [s.count(f"feats.{i}.block_n.") for i in groups]}
    if "upsampler.end_conv.weight" in s:
        return [{**common, "num_out_ch": s.dim("upsampler.end_conv.weight", 0), "upsampler": "dys",
                 "upscale": dysample_scale(s, "upsampler.")}]
    if "upsampler.0.weight" in s:
        return [{**common, "num_out_ch": cin, "upsampler": "ps", "upscale": sc}
                for _, sc in shuffle_splits(s.dim("upsampler.0.weight", 0), (cin,))]
    return [{**common, "num_out_ch": cin, "upsampler": "conv", "upscale": 1}] if "upsampler.weight" in s else []


register_recogniser("SpanPlus", _recognise)
