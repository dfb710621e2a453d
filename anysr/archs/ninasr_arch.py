"""NinaSR: a plain residual CNN for super-resolution by Gabriel Gouvine (torchSR, 2021), as neosr trains it.

Module names and constructor arguments follow neosr's ``ninasr`` (``ninasr_arch.py``), so its checkpoints load with
``strict=True`` and give the same output. A learned scalar shift, a 3x3 conv (no bias), ``n_resblocks`` residual
blocks (3x3 conv to ``expansion * n_feats`` channels, ReLU, a local squeeze-excite gate, 3x3 conv back, no bias),
each scaled to keep the residual stream's variance near one (input by ``1 / sqrt(1 + i * (4 / n)^2)``, output by
``2 * 4 / n``), a long skip, then a conv + PixelShuffle head and a second learned scalar shift.

The gate: average pools of 31x31 windows every 16 pixels (borders not counted), a 1x1 bottleneck MLP, sigmoid,
nearest upsampling by 16, cropped to the input. Any input size; no padding.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits, width_ratio
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

STRIDE = 16  # the gate's pooling stride (and its upsampling factor)


class AttentionBlock(nn.Module):
    """``x * sigmoid(mlp(local_mean(x)))``: the mean over 31x31 windows every 16 pixels, upsampled back (nearest)."""

    def __init__(self, n_feats: int, reduction: int = 4, stride: int = STRIDE) -> None:
        super().__init__()
        self.stride = stride
        self.body = nn.Sequential(
            nn.AvgPool2d(2 * stride - 1, stride=stride, padding=stride - 1, count_include_pad=False),
            nn.Conv2d(n_feats, n_feats // reduction, 1), nn.ReLU(inplace=True),
            nn.Conv2d(n_feats // reduction, n_feats, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        g = self.body(x)
        b, c, gh, gw = g.shape
        s = self.stride  # nearest upsampling by an integer factor as a broadcast (XLA has no backward for the op)
        gate = g[:, :, :, None, :, None].expand(b, c, gh, s, gw, s).reshape(b, c, gh * s, gw * s)
        return x * gate[..., :h, :w]


class ResBlock(nn.Module):
    """``x + 2 * out_scale * body(in_scale * x)``; body: conv3x3, ReLU, gate, conv3x3 (no bias)."""

    def __init__(self, n_feats: int, mid_feats: int, in_scale: float, out_scale: float) -> None:
        super().__init__()
        self.in_scale = in_scale
        self.out_scale = out_scale
        conv1 = nn.Conv2d(n_feats, mid_feats, 3, padding=1)
        nn.init.kaiming_normal_(conv1.weight)
        nn.init.zeros_(conv1.bias)
        conv2 = nn.Conv2d(mid_feats, n_feats, 3, padding=1, bias=False)
        nn.init.kaiming_normal_(conv2.weight)
        self.body = nn.Sequential(conv1, nn.ReLU(inplace=True), AttentionBlock(mid_feats), conv2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x * self.in_scale) * (2 * self.out_scale)


class Rescale(nn.Module):
    """``x + bias``, one learned scalar (parameter ``bias``, a 0-d tensor in the files)."""

    def __init__(self, sign: float) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.tensor(float(sign)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


@ARCH_REGISTRY.register()
class NinaSR(nn.Module):
    """NinaSR (neosr's ``ninasr``).

    Args (neosr's): n_resblocks (depth), n_feats (width), n_colors (image channels), scale (integer >= 1),
    expansion (the blocks' inner width per ``n_feats``).
    """

    def __init__(self, n_resblocks: int = 26, n_feats: int = 32, n_colors: int = 3, scale: int = 4,
                 expansion: float = 2.0) -> None:
        super().__init__()
        for name, value in (("n_resblocks", n_resblocks), ("n_feats", n_feats), ("n_colors", n_colors),
                            ("scale", scale)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArchArgumentError(name, f"NinaSR needs an integer {name} >= 1, got {value!r}")
        mid_feats = int(n_feats * expansion)
        if mid_feats < 4:
            raise ArchArgumentError("expansion", f"NinaSR's blocks need n_feats * expansion >= 4 (their gate "
                                    f"divides it by 4), got {n_feats} * {expansion!r}")
        self.scale = scale
        self.in_channels = n_colors
        self.head = nn.Sequential(Rescale(-1.0), nn.Conv2d(n_colors, n_feats, 3, padding=1, bias=False))
        out_scale = 4 / n_resblocks
        self.body = nn.Sequential(*(ResBlock(n_feats, mid_feats, 1.0 / math.sqrt(1.0 + i * out_scale**2), out_scale)
                                    for i in range(n_resblocks)))
        self.tail = nn.Sequential(nn.Conv2d(n_feats, n_colors * scale**2, 3, padding=1), nn.PixelShuffle(scale),
                                  Rescale(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(x)
        return self.tail(self.body(x) + x)


__all__ = ["NinaSR"]


# neosr's named variants (its builders ignore every argument but the scale, which comes from the options file).
register_presets("NinaSR", scale_arg="scale", source="neosr", presets={
    "ninasr": {},  # neosr's name: the class defaults, the top-level scale
    "ninasr_b0": {"n_resblocks": 10, "n_feats": 16},
    "ninasr_b2": {"n_resblocks": 84, "n_feats": 56},
})


def _recognise(s: StateShapes) -> list[dict] | None:
    """NinaSR from its tensors: the two scalar shifts (``head.0.bias``, ``tail.2.bias``: no other family has a
    0-d tensor there), width and image channels from the head conv, depth, expansion from the first block, and
    the channels / scale split of the tail conv."""
    if s.shape("head.0.bias") != () or s.shape("tail.2.bias") != () or len(s.shape("head.1.weight")) != 4:
        return None
    n_feats, colors = s.shape("head.1.weight")[:2]
    depth = s.count("body.")
    args = {"n_feats": n_feats, "n_colors": colors, "n_resblocks": depth}
    if depth:
        args["expansion"] = width_ratio(s.dim("body.0.body.0.weight", 0), n_feats, 2.0)
    return [{**args, "scale": sc} for c, sc in shuffle_splits(s.dim("tail.0.weight", 0), (colors,)) if c == colors]


register_recogniser("NinaSR", _recognise)
