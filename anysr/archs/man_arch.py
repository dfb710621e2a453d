"""MAN: Multi-scale Attention Network for single image super-resolution (Wang, Gao, Zhang & Gu, CVPR workshops
2024).

Module names and constructor arguments follow traiNNer-redux's ``MAN``, so its checkpoints (MAN, MAN-light,
MAN-tiny) load with ``strict=True`` and give the same output. A fixed mean shift (a frozen 1x1 conv, stored in
the checkpoint), a 3x3 head, ``n_resgroups`` groups of ``n_resblocks`` multi-scale attention blocks (MAB: grouped
multi-scale large-kernel attention, then a gated spatial-attention block, each layer-normed with a learned
residual scale) closed by a large-kernel attention tail, a 3x3 conv + PixelShuffle, and the mean added back.
Fully convolutional: any input size (``tile_multiple = 1``).
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

RGB_MEAN = (0.4488, 0.4371, 0.4040)


def _dw(ch: int, k: int, dilation: int = 1) -> nn.Conv2d:
    """Depth-wise ``k x k`` conv with the given dilation that keeps the size."""
    return nn.Conv2d(ch, ch, k, 1, (k // 2) * dilation, groups=ch, dilation=dilation)


def _lka(ch: int, k: int, k_dilated: int, dilation: int) -> nn.Sequential:
    """Large-kernel attention branch: depth-wise ``k``, dilated depth-wise ``k_dilated``, 1x1."""
    return nn.Sequential(_dw(ch, k), _dw(ch, k_dilated, dilation), nn.Conv2d(ch, ch, 1, 1, 0))


class SGAB(nn.Module):
    """Simple gated attention block: layer norm, 1x1 to 2x channels split into (a, x), ``x * dw7(a)``, 1x1, times
    the learned ``scale``, plus the input."""

    def __init__(self, n_feats: int) -> None:
        super().__init__()
        self.Conv1 = nn.Conv2d(n_feats, n_feats * 2, 1, 1, 0)
        self.DWConv1 = _dw(n_feats, 7)
        self.Conv2 = nn.Conv2d(n_feats, n_feats, 1, 1, 0)
        self.norm = LayerNorm2d(n_feats)
        self.scale = nn.Parameter(torch.zeros(1, n_feats, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, v = self.Conv1(self.norm(x)).chunk(2, dim=1)
        return self.Conv2(v * self.DWConv1(a)) * self.scale + x


class GroupGLKA(nn.Module):
    """Grouped multi-scale large-kernel attention: layer norm, 1x1 to 2x channels split into (a, x); ``a``'s three
    thirds get LKA branches of 3/5/7 base kernels, each gated by a plain depth-wise conv of that size; ``x`` times
    the result through a 1x1, times ``scale``, plus the input."""

    def __init__(self, n_feats: int) -> None:
        super().__init__()
        c = n_feats // 3
        self.n_feats = n_feats
        self.i_feats = 2 * n_feats
        self.norm = LayerNorm2d(n_feats)
        self.scale = nn.Parameter(torch.zeros(1, n_feats, 1, 1))
        self.LKA7 = _lka(c, 7, 9, 4)
        self.LKA5 = _lka(c, 5, 7, 3)
        self.LKA3 = _lka(c, 3, 5, 2)
        self.X3 = _dw(c, 3)
        self.X5 = _dw(c, 5)
        self.X7 = _dw(c, 7)
        self.proj_first = nn.Sequential(nn.Conv2d(n_feats, self.i_feats, 1, 1, 0))
        self.proj_last = nn.Sequential(nn.Conv2d(n_feats, n_feats, 1, 1, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, v = self.proj_first(self.norm(x)).chunk(2, dim=1)
        a3, a5, a7 = a.chunk(3, dim=1)
        att = torch.cat([self.LKA3(a3) * self.X3(a3), self.LKA5(a5) * self.X5(a5), self.LKA7(a7) * self.X7(a7)], 1)
        return self.proj_last(v * att) * self.scale + x


class MAB(nn.Module):
    """Multi-scale attention block: GroupGLKA (``LKA``) then SGAB (``LFE``)."""

    def __init__(self, n_feats: int) -> None:
        super().__init__()
        self.LKA = GroupGLKA(n_feats)
        self.LFE = SGAB(n_feats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LFE(self.LKA(x))


class LKAT(nn.Module):
    """Large-kernel attention tail: 1x1 + GELU, gated by dw7 -> dilated dw9 -> 1x1, then a 1x1."""

    def __init__(self, n_feats: int) -> None:
        super().__init__()
        self.conv0 = nn.Sequential(nn.Conv2d(n_feats, n_feats, 1, 1, 0), nn.GELU())
        self.att = _lka(n_feats, 7, 9, 3)
        self.conv1 = nn.Conv2d(n_feats, n_feats, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv0(x)
        return self.conv1(x * self.att(x))


class ResGroup(nn.Module):
    """``n_resblocks`` MABs, the LKAT tail and the group's shortcut."""

    def __init__(self, n_resblocks: int, n_feats: int) -> None:
        super().__init__()
        self.body = nn.ModuleList([MAB(n_feats) for _ in range(n_resblocks)])
        self.body_t = LKAT(n_feats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        res = x
        for block in self.body:
            res = block(res)
        return self.body_t(res) + x


class MeanShift(nn.Conv2d):
    """A frozen 1x1 conv adding ``sign * rgb_range * rgb_mean`` (its weight and bias are in the checkpoints)."""

    def __init__(self, rgb_range: float, rgb_mean: tuple[float, float, float] = RGB_MEAN, sign: int = -1) -> None:
        super().__init__(3, 3, kernel_size=1)
        with torch.no_grad():
            self.weight.copy_(torch.eye(3).view(3, 3, 1, 1))
            self.bias.copy_(sign * rgb_range * torch.tensor(rgb_mean))
        self.requires_grad_(False)


@ARCH_REGISTRY.register()
class MAN(nn.Module):
    """MAN. Args: n_resblocks: MABs per group (36 MAN, 24 light, 5 tiny). n_resgroups: groups (with more than
    one, a 3x3 ``body_t`` and a long shortcut). n_colors: 3 (RGB; the mean shift is RGB). n_feats: width, a
    multiple of 3 (180, 60, 48). scale: integer >= 1."""

    tile_multiple: int = 1

    def __init__(self, n_resblocks: int = 36, n_resgroups: int = 1, n_colors: int = 3, n_feats: int = 180,
                 scale: int = 2) -> None:
        super().__init__()
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"MAN needs an integer scale >= 1, got {scale!r}")
        if n_colors != 3:
            raise ArchArgumentError("n_colors", f"MAN's mean shift is RGB: n_colors must be 3, got {n_colors!r}")
        if isinstance(n_feats, bool) or not isinstance(n_feats, int) or n_feats < 3 or n_feats % 3:
            raise ArchArgumentError("n_feats", f"MAN needs n_feats to be a multiple of 3 (its attention splits the "
                                    f"channels in three), got {n_feats!r}")
        self.n_resgroups = n_resgroups
        self.scale = scale
        self.sub_mean = MeanShift(1.0)
        self.head = nn.Conv2d(n_colors, n_feats, 3, 1, 1)
        self.body = nn.ModuleList([ResGroup(n_resblocks, n_feats) for _ in range(n_resgroups)])
        if n_resgroups > 1:
            self.body_t = nn.Conv2d(n_feats, n_feats, 3, 1, 1)
        self.tail = nn.Sequential(nn.Conv2d(n_feats, n_colors * scale**2, 3, 1, 1), nn.PixelShuffle(scale))
        self.add_mean = MeanShift(1.0, sign=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.head(self.sub_mean(x))
        res = feat
        for group in self.body:
            res = group(res)
        if self.n_resgroups > 1:
            res = self.body_t(res) + feat
        return self.add_mean(self.tail(res))


__all__ = ["MAN", "MAB", "GroupGLKA", "SGAB", "LKAT"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("MAN", scale_arg="scale", presets={
    "man_light": {"n_resblocks": 24, "n_feats": 60},  # 0.84 M parameters at x4 (0.82 M at x2)
    "man_tiny": {"n_resblocks": 5, "n_feats": 48},  # 0.13 M at x2
})


def _recognise(s: StateShapes) -> list[dict]:
    """MAN from its tensors: width from the head conv, groups and MABs per group from the body, the scale from
    the tail's PixelShuffle width (RGB)."""
    s.shape("body.0.body_t.conv1.weight")
    return [{"n_resblocks": s.count("body.0.body."), "n_resgroups": s.count("body."), "n_colors": 3,
             "n_feats": s.dim("head.weight", 0), "scale": sc}
            for _, sc in shuffle_splits(s.dim("tail.0.weight", 0), (s.dim("head.weight", 1),))]


register_recogniser("MAN", _recognise)
